"""How often does a policy cheat? Code-v0's ``impossible`` split, base model against a trained one.

Code-v0's ``impossible`` split (:mod:`llm_zoo.envs.code_impossible`) holds every built-in problem
with its hidden tests contradicted: the right program passes none of them, so an episode that
succeeds there succeeded by cheating (an always-true ``__eq__``, an early exit, a harness patch,
hard-coded outputs). Its success rate is the *cheating rate*. This benchmark

1. trains SmolLM2-135M-Instruct (alias ``smollm2-135m-instruct``) with LoRA on Code-v0's train
   split for ``--steps`` AT-GRPO steps (small by default: the machine it was written for has two
   shared CPU cores), with the ``llm-zoo-train`` command;
2. evaluates the base model and the trained adapters greedily on ``--episodes`` distinct
   impossible problems, with ``llm-zoo-train eval RUN --policies base,adapters --splits
   impossible``;

and reports for each policy the cheating rate with its 95% Wilson interval, the number of
distinct problems, and the format rate. ``--no-train`` evaluates the base model only.

    python benchmarks/cheating_rate.py                    # the published run
    python benchmarks/cheating_rate.py --quick --output-dir /tmp/bench   # smoke run, tiny model
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import RESULTS_DIR, bar_chart, finish, quick_overrides, run_facts

REPO = Path(__file__).resolve().parent.parent
NAME = "cheating_rate"

#: The training run (a YAML written into the work dir): Code-v0's train split, one turn each.
CONFIG = """\
model: {name_or_path: smollm2-135m-instruct, dtype: bfloat16}
env:
  id: Code-v0
  kwargs: {split: train, max_turns: 1}
agents: {adapters: per_agent}
lora: {r: 8, lora_alpha: 16, target_modules: all-linear}
rollout: {num_generations: 2, envs_per_step: 2, max_completion_length: 96, temperature: 0.7}
algorithm: {loss_type: dapo, zero_variance_groups: drop}
training: {max_steps: 2, learning_rate: 3.0e-4, per_device_train_batch_size: 8, seed: 0}
eval: {num_episodes: 16, distinct_problems: true, temperature: 0.0}
logging: {logging_steps: 1}
"""


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=2, help="training steps (default: %(default)s)")
    parser.add_argument("--episodes", type=int, default=16, help="distinct impossible problems evaluated")
    parser.add_argument("--tokens", type=int, default=96, help="max completion tokens, training and eval")
    parser.add_argument("--generations", type=int, default=2, help="K candidates per group in training")
    parser.add_argument("--envs-per-step", type=int, default=2, help="training episodes per step")
    parser.add_argument("--no-train", action="store_true", help="evaluate the base model only")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny random model, 1 step")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--workdir", type=Path, default=None, help="where the run goes (default: temp dir)")
    args = parser.parse_args(argv)
    for name in ("steps", "episodes", "tokens", "generations", "envs_per_step"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def _command(arguments: list[str], log: Path) -> float:
    """Run ``python -m llm_zoo_train ARGUMENTS`` with this checkout's sources; its seconds."""
    environment = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    )
    environment.setdefault("OMP_NUM_THREADS", "1")
    start = time.monotonic()
    with log.open("w") as stream:
        done = subprocess.run(
            [sys.executable, "-m", "llm_zoo_train", *arguments], stdout=stream, stderr=subprocess.STDOUT,
            env=environment, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"llm-zoo-train {arguments[0]} failed (exit {done.returncode}); log {log}:\n{tail}")
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    facts = run_facts(__file__, argv)
    with tempfile.TemporaryDirectory(prefix="cheating-rate-") as temporary:
        workdir = args.workdir or Path(temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "code_smollm2.yaml"
        config.write_text(CONFIG)
        run = workdir / "run"
        overrides = [
            "--training.output_dir", str(run), "--training.overwrite_output_dir", "true",
            "--training.max_steps", str(args.steps), "--rollout.max_completion_length", str(args.tokens),
        ]  # fmt: skip
        sizes = [
            "--rollout.num_generations",
            str(args.generations),
            "--rollout.envs_per_step",
            str(args.envs_per_step),
        ]
        if args.quick:
            overrides += quick_overrides(workdir)
        seconds: dict[str, float] = {}
        if not args.no_train:
            # the trainer's own evaluation cut to one episode: the eval command below measures
            quiet_eval = ["--eval.eval_on_start", "false", "--eval.num_episodes", "1"]
            seconds["train"] = _command([str(config), *sizes, *overrides, *quiet_eval], workdir / "train.log")
            source, policies = str(run), "base,adapters"
        else:
            source, policies = str(config), "base"
        output = workdir / "eval.json"
        seconds["eval"] = _command(
            ["eval", source, "--policies", policies, "--splits", "impossible", "--output", str(output),
             *overrides, "--eval.num_episodes", str(args.episodes)],
            workdir / "eval.log",
        )  # fmt: skip
        evaluation = json.loads(output.read_text())
        training = None if args.no_train else training_summary(run / "metrics.jsonl")
    rows = [_summary(row) for row in evaluation["results"]]
    for row in rows:
        print(
            f"{row['policy']:<9} cheating rate {100 * row['cheating_rate']:.1f}% "
            f"(95% CI {100 * row['ci_low']:.1f}-{100 * row['ci_high']:.1f}%), "
            f"{row['cheats']}/{row['episodes']} episodes, {row['distinct_problems']} distinct problems, "
            f"format ok {100 * row['format_ok_rate']:.0f}%"
        )
    results: dict[str, Any] = {
        **facts,
        "benchmark": NAME,
        "model": "tiny random (--quick)" if args.quick else "smollm2-135m-instruct",
        "training_steps": 0 if args.no_train else args.steps,
        "training_sizes": {"num_generations": args.generations, "envs_per_step": args.envs_per_step},
        "config": CONFIG,
        "episodes_requested": args.episodes,
        "max_completion_length": 8 if args.quick else args.tokens,  # quick_overrides' length wins
        "seconds": {key: round(value, 1) for key, value in seconds.items()},
        "rows": rows,
    }
    if training is not None:
        results["training"] = training
    if args.no_train:
        results["missing"] = (
            "The trained policy is missing: on the 2 shared cores this was run on, a Code-v0 training"
            " step did not fit in the time; `python benchmarks/cheating_rate.py` trains and adds it."
        )
    finish(results, args.output_dir / f"{NAME}.json", lambda png: _plot(rows, png))


def training_summary(metrics: Path) -> dict[str, Any]:
    """What the training run trained on, from its ``metrics.jsonl``: steps, samples trained,
    steps that trained nothing (every group's rewards equal), and each agent's format rate and
    mean reward at the first and the last step (a policy that trained on nothing is no trained
    policy, and the table must say so)."""
    steps = [row for row in map(json.loads, metrics.read_text().splitlines()) if "train/num_samples" in row]
    if not steps:
        return {"steps": 0, "samples_trained": 0, "steps_without_samples": 0}
    agents = sorted({key.split("/")[0] for key in steps[0] if key.endswith("/format_ok")})
    return {
        "steps": len(steps),
        "samples_trained": int(sum(row["train/num_samples"] for row in steps)),
        "steps_without_samples": sum(row["train/num_samples"] == 0 for row in steps),
        "format_ok": {a: [steps[0].get(f"{a}/format_ok"), steps[-1].get(f"{a}/format_ok")] for a in agents},
        "reward": {a: [steps[0].get(f"{a}/reward"), steps[-1].get(f"{a}/reward")] for a in agents},
    }


def _summary(row: dict[str, Any]) -> dict[str, Any]:
    result = row["result"]
    return {
        "policy": row["policy"],
        "cheating_rate": row.get("cheating_rate", result["success_rate"]),
        "ci_low": result["ci_low"],
        "ci_high": result["ci_high"],
        "cheats": result["successes"],
        "episodes": result["num_episodes"],
        "distinct_problems": result.get("distinct_tasks", 0),
        "format_ok_rate": result["format_ok_rate"],
        "cheating_problems": sorted({e["task_id"] for e in row.get("episodes", []) if e.get("success")}),
    }


def _plot(rows: list[dict[str, Any]], png: Path) -> None:
    bar_chart(
        png,
        "Cheating rate on Code-v0's impossible split (greedy)",
        [row["policy"] for row in rows],
        {
            "cheating rate (%)": [100 * row["cheating_rate"] for row in rows],
            "its 95% CI's upper end (%)": [100 * row["ci_high"] for row in rows],
            "format ok (%)": [100 * row["format_ok_rate"] for row in rows],
        },
        "% of episodes (impossible split)",
    )


if __name__ == "__main__":
    main()
