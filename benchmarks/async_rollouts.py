"""Asynchronous rollouts against synchronous ones: step time and learning, side by side on 2 cores.

The same job in each mode, interleaved (sync, async, sync_2cores, sync, ... to cancel the drift of a
shared machine's load): ``examples/math_smollm2_cpu.yaml`` (SmolLM2-135M-Instruct, Math-v0, both
agents trained) for ``--steps`` steps.

* ``sync`` (``rollout.async_steps 0``): the trainer, pinned to ``--trainer-core`` with one torch
  thread, rolls out and updates in turn.
* ``async`` (``rollout.async_steps 1``): the trainer, pinned to the same core with one thread,
  updates while its generation process, pinned to ``--worker-core`` with one thread, generates
  the next step's rollout (one step off-policy, importance sampling on). The trainer plays
  ``--trainer-envs`` of each step's 8 tasks itself before its update
  (``rollout.async_trainer_envs``), so that neither process waits long for the other.
* ``sync_2cores`` (reference, not part of the target): the synchronous trainer on both cores with
  two torch threads: what the same two cores give without a generation process.

Printed and written to ``OUTPUT_DIR/async_rollouts.json``: each run's step times, the ratio of the
mean step time async / sync over the steady steps (all but the first and the last: the first async
step overlaps nothing and plays two rollouts' shares, the last has no next rollout to generate)
and over all steps, async / sync_2cores, and the greedy success on the 64 held-out
test problems after the last step of the first sync and async runs (95% Wilson intervals; a run is
determined by its seed, so the repeats only re-measure time). Target: steady-state async / sync
<= 0.65 with learning no worse (the async interval reaches the sync one, or better).

    python benchmarks/async_rollouts.py                                  # the published run
    python benchmarks/async_rollouts.py --quick --output-dir /tmp/bench  # smoke run, tiny model
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from _common import (
    RESULTS_DIR,
    add_workdir_argument,
    bar_chart,
    finish,
    parse_with_overrides,
    quick_overrides,
    run_facts,
)

from llm_zoo_train.config import load_config
from llm_zoo_train.trainer import Trainer

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "examples" / "math_smollm2_cpu.yaml"
NAME = "async_rollouts"
TARGET_RATIO = 0.65
MODES = {"sync": ["--rollout.async_steps", "0"], "async": ["--rollout.async_steps", "1"], "sync_2cores": []}
#: The modes whose step times the target compares.
TARGET_MODES = ("sync", "async")


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny random model, 2 steps")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--steps", type=int, default=5, help="training steps of every run (>= 3)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each mode, interleaved")
    parser.add_argument("--trainer-core", type=int, default=1, help="the core of the trainer process")
    parser.add_argument("--worker-core", type=int, default=0, help="the core of the generation process")
    parser.add_argument(
        "--trainer-envs",
        type=int,
        default=None,
        help="async: tasks per step the trainer plays itself (default 2 of 8; 1 of 2 with --quick)",
    )
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated modes to run, of {', '.join(MODES)} (sync and async are required)",
    )
    add_workdir_argument(parser)
    parser.epilog = "Any other --section.field VALUE is a config override."
    args, overrides = parse_with_overrides(parser, argv)
    cores = sorted(os.sched_getaffinity(0))
    for option in ("trainer_core", "worker_core"):
        if getattr(args, option) not in cores:
            parser.error(
                f"--{option.replace('_', '-')} {getattr(args, option)}: choose one of the cores {cores}"
            )
    if args.trainer_core == args.worker_core:
        parser.error("--trainer-core and --worker-core must differ: the point is that they do not compete")
    if args.trainer_envs is None:
        args.trainer_envs = 1 if args.quick else 2
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.modes if m not in MODES]
    if unknown or not set(TARGET_MODES) <= set(args.modes):
        parser.error(f"--modes {','.join(args.modes)}: choose from {', '.join(MODES)}, with sync and async")
    if args.steps < 3 or args.repeats < 1:
        parser.error("--steps must be >= 3 (the first and the last step are not steady) and --repeats >= 1")
    return args, list(overrides)


def run(
    mode: str, repeat: int, args: argparse.Namespace, overrides: list[str], workdir: Path
) -> dict[str, Any]:
    """Train one run of ``mode``; evaluate it when it is the mode's first."""
    evaluate = repeat == 0 and mode in TARGET_MODES
    both = mode == "sync_2cores"
    os.sched_setaffinity(0, {args.trainer_core, args.worker_core} if both else {args.trainer_core})
    torch.set_num_threads(2 if both else 1)
    config = load_config(
        CONFIG,
        [
            *overrides,
            *MODES[mode],
            "--rollout.async_worker_threads", "1",
            "--rollout.async_worker_cores", f"[{args.worker_core}]",
            "--rollout.async_trainer_envs", str(args.trainer_envs if mode == "async" else 0),
            "--training.output_dir", str(workdir / f"{mode}-{repeat}"),
            "--training.overwrite_output_dir", "true",
            "--training.max_steps", str(args.steps),
            "--training.save_steps", "0",
            "--eval.eval_on_start", "false",
            *([] if evaluate else ["--eval.num_episodes", "0"]),
            "--logging.progress_bar", "false",
            "--logging.plot", "false",
        ],
    )  # fmt: skip
    trainer = Trainer(config)
    start = time.perf_counter()
    result = trainer.train()
    wall = time.perf_counter() - start
    steps = [r for r in trainer.history if r["step"] > 0 and "time/step" in r]
    after = result.get("after")
    return {
        "mode": mode,
        "repeat": repeat,
        "wall_seconds": wall,
        "step_seconds": [r["time/step"] for r in steps],
        "generation_seconds": [r["time/generation"] for r in steps],
        "update_seconds": [r["time/update"] for r in steps],
        "rollout_wait_seconds": [r.get("time/rollout_wait") for r in steps],
        "trainer_rollout_seconds": [r.get("time/trainer_rollout") for r in steps],
        "staleness": [r.get("rollout/staleness", 0.0) for r in steps],
        "train_success": [r.get("train/success_rate") for r in steps],
        "eval": None
        if after is None
        else {
            "success_rate": after["eval/success_rate"],
            "ci_low": after["eval/success_ci_low"],
            "ci_high": after["eval/success_ci_high"],
            "num_episodes": int(after["eval/num_episodes"]),
            "successes": round(after["eval/success_rate"] * after["eval/num_episodes"]),
        },
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean step times per mode (all steps; the steady ones), their ratios, the verdict."""

    def mean_step(mode: str, steady: bool) -> float:
        return statistics.mean(
            t
            for r in runs
            if r["mode"] == mode
            for t in (r["step_seconds"][1:-1] if steady else r["step_seconds"])
        )

    modes = [m for m in MODES if any(r["mode"] == m for r in runs)]
    ratio_all = mean_step("async", False) / mean_step("sync", False)
    ratio_steady = mean_step("async", True) / mean_step("sync", True)
    two_cores = mean_step("async", True) / mean_step("sync_2cores", True) if "sync_2cores" in modes else None
    evals = {r["mode"]: r["eval"] for r in runs if r["eval"] is not None}
    sync_eval, async_eval = evals.get("sync"), evals.get("async")
    learning_ok = bool(
        sync_eval
        and async_eval
        and (
            async_eval["success_rate"] >= sync_eval["success_rate"]
            or async_eval["ci_high"] >= sync_eval["ci_low"]
        )
    )
    return {
        "mean_step_seconds": {m: {"all": mean_step(m, False), "steady": mean_step(m, True)} for m in modes},
        "ratio_all_steps": ratio_all,
        "ratio_steady_steps": ratio_steady,
        "ratio_async_to_sync_2cores": two_cores,
        "eval": evals,
        "verdict": {
            "ratio_met": ratio_steady <= TARGET_RATIO,
            "learning_no_worse": learning_ok,
            "met": ratio_steady <= TARGET_RATIO and learning_ok,
        },
    }


def describe(eval_result: dict[str, Any] | None) -> str:
    if not eval_result:
        return "-"
    return (
        f"{100 * eval_result['success_rate']:.1f}% ({100 * eval_result['ci_low']:.1f}-"
        f"{100 * eval_result['ci_high']:.1f}, {eval_result['successes']}/{eval_result['num_episodes']})"
    )


def main(argv: Sequence[str] | None = None) -> None:
    args, overrides = parse_args(argv)
    facts = run_facts(__file__, argv)
    with tempfile.TemporaryDirectory(prefix="async-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        if args.quick:
            overrides = [*quick_overrides(workdir), *overrides]
        runs = []
        for repeat in range(args.repeats):
            for mode in args.modes:
                runs.append(run(mode, repeat, args, overrides, workdir))
                last = runs[-1]
                print(
                    f"{mode} #{repeat + 1}: steps {[round(t, 1) for t in last['step_seconds']]} s; "
                    f"success after {args.steps} steps {describe(last['eval'])}",
                    flush=True,
                )
    summary = summarize(runs)
    steps = summary["mean_step_seconds"]
    print(
        f"mean step: sync {steps['sync']['all']:.1f} s, async {steps['async']['all']:.1f} s "
        f"(steady steps: sync {steps['sync']['steady']:.1f} s, async {steps['async']['steady']:.1f} s)"
    )
    print(
        f"async / sync step time: {summary['ratio_steady_steps']:.2f} over the steady steps, "
        f"{summary['ratio_all_steps']:.2f} over all steps (target <= {TARGET_RATIO})"
    )
    if summary["ratio_async_to_sync_2cores"] is not None:
        print(
            f"reference: sync on both cores (2 threads) {steps['sync_2cores']['steady']:.1f} s a steady step;"
            f" async / sync_2cores = {summary['ratio_async_to_sync_2cores']:.2f}"
        )
    print(
        f"greedy success after {args.steps} steps: sync {describe(summary['eval'].get('sync'))}, "
        f"async {describe(summary['eval'].get('async'))}; target {'met' if summary['verdict']['met'] else 'not met'}"
    )
    results = {
        **facts,
        "quick": args.quick,
        "settings": {
            "config_file": str(CONFIG.relative_to(REPO)),
            "overrides": overrides if not args.quick else ["(tiny model)"],
            "steps": args.steps,
            "repeats": args.repeats,
            "trainer_core": args.trainer_core,
            "worker_core": args.worker_core,
            "threads": 1,
            "trainer_envs": args.trainer_envs,
            "modes": args.modes,
            "target_ratio": TARGET_RATIO,
        },
        "runs": runs,
        **summary,
    }
    output_dir = (
        args.output_dir if not args.quick or args.output_dir != RESULTS_DIR else Path(tempfile.mkdtemp())
    )
    finish(results, output_dir / f"{NAME}.json", lambda png: plot(runs, png))


def plot(runs: list[dict[str, Any]], png: Path) -> None:
    """Each run's mean step time, over all steps and over the steady ones."""
    bar_chart(
        png,
        "Step time, sync vs async rollouts (trainer and generation on their own cores)",
        [f"{r['mode']} #{r['repeat'] + 1}" for r in runs],
        {
            "all steps": [statistics.mean(r["step_seconds"]) for r in runs],
            "steady steps": [statistics.mean(r["step_seconds"][1:-1]) for r in runs],
        },
        "mean seconds per training step",
    )


if __name__ == "__main__":
    main()
