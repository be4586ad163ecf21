"""Tests per second: llm_zoo's sandbox against the plain harness pattern, side by side.

The plain pattern is what public harnesses do: a fresh ``subprocess.run([python, file],
timeout=...)`` per test, one after the other. Ours is :meth:`llm_zoo.sandbox.Sandbox.run_many`
over the same tests (pre-started fork servers, one limited child per test, in parallel across the
CPUs), under the active isolation layer.

Workload: the built-in code problems (:func:`llm_zoo.data.code.load_builtin_problems`) with their
reference solutions, plus, for each problem, a wrong program (prints a count instead of the
answer) and a crashing one (exceptions of several kinds, a failed 1 TiB allocation), and for every
``--slow-every``-th problem a slow one (reads the input, then loops past the timeout). Call-based
problems form the ``call`` category: the reference through the call harness
(:mod:`llm_zoo.checkers.call_harness`), judged by return value. Each
category is timed on both sides, alternating, and the verdicts (passed / failed / timed out) of the
two sides are compared test by test. The overall ratio is total plain time / total sandbox time.

Tests per second per core (``sandbox_tests_per_s_per_core``: tests/s divided by the cores the
servers ran on, the lesser of ``--workers`` and this process's CPUs) is the figure to quote
beside other harnesses: what one core buys, whatever the machine. Quote it with the CPU model, the
load average (both in the JSON) and the ratio to a fresh process measured in the same run.

    python benchmarks/sandbox_speed.py            # full run, writes benchmarks/results/sandbox_speed.{json,png}
    python benchmarks/sandbox_speed.py --quick    # smoke run (a few problems, a couple of tests)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import bar_chart, finish, run_facts

from llm_zoo import sandbox
from llm_zoo.data.code import TestCase, load_builtin_problems
from llm_zoo.envs.code import outputs_match
from llm_zoo.envs.code_judge import CallJudge

RESULTS = Path(__file__).parent / "results" / "sandbox_speed.json"

WRONG = "import sys\nprint(len(sys.stdin.read().split()))\n"
CRASHES = (
    "import sys\ndata = sys.stdin.read().split()\nprint(data[10**6])\n",
    "import sys\nsys.stdin.read()\nprint(1 // 0)\n",
    "import sys\nsys.stdin.read()\nbuffer = bytearray(1 << 40)\n",
    "import not_a_module\n",
)
SLOW = "import sys\nsys.stdin.read()\nwhile True:\n    pass\n"


@dataclass
class Program:
    category: str
    problem: str
    code: str
    tests: list  # of llm_zoo.data.code.TestCase
    judge: Any = None  # a CallJudge for the call category; None: stdout compared


def build_workload(quick: bool, slow_every: int) -> list[Program]:
    problems = load_builtin_problems()
    if quick:
        problems = problems[:6] + [p for p in problems if p.call is not None][:3]
    programs = []
    for index, problem in enumerate(problems):
        tests = list(problem.tests[:2] if quick else problem.tests)
        if problem.call is not None:  # the harness program, the arguments in its input format
            judge = CallJudge(problem.call)
            harnessed = [TestCase(judge.stdin(t.input), t.output) for t in tests]
            programs.append(Program("call", problem.id, judge.program(problem.reference), harnessed, judge))
            continue
        programs.append(Program("reference", problem.id, problem.reference, tests))
        programs.append(Program("wrong", problem.id, WRONG, tests))
        programs.append(Program("crashing", problem.id, CRASHES[index % len(CRASHES)], tests))
        if index % slow_every == 0:
            programs.append(Program("slow", problem.id, SLOW, tests))
    return programs


def verdict(stdout: str, exit_code: int | None, timed_out: bool, expected: str, judge: Any = None) -> str:
    if timed_out:
        return "timeout"
    if judge is not None:
        run = sandbox.RunResult(stdout, "", exit_code, False, 0.0)
        return "pass" if judge.verdict(TestCase("", expected), run, 0.0)[0] else "fail"
    return "pass" if exit_code == 0 and outputs_match(expected, stdout) else "fail"


def run_plain(programs: list[Program], timeout: float, workdir: Path) -> list[str]:
    """A fresh interpreter per test, sequentially (the pattern public harnesses use)."""
    verdicts = []
    for number, program in enumerate(programs):
        path = workdir / f"program_{number}.py"
        path.write_text(program.code)
        for test in program.tests:
            try:
                done = subprocess.run(
                    [sys.executable, str(path)], input=test.input, capture_output=True, text=True,
                    timeout=timeout, cwd=workdir,
                )  # fmt: skip
                verdicts.append(verdict(done.stdout, done.returncode, False, test.output, program.judge))
            except subprocess.TimeoutExpired:
                verdicts.append("timeout")
    return verdicts


def run_sandboxed(box: sandbox.Sandbox, programs: list[Program], timeout: float, memory_mb: int) -> list[str]:
    jobs = [
        sandbox.Job(p.code, t.input, timeout=timeout, memory_mb=memory_mb) for p in programs for t in p.tests
    ]
    expected = [(t.output, p.judge) for p in programs for t in p.tests]
    results = box.run_many(jobs)
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"{len(errors)} sandbox failures, first: {errors[0]}")
    return [verdict(r.stdout, r.exit_code, r.timed_out, *e) for r, e in zip(results, expected, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 6 problems, 2 tests each")
    parser.add_argument("--layer", default=None, help="bubblewrap, rlimits or auto (default: auto)")
    parser.add_argument("--workers", type=int, default=None, help="sandbox servers (default: CPUs)")
    parser.add_argument("--timeout", type=float, default=1.0, help="seconds per test, both sides")
    parser.add_argument("--memory-mb", type=int, default=512, help="sandbox memory limit per test")
    parser.add_argument("--slow-every", type=int, default=10, help="a slow program every N problems")
    parser.add_argument("--output", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args()
    facts = run_facts(__file__)

    programs = build_workload(args.quick, args.slow_every)
    categories = sorted(
        {p.category for p in programs}, key=["reference", "call", "wrong", "crashing", "slow"].index
    )
    box = sandbox.Sandbox(args.layer, workers=args.workers)
    box.run_tests("print(1)", [""] * box.workers)  # servers started before timing, like in training
    cores = min(box.workers, len(os.sched_getaffinity(0)))
    load_at_start = os.getloadavg()[0]
    rows, mismatches = [], 0
    with tempfile.TemporaryDirectory(prefix="sandbox_speed_") as scratch:
        for category in categories:
            chosen = [p for p in programs if p.category == category]
            tests = sum(len(p.tests) for p in chosen)
            start = time.perf_counter()
            plain = run_plain(chosen, args.timeout, Path(scratch))
            plain_s = time.perf_counter() - start
            start = time.perf_counter()
            ours = run_sandboxed(box, chosen, args.timeout, args.memory_mb)
            ours_s = time.perf_counter() - start
            differing = sum(a != b for a, b in zip(plain, ours, strict=True))
            mismatches += differing
            rows.append({
                "category": category, "programs": len(chosen), "tests": tests,
                "plain_s": round(plain_s, 3), "sandbox_s": round(ours_s, 3),
                "plain_tests_per_s": round(tests / plain_s, 1), "sandbox_tests_per_s": round(tests / ours_s, 1),
                "sandbox_tests_per_s_per_core": round(tests / ours_s / cores, 1), "ratio": round(plain_s / ours_s, 2), "verdicts": {v: ours.count(v) for v in sorted(set(ours))},
                "verdict_mismatches": differing,
            })  # fmt: skip
    box.close()
    total_tests = sum(r["tests"] for r in rows)
    plain_total, ours_total = sum(r["plain_s"] for r in rows), sum(r["sandbox_s"] for r in rows)
    fast = [r for r in rows if r["category"] != "slow"]
    summary = {
        "tests": total_tests,
        "plain_tests_per_s": round(total_tests / plain_total, 1),
        "sandbox_tests_per_s": round(total_tests / ours_total, 1),
        "sandbox_tests_per_s_per_core": round(total_tests / ours_total / cores, 1),
        "sandbox_tests_per_s_per_core_without_timeouts": round(
            sum(r["tests"] for r in fast) / sum(r["sandbox_s"] for r in fast) / cores, 1
        ),
        "ratio": round(plain_total / ours_total, 2),
        "ratio_without_timeouts": round(
            sum(r["plain_s"] for r in fast) / sum(r["sandbox_s"] for r in fast), 2
        ),
        "verdict_mismatches": mismatches,
    }
    report = {
        "benchmark": "sandbox_speed",
        **facts,
        "quick": args.quick,
        "layer": box.layer,
        "isolation": sandbox.isolation_info(box.layer),
        "workers": box.workers,
        "cores": cores,
        "load_average": {"start": round(load_at_start, 2), "end": round(os.getloadavg()[0], 2)},
        "timeout_s": args.timeout,
        "categories": rows,
        "summary": summary,
    }
    print(
        f"layer {box.layer}, {box.workers} workers on {cores} cores, timeout {args.timeout} s, "
        f"load {load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    )
    print(
        f"{'category':<10} {'tests':>6} {'plain t/s':>10} {'sandbox t/s':>12} {'per core':>9} {'ratio':>7}  verdicts"
    )
    for r in rows:
        print(f"{r['category']:<10} {r['tests']:>6} {r['plain_tests_per_s']:>10} {r['sandbox_tests_per_s']:>12} "
              f"{r['sandbox_tests_per_s_per_core']:>9} {r['ratio']:>6}x  {r['verdicts']}")  # fmt: skip
    print(f"{'all':<10} {total_tests:>6} {summary['plain_tests_per_s']:>10} {summary['sandbox_tests_per_s']:>12} "
          f"{summary['sandbox_tests_per_s_per_core']:>9} {summary['ratio']:>6}x  (without the slow category: "
          f"{summary['ratio_without_timeouts']}x, {summary['sandbox_tests_per_s_per_core_without_timeouts']} "
          "tests/s per core)")  # fmt: skip
    print(f"verdicts differing between the two sides: {mismatches}")
    finish(report, args.output, lambda png: plot(report, png))


def plot(report: dict, png: Path) -> None:
    rows = [*report["categories"], {"category": "all", **report["summary"]}]
    bar_chart(
        png,
        f"Sandbox ({report['layer']}, {report['workers']} workers) vs a fresh process per test",
        [r["category"] for r in rows],
        {"ratio (tests/s ours / plain)": [r["ratio"] for r in rows]},
        "throughput ratio",
        target=5.0,
    )


if __name__ == "__main__":
    main()
