"""How long the reward-hack search takes per env, and how close a non-solving episode comes.

    python benchmarks/reward_hack_search.py              # every registered env (plugins included)
    python benchmarks/reward_hack_search.py --env Code-v0 --repeats 3

For each env it runs :func:`llm_zoo.testing.check_reward_hacks` - the search ``check_env`` and
``llm-zoo check ID`` run, on task seed 0 unless ``--seeds`` says otherwise - ``--repeats`` times
and reports the best wall time (the target: seconds per env), the episodes played, and per agent
and for the team the best return of an episode that did not succeed against the worst return of
one that did (the margin the invariant keeps). An env with a violation is reported with the worst
offending episode in words, not as an error. Results go to ``benchmarks/results/reward_hack_search.json``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from _common import RESULTS_DIR, bar_chart, finish, run_facts

import llm_zoo
from llm_zoo.reward_hacks import search_reward_hacks


def measure(env_id: str, seeds: tuple[int, ...], repeats: int) -> dict[str, Any]:
    """Best wall time of ``repeats`` searches of ``env_id`` and what the last one found."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        report = search_reward_hacks(lambda: llm_zoo.make(env_id), seeds=seeds)
        times.append(time.perf_counter() - start)
    return {
        "seconds": min(times),
        "all_seconds": times,
        "episodes": len(report.episodes),
        "violations": len(report.violations),
        "worst_violation": report.violations[0][1] if report.violations else None,
        "best_failing": report.best_failing,
        "worst_succeeding": report.worst_succeeding,
        "has_oracle": report.has_oracle,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", action="append", help="env id (repeatable); default: every registered env")
    parser.add_argument("--seeds", default="0", help="comma-separated task seeds of the search (default 0)")
    parser.add_argument("--repeats", type=int, default=2, help="searches per env; the best time counts")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    try:
        seeds = tuple(int(seed) for seed in args.seeds.split(",") if seed.strip())
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: give comma-separated integers, e.g. 0,1")
    env_ids = args.env or sorted(llm_zoo.registry)
    unknown = [env_id for env_id in env_ids if env_id not in llm_zoo.registry]
    if unknown:
        parser.error(f"unknown env ids {unknown}; registered: {sorted(llm_zoo.registry)}")
    results: dict[str, Any] = {**run_facts(__file__, argv), "seeds": list(seeds), "repeats": args.repeats}
    results["envs"] = {}
    for env_id in env_ids:
        entry = measure(env_id, seeds, args.repeats)
        results["envs"][env_id] = entry
        margins = ", ".join(
            f"{key} {entry['best_failing'][key]:+.2f} vs {entry['worst_succeeding'][key]:+.2f}"
            for key in entry["best_failing"]
        )
        print(f"{env_id}: {entry['seconds']:.2f} s, {entry['episodes']} episodes, "
              f"{entry['violations']} violations; best non-solving vs worst solving: {margins or '-'}", flush=True)  # fmt: skip
    finish(results, args.output_dir / "reward_hack_search.json", lambda png: plot(results, png))
    return results


def plot(results: dict[str, Any], png: Path) -> None:
    env_ids = list(results["envs"])
    bar_chart(png, "Reward-hack search, best wall time per env", env_ids,
              {"seconds": [results["envs"][e]["seconds"] for e in env_ids]}, "seconds")  # fmt: skip


if __name__ == "__main__":
    main()
