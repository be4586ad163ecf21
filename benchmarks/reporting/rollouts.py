"""RESULTS.md sections of the rollout benchmarks: generation paths and tree rollouts on the
transformers and vLLM engines, a vLLM server against colocated vLLM, and async rollouts."""

from __future__ import annotations

import statistics
from typing import Any

from reporting.format import fmt, markdown_table, success_cell
from reporting.kernels import decode_attention_line, prefill_choice


def rollout_speed(result: dict[str, Any]) -> str:
    best = result["tokens_per_s_best"]
    rows = [[name, fmt(value)] for name, value in best.items()]
    tree = result.get("tree_rollout", {})
    text = (
        f"{result['model']} ({result['dtype']}), env {result['env']}, {result['envs']} envs x K={result['k']},"
        f" {result['max_tokens']} new tokens, ~{result['prompt_tokens_mean']:.0f} prompt tokens, best of"
        f" {result['repeats']} repeats.\n\n"
    )
    text += markdown_table(["generation path", "tokens/s"], rows) + "\n\n"
    text += markdown_table(
        ["ratio", "value"], [[name, f"{value:.2f}"] for name, value in result["ratios"].items()]
    )
    if "raw_replay_tokens_per_s_best" in tree:
        per_repeat = [
            run["tokens_per_s"] / replay["tokens_per_s"]
            for run, replay in zip(tree["runs"], tree["raw_replay_runs"], strict=True)
        ]
        text += (
            f"\n\nWhole tree rollouts ({tree['max_turns']} turn(s), envs and sandbox included):"
            f" {tree['tokens_per_s_best']:.1f} tokens/s against {tree['raw_replay_tokens_per_s_best']:.1f}"
            f" tokens/s for the same generation calls replayed raw: **{tree['tokens_per_s_over_raw']:.2f} x raw**"
            f" (best repeat of each; target >= 0.9). Per repeat (rollout, then its replay):"
            f" {', '.join(f'{r:.2f}' for r in per_repeat)}, median {statistics.median(per_repeat):.2f}."
        )
    elif "tokens_per_s" in tree:
        text += f"\n\nOne whole tree rollout (1 turn): {tree['tokens_per_s']:.1f} tokens/s."
    cost, immediate = result.get("team_credit_cost"), result.get("tree_rollout_lookahead_0")
    if cost and immediate:
        calls = ", ".join(f"{name} {count}" for name, count in cost.get("engine_calls", {}).items())
        text += (
            f"\n\nTeam credit cost (`rollout.team_credit_lookahead`): the default look-ahead (a full round of"
            f" teammates) takes **{cost['seconds_ratio']:.2f} x the time** of look-ahead 0"
            f" ({tree['seconds_best']:.2f} s against {immediate['seconds_best']:.2f} s, best repeat of each)"
            f" and generates **{cost['generated_tokens_ratio']:.2f} x the tokens**"
            + (f"; engine calls per rollout: {calls}." if calls else ".")
        )
    cache = result.get("prefix_cache")
    if cache and cost and "mb" in cache:
        without, ratio = cache["team_credit_cost_without"], cache["seconds_with_over_without"]
        text += (
            f"\n\nThese rollouts ran on the trainer's default engine: the prefix cache on"
            f" ({cache['mb']:.0f} MiB, {cache['block']}-token blocks). Without it the default look-ahead"
            f" takes {without['seconds_ratio']:.2f} x the time of look-ahead 0 for"
            f" {without['generated_tokens_ratio']:.2f} x the tokens; seconds with the cache over without:"
            f" look-ahead 0 {ratio['lookahead_0']:.2f}, default look-ahead {ratio['lookahead_default']:.2f}."
        )
    choices = result.get("decode_kernel_choices")
    if choices:
        text += (
            "\n\nFloat32 decode products (`rollout.decode_kernel: auto`, measured once per row count on this"
            " machine: one pass over the model's linear layers with each kernel, the fastest of several): "
            + "; ".join(
                f"{c['rows']} rows: {'oneDNN' if c['kernel'] == 'onednn' else 'MKL (exact)'}"
                + (
                    f" ({1e3 * c['onednn_s']:.1f} ms oneDNN, {1e3 * c['exact_s']:.1f} ms exact)"
                    if c.get("exact_s") is not None
                    else ""
                )
                + prefill_choice(c)
                for c in choices
            )
            + ". `engine_n_k_exact` is `engine_n_k` with `decode_kernel: exact`."
        )
    if result.get("decode_attention_choices"):
        text += "\n\n" + decode_attention_line(result).strip()
    return text


def vllm_server_speed(result: dict[str, Any]) -> str:
    best, ratios = result["tokens_per_s_best"], result["server_over_colocated"]
    rows = [
        [job, fmt(rates["server"]), fmt(rates["colocated"]), f"**{ratios[job]:.2f}**"]
        for job, rates in best.items()
    ]
    return (
        f"{result['model']} ({result['dtype']}), env {result['env']}, {result['envs']} envs x K={result['k']},"
        f" {result['max_tokens']} new tokens, ~{result['prompt_tokens_mean']:.0f} prompt tokens, tree rollouts of"
        f" {result['max_turns']} turn(s), best of {result['repeats']} repeats; one server on the same machine.\n\n"
        + markdown_table(["job", "server tokens/s", "colocated tokens/s", "server / colocated"], rows)
        + f"\n\nTarget: >= {result['target']}. Both engines generated the same tokens:"
        f" {'yes' if result['same_tokens'] else 'no'}."
    )


def async_rollouts(result: dict[str, Any]) -> str:
    settings, steps = result["settings"], result["mean_step_seconds"]

    def mean(values: list[float | None]) -> str:
        present = [v for v in values if v is not None]
        return f"{statistics.mean(present):.1f}" if present else "-"

    rows = [
        [f"{run['mode']} #{run['repeat'] + 1}", ", ".join(f"{t:.1f}" for t in run["step_seconds"]),
         mean(run["generation_seconds"]), mean(run.get("trainer_rollout_seconds", [])),
         mean(run["update_seconds"]), mean(run["rollout_wait_seconds"]), success_cell(run["eval"])]
        for run in result["runs"]
    ]  # fmt: skip
    verdict = result["verdict"]
    headers = [
        "run",
        "step seconds",
        "generation s",
        "trainer's part s",
        "update s",
        "waited s",
        "success after",
    ]
    trainer_envs = settings.get("trainer_envs", 0)
    reference = result.get("ratio_async_to_sync_2cores")
    return (
        f"`{settings['config_file']}` for {settings['steps']} steps, each mode {settings['repeats']} times,"
        f" interleaved. sync: the trainer on core {settings['trainer_core']}, one torch thread. async: the"
        f" trainer on that core and its generation process on core {settings['worker_core']}, one thread"
        f" each; the trainer plays {trainer_envs} of each step's tasks itself before its update"
        " (`rollout.async_trainer_envs`)."
        + (
            " sync_2cores (a reference): the synchronous trainer on both cores, two threads."
            if reference
            else ""
        )
        + " Generation seconds add up both processes' generation; the trainer's part is also shown"
        " alone. Success: greedy on the held-out test problems after the last step of the first sync"
        " and async runs (95% Wilson intervals).\n\n"
        + markdown_table(headers, rows)
        + f"\n\nMean steady step (all but the first and the last: the first async step overlaps nothing and"
        " plays two rollouts' shares, the last has no next rollout to generate): sync"
        f" {steps['sync']['steady']:.1f} s, async {steps['async']['steady']:.1f} s (over all steps: sync"
        f" {steps['sync']['all']:.1f} s, async {steps['async']['all']:.1f} s). **async / sync ="
        f" {result['ratio_steady_steps']:.2f}** over the steady steps ({result['ratio_all_steps']:.2f} over all"
        f" steps). Target (<= {settings['target_ratio']} with learning no worse):"
        f" {'**met**' if verdict['met'] else '**not met**'} (ratio: {'yes' if verdict['ratio_met'] else 'no'};"
        f" learning no worse: {'yes' if verdict['learning_no_worse'] else 'no'})."
        + (
            f" Reference: sync on both cores {steps['sync_2cores']['steady']:.1f} s a steady step;"
            f" async / sync_2cores = {reference:.2f}."
            if reference
            else ""
        )
    )
