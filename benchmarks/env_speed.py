"""How fast the environments step, with random and with oracle actions, and how fast the sandbox runs.

    python benchmarks/env_speed.py                      # every registered env
    python benchmarks/env_speed.py --quick              # smoke run (about a second per measurement)
    python benchmarks/env_speed.py --env PlanPath-v0    # one env (repeat --env for more)

For each env it plays whole episodes for ``--seconds`` with

* **random** actions: printable noise of 0-200 characters (every answer is malformed, so this is
  the cost of the rules, the prompts and the bookkeeping; the sandbox never runs);
* **oracle** actions, where :data:`ORACLE_POLICIES` has a policy for the env: answers that solve
  the task (for PlanPath/Sokoban the tool agent's program prints the solution, so every tool step
  runs the sandbox once). Code-v0 is also measured per problem kind (``oracle_stdio``,
  ``oracle_call``: call-based problems run through the call harness).

Steps/s counts live ``env.step`` calls per second of time spent inside the env (``reset``,
``last``, ``step``); the policy's own thinking is excluded, and reported separately as wall time.
It also times the sandbox on a trivial program (one run at a time, and as a ``run_many`` batch where
the sandbox has one). Results are printed and written as JSON to
``benchmarks/results/env_speed.json`` (or ``--output``).

To benchmark a new env with oracle actions, add ``ORACLE_POLICIES[env_id] = factory`` where
``factory(env)`` returns ``policy(agent, prompt) -> action`` (it gets the env, so an oracle may read
the hidden answer of the current task).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _common import bar_chart, finish, run_facts

import llm_zoo
from llm_zoo import sandbox
from llm_zoo.sandbox import run_python

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the oracles are written for the tests

Policy = Callable[[str, str], str]
PolicyFactory = Callable[[Any], Policy]


def _oracle_policies() -> dict[str, PolicyFactory]:
    try:
        import oracles
    except ImportError as err:  # e.g. an installed package without the tests folder
        print(f"oracle policies unavailable ({err}); only random actions will run", file=sys.stderr)
        return {}
    from llm_zoo.envs.code import oracle_policy as code_oracle
    from llm_zoo.envs.math import oracle_policy as math_oracle

    return {
        "PlanPath-v0": lambda env: oracles.plan_path_policy(),
        "Sokoban-v0": lambda env: oracles.sokoban_policy(),
        "Code-v0": code_oracle,
        "Math-v0": math_oracle,
    }


ORACLE_POLICIES: dict[str, PolicyFactory] = _oracle_policies()


def random_policy(seed: int = 0) -> Policy:
    """Printable noise of 0-200 characters."""
    rng = np.random.default_rng(seed)
    alphabet = np.array(list("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?#[]()\n"))

    def policy(agent: str, prompt: str) -> str:
        return "".join(rng.choice(alphabet, size=int(rng.integers(0, 201))))

    return policy


def measure_env(
    env_id: str, factory: PolicyFactory, seconds: float, max_episodes: int, **env_kwargs: Any
) -> dict[str, Any]:
    """Play episodes with ``factory(env)`` until ``seconds`` of wall time or ``max_episodes`` pass."""
    env = llm_zoo.make(env_id, **env_kwargs)
    policy = factory(env)
    steps = episodes = successes = 0
    env_time = 0.0
    wall_start = time.perf_counter()
    while time.perf_counter() - wall_start < seconds and episodes < max_episodes:
        tick = time.perf_counter()
        env.reset(seed=episodes)
        env_time += time.perf_counter() - tick
        for agent in env.agent_iter():
            tick = time.perf_counter()
            observation, _, termination, truncation, _ = env.last()
            env_time += time.perf_counter() - tick
            action = None if termination or truncation else policy(agent, observation["prompt"])
            tick = time.perf_counter()
            env.step(action)
            env_time += time.perf_counter() - tick
            steps += action is not None
        episodes += 1
        successes += bool(getattr(env, "success", False))
    wall = time.perf_counter() - wall_start
    return {
        "episodes": episodes,
        "steps": steps,
        "env_seconds": round(env_time, 4),
        "wall_seconds": round(wall, 4),
        "steps_per_s": round(steps / env_time, 2) if env_time else None,
        "wall_steps_per_s": round(steps / wall, 2) if wall else None,
        "success_rate": round(successes / episodes, 4) if episodes else None,
    }


def measure_sandbox(runs: int) -> dict[str, Any]:
    """Runs of a trivial program: one after another, and as one batch where the sandbox offers
    ``run_many`` (parallel workers)."""
    start = time.perf_counter()
    ok = sum(run_python("print('ok')").ok for _ in range(runs))
    seconds = time.perf_counter() - start
    result: dict[str, Any] = {
        "runs": runs,
        "ok": ok,
        "seconds": round(seconds, 4),
        "runs_per_s": round(runs / seconds, 2),
    }
    if hasattr(sandbox, "run_many") and hasattr(sandbox, "Job"):
        try:
            start = time.perf_counter()
            batch = sandbox.run_many([sandbox.Job("print('ok')") for _ in range(runs)])
            seconds = time.perf_counter() - start
            result["batch"] = {
                "ok": sum(r.ok for r in batch),
                "seconds": round(seconds, 4),
                "runs_per_s": round(runs / seconds, 2),
            }
        except Exception as err:  # the batch API is optional; report, do not fail
            result["batch"] = {"error": f"{type(err).__name__}: {err}"}
    return result


def code_kinds() -> dict[str, dict[str, Any]]:
    """Code-v0 on one problem kind at a time (its default train split mixes both): env kwargs per
    row name, ``oracle_stdio`` (stdin/stdout programs) and ``oracle_call`` (call-based problems)."""
    from llm_zoo.data.code import load_builtin_problems

    train = load_builtin_problems("train")
    return {
        "oracle_stdio": {"dataset": [p for p in train if p.call is None], "split": "all"},
        "oracle_call": {"dataset": [p for p in train if p.call is not None], "split": "all"},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", action="append", help="env id (repeatable); default: every registered env")
    parser.add_argument("--quick", action="store_true", help="smoke run: short measurements")
    parser.add_argument("--seconds", type=float, help="wall seconds per measurement (default 10, quick 1)")
    parser.add_argument("--max-episodes", type=int, default=100_000, help="episodes per measurement at most")
    parser.add_argument("--sandbox-runs", type=int, help="sandbox runs (default 200, quick 10)")
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "env_speed.json")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else (1.0 if args.quick else 10.0)
    sandbox_runs = args.sandbox_runs if args.sandbox_runs is not None else (10 if args.quick else 200)
    env_ids = args.env or sorted(llm_zoo.registry)

    results: dict[str, Any] = {
        "benchmark": "env_speed",
        **run_facts(__file__, argv),
        "seconds_per_measurement": seconds,
        "envs": {},
    }
    print(f"{'env':<24} {'actions':<8} {'steps/s':>10} {'episodes':>9} {'success':>8}")
    for env_id in env_ids:
        entry: dict[str, Any] = {}
        try:
            entry["random"] = measure_env(env_id, lambda env: random_policy(), seconds, args.max_episodes)
            if env_id in ORACLE_POLICIES:
                entry["oracle"] = measure_env(env_id, ORACLE_POLICIES[env_id], seconds, args.max_episodes)
        except Exception as err:  # report the env as broken, measure the others
            entry["error"] = f"{type(err).__name__}: {err}"
            print(f"{env_id:<24} error: {entry['error']}")
        for kind in ("random", "oracle"):
            if kind in entry:
                row = entry[kind]
                print(
                    f"{env_id:<24} {kind:<8} {row['steps_per_s']:>10} {row['episodes']:>9} "
                    f"{row['success_rate']:>8}"
                )
        if env_id == "Code-v0" and "oracle" in entry:
            for kind, kwargs in code_kinds().items():
                row = entry[kind] = measure_env(
                    env_id, ORACLE_POLICIES[env_id], seconds, args.max_episodes, **kwargs
                )
                print(
                    f"{env_id:<24} {kind:<8} {row['steps_per_s']:>10} {row['episodes']:>9} {row['success_rate']:>8}"
                )
        results["envs"][env_id] = entry
    results["sandbox"] = measure_sandbox(sandbox_runs)
    print(f"sandbox: {results['sandbox']['runs_per_s']} runs/s (trivial program, one at a time)")
    if "runs_per_s" in results["sandbox"].get("batch", {}):
        print(
            f"sandbox: {results['sandbox']['batch']['runs_per_s']} runs/s (trivial program, run_many batch)"
        )

    finish(results, args.output, lambda png: plot(results, png))
    return results


def plot(results: dict[str, Any], png: Path) -> None:
    env_ids = [e for e, entry in results["envs"].items() if "random" in entry]
    series = {
        kind: [results["envs"][e].get(kind, {}).get("steps_per_s", 0.0) for e in env_ids]
        for kind in ("random", "oracle")
    }
    bar_chart(png, "Env steps per second (one process)", env_ids, series, "env steps/s", log=True)


if __name__ == "__main__":
    main()
