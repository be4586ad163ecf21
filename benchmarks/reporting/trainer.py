"""RESULTS.md sections of the trainer benchmarks: speed against TRL (per CPU model), memory
under ddp and fsdp2, the main job before and now, attention kernels and torch threads."""

from __future__ import annotations

import json
import statistics
from typing import Any

from reporting.format import RESULTS_DIR, created, markdown_table
from reporting.kernels import (
    decode_attention_line,
    decode_kernel_line,
    rollout_activations_line,
    update_attention_line,
    update_kernel_line,
)


def threads(result: dict[str, Any]) -> str:
    rows = [
        [case["job"], case["state"]]
        + [f"{case['ratio_to_best'][s]:.2f}" for s in ("one", "default", "all")]
        + [", ".join(str(r["threads"]) for r in case["runs"]["default"])]
        + ["met" if case["default_within_target"] else "**missed**"]
        for case in result["cases"]
    ]
    return (
        f"Each job in a fresh `llm-zoo-train` process, {result['repeats']} runs per setting, interleaved;"
        f" busy: {result['busy_procs']} spinning processes started by the benchmark. Mean seconds over the"
        " best setting's:\n\n"
        + markdown_table(
            [
                "job",
                "machine",
                "one / best",
                "default / best",
                "all / best",
                "default chose",
                f"default <= {result['target']}",
            ],
            rows,
        )
    )


def _allocator_line(settings: dict[str, Any]) -> str:
    allocator = settings.get("allocator")
    if not allocator:  # results from before the --allocator option ran on glibc's defaults
        return " Memory allocator: glibc's defaults for both sides."
    environment = ", ".join(f"{k}={v}" for k, v in allocator.get("malloc_environment", {}).items())
    if allocator["mode"] == "kept":
        text = (" Memory allocator: freed memory kept in the process for both sides (`--allocator kept`, what"
                " our trainer sets by default on a CPU: `llm_zoo_train.runs.memory`).")  # fmt: skip
    else:
        text = " Memory allocator: glibc's defaults for both sides (`--allocator glibc`)."
    return text + (f" Environment: {environment}." if environment else "")


def trainer_vs_trl_by_cpu(result: dict[str, Any]) -> str:
    """One row per CPU model (and dtype) of the results of trainer_vs_trl.py on kept memory, then
    the details of ``result`` (the AMD EPYC's, published first)."""
    rows = []
    for path in sorted(RESULTS_DIR.glob("trainer_vs_trl*.json")):
        if "_glibc" in path.stem:
            continue
        run = json.loads(path.read_text())
        machine, summary, settings = run.get("machine", {}), run["summary"], run["settings"]
        flags = machine.get("cpu_flags")
        rows.append([
            machine.get("cpu", "?"), ", ".join(flags) if flags else "not recorded", settings.get("dtype", "?"),
            settings.get("rounds", "?"), f"{summary['ours']['median_s']:.2f}", f"{summary['trl']['median_s']:.2f}",
            f"**{summary['ratio_median']:.3f}**", created(run) or "?", f"`{path.name}`",
        ])  # fmt: skip
    table = markdown_table(
        [
            "CPU",
            "flags",
            "dtype",
            "rounds",
            "ours s/step",
            "TRL s/step",
            "ours/TRL (median)",
            "date",
            "result",
        ],
        rows,
    )
    return (
        f"Per CPU model (issue 56's target: <= 0.45 on each, float32):\n\n{table}\n\nThe AMD EPYC's run:\n\n"
        + (trainer_vs_trl(result))
    )


def trainer_vs_trl(result: dict[str, Any]) -> str:
    summary, settings = result["summary"], result["settings"]
    rows = []
    for side, label in (("ours", "llm_zoo_train"), ("trl", f"TRL {result['versions'].get('trl', '')}")):
        timing = summary[side]
        rounds = ", ".join(f"{value:.1f}" for value in timing["per_round_mean_s"].values())
        rows.append([label, f"{timing['median_s']:.2f}", f"{timing['mean_s']:.2f}",
                     f"{timing['min_s']:.1f}-{timing['max_s']:.1f}", timing["timed_steps"], rounds])  # fmt: skip
    text = (
        f"The same single-agent GRPO job on both sides: {settings['model']} ({settings['dtype']}), LoRA r="
        f"{settings['lora']['r']} {settings['lora']['target_modules']}, {settings['prompts_per_step']} prompts x K="
        f"{settings['num_generations']}, {settings['max_completion_length']} new tokens, loss"
        f" {settings['algorithm']['loss_type']}, beta {settings['algorithm']['beta']}, micro-batches of"
        f" {settings['micro_batch']}, one optimizer step per generation batch, {settings['torch_threads']} torch"
        f" thread(s) each, {settings['rounds']} alternating rounds of {settings['steps_per_round']} steps"
        f" ({settings['warmup']}). Same prompts on both sides:"
        f" {result['prompt_check'].get('same_prompt_token_ids')} (token ids compared).{_allocator_line(settings)}{decode_kernel_line(result)}{update_kernel_line(result)}{decode_attention_line(result)}{update_attention_line(result)}{rollout_activations_line(result)}\n\n"
    )
    text += markdown_table(["trainer", "median s/step", "mean", "range", "steps", "round means"], rows)
    breakdown = summary.get("breakdown_ours_mean_s", {})
    text += (
        f"\n\n**ours / TRL = {summary['ratio_median']:.3f}** (median; mean {summary['ratio_mean']:.3f}; target"
        f" <= 0.8; issue 29's <= 0.45: {'met' if summary['ratio_median'] <= 0.45 else 'not met'}). Our step: generation {breakdown.get('generation_s', float('nan')):.1f} s, update"
        f" {breakdown.get('update_s', float('nan')):.1f} s, envs {breakdown.get('env_s', float('nan')):.3f} s;"
        f" TRL's generation {summary.get('trl_generation_mean_s', float('nan')):.1f} s."
    )
    if "ours_old" in summary:
        old = summary.get("breakdown_ours_old_mean_s", {})
        # runs that record the update's kernel also ran their old side without the two later levers
        old_levers = (
            ", `F.linear` for the update's frozen layers, adapters not merged into the engine's packed copies"
            if "update_kernel_choices" in result
            else ""
        )
        if "update_lora_choices" in result:  # training.update_kernel: exact also keeps peft's LoRA products
            old_levers += ", peft's LoRA products"
        text += (
            f"\n\nSide by side, our trainer as before issue 29 (`--old-too`: samples shuffled one by one"
            f" into micro-batches, sdpa attention{old_levers}): **{summary['ratio_old_median']:.3f}** (median; mean"
            f" {summary['ratio_old_mean']:.3f}); its update {old.get('update_s', float('nan')):.1f} s"
            f" ({old.get('update_cpu_s', float('nan')):.1f} s CPU) against"
            f" {breakdown.get('update_s', float('nan')):.1f} s ({breakdown.get('update_cpu_s', float('nan')):.1f}"
            " s CPU) now."
        )
    return text


def fsdp_memory(result: dict[str, Any]) -> str:
    """Peak resident memory per process under ddp and fsdp2, per phase of one training step."""
    model, processes, runs = result["model"], result["processes"], result["runs"]
    phases = ("load", "rollout", "update")
    rows = []
    for strategy, records in runs.items():
        cells = []
        for phase in phases:
            values = [r["peak_gib"][phase] for r in sorted(records, key=lambda r: r["rank"])]
            cells.append(" / ".join(f"{v:.2f}" for v in values))
        rows.append([strategy, *cells])
    base = model["float32_gib"]
    update = {s: max(r["peak_gib"]["update"] for r in records) for s, records in runs.items()}
    text = (
        f"A random Llama of {model['parameters'] / 1e9:.2f}B parameters ({base} GiB in float32; hidden"
        f" {model['hidden']}, {model['layers']} blocks) with one LoRA adapter per agent (r=8 on q/v), one step"
        f" of the toy job under `torchrun --nproc_per_node {processes}` on CPU + gloo, one thread per process."
        " Peak resident memory of each process (GiB, rank 0 / rank 1) in each phase, the peak reset between"
        " phases (`VmHWM`):\n\n"
    )
    text += markdown_table(["strategy", "load (+shard, optimizers)", "rollout (hf engine)", "update"], rows)
    if all("resident_at_end_gib" in r for records in runs.values() for r in records):
        split = []
        for strategy, records in runs.items():
            cells = [
                " / ".join(
                    f"{r['resident_at_end_gib'][phase]['anon']:.2f} + {r['resident_at_end_gib'][phase]['file']:.2f}"
                    for r in sorted(records, key=lambda r: r["rank"])
                )
                for phase in phases
            ]
            split.append([strategy, *cells])
        text += (
            "\n\nResident at each phase's end, the process's own pages + pages of mapped files (GiB, rank 0 /"
            " rank 1). ddp's weights stay memory-mapped from the model's files on a CPU, and processes that"
            " map one file share its pages: the machine holds one base for all of them.\n\n"
        )
        text += markdown_table(["strategy", "after load", "after rollout", "after update"], split)
    if all("seconds" in r for records in runs.values() for r in records):
        timing = [
            [
                strategy,
                *(
                    f"{max(r['seconds'][key] for r in records):.1f}"
                    for key in ("rollout", "generation", "update")
                ),
            ]
            for strategy, records in runs.items()
        ]
        text += (
            "\n\nSeconds (the slower process; one thread each, both processes on the machine's 2 cores). Under"
            " fsdp2 the rollout includes gathering the whole model at its start:\n\n"
        )
        text += markdown_table(["strategy", "rollout", "of which generation", "update"], timing)
    if "ddp" in update and "fsdp2" in update:
        text += (
            f"\n\n**Per process**, the update's peak was ddp {update['ddp']:.2f} GiB against fsdp2"
            f" {update['fsdp2']:.2f} GiB ({update['fsdp2'] / update['ddp']:.2f}x): under full sharding a process"
            f" keeps 1/N of the base ({base / processes:.2f} GiB here) plus one gathered block during its passes,"
            f" so the base's share falls as {base} GiB / N with the process count N, where ddp keeps {base} GiB in"
            " every process. The rollout's peak is higher under fsdp2: the transformers engine generates with the"
            " whole model gathered beside the slices (`llm_zoo_train.models.sharding`), and loading holds the"
            " whole base before it is sharded."
        )
        if all("resident_at_end_gib" in r for records in runs.values() for r in records):
            totals = {}
            for strategy, records in runs.items():
                ends = [r["resident_at_end_gib"]["update"] for r in records]
                # mapped file pages are shared by the processes: count them once
                totals[strategy] = sum(e["anon"] for e in ends) + max(e["file"] for e in ends)
            text += (
                f"\n\n**For the whole machine** it goes the other way on a CPU: ddp's processes share one"
                f" memory-mapped base, so after the update the machine held about {totals['ddp']:.1f} GiB under"
                f" ddp against {totals['fsdp2']:.1f} GiB under fsdp2, whose slices and freed gather buffers are"
                " each process's own. The saving fsdp2 is for is device memory on GPUs, where every ddp process"
                " holds its own copy of the base; it has not been measured (no GPU here), and there it reaches the"
                " run's peak only when generation runs elsewhere (a vLLM server, or replayed rollouts). The"
                " gathers cost time too: see the seconds above (gloo over loopback on 2 cores)."
            )
    return text


def main_job_speed(result: dict[str, Any]) -> str:
    """The README's main job at an earlier commit against now, run at the same time."""
    sides = result["sides"]

    def success(record: dict[str, Any] | None) -> str:
        if not record:
            return "-"
        n = int(record.get("num_episodes") or 0)
        rate = record["success_rate"]
        return (
            f"{100 * rate:.1f}% ({100 * record['success_ci_low']:.1f}-{100 * record['success_ci_high']:.1f},"
            f" {round(rate * n)}/{n})"
        )

    rows = []
    for side in ("before", "after"):
        run = sides[side]
        label = f"before: {result['before_revision']}" if side == "before" else "now: this commit"
        trained = sum(sum(step.values()) for step in run.get("trained_samples", []))
        per_sample = f"{sum(run['update_seconds']) / trained:.3f}" if trained else "-"
        rows.append([
            label, f"{run['wall_seconds'] / 60:.1f}", f"{(run['wall_seconds'] - sum(run['step_seconds'])) / 60:.1f}",
            f"{statistics.median(run['step_seconds']):.1f}",
            f"{sum(run['generation_seconds']) / 60:.1f}", f"{sum(run['update_seconds']) / 60:.1f}",
            f"{trained:g}", per_sample, success(run["before"]), success(run["after"]),
        ])  # fmt: skip
    seed = result.get("seed")
    if seed is None and "--seed" in result.get("command", "").split():
        words = result["command"].split()
        seed = words[words.index("--seed") + 1]
    changes = ", ".join(f"`{key}`" for key in result.get("dropped_keys", [])) or "none"
    after_only = " ".join(result.get("after_only", [])) or "none"
    text = (
        f"`{result['config']}` run twice at the same time, one process per side with"
        f" {result['threads_per_side']} torch thread(s) (one core each): the source tree of"
        f" {result['before_revision']} and this commit's. Keys dropped from both sides' config (the older code"
        f" does not know them): {changes}; this commit's side only: `{after_only}`. Training seed:"
        f" {seed if seed is not None else 'the config' + chr(39) + 's'}. The update's time grows with the samples it trains"
        f" (groups without signal are dropped), which depends on what each side has learned.\n\n"
    )
    text += markdown_table(
        ["side", "whole job (min)", "outside the steps: loading, evaluations (min)", "median step (s)",
         "generation (min)", "update (min)", "trained samples", "update s/sample",
         "success before training", "after"],
        rows,
    )  # fmt: skip
    text += (
        f"\n\n**Before / now: the whole job {result['speedup_wall']:.2f}x faster** (target >= 1.5); the training"
        f" steps {result['speedup_steps']:.2f}x (generation {result['speedup_generation']:.2f}x, update"
        f" {result['speedup_update']:.2f}x)."
    )
    return text


def attention_speed(result: dict[str, Any]) -> str:
    settings, load = result["settings"], result["load_average_during"]
    rows = [
        [
            dtype,
            phase,
            f"{row['eager_best_s']:.3f}",
            f"{row['sdpa_best_s']:.3f}",
            f"{row['sdpa_over_eager']:.2f}",
        ]
        for dtype, figures in result["summary"].items()
        for phase, row in figures["phases"].items()
    ]
    phases = {phase for figures in result["summary"].values() for phase in figures["phases"]}
    shapes = {
        "prefill": f"prefill {settings['prefill_batch']} x {settings['prefill_tokens']} tokens",
        "decode_short": f"decode {settings['decode_steps']} steps of {settings['decode_batch']} rows on"
        f" {settings['short_context']} (short) / {settings['long_context']} (long) cached tokens, "
        + (
            f"every other row left-padded by {settings['pad_fraction']:g} of the context"
            if settings.get("pad_fraction")
            else "rows unpadded (an all-ones mask)"
        ),
        "update": f"update: LoRA forward + backward of {settings['update_groups']} prompts x"
        f" {settings['update_rows']} rows ({settings['update_prompt']} + {settings['update_completion']} tokens)",
    }
    gaps = ", ".join(
        f"{dtype} {figures['logp_gap']:.1e}"
        for dtype, figures in result["summary"].items()
        if figures.get("logp_gap") is not None
    )
    return (
        f"Best of {settings['repeats']} interleaved repeat(s) after one warm-up, {settings['threads']} thread(s),"
        f" load average {load['min']:.1f}-{load['max']:.1f} during the run; "
        + "; ".join(text for phase, text in shapes.items() if phase in phases)
        + ".\n\n"
        + markdown_table(["dtype", "phase", "eager s", "sdpa s", "sdpa / eager"], rows)
        + (f"\n\nLargest completion log-prob difference between the two: {gaps}." if gaps else "")
    )


def step_profile_by_cpu(result: dict[str, Any]) -> str:
    """One table per result of step_profile.py (each CPU model and dtype), the AMD EPYC's float32
    first (``result``)."""
    paths = sorted(RESULTS_DIR.glob("step_profile*.json"), key=lambda p: (p.stem != "step_profile", p.stem))
    return "\n\n".join(
        _step_profile(json.loads(path.read_text()), path.name) for path in paths
    ) or step_profile(result)


def _step_profile(result: dict[str, Any], name: str) -> str:
    machine, settings, limits = result.get("machine", {}), result["settings"], result["limits"]
    summary = result["summary"]
    dtype = settings["dtype"]
    peaks = limits["products"][dtype]
    peak = max(peaks.values())
    shape = " x ".join(str(n) for n in limits["product_shape"])
    flags = ", ".join(machine.get("cpu_flags") or []) or "not recorded"
    rows = []
    for phase, seconds in summary["phases_s"].items():
        rate = summary["product_gflops"].get(phase)
        rows.append([
            phase, f"{seconds:.3f}", f"{100 * seconds / summary['step_s']:.1f}%",
            f"{summary['product_gflop'][phase]:.0f}" if phase in summary["product_gflop"] else "",
            f"{rate:.0f}" if rate is not None else "", f"{100 * rate / peak:.0f}%" if rate is not None else "",
        ])  # fmt: skip
    decode_s = summary["phases_s"].get("generation/decode body", 0.0)
    passes = summary["decode_rows_per_step"] / max(
        1, settings["prompts_per_step"] * settings["num_generations"]
    )
    read = summary["body_weight_bytes"] * passes / decode_s / 1e9 if decode_s else float("nan")
    return (
        f"**{machine.get('cpu', '?')}** ({flags}), {dtype}, {settings['threads']} thread(s), commit"
        f" {result.get('git_commit') or '?'}, {created(result) or '?'} (`{name}`, `{result['command']}`). Load"
        f" average {machine.get('load_average_at_start', ['?'])[0]} at the start,"
        f" {machine.get('load_average_at_end', ['?'])[0]} at the end. Median of {settings['steps']} steps after"
        f" {settings['warmup_steps']} warm-up: **{summary['step_s']:.2f} s a step**. Limits measured in the same"
        f" process: {dtype} products of {shape} "
        + ", ".join(f"{name} {value:.0f} GFLOP/s" for name, value in peaks.items())
        + f"; memory read {limits['read_gbs']:.1f} GB/s, copy {limits['copy_gbs']:.1f} GB/s. The decode passes"
        f" read the frozen weights at {read:.1f} GB/s.\n\n"
        + markdown_table(["phase", "s / step", "share", "product GFLOP", "GFLOP/s", "of peak"], rows)
        + _step_profile_bounds(result, peak)
    )


def _step_profile_bounds(result: dict[str, Any], peak: float) -> str:
    """The step's floor (every counted product at the measured peak) and the update's operators."""
    summary, operators = result["summary"], result.get("update_operators")
    lines = []
    if "products_at_peak_s" in summary:
        lines.append(
            f"Every counted product at the measured peak, and nothing else: {summary['products_at_peak_s']:.2f} s"
            f" a step ({100 * summary['products_at_peak_s'] / summary['step_s']:.0f}% of the measured step)."
        )
    if operators:
        rate = operators.get("frozen_products_gflops")
        top = ", ".join(
            f"{op['name']} {op['self_s']:.2f} s ({op['calls']} calls)"
            for op in operators["top_operators"][:6]
        )
        lines.append(
            f"One more step's update under torch's profiler: {operators['profiled_update_s']:.2f} s"
            f" (unprofiled median {operators['unprofiled_update_s']:.2f} s). Products by frozen weights,"
            f" forward and input gradients: {operators['frozen_products_s']:.2f} s of the operators'"
            f" {operators['operators_s']:.2f} s"
            + (f", {rate:.0f} GFLOP/s ({100 * rate / peak:.0f}% of the peak)" if rate else "")
            + f". Most own time: {top}."
        )
    return "".join(f"\n\n{line}" for line in lines)


def step_profile(result: dict[str, Any]) -> str:
    return _step_profile(result, "step_profile.json")
