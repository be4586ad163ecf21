"""Reproduce the AT-GRPO paper's Plan-Path and Sokoban rows with Qwen3-1.7B and per-role adapters.

The paper (arXiv 2510.11062) reports, for Qwen3-1.7B with one policy per role, success rates of
Plan-Path 11% -> 97% and Sokoban 3% -> 11.5% (before -> after AT-GRPO). This script trains each
row with its config from ``examples/`` (one LoRA adapter per role; the paper trains full
weights), then reads the run's ``metrics.jsonl`` and writes, next to the other benchmarks,
``benchmarks/results/reproduce_paper.{json,png}``: hardware, wall time, settings, and the success
rate before and after training with 95% confidence intervals, beside the paper's figures.

    python benchmarks/reproduce_paper.py                     # full configs: hours on one GPU
    python benchmarks/reproduce_paper.py --short             # 10 steps, 64 eval episodes per row
    python benchmarks/reproduce_paper.py --rows plan_path --set rollout.engine=vllm
    python benchmarks/reproduce_paper.py --launcher "accelerate launch --num_processes 2"
    python benchmarks/reproduce_paper.py --smoke --output-dir /tmp/paper  # CPU check of the script

``--smoke`` swaps in SmolLM2-135M and tiny sizes, so the script itself can be checked on a CPU in
a few minutes (``nox -s bench`` does); its figures mean nothing. Each row runs as
``LAUNCHER -m llm_zoo_train CONFIG --training.output_dir DIR [--section.field VALUE ...]``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import REPO, RESULTS_DIR, finish, run_facts

ROWS: dict[str, dict[str, Any]] = {
    "plan_path": {
        "config": "examples/plan_path_qwen3_1.7b_per_agent.yaml",
        "paper": {"before": 0.11, "after": 0.97},
    },
    "sokoban": {
        "config": "examples/sokoban_qwen3_1.7b_per_agent.yaml",
        "paper": {"before": 0.03, "after": 0.115},
    },
}
SHORT = {"training.max_steps": 10, "eval.num_episodes": 64, "eval.eval_steps": 5, "training.save_steps": 0}
SMOKE = {
    "model.name_or_path": "smollm2-135m-instruct",
    "model.dtype": "float32",
    "training.max_steps": 1,
    "training.mixed_precision": "no",
    "training.gradient_checkpointing": False,
    "training.per_device_train_batch_size": 2,
    "training.save_steps": 0,
    "rollout.engine": "hf",
    "rollout.num_generations": 2,
    "rollout.envs_per_step": 1,
    "rollout.max_completion_length": 8,
    "eval.num_episodes": 2,
    "eval.eval_steps": 0,
    "eval.max_completion_length": 8,
    "lora.r": 8,
    "lora.lora_alpha": 16,
    "logging.progress_bar": False,
}


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"reproduce_paper.py: --set takes section.field=VALUE, got {pair!r}")
        overrides[key] = value
    return overrides


def hardware() -> dict[str, Any]:
    """GPU names and memory from nvidia-smi when present (the CPU facts are in the common facts)."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {"gpus": []}
    return {"gpus": [line.strip() for line in done.stdout.splitlines() if line.strip()]}


def evaluations(metrics_path: Path) -> list[dict[str, Any]]:
    """The run's evaluation records (step, success rate, CI, episodes), oldest first."""
    records = []
    for line in metrics_path.read_text().splitlines():
        record = json.loads(line)
        if "eval/success_rate" in record:
            records.append({
                "step": record["step"],
                "success_rate": record["eval/success_rate"],
                "ci_low": record.get("eval/success_ci_low"),
                "ci_high": record.get("eval/success_ci_high"),
                "episodes": record.get("eval/num_episodes"),
            })  # fmt: skip
    return records


def run_row(name: str, launcher: list[str], overrides: dict[str, Any], output_dir: Path) -> dict[str, Any]:
    row = ROWS[name]
    run_dir = output_dir / "runs" / name
    command = [
        *launcher,
        "-m",
        "llm_zoo_train",
        str(REPO / row["config"]),
        "--training.output_dir",
        str(run_dir),
        # A rerun of the benchmark replaces its own earlier row.
        "--training.overwrite_output_dir",
        "true",
    ]
    for key, value in overrides.items():
        command += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    print("$ " + shlex.join(command), flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO)
    seconds = time.perf_counter() - start
    result: dict[str, Any] = {
        "config": row["config"],
        "overrides": overrides,
        "command": shlex.join(command),
        "paper": row["paper"],
        "wall_seconds": round(seconds, 1),
        "exit_code": done.returncode,
    }
    metrics = run_dir / "metrics.jsonl"
    if done.returncode != 0 or not metrics.exists():
        result["error"] = f"training exited with code {done.returncode}; see the output above"
        return result
    evals = evaluations(metrics)
    result["evaluations"] = evals
    result["before"] = next((e for e in evals if e["step"] == 0), None)
    result["after"] = evals[-1] if evals and evals[-1]["step"] > 0 else None
    return result


def plot(results: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for index, (name, row) in enumerate(results["rows"].items()):
        colour = f"C{index}"
        evals = row.get("evaluations") or []
        if evals:
            steps = [e["step"] for e in evals]
            axes.plot(
                steps,
                [100 * e["success_rate"] for e in evals],
                marker="o",
                color=colour,
                label=f"{name} (ours)",
            )
            if all(e["ci_low"] is not None for e in evals):
                axes.fill_between(steps, [100 * e["ci_low"] for e in evals], [100 * e["ci_high"] for e in evals],
                                  color=colour, alpha=0.15)  # fmt: skip
        axes.axhline(100 * row["paper"]["after"], color=colour, linestyle="--", linewidth=1,
                     label=f"{name}: paper after training")  # fmt: skip
    axes.set_xlabel("training step")
    axes.set_ylabel("success rate (%) with 95% CI")
    axes.set_ylim(0, 100)
    axes.set_title(f"AT-GRPO, per-role adapters ({results['mode']})")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(png, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="plan_path,sokoban", help=f"comma-separated, from {sorted(ROWS)}")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--short", action="store_true", help=f"a first look: {SHORT}")
    mode.add_argument(
        "--smoke", action="store_true", help="CPU check of the script with SmolLM2 and tiny sizes"
    )
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="config override for every row (repeatable; applied last)")  # fmt: skip
    parser.add_argument("--launcher", default=f"{shlex.quote(sys.executable)}",
                        help="how to start training, e.g. 'accelerate launch' (default: this python)")  # fmt: skip
    parser.add_argument(
        "--output-dir", type=Path, default=RESULTS_DIR, help="where the JSON, PNG and runs go"
    )
    args = parser.parse_args(argv)

    names = [n.strip() for n in args.rows.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROWS]
    if unknown or not names:
        parser.error(f"unknown row(s) {unknown}; choose from {sorted(ROWS)}")
    overrides: dict[str, Any] = dict(SHORT if args.short else SMOKE if args.smoke else {})
    overrides.update(parse_overrides(args.set))
    launcher = shlex.split(args.launcher)

    results: dict[str, Any] = {
        "benchmark": "reproduce_paper",
        **run_facts(__file__, argv),
        "mode": "short" if args.short else "smoke" if args.smoke else "full",
        "hardware": hardware(),
        "rows": {},
    }
    for name in names:
        results["rows"][name] = run_row(name, launcher, overrides, args.output_dir)
    for name, row in results["rows"].items():
        before, after = row.get("before"), row.get("after")
        ours = (
            f"{100 * before['success_rate']:.1f}% -> {100 * after['success_rate']:.1f}%"
            if before and after
            else row.get("error", "no evaluation recorded")
        )
        print(f"{name}: ours {ours} in {row['wall_seconds']} s; paper "
              f"{100 * row['paper']['before']:.1f}% -> {100 * row['paper']['after']:.1f}%")  # fmt: skip
    finish(results, args.output_dir / "reproduce_paper.json", lambda png: plot(results, png))
    return 0 if all(r["exit_code"] == 0 for r in results["rows"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
