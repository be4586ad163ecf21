"""Envs on ``llm-zoo serve`` servers vs. in-process: Code-v0 episodes per second, and the protocol's
cost per step.

    python benchmarks/env_server_speed.py                     # 32 Code-v0 episodes, 1/2/4 servers
    python benchmarks/env_server_speed.py --quick --output /tmp/x.json   # smoke run, a few episodes

**Code-v0 scale-out.** The same episodes (seeds ``0..episodes-1``; answers recorded once from the
env's oracle, so every coder step runs the sandbox on the tests and both sides play identical
actions) are played

* in-process, one after another: what a rollout does today on the training machine;
* on 1, 2 and 4 ``llm-zoo serve`` child processes, ``--clients-per-server`` episodes at a time per
  server (threads, each its own ``llm_zoo.remote`` session), spread evenly over the servers.

Reported: live steps per second of wall time, and each server count's ratio to in-process,
measured side by side in one run. On a machine with few free cores the servers compete with each
other and with this process, so the ratio says what the machine allows, not what separate CPU
machines would give.

**Protocol overhead.** A trivial env (``tests/toy_envs.KeywordEnv``: no sandbox, tiny prompts) is
stepped sequentially in-process and through one server; the difference per step is the cost of a
round trip (JSON, WebSocket, the server's thread hop) on this machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from _common import RESULTS_DIR, bar_chart, finish, run_facts

import llm_zoo
from llm_zoo import remote
from llm_zoo.envs.code import oracle_action
from llm_zoo.serve import ServerProcess

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
TRIVIAL_ID = "bench/Keyword-v0"


def record_oracle_actions(seeds: list[int]) -> dict[int, list[str | None]]:
    """Each seed's actions (None for dead steps) as the oracle plays them in-process."""
    actions: dict[int, list[str | None]] = {}
    for seed in seeds:
        env = llm_zoo.make("Code-v0")
        env.reset(seed=seed)
        played: list[str | None] = []
        for agent in env.agent_iter():
            _, _, termination, truncation, _ = env.last()
            action = None if termination or truncation else oracle_action(env, agent)
            env.step(action)
            played.append(action)
        actions[seed] = played
        env.close()
    return actions


def play(env: Any, seed: int, actions: list[str | None]) -> int:
    """Replay ``actions`` from ``reset(seed)``; return the live steps."""
    env.reset(seed=seed)
    live = 0
    for action in actions:
        env.last()
        env.step(action)
        live += action is not None
    return live


def in_process(actions: dict[int, list[str | None]]) -> dict[str, float]:
    start = time.perf_counter()
    steps = 0
    for seed, played in actions.items():
        env = llm_zoo.make("Code-v0")
        steps += play(env, seed, played)
        env.close()
    seconds = time.perf_counter() - start
    return {"steps": steps, "seconds": seconds, "steps_per_s": steps / seconds}


def on_servers(
    urls: list[str], episodes: list[tuple[int, list[str | None]]], clients_per_server: int
) -> dict[str, float]:
    def one(item: tuple[int, tuple[int, list[str | None]]]) -> int:
        index, (seed, played) = item
        env = remote.make(urls[index % len(urls)], "Code-v0")
        try:
            return play(env, seed, played)
        finally:
            env.close()

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients_per_server * len(urls)) as pool:
        steps = sum(pool.map(one, enumerate(episodes)))
    seconds = time.perf_counter() - start
    return {"steps": steps, "seconds": seconds, "steps_per_s": steps / seconds}


def protocol_overhead(url: str, steps: int) -> dict[str, float]:
    def run(env: Any) -> float:
        env.reset(seed=0)
        start = time.perf_counter()
        for index in range(steps):
            if not env.agents:
                env.reset(seed=index)
            agent = env.agent_selection
            dead = env.terminations[agent] or env.truncations[agent]
            env.step(None if dead else "nothing")  # never the keyword: long episodes
        return (time.perf_counter() - start) / steps

    local = run(llm_zoo.make(TRIVIAL_ID, max_turns=1000))
    env = remote.make(url, TRIVIAL_ID, max_turns=1000)
    served = run(env)
    env.close()
    return {
        "in_process_ms_per_step": local * 1e3,
        "served_ms_per_step": served * 1e3,
        "overhead_ms_per_step": (served - local) * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--clients-per-server", type=int, default=2)
    parser.add_argument("--overhead-steps", type=int, default=2000)
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 4 episodes, 1 and 2 servers, 200 steps"
    )
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "env_server_speed.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.episodes, args.servers, args.overhead_steps = 4, [1, 2], 200
    facts = run_facts(__file__, argv)
    from toy_envs import KeywordEnv

    llm_zoo.register(TRIVIAL_ID, KeywordEnv, override=True)
    actions = record_oracle_actions(list(range(args.episodes)))
    child_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    results: dict[str, Any] = {
        **facts,
        "quick": args.quick,
        "episodes": args.episodes,
        "clients_per_server": args.clients_per_server,
        "overhead_steps": args.overhead_steps,
    }
    results["in_process"] = in_process(actions)
    print(f"in-process: {results['in_process']['steps_per_s']:.1f} steps/s")
    results["servers"] = {}
    for count in args.servers:
        with ExitStack() as stack:
            urls = [
                stack.enter_context(ServerProcess("--plugin", "bench_trivial_env", env=child_env))
                for _ in range(count)
            ]
            # Untimed: one episode per client slot starts each server's sandbox workers, as the
            # in-process side's were started by recording the answers.
            first = next(iter(actions.items()))
            on_servers(urls, [first] * (len(urls) * args.clients_per_server), args.clients_per_server)
            measured = on_servers(urls, list(actions.items()), args.clients_per_server)
            if count == args.servers[0]:
                results["protocol"] = protocol_overhead(urls[0], args.overhead_steps)
        measured["ratio_to_in_process"] = measured["steps_per_s"] / results["in_process"]["steps_per_s"]
        results["servers"][str(count)] = measured
        print(
            f"{count} server(s): {measured['steps_per_s']:.1f} steps/s ({measured['ratio_to_in_process']:.2f}x in-process)"
        )
    protocol = results["protocol"]
    print(
        f"protocol: {protocol['served_ms_per_step']:.3f} ms/step served vs {protocol['in_process_ms_per_step']:.3f} "
        f"in-process: {protocol['overhead_ms_per_step']:.3f} ms overhead per step"
    )
    finish(results, args.output, lambda png: plot(results, png))
    return 0


def plot(results: dict[str, Any], png: Path) -> None:
    """Code-v0 live steps per second, in-process and on each number of servers."""
    labels = ["in-process"] + [f"{n} server{'s' if n != '1' else ''}" for n in results["servers"]]
    rates = [results["in_process"]["steps_per_s"]]
    rates += [entry["steps_per_s"] for entry in results["servers"].values()]
    title = f"Code-v0 steps per second: {results['episodes']} episodes, {results['clients_per_server']} per server at a time"
    bar_chart(png, title, labels, {"steps/s": rates}, "live env steps/s")


if __name__ == "__main__":
    sys.exit(main())
