"""The ``llm-zoo`` command: list environments, play one by hand, check one.

::

    llm-zoo list                       ids with a one-line description
    llm-zoo play PlanPath-v0 --seed 3  play every role yourself, seeing exactly what each agent sees
    llm-zoo check PlanPath-v0          run llm_zoo.testing.check_env on an env
    llm-zoo serve --port 8000          serve every env over OpenEnv's protocol (llm-zoo[serve])

In ``play``, type an agent's answer over as many lines as you like and finish it with a line
holding only ``/end`` (or end of input). ``/quit`` on its own line, end of input with no answer
typed, or Ctrl-C stops the game (Ctrl-C with exit status 130, as shells expect).
Environment arguments are given as ``--env-arg name=value`` (the value is read as a Python
literal where possible, so ``--env-arg rows=5`` passes the integer 5).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import sys
import warnings
from collections.abc import Sequence
from typing import Any, TextIO

from llm_zoo.registry import UnknownEnvError, make, registry

__all__ = ["main"]

END_OF_ANSWER = "/end"
QUIT = "/quit"
#: Exit status after Ctrl-C (128 + SIGINT), as shells report an interrupted command.
INTERRUPTED_EXIT_CODE = 130
#: Info keys every env reports; ``play`` shows the others as the env's own details.
_STANDARD_INFO_KEYS = ("role_reward", "global_reward", "success", "turn", "format_ok", "feedback", "task_id")


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


def _turn_label(env: Any) -> str:
    if hasattr(env, "turn_label"):
        return env.turn_label()
    return f"turn {env.turn + 1} of {env.max_turns}"  # an env that does not build on TextAECEnv


def _yes_no(flag: object) -> str:
    return "yes" if flag else "no"


def describe_step(env: Any, agent: str) -> list[str]:
    """What ``agent``'s last action did, in lines for a person: its reward, whether its answer
    could be read, what its own answer achieved, and whether the *team* has succeeded (which,
    for an agent that does not act last, later agents of the turn still decide)."""
    info = env.infos[agent]
    lines = [
        f"-> reward {env.rewards[agent]:+.3f} = role {info['role_reward']:+.3f} + alpha x global "
        f"{info['global_reward']:+.3f}; answer readable: {_yes_no(info['format_ok'])}"
    ]
    if "moves_solve" in info:
        lines.append(
            f"-> this answer's moves, played from the board it was shown, reach the goal: {_yes_no(info['moves_solve'])}"
        )
    later = env.possible_agents[env.possible_agents.index(agent) + 1 :]
    episode_over = not env.agents or all(env.terminations[a] or env.truncations[a] for a in env.agents)
    if info["success"]:
        team = "yes"
    elif later and not episode_over:
        team = f"not yet ({', '.join(later)} still to act this turn)"
    else:
        team = "no"
    lines.append(f"-> team success: {team}")
    details = {k: v for k, v in info.items() if k not in (*_STANDARD_INFO_KEYS, "moves_solve")}
    if details:
        lines.append("-> details: " + ", ".join(f"{k}={v}" for k, v in details.items()))
    if info.get("feedback"):
        lines.append(f"-> feedback: {info['feedback']}")
    return lines


def cmd_play(env_id: str, seed: int | None, env_kwargs: dict[str, Any], stdin: TextIO, out: TextIO) -> int:
    env = make(env_id, render_mode="ansi", **env_kwargs)
    try:
        env.reset(seed=seed)  # errors in the env itself are bugs: let them show a traceback
        print(f"== {env_id} (task {getattr(env, 'task_id', '?')}) ==", file=out)
        for agent in env.agent_iter():
            _, _, termination, truncation, _ = env.last()
            if termination or truncation:
                env.step(None)
                continue
            print(f"\n=========== {agent}, {_turn_label(env)} ===========", file=out)
            print(env.observe(agent)["prompt"], file=out)
            answer = _read_answer(stdin, out)
            if answer is None:
                print("\nstopped.", file=out)
                return 0
            env.step(answer)
            print("", *describe_step(env, agent), sep="\n", file=out)
            picture = env.render()
            if picture:
                print(picture, file=out)
        print(f"\nepisode {_turn_label(env)}: success={env.success}", file=out)
        return 0
    finally:
        env.close()


def cmd_check(env_id: str, env_kwargs: dict[str, Any], out: TextIO) -> int:
    from llm_zoo.testing import check_env

    try:
        report = check_env(env_id, env_kwargs=env_kwargs)
    except AssertionError as err:
        print(f"FAIL {env_id}: {err}", file=out)
        return 1
    print(
        f"OK {env_id}: PettingZoo api_test, seed_test, render_test, parallel_api_test, determinism, clone, "
        f"fuzz, reward-hack search ({len(report.episodes)} episodes)",
        file=out,
    )
    print(report.summary(), file=out)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from llm_zoo.serve.run import serve
    except ImportError as err:
        print(f"llm-zoo serve needs the serve extra ({err}): pip install 'llm-zoo[serve]'", file=sys.stderr)
        return 2
    for module in args.plugin:  # envs a module registers on import (installed plugins load by themselves)
        try:
            importlib.import_module(module)
        except ImportError as err:
            print(f"llm-zoo serve: --plugin {module}: cannot import it: {err}", file=sys.stderr)
            return 2
    for name in ("session_ttl", "max_sessions", "max_message_bytes"):
        if not getattr(args, name) > 0:
            print(f"llm-zoo serve: --{name.replace('_', '-')} must be > 0", file=sys.stderr)
            return 2
    from llm_zoo.registry import registry
    from llm_zoo.serve.auth import read_tokens

    unknown = [env_id for env_id in args.env if env_id not in registry]
    if unknown:
        print(
            f"llm-zoo serve: --env {unknown[0]}: unknown env; registered: {', '.join(sorted(registry))}",
            file=sys.stderr,
        )
        return 2

    try:
        tokens = read_tokens(args.token_file)
        for flag, value in (("--max-sessions-per-client", args.max_sessions_per_client),
                            ("--max-calls-per-client", args.max_calls_per_client),
                            ("--max-connections-per-client", args.max_connections_per_client)):  # fmt: skip
            if value is not None and not value > 0:
                raise ValueError(f"{flag} must be > 0")
        serve(
            args.host,
            args.port,
            session_ttl_s=args.session_ttl,
            max_sessions=args.max_sessions,
            max_message_bytes=args.max_message_bytes,
            token=tokens,
            allow_no_token=args.allow_no_token,
            max_sessions_per_client=args.max_sessions_per_client,
            max_calls_per_client=args.max_calls_per_client,
            max_connections_per_client=args.max_connections_per_client,
            env_ids=args.env or None,
            allowed_arguments=args.allow_arg,
        )
    except ValueError as err:
        print(f"llm-zoo serve: {err}", file=sys.stderr)
        return 2
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
    serve = commands.add_parser("serve", help="serve every env to OpenEnv clients and llm_zoo.remote")
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: this machine only)"
    )
    serve.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed when listening)")
    serve.add_argument(
        "--session-ttl", type=float, default=600.0, help="seconds before an unused session expires"
    )
    serve.add_argument("--max-sessions", type=int, default=1024, help="sessions held at once")
    serve.add_argument(
        "--max-message-bytes", type=int, default=8 << 20, help="largest frame or body accepted"
    )
    serve.add_argument(
        "--token-file",
        default=None,
        metavar="PATH",
        help="serve only clients sending one of this file's tokens (one per line, one per client) "
        "as a bearer token (default: LLM_ZOO_SERVE_TOKEN, if set)",
    )
    serve.add_argument(
        "--max-sessions-per-client",
        type=int,
        default=None,
        metavar="N",
        help="sessions one client (one token) may hold, clones included (default: half of "
        "--max-sessions with several tokens, else --max-sessions)",
    )
    serve.add_argument(
        "--max-calls-per-client",
        type=int,
        default=None,
        metavar="N",
        help="env calls of one client (one token) running at once, of the server's 64 env threads; "
        "its further calls wait without a thread (default: 32 with several tokens, else 64)",
    )
    serve.add_argument(
        "--max-connections-per-client",
        type=int,
        default=None,
        metavar="N",
        help="WebSocket connections one client (one token) may have open; more are refused with "
        "HTTP 429 (default: its sessions plus 64)",
    )
    serve.add_argument(
        "--allow-no-token",
        action="store_true",
        help="listen on a non-loopback --host without a token (anyone who reaches the port may use it)",
    )
    serve.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="ENV_ID",
        help="serve only this env (repeat for several; default: every registered env)",
    )
    serve.add_argument(
        "--allow-arg",
        action="append",
        default=[],
        metavar="NAME",
        help="let clients set constructor argument NAME to a file path or above its default bound",
    )
    serve.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it registers envs)",
    )
    return parser


def main(argv: Sequence[str] | None = None, *, stdin: TextIO | None = None, out: TextIO | None = None) -> int:
    """Run one ``llm-zoo`` command; returns the exit status (130 after Ctrl-C, without a traceback)."""
    try:
        return _run(argv, stdin or sys.stdin, out or sys.stdout)
    except KeyboardInterrupt:
        print("\nllm-zoo: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE


def _run(argv: Sequence[str] | None, stdin: TextIO, out: TextIO) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "list":
        return cmd_list(out)
    if args.command == "serve":
        return cmd_serve(args)
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
