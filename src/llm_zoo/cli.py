"""The ``llm-zoo`` command: list environments, play one by hand, check one.

::

    llm-zoo list                       ids with a one-line description
    llm-zoo play PlanPath-v0 --seed 3  play every role yourself, seeing exactly what each agent sees
    llm-zoo check PlanPath-v0          run llm_zoo.testing.check_env on an env

In ``play``, type an agent's answer over as many lines as you like and finish it with a line
holding only ``/end`` (or end of input). ``/quit`` on its own line stops the game.
Environment arguments are given as ``--env-arg name=value`` (the value is read as a Python
literal where possible, so ``--env-arg rows=5`` passes the integer 5).
"""

from __future__ import annotations

import argparse
import ast
import sys
import warnings
from collections.abc import Sequence
from typing import Any, TextIO

from llm_zoo.registry import UnknownEnvError, make, registry

__all__ = ["main"]

END_OF_ANSWER = "/end"
QUIT = "/quit"


def _parse_env_args(pairs: Sequence[str]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"llm-zoo: --env-arg must look like name=value, got {pair!r}")
        try:
            value: Any = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw  # plain strings need no quotes
        kwargs[name.strip()] = value
    return kwargs


def cmd_list(out: TextIO) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # plugin failures are listed below, in plain words
        ids = list(registry)
    width = max((len(i) for i in ids), default=0)
    for env_id in ids:
        env_spec = registry[env_id]
        origin = f"  [plugin: {env_spec.plugin}]" if env_spec.plugin else ""
        print(f"{env_id:<{width}}  {env_spec.description}{origin}", file=out)
    for name, error in registry.plugin_errors.items():
        print(f"warning: plugin {name!r} failed to load: {error}", file=out)
    return 0


def _read_answer(stdin: TextIO, out: TextIO) -> str | None:
    print(f"--- your answer (finish with a line '{END_OF_ANSWER}', '{QUIT}' to stop) ---", file=out)
    out.flush()
    lines: list[str] = []
    for line in stdin:
        stripped = line.rstrip("\n")
        if stripped.strip() == END_OF_ANSWER:
            return "\n".join(lines)
        if stripped.strip() == QUIT:
            return None
        lines.append(stripped)
    return "\n".join(lines) if lines else None


def cmd_play(env_id: str, seed: int | None, env_kwargs: dict[str, Any], stdin: TextIO, out: TextIO) -> int:
    env = make(env_id, render_mode="ansi", **env_kwargs)
    env.reset(seed=seed)  # errors in the env itself are bugs: let them show a traceback
    print(f"== {env_id} (task {getattr(env, 'task_id', '?')}) ==", file=out)
    for agent in env.agent_iter():
        _, _, termination, truncation, _ = env.last()
        if termination or truncation:
            env.step(None)
            continue
        print(f"\n=========== {agent}, turn {env.turn + 1} of {env.max_turns} ===========", file=out)
        print(env.observe(agent)["prompt"], file=out)
        answer = _read_answer(stdin, out)
        if answer is None:
            print("\nstopped.", file=out)
            return 0
        env.step(answer)
        info = env.infos[agent]
        print(
            f"\n-> reward {env.rewards[agent]:+.3f} (role {info['role_reward']:+.3f}, "
            f"global {info['global_reward']:+.3f}), format_ok={info['format_ok']}, "
            f"success={info['success']}",
            file=out,
        )
        if info.get("feedback"):
            print(f"-> feedback: {info['feedback']}", file=out)
        picture = env.render()
        if picture:
            print(picture, file=out)
    print(f"\nepisode over after {env.turn} turn(s): success={env.success}", file=out)
    return 0


def cmd_check(env_id: str, env_kwargs: dict[str, Any], out: TextIO) -> int:
    from llm_zoo.testing import check_env

    try:
        check_env(env_id, env_kwargs=env_kwargs)
    except AssertionError as err:
        print(f"FAIL {env_id}: {err}", file=out)
        return 1
    print(
        f"OK {env_id}: PettingZoo api_test, seed_test, parallel_api_test, determinism, clone, fuzz", file=out
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llm-zoo", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="list the registered environments")
    play = commands.add_parser("play", help="play an environment yourself, every role")
    play.add_argument("env_id")
    play.add_argument("--seed", type=int, default=None)
    check = commands.add_parser("check", help="run check_env on an environment")
    check.add_argument("env_id")
    for sub in (play, check):
        sub.add_argument("--env-arg", action="append", default=[], metavar="NAME=VALUE")
    return parser


def main(argv: Sequence[str] | None = None, *, stdin: TextIO | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    stdin = stdin or sys.stdin
    out = out or sys.stdout
    if args.command == "list":
        return cmd_list(out)
    env_kwargs = _parse_env_args(args.env_arg)
    try:  # a wrong id or argument is the user's mistake: say so without a traceback
        make(args.env_id, **env_kwargs).close()
    except (UnknownEnvError, TypeError, ValueError) as err:
        print(f"llm-zoo: {err}", file=sys.stderr)
        return 2
    if args.command == "play":
        return cmd_play(args.env_id, args.seed, env_kwargs, stdin, out)
    return cmd_check(args.env_id, env_kwargs, out)


if __name__ == "__main__":
    sys.exit(main())
