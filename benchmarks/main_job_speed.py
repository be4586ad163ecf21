"""The README's main job at an earlier commit against this checkout, side by side in one run.

Issue 29 asks for the main job (``examples/math_smollm2_cpu.yaml``, what ``nox -s demo`` runs) to
be at least 1.5x faster than before its levers, at the same figures. This script runs the job twice
*at the same time*: once with the source tree of ``--before`` (default ``cb3ad02``, main when the
issue was filed; extracted with ``git archive``) and once with this checkout's ``src``, each as
``python -m llm_zoo_train CONFIG`` in its own process with ``OMP_NUM_THREADS=--threads`` (one core
each on a 2-core machine, so both see the same machine). Both get the same config file, except:

* keys the older code does not know are dropped from both sides' file (``--drop``; default
  ``eval.distinct_problems``: both draw their evaluation episodes the same way, the older way);
* ``--after-override`` options go to this checkout's side only (default
  ``--rollout.team_credit_teammate sampled``: the teammate of the look-ahead answers as it did
  before; the greedy default came with issue 25, an algorithm change, not a speed lever).

From each run's ``metrics.jsonl``: the seconds of every training step (and its generation and
update), and the greedy success before and after training; from the process, its wall time
(model loading, both evaluations and the steps). Written to ``OUTPUT_DIR/main_job_speed.json`` and
``.png``; RESULTS.md when OUTPUT_DIR is ``benchmarks/results``.

    python benchmarks/main_job_speed.py                      # the published run (~40 min, 2 cores)
    python benchmarks/main_job_speed.py --quick --output-dir /tmp/bench   # smoke: tiny model, HEAD
    python benchmarks/main_job_speed.py --seed 1 --output-dir /tmp/seed1  # another seed, both sides
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from _common import REPO, RESULTS_DIR, bar_chart, finish, quick_overrides, run_facts

DEFAULT_CONFIG = "examples/math_smollm2_cpu.yaml"
SIDES = ("before", "after")


def source_tree(revision: str, workdir: Path) -> Path:
    """``revision``'s ``src`` directory, extracted into ``workdir`` (the checkout is left as it is)."""
    target = workdir / f"src-{revision}"
    target.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", revision, "src"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target / "src"


def config_without(path: Path, dropped: Sequence[str], target: Path) -> Path:
    """A copy of the YAML config at ``path`` without the dotted keys ``dropped``."""
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    for key in dropped:
        section, _, field = key.rpartition(".")
        holder = config.get(section, {}) if section else config
        holder.pop(field, None)
    target.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return target


def launch(source: Path, config: Path, output_dir: Path, overrides: Sequence[str], threads: int, log: Path):
    """Start the job on ``source``'s packages; returns (process, start time, log file)."""
    env = {**os.environ, "PYTHONPATH": str(source), "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    imported = subprocess.run(
        [sys.executable, "-c", "import llm_zoo, llm_zoo_train; print(llm_zoo.__file__); print(llm_zoo_train.__file__)"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    if not all(Path(path).resolve().is_relative_to(source.resolve()) for path in imported):
        raise SystemExit(
            f"PYTHONPATH={source} does not take precedence over the installed packages: {imported}"
        )
    command = [sys.executable, "-m", "llm_zoo_train", str(config), "--training.output_dir", str(output_dir)]
    handle = log.open("w", encoding="utf-8")
    process = subprocess.Popen(
        [*command, *overrides], cwd=str(REPO), env=env, stdout=handle, stderr=subprocess.STDOUT
    )
    return process, time.perf_counter(), handle


def read_run(output_dir: Path) -> dict[str, Any]:
    """Step times and evaluations from a finished run's ``metrics.jsonl``."""
    records = [
        json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    steps = [r for r in records if "time/step" in r]
    evals = [r for r in records if "eval/success_rate" in r]

    def evaluation(record: dict[str, Any] | None) -> dict[str, Any] | None:
        if record is None:
            return None
        keys = ("eval/success_rate", "eval/success_ci_low", "eval/success_ci_high", "eval/num_episodes")
        return {key.removeprefix("eval/"): record.get(key) for key in keys} | {"step": record.get("step")}

    return {
        "step_seconds": [r["time/step"] for r in steps],
        "generation_seconds": [r.get("time/generation") for r in steps],
        "update_seconds": [r.get("time/update") for r in steps],
        "trained_samples": [
            {k.split("/")[1]: v for k, v in r.items() if k.startswith("update/") and k.endswith("/samples")}
            for r in steps
        ],
        "before": evaluation(evals[0] if evals and evals[0].get("step", 0) == 0 else None),
        "after": evaluation(evals[-1] if evals and evals[-1].get("step", 0) > 0 else None),
    }


def measure(args: argparse.Namespace, workdir: Path, quick_options: list[str]) -> dict[str, Any]:
    config = config_without(REPO / args.config, args.drop, workdir / "config.yaml")
    sources = {"before": source_tree(args.before, workdir), "after": REPO / "src"}
    seed = [] if args.seed is None else ["--training.seed", str(args.seed)]
    overrides = {"before": [*quick_options, *seed], "after": [*quick_options, *seed, *args.after_override]}
    running = {}
    for side in SIDES:
        log = workdir / f"{side}.log"
        running[side] = (
            *launch(sources[side], config, workdir / side, overrides[side], args.threads, log),
            log,
        )
    ended: dict[str, tuple[int, float]] = {}
    while len(ended) < len(SIDES):  # each side's own end time, whichever ends first
        for side in SIDES:
            code = running[side][0].poll()
            if side not in ended and code is not None:
                ended[side] = (code, time.perf_counter() - running[side][1])
        time.sleep(1.0)
    sides: dict[str, Any] = {}
    for side in SIDES:
        _, _, handle, log = running[side]
        handle.close()
        code, wall = ended[side]
        if code != 0:
            tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
            raise SystemExit(f"the {side} side's job failed (exit {code}); the end of its output:\n{tail}")
        sides[side] = {"wall_seconds": wall, "overrides": overrides[side], **read_run(workdir / side)}
        print(f"{side}: {wall:.0f} s, median step {statistics.median(sides[side]['step_seconds']):.1f} s")
    before, after = sides["before"], sides["after"]
    return {
        "config": args.config,
        "dropped_keys": list(args.drop),
        "before_revision": args.before,
        "after_revision": "this checkout",
        "threads_per_side": args.threads,
        "after_only": list(args.after_override),
        "seed": args.seed,
        "sides": sides,
        "speedup_wall": before["wall_seconds"] / after["wall_seconds"],
        "speedup_steps": sum(before["step_seconds"]) / sum(after["step_seconds"]),
        "speedup_generation": sum(before["generation_seconds"]) / sum(after["generation_seconds"]),
        "speedup_update": sum(before["update_seconds"]) / max(sum(after["update_seconds"]), 1e-9),
    }


def plot(result: dict[str, Any], png: Path) -> None:
    sides = result["sides"]
    phases = {
        "generation (all steps)": [sum(sides[s]["generation_seconds"]) / 60 for s in SIDES],
        "update (all steps)": [sum(sides[s]["update_seconds"]) / 60 for s in SIDES],
        "whole job": [sides[s]["wall_seconds"] / 60 for s in SIDES],
    }
    labels = list(phases)
    series = {
        f"{side} ({result['before_revision'] if side == 'before' else 'now'})": [phases[p][i] for p in labels]
        for i, side in enumerate(SIDES)
    }
    bar_chart(
        png,
        f"Main job, side by side: {result['speedup_wall']:.2f}x faster as a whole",
        labels,
        series,
        "minutes",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="cb3ad02", help="the earlier commit (any git revision)")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="config file, relative to the repository")
    parser.add_argument("--drop", nargs="*", default=["eval.distinct_problems"], help="dotted keys dropped")
    parser.add_argument(
        "--after-override",
        nargs="*",
        default=["--rollout.team_credit_teammate", "sampled"],
        help="config overrides for this checkout's side only",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each side")
    parser.add_argument(
        "--seed", type=int, default=None, help="training.seed of both sides (default: the config's)"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny model, 1 step, --before HEAD")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    facts = run_facts(__file__, argv)
    with tempfile.TemporaryDirectory(prefix="main_job_speed-") as tmp:
        workdir = Path(tmp)
        quick_options = []
        if args.quick:
            args.before = "HEAD"
            quick_options = quick_overrides(workdir)
        result = {**facts, "quick": args.quick, **measure(args, workdir, quick_options)}
    print(
        f"before / after: whole job {result['speedup_wall']:.2f}x, training steps {result['speedup_steps']:.2f}x "
        f"(generation {result['speedup_generation']:.2f}x, update {result['speedup_update']:.2f}x)"
    )
    finish(result, args.output_dir / "main_job_speed.json", lambda png: plot(result, png))


if __name__ == "__main__":
    main()
