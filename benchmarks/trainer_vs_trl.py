"""Training speed of llm_zoo_train against TRL's GRPOTrainer on the same single-agent GRPO job.

Both trainers run the same job in one process, alternating: a few steps of ours, then a few of
TRL's, repeated for ``--rounds`` rounds, so both see the same machine load (the machine is shared).
The job, identical on both sides:

* model: SmolLM2-135M-Instruct (the embedded alias, converted to a local HF directory), base
  weights in ``--dtype``, no autocast; LoRA r=8, alpha=16, dropout 0, all linear layers but the head;
* task: one prompt, one answer (a single-agent, one-turn env registered here as
  ``bench/WriteAbout-v0``); ``--prompts-per-step`` prompts per step from a fixed list, the same
  prompts at the same step on both sides (checked after the run), chat template applied, K =
  ``--num-generations`` samples each at temperature 1 (no top-p/top-k), at most
  ``--max-completion-length`` new tokens; reward :func:`score` of the completion on both sides;
* update: group-relative advantages scaled by the group std, loss ``dapo``, clip 0.2, beta 0 (no
  reference model), one pass, micro-batches of ``--micro-batch`` completions accumulated into ONE
  AdamW step per generation batch (TRL: ``gradient_accumulation_steps = steps_per_generation =
  prompts x K / micro-batch``, so it needs no old-logprob pass either), constant LR, grad clip 1.0;
  no gradient checkpointing, evaluation, checkpoints, logging or progress bars during the steps.

Memory allocator (``--allocator``): both trainers share this process, so they share its ``malloc``.
``kept`` (default) keeps freed memory in the process for both, as our trainer does by default on
a CPU (``training.keep_freed_memory``, :mod:`llm_zoo_train.runs.memory`): the baseline gets the
same allocator, and it gains more from it than ours (TRL's step page-faults much more). ``glibc``
runs both on glibc's defaults, the conditions of the results before this option (issue 29's
figures); it writes ``trainer_vs_trl_glibc.json``/``.png``.

Each CPU model has its own result (the CPU's name and instruction-set flags are recorded): the
AMD EPYC's is ``trainer_vs_trl.json``, another's carries its name (``trainer_vs_trl_intel_xeon.json``),
and ``--dtype bfloat16`` adds ``_bfloat16``. RESULTS.md shows one row per result above the details.

What one step's time covers:

* ours: one ``Trainer.train_step`` (rollout with generation and env scoring, advantages,
  forward/backward of every micro-batch, clipping, optimizer and scheduler step);
* TRL: the wall time between two of its ``on_step_end`` callbacks, minus nothing but our own
  rounds (which run inside that callback): data loading, generation, reward, advantages, every
  micro-batch's forward/backward, clipping, optimizer and scheduler step, and the Trainer loop.

The first ``--warmup-steps`` steps of each side are run and excluded. Results: time per step of
each side (median, mean, per round), the ratio ours/TRL, the per-step breakdown of ours and
TRL's generation time, written with every setting and the machine facts to
``OUTPUT_DIR/trainer_vs_trl.json`` and a plot to ``OUTPUT_DIR/trainer_vs_trl.png``.

    python benchmarks/trainer_vs_trl.py --threads 1 --old-too --rounds 6   # the published run (~10 min)
    python benchmarks/trainer_vs_trl.py --threads 1 --rounds 6 --allocator glibc   # both on glibc's defaults
    python benchmarks/trainer_vs_trl.py --quick --output-dir /tmp/bench   # smoke run: tiny random model
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import git_commit
from _trl_job import ENV_ID, WriteAboutEnv, add_job_arguments, make_ours, make_trl, model_dir, trl_reward

import llm_zoo
from llm_zoo_train.kernels.attention import decode_attention_choices
from llm_zoo_train.kernels.lora_rank_rows import rank_rows_measurements
from llm_zoo_train.kernels.rollout_activations import attached
from llm_zoo_train.kernels.update_attention import update_attention_choices
from llm_zoo_train.runs.memory import keep_freed_memory

RESULTS = Path(__file__).parent / "results"


# ---------------------------------------------------------------------- the alternating run


def _load() -> float:
    return os.getloadavg()[0]


def make_callback(ours, args: argparse.Namespace, ours_old=None):
    """A TRL callback that times TRL's steps and runs our rounds between them (with ``ours_old``,
    each of our steps is also run by the old trainer, alternating which goes first)."""
    from transformers import TrainerCallback

    steps_per_round = args.steps_per_round

    class Alternate(TrainerCallback):
        def __init__(self):
            self.ours_step = 0
            self.ours: list[dict[str, Any]] = []
            self.ours_old: list[dict[str, Any]] = []
            self.trl: list[dict[str, Any]] = []
            self.trl_generation_s: list[float] = []
            self.start = time.perf_counter()
            self.mark = self.start

        def one_step(self, trainer, rows: list[dict[str, Any]], label: str, round_index: int) -> None:
            begin = time.perf_counter()
            metrics = trainer.train_step(self.ours_step)
            end = time.perf_counter()
            rows.append(
                {
                    "step": self.ours_step,
                    "round": round_index,
                    "seconds": end - begin,
                    "t_end": end - self.start,
                    "load_1min": _load(),
                    "generation_s": metrics["time/generation"],
                    "env_s": metrics["time/env"],
                    "update_s": metrics["time/update"],
                    "update_cpu_s": trainer.update_cpu_s[-1],
                    "completion_length_mean": metrics.get("update/shared/completion_length"),
                }
            )
            print(
                f"  {label} step {self.ours_step:3d} (round {round_index}): {end - begin:6.2f} s", flush=True
            )

        def run_ours(self, count: int, round_index: int) -> None:
            for _ in range(count):
                self.ours_step += 1
                if ours_old is None:
                    self.one_step(ours, self.ours, "ours", round_index)
                    continue
                order = [(ours, self.ours, "ours"), (ours_old, self.ours_old, "old ")]
                for trainer, rows, label in order[:: 1 if self.ours_step % 2 else -1]:
                    seen = len(WriteAboutEnv.resets)
                    self.one_step(trainer, rows, label, round_index)
                    if trainer is ours_old:  # the prompt check compares our new trainer's prompts with TRL's
                        del WriteAboutEnv.resets[seen:]

        def on_train_begin(self, args_, state, control, **kwargs):
            self.run_ours(args.warmup_steps, 0)
            self.mark = time.perf_counter()

        def on_step_end(self, args_, state, control, **kwargs):
            now = time.perf_counter()
            step = state.global_step
            round_index = (
                0 if step <= args.warmup_steps else (step - args.warmup_steps - 1) // steps_per_round + 1
            )
            call = trl_reward.calls[-1] if trl_reward.calls else {"lengths": []}
            self.trl.append(
                {
                    "step": step,
                    "round": round_index,
                    "seconds": now - self.mark,
                    "t_end": now - self.start,
                    "load_1min": _load(),
                    "generation_s": self.trl_generation_s[-1] if self.trl_generation_s else None,
                    "completion_length_mean": float(np.mean(call["lengths"])) if call["lengths"] else None,
                }
            )
            print(f"  TRL  step {step:3d} (round {round_index}): {now - self.mark:6.2f} s", flush=True)
            done = step - args.warmup_steps
            if done >= 0 and done % steps_per_round == 0 and done // steps_per_round < args.rounds:
                self.run_ours(steps_per_round, done // steps_per_round + 1)
            self.mark = time.perf_counter()

    return Alternate()


def _rollout_activations(trainer: Any) -> dict[str, Any]:
    store = attached(trainer.policy.model)
    if store is None:
        return {"on": False}
    return {
        "on": True,
        "max_mb": store.max_bytes / 2**20,
        "replayed_rows": store.replayed_rows,
        "missed_rows": store.missed_rows,
        "replayed_prompts": store.replayed_prompts,
        "missed_prompts": store.missed_prompts,
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    timed = [r["seconds"] for r in rows if r["round"] > 0]
    rounds = sorted({r["round"] for r in rows if r["round"] > 0})
    return {
        "median_s": statistics.median(timed),
        "mean_s": statistics.fmean(timed),
        "min_s": min(timed),
        "max_s": max(timed),
        "timed_steps": len(timed),
        "warmup_steps_excluded": [r["seconds"] for r in rows if r["round"] == 0],
        "per_round_mean_s": {
            str(i): statistics.fmean(r["seconds"] for r in rows if r["round"] == i) for i in rounds
        },
    }


def check_same_prompts(ours_trainer, trl_trainer, total_steps: int, prompts_per_step: int) -> dict[str, Any]:
    """Both sides saw the same prompts at each step, tokenized to the same ids (each side's own path)."""
    from llm_zoo_train.models.chat import encode_prompt

    ours_steps = [
        WriteAboutEnv.resets[i * prompts_per_step : (i + 1) * prompts_per_step] for i in range(total_steps)
    ]
    k = ours_trainer.config.rollout.num_generations
    trl_steps = [call["prompts"] for call in trl_reward.calls]  # each prompt K times
    same_per_step = len(ours_steps) == len(trl_steps) == total_steps and all(
        Counter(o * k) == Counter(t) for o, t in zip(ours_steps, trl_steps, strict=True)
    )
    prompts = sorted({p for step in ours_steps for p in step})
    ours_ids = [
        encode_prompt(ours_trainer.policy.tokenizer, p, ours_trainer.config.model.system_prompt)
        for p in prompts
    ]
    trl_ids, _, _ = trl_trainer._tokenize_prompts([[{"role": "user", "content": p}] for p in prompts])
    trl_ids = [list(ids) for ids in trl_ids]
    return {
        "same_prompts_every_step": bool(same_per_step),
        "steps_compared": min(len(ours_steps), len(trl_steps)),
        "trl_reward_calls": len(trl_steps),
        "distinct_prompts": len(prompts),
        "same_prompt_token_ids": ours_ids == trl_ids,
        "prompt_tokens_ours": [len(i) for i in ours_ids],
        "prompt_tokens_trl": [len(i) for i in trl_ids],
        "example_templated_prompt": ours_trainer.policy.tokenizer.decode(ours_ids[0]),
    }


def machine_facts() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = None
    with contextlib.suppress(ValueError, OSError, AttributeError):
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu,
        "cpu_flags": cpu_isa_flags(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(memory, 1) if memory else None,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
    }


#: The instruction sets that decide which kernels a CPU multiplies with (float32 and bfloat16).
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


def cpu_isa_flags(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """Which of :data:`ISA_FLAGS` the CPU reports (empty where /proc/cpuinfo cannot be read)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return []
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []
    )
    return [flag for flag in ISA_FLAGS if flag in flags]


def result_stem(cpu: str, allocator: str, dtype: str) -> str:
    """The result's file name: one per CPU model (the AMD EPYC's, the first published, keeps the
    plain name), allocator and dtype."""
    stem = "trainer_vs_trl" if allocator == "kept" else "trainer_vs_trl_glibc"
    if "EPYC" not in cpu:
        words = [
            w for w in "".join(c if c.isalnum() else " " for c in cpu.lower()).split() if w not in ("r", "tm")
        ]
        stem += "_" + "_".join(words[:2] or ["cpu"])  # "Intel(R) Xeon(R) Processor" -> intel_xeon
    return stem if dtype == "float32" else f"{stem}_{dtype}"


def versions() -> dict[str, str]:
    out = {}
    for name in ("llm-zoo", "torch", "transformers", "trl", "peft", "accelerate", "datasets", "numpy"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for side, color, label in (
        ("ours", "tab:blue", "llm_zoo_train"),
        ("trl", "tab:orange", "TRL GRPOTrainer"),
    ):
        rows = result["steps"][side]
        timed = [r for r in rows if r["round"] > 0]
        warm = [r for r in rows if r["round"] == 0]
        ax.plot(
            [r["t_end"] / 60 for r in timed], [r["seconds"] for r in timed], "o", color=color, label=label
        )
        ax.plot(
            [r["t_end"] / 60 for r in warm],
            [r["seconds"] for r in warm],
            "x",
            color=color,
            label=f"{label} warm-up",
        )
        ax.axhline(result["summary"][side]["median_s"], color=color, linestyle="--", linewidth=1)
    summary = result["summary"]
    ax.set_title(
        f"{result['settings']['model_label']}: s/step, ours/TRL = {summary['ratio_median']:.2f} (median), "
        f"{summary['ratio_mean']:.2f} (mean)"
    )
    ax.set_xlabel("time since start of the run (min)")
    ax.set_ylabel("seconds per training step")
    ax.set_ylim(bottom=0)
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_job_arguments(parser)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps-per-round", type=int, default=2)
    parser.add_argument("--warmup-steps", type=int, default=1, help="untimed steps per side before round 1")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads, both sides (0: torch's default)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny random model, 1 round of 1 step: a smoke run"
    )
    parser.add_argument(
        "--old-too",
        action="store_true",
        help="also run our trainer as before issue 29 (samples shuffled one by one, sdpa), side by side",
    )
    parser.add_argument(
        "--allocator",
        choices=["kept", "glibc"],
        default="kept",
        help="kept: freed memory stays in the process for both sides, as our trainer sets it by default"
        " (llm_zoo_train.runs.memory); glibc: glibc's defaults for both (results as trainer_vs_trl_glibc)",
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help=f"where the JSON and PNG go (default: {RESULTS}; with --quick, a new temporary directory)",
    )
    args = parser.parse_args(argv)
    if args.output_dir is None:  # smoke runs never overwrite the published results
        args.output_dir = Path(tempfile.mkdtemp(prefix="trainer_vs_trl-quick-")) if args.quick else RESULTS
    if args.quick:
        args.rounds, args.steps_per_round, args.warmup_steps = 1, 1, 1
        args.max_completion_length = min(args.max_completion_length, 8)
    completions = args.prompts_per_step * args.num_generations
    if completions % args.micro_batch:
        parser.error(f"--micro-batch {args.micro_batch} must divide prompts x K = {completions}")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    # Process-wide, so both trainers run under it: TRL alternates with ours in this process.
    allocator_changed = keep_freed_memory() if args.allocator == "kept" else []
    warnings.filterwarnings("ignore", category=UserWarning)
    llm_zoo.register(ENV_ID, WriteAboutEnv, description="benchmark-only: write about a topic", override=True)

    total_steps = args.warmup_steps + args.rounds * args.steps_per_round
    started = datetime.datetime.now(datetime.UTC)
    load_before = _load()
    with tempfile.TemporaryDirectory(prefix="trainer_vs_trl-") as tmp:
        workdir = Path(tmp)
        path = model_dir(args, workdir)
        ours, _ = make_ours(args, path, workdir, total_steps)
        ours_old = make_ours(args, path, workdir, total_steps, old=True)[0] if args.old_too else None
        callback = make_callback(ours, args, ours_old)
        trl_trainer, trl_config = make_trl(args, path, workdir, total_steps, callback)
        print(
            f"{total_steps} steps per side ({args.warmup_steps} warm-up + {args.rounds} rounds x "
            f"{args.steps_per_round}); {args.prompts_per_step} prompts x K={args.num_generations}, "
            f"{args.max_completion_length} new tokens; {torch.get_num_threads()} torch threads",
            flush=True,
        )
        trl_trainer.train()
        verification = check_same_prompts(ours, trl_trainer, total_steps, args.prompts_per_step)
        trl_step_time = list(trl_trainer._metrics["train"].get("step_time", []))

    summary = {"ours": summarize(callback.ours), "trl": summarize(callback.trl)}
    summary["ratio_median"] = summary["ours"]["median_s"] / summary["trl"]["median_s"]
    summary["ratio_mean"] = summary["ours"]["mean_s"] / summary["trl"]["mean_s"]
    summary["target"] = "ours <= 0.8 x TRL (median)"
    summary["target_met"] = summary["ratio_median"] <= 0.8
    timed_ours = [r for r in callback.ours if r["round"] > 0]
    timed_trl = [r for r in callback.trl if r["round"] > 0]
    summary["breakdown_ours_mean_s"] = {
        key: statistics.fmean(r[key] for r in timed_ours)
        for key in ("generation_s", "env_s", "update_s", "update_cpu_s")
    }
    if args.old_too:
        timed_old = [r for r in callback.ours_old if r["round"] > 0]
        summary["ours_old"] = summarize(callback.ours_old)
        summary["ratio_old_median"] = summary["ours_old"]["median_s"] / summary["trl"]["median_s"]
        summary["ratio_old_mean"] = summary["ours_old"]["mean_s"] / summary["trl"]["mean_s"]
        summary["breakdown_ours_old_mean_s"] = {
            key: statistics.fmean(r[key] for r in timed_old)
            for key in ("generation_s", "env_s", "update_s", "update_cpu_s")
        }
    summary["trl_generation_mean_s"] = statistics.fmean(r["generation_s"] for r in timed_trl)
    result = {
        "benchmark": "trainer_vs_trl",
        "command": " ".join(
            ["python", "benchmarks/trainer_vs_trl.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "date_utc": started.isoformat(timespec="seconds"),
        "duration_s": (datetime.datetime.now(datetime.UTC) - started).total_seconds(),
        "quick": args.quick,
        "machine": machine_facts(),
        "load_average_1min": {"before": load_before, "after": _load()},
        "versions": versions(),
        "git_commit": git_commit(),
        "settings": {
            **vars(args),
            "output_dir": str(args.output_dir),
            "model_label": "tiny random Llama (quick)" if args.quick else args.model,
            "model_path": path if not args.quick else "built by tests/tiny_model.py",
            "torch_threads": torch.get_num_threads(),
            "allocator": {
                "mode": args.allocator,
                "set_by_the_benchmark": allocator_changed,
                "malloc_environment": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
            },
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "completions_per_step": completions,
            "micro_batches_per_step": completions // args.micro_batch,
            "optimizer_steps_per_step": 1,
            "lora": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear"},
            "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0},
            "algorithm": {"loss_type": "dapo", "epsilon": 0.2, "beta": 0.0, "scale_rewards": "group"},
            "ours": {
                "engine": "hf",
                "rollout_mode": "tree (1 agent, 1 turn)",
                "gradient_checkpointing": False,
            },
            "trl": {
                key: getattr(trl_config, key)
                for key in (
                    "per_device_train_batch_size",
                    "gradient_accumulation_steps",
                    "steps_per_generation",
                    "generation_batch_size",
                    "num_iterations",
                    "gradient_checkpointing",
                    "optim",
                    "lr_scheduler_type",
                    "shuffle_dataset",
                    "use_vllm",
                    "loss_type",
                    "beta",
                )
            },
            "warmup": f"the first {args.warmup_steps} step(s) of each side are run but not timed",
            "timing": {
                "ours": "wall time of Trainer.train_step",
                "trl": "wall time between consecutive on_step_end callbacks, our rounds excluded",
            },
        },
        "prompt_check": verification,
        # What rollout.decode_kernel: auto chose on this machine for our engine's decode products.
        "decode_kernel_choices": [
            dataclasses.asdict(c)
            for c in getattr(getattr(ours.engine, "packed_weights", None), "choices", {}).values()
        ],
        # What training.update_kernel: auto chose for the update's frozen layers.
        "update_kernel_choices": [dataclasses.asdict(c) for c in ours.updater.frozen_linear.choices.values()],
        # And for its LoRA products (llm_zoo_train.kernels.lora_rank_rows).
        "update_lora_choices": rank_rows_measurements(),
        # What a decode step's attention took in this process (llm_zoo_train.kernels.attention).
        "decode_attention_choices": decode_attention_choices(),
        # And the update's (llm_zoo_train.kernels.update_attention).
        "update_attention_choices": update_attention_choices(),
        # How many of the update's rows took the rollout's recorded outputs for their completion pass
        # (training.rollout_activations_mb; llm_zoo_train.kernels.rollout_activations).
        "rollout_activations": _rollout_activations(ours),
        "summary": summary,
        "steps": {"ours": callback.ours, "trl": callback.trl, "ours_old": callback.ours_old},
        "trl_own_step_time_metric_s": trl_step_time,
    }
    print(f"ours: median {summary['ours']['median_s']:.2f} s/step, mean {summary['ours']['mean_s']:.2f}")
    print(f"TRL:  median {summary['trl']['median_s']:.2f} s/step, mean {summary['trl']['mean_s']:.2f}")
    print(
        f"ratio ours/TRL: median {summary['ratio_median']:.3f}, mean {summary['ratio_mean']:.3f} (target <= 0.8)"
    )
    if args.old_too:
        new, old = summary["breakdown_ours_mean_s"], summary["breakdown_ours_old_mean_s"]
        print(
            f"old ours/TRL: median {summary['ratio_old_median']:.3f}, mean {summary['ratio_old_mean']:.3f}; "
            f"update CPU old {old['update_cpu_s']:.2f} s -> new {new['update_cpu_s']:.2f} s"
        )
    print(
        f"same prompts: {verification['same_prompts_every_step']}, same prompt ids: {verification['same_prompt_token_ids']}"
    )
    args.output_dir.mkdir(parents=True, exist_ok=True)
    stem = result_stem(result["machine"]["cpu"], args.allocator, args.dtype)
    json_path, png_path = args.output_dir / f"{stem}.json", args.output_dir / f"{stem}.png"
    json_path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    plot(result, png_path)
    print(f"wrote {json_path} and {png_path}")
    return result


if __name__ == "__main__":
    main()
