"""Torch threads on a CPU: the command line's own choice against one thread and against all cores.

Each job runs as ``llm-zoo-train CONFIG`` in a fresh process, under three settings:

* ``default``: no ``OMP_NUM_THREADS``; the command chooses (:mod:`llm_zoo_train.runs.threads`: the idle
  physical cores) and says what it chose;
* ``one``: ``OMP_NUM_THREADS=1``;
* ``all``: ``OMP_NUM_THREADS`` = every CPU the process may run on;

on a quiet machine and on a busy one (``--busy-procs`` processes that spin on a CPU each, started
here, as many by default as twice the CPUs: a load of about 2 per CPU). The settings run interleaved
(one, default, all, then the next repeat in another order) to cancel the drift of the machine.

Jobs: ``main`` is ``examples/math_smollm2_cpu.yaml`` (SmolLM2-135M, Math-v0; shorten it with config
overrides, e.g. ``--training.max_steps 2 --eval.num_episodes 16``); ``tiny`` is the tiny random test
model for one step (the ``--quick`` overrides of every benchmark).

Printed and written to ``OUTPUT_DIR/threads.json``: every run's wall seconds and chosen threads,
and for each job and machine state each setting's mean seconds over the best setting's. Target: the
default within 1.25x of the best in every case. Measure on a machine with nothing else running
(the busy case brings its own load).

    python benchmarks/threads.py                                   # the published run
    python benchmarks/threads.py --quick --output-dir /tmp/bench   # smoke run: tiny job, 1 repeat
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _common import (
    RESULTS_DIR,
    add_workdir_argument,
    bar_chart,
    finish,
    parse_with_overrides,
    quick_overrides,
    run_facts,
)

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "examples" / "math_smollm2_cpu.yaml"
NAME = "threads"
TARGET = 1.25
SETTINGS = ("one", "default", "all")
JOBS = ("main", "tiny")
STATES = ("quiet", "busy")
SPIN = "while True: pass"


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: the tiny job, 1 repeat, 1 busy process"
    )
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated subset of {list(JOBS)}")
    parser.add_argument(
        "--states", default=",".join(STATES), help=f"comma-separated subset of {list(STATES)}"
    )
    parser.add_argument("--repeats", type=int, default=2, help="runs of each setting, interleaved")
    parser.add_argument("--busy-procs", type=int, default=None, help="spinning processes (default 2 per CPU)")
    add_workdir_argument(parser)
    parser.epilog = "Any other --section.field VALUE is a config override of the main job."
    args, overrides = parse_with_overrides(parser, argv)
    for option, valid in (("jobs", JOBS), ("states", STATES)):
        chosen = [name for name in getattr(args, option).split(",") if name]
        unknown = [name for name in chosen if name not in valid]
        if unknown or not chosen:
            parser.error(f"--{option}: unknown or empty {unknown}; choose from {list(valid)}")
        setattr(args, option, chosen)
    if args.quick:
        args.jobs, args.repeats = ["tiny"], 1
        args.busy_procs = 1 if args.busy_procs is None else args.busy_procs
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args, list(overrides)


def cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextmanager
def busy(processes: int) -> Iterator[None]:
    """``processes`` spinning processes (none: a quiet machine) while the block runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(processes)]
    try:
        time.sleep(2.0 if spinners else 0.0)  # the spinners show in the CPU use the choice samples
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


def run_job(overrides: list[str], setting: str, output_dir: Path) -> dict[str, Any]:
    """One training run in a fresh process; its wall seconds and the threads it used."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if setting == "one":
        env["OMP_NUM_THREADS"] = "1"
    elif setting == "all":
        env["OMP_NUM_THREADS"] = str(cpus())
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "llm_zoo_train", str(CONFIG), *overrides]
    command += ["--training.output_dir", str(output_dir), "--logging.progress_bar", "false"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{setting} run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    chosen = re.search(r"^torch threads: (\d+) \((.*)\)$", done.stdout, re.MULTILINE)
    return {
        "seconds": round(seconds, 2),
        "threads": int(chosen.group(1)) if chosen else None,
        "why": chosen.group(2) if chosen else None,
        "load_average_after": round(os.getloadavg()[0], 2),
    }


def ratios(runs: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """Each setting's mean seconds over the best setting's."""
    means = {setting: statistics.mean(r["seconds"] for r in rs) for setting, rs in runs.items() if rs}
    best = min(means.values())
    return {setting: round(mean / best, 3) for setting, mean in means.items()}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args, overrides = parse_args(argv)
    facts = run_facts(__file__, argv)
    busy_procs = 2 * cpus() if args.busy_procs is None else args.busy_procs
    with tempfile.TemporaryDirectory(prefix="bench_threads_") as tmp:
        cases = measure(args, overrides, busy_procs, args.workdir or Path(tmp))
    print_table(cases)
    result = {
        **facts,
        "quick": args.quick,
        "overrides": overrides,
        "busy_procs": busy_procs,
        "repeats": args.repeats,
        "target": TARGET,
        "cases": cases,
    }

    def plot(png: Path) -> None:
        labels = [f"{c['job']} {c['state']}" for c in cases]
        series = {s: [c["ratio_to_best"][s] for c in cases] for s in SETTINGS}
        bar_chart(png, "torch threads: seconds over the best setting", labels, series, "ratio", target=TARGET)

    # A smoke run never replaces the published figures.
    output_dir = (
        args.output_dir if not args.quick or args.output_dir != RESULTS_DIR else Path(tempfile.mkdtemp())
    )
    finish(result, output_dir / f"{NAME}.json", plot)
    return result


def measure(
    args: argparse.Namespace, overrides: list[str], busy_procs: int, workdir: Path
) -> list[dict[str, Any]]:
    """Every job, machine state and setting, ``args.repeats`` times, interleaved."""
    jobs = {"main": overrides, "tiny": quick_overrides(workdir) if "tiny" in args.jobs else []}
    cases: list[dict[str, Any]] = []
    counter = itertools.count()
    for state in args.states:
        with busy(busy_procs if state == "busy" else 0):
            for job in args.jobs:
                runs: dict[str, list[dict[str, Any]]] = {setting: [] for setting in SETTINGS}
                for repeat in range(args.repeats):
                    order = SETTINGS[repeat % 3 :] + SETTINGS[: repeat % 3]
                    for setting in order:
                        run = run_job(jobs[job], setting, workdir / f"run{next(counter)}")
                        runs[setting].append(run)
                        print(f"{job:>4} {state:>5} {setting:>7}: {run['seconds']:8.1f} s, "
                              f"{run['threads']} threads ({run['why']})", flush=True)  # fmt: skip
                case = {"job": job, "state": state, "runs": runs, "ratio_to_best": ratios(runs)}
                case["default_within_target"] = case["ratio_to_best"]["default"] <= TARGET
                cases.append(case)
    return cases


def print_table(cases: list[dict[str, Any]]) -> None:
    print(f"\n{'job':>4} {'state':>5} | " + " | ".join(f"{s} / best" for s in SETTINGS) + " | target")
    for case in cases:
        cells = " | ".join(f"{case['ratio_to_best'][s]:>{len(s) + 7}.2f}" for s in SETTINGS)
        verdict = "met" if case["default_within_target"] else "MISSED"
        print(f"{case['job']:>4} {case['state']:>5} | {cells} | default <= {TARGET}: {verdict}")


if __name__ == "__main__":
    main()
