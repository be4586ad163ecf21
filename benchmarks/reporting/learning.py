"""RESULTS.md sections of the learning benchmarks: success before and after training (Plan-Path,
the team comparisons over seeds with paired tests), the paper's rows, the relay reasoner's
ceiling and greedy evaluation against batch composition."""

from __future__ import annotations

import statistics
from typing import Any

from reporting.format import markdown_table, success_cell

LEARNING_VARIANTS = {
    "single_agent": "(c) single agent, GRPO (the paper's baseline)",
    "per_agent": "(a) AT-GRPO, per-agent adapters",
    "shared": "(b) AT-GRPO, one shared adapter",
}


LEARNING_HEADER = [
    "variant", "success before (95% CI, solved/tasks)", "after", "answers parsed", "doubled", "intervals apart",
    "minutes",
]  # fmt: skip


def learning_plan_path(result: dict[str, Any]) -> str:
    variants = result["variants"]
    rows: list[list[Any]] = []
    verdicts: list[bool] = []
    for name, label in LEARNING_VARIANTS.items():
        variant = variants.get(name)
        if variant is None:
            continue
        before = variant.get("before") or variants.get("per_agent", {}).get("before")
        after = variant.get("after")
        doubled = bool(before and after and after["success_rate"] >= 2 * before["success_rate"] > 0)
        separated = bool(before and after and after["ci_low"] > before["ci_high"])
        verdicts.append(separated)
        rows.append([label, success_cell(before), success_cell(after),
                     f"{100 * before['format_ok_rate']:.0f}% -> {100 * after['format_ok_rate']:.0f}%" if before and after else "-",
                     "yes" if doubled else "no", "yes" if separated else "no",
                     f"{variant['wall_seconds'] / 60:.1f}"])  # fmt: skip
        swap = variant.get("role_swap")
        if swap:
            rows.append(
                ["(d) (a)'s adapters, roles swapped", "-", success_cell(swap["after"]), "-", "-", "-", "-"]
            )
    settings = result["settings"]
    verdict = (
        "**met** by at least one variant with the intervals apart"
        if any(verdicts)
        else "**not met**: no variant's success after training lies above its interval before training"
    )
    return (
        f"{settings['description']} (config `{settings['config_file']}`, {settings['threads']} torch thread)."
        " Success is greedy, on evaluation tasks never used in training, with 95% Wilson intervals; an"
        ' untrained LoRA adapter equals the base model, so (b) starts from (a)\'s "before".\n\n'
        + markdown_table(LEARNING_HEADER, rows)
        + f"\n\nTarget (success at least doubles): {verdict}."
    )


NEW_MATH_HEADER = [
    "variant", "before (95% CI)", "after, seeds pooled (95% CI)", "after per seed", "tokens per run",
    "samples trained per run", "minutes",
]  # fmt: skip


def _budget(runs: list[dict[str, Any]]) -> tuple[str, str]:
    """Mean generated tokens (every agent's sampled completions, look-ahead included) and trained
    samples per run, from each run's per-step history (absent from runs that kept none); the roles
    trained apart (``separate``) count both of their training runs (``histories``)."""
    tokens, trained = [], []
    for run in runs:
        history = run.get("history") or [
            step for part in (run.get("histories") or {}).values() for step in part
        ]
        if not history:
            continue
        total = 0.0
        for step in history:
            agents = [key[: -len("/completion_length")] for key in step if key.endswith("/completion_length")]
            total += sum(step[f"{a}/completion_length"] * step.get(f"{a}/samples", 0) for a in agents)
            total += step.get("rollout/lookahead_tokens", 0)
        tokens.append(total)
        trained.append(
            sum(
                v
                for step in history
                for k, v in step.items()
                if k.startswith("update/") and k.endswith("/samples")
            )
        )
    if not tokens:
        return "-", "-"
    return f"{statistics.mean(tokens) / 1000:.1f}k", f"{statistics.mean(trained):.0f}"


def learning_math(result: dict[str, Any]) -> str:
    """The comparison on distinct problems with several training seeds and paired tests."""
    labels, before_of = result["labels"], result["before_of"]
    table, befores = result["summary"]["table"], result["befores"]
    rows = []
    for name, row in sorted(table.items(), key=lambda item: list(labels).index(item[0])):
        before = befores.get(before_of[name])
        minutes = sum(r.get("wall_seconds", 0.0) for r in result["variants"][name]) / 60
        rows.append([
            labels[name], success_cell(before) if before else "-",
            f"{100 * row['success_rate']:.1f}% ({100 * row['ci_low']:.1f}-{100 * row['ci_high']:.1f},"
            f" {row['successes']}/{row['episodes']})",
            ", ".join(f"{100 * r:.1f}%" for r in row["per_seed"]), *_budget(result["variants"][name]),
            f"{minutes:.1f}" if minutes else "-",
        ])  # fmt: skip

    def per_seed(comparison: dict[str, Any]) -> str:
        seeds = comparison.get("per_seed")  # absent from results recorded before it was
        if not seeds:
            return "-"
        return "; ".join(f"{s['seed']}: {s['only_a']}/{s['only_b']}, p={s['p_value']:.2g}" for s in seeds)

    pairs = [[pair, r["pairs"], r["only_a"], r["only_b"], f"{r['p_value']:.3g}", per_seed(r)]
             for pair, r in result["summary"]["comparisons"].items()]  # fmt: skip
    checks = {k: v for k, v in result["summary"]["verdict"].items() if k != "met"}
    listed = "; ".join(
        f"{name}: {ok if isinstance(ok, str) else 'yes' if ok else 'no'}" for name, ok in checks.items()
    )
    met = "**met**" if result["summary"]["verdict"].get("met") else "**not met**"
    settings = result["settings"]
    credit = []
    for name, runs in result["variants"].items():
        rollout = (runs[0].get("config") or {}).get("rollout")
        if rollout and before_of.get(name) == "team":
            teammate = rollout.get("team_credit_teammate", "sampled").replace("auto", "auto (greedy)")
            credit.append(f"{name}: look-ahead {rollout['team_credit_lookahead']}, teammate {teammate}"
                          if rollout["team_credit_lookahead"] != 0 else f"{name}: look-ahead 0")  # fmt: skip
    return (
        f"{settings['description']} (config `{settings['config_file']}`, {settings['threads']} torch threads)."
        f" Greedy success on {settings.get('eval_tasks', 'distinct held-out test problems (each once)')},"
        " pooled over the training seeds with"
        ' 95% Wilson intervals; untrained adapters equal the base model, so each env has one "before".'
        + (f" Team credit as run: {'; '.join(credit)}." if credit else "")
        + "\n\n"
        + markdown_table(NEW_MATH_HEADER, rows)
        + "\n\nPaired comparisons, problem by problem and seed by seed (exact McNemar test):\n\n"
        + markdown_table(
            ["A vs B", "pairs", "only A solved", "only B solved", "p", "seed: only A/only B, p"], pairs
        )
        + f"\n\nTargets: {met} ({listed})."
    )


def reproduce_paper(result: dict[str, Any]) -> str:
    def cell(evaluation: dict[str, Any] | None) -> str:
        if not evaluation:
            return "-"
        text = f"{100 * evaluation['success_rate']:.1f}%"
        if evaluation.get("ci_low") is not None:
            text += f" ({100 * evaluation['ci_low']:.0f}-{100 * evaluation['ci_high']:.0f})"
        return text

    rows = []
    for name, row in result["rows"].items():
        paper = row["paper"]
        steps = row["after"]["step"] if row.get("after") else "-"
        rows.append([
            name, f"{100 * paper['before']:.1f}% -> {100 * paper['after']:.1f}%", cell(row.get("before")),
            cell(row.get("after")), steps, f"{row['wall_seconds'] / 60:.1f}", row.get("error", ""),
        ])  # fmt: skip
    gpus = ", ".join(result.get("hardware", {}).get("gpus", [])) or "no GPU"
    text = f"Mode: {result['mode']}; GPUs: {gpus}.\n\n"
    return text + markdown_table(
        ["row", "paper (full weights)", "ours before (95% CI)", "ours after", "steps", "minutes", "error"],
        rows,
    )


def relay_reasoner_ceiling(result: dict[str, Any]) -> str:
    settings = result["settings"]
    rows = [
        [rule, f"{r['sampled']['correct']}/{r['sampled']['answers']}", f"{r['greedy']['correct']}/{r['greedy']['answers']}",
         f"`{r['greedy_example'][:60]!r}`"]
        for rule, r in result["rules"].items()
    ]  # fmt: skip
    return (
        f"The base model as the reasoner, given the right intermediate (an oracle tool agent), on"
        f" {settings['problems']} training problems: {settings['k']} samples at T={settings['temperature']}"
        " and one greedy answer each. `env` is MathRelay-v0's own prompt; the other rows are prompts for a"
        " redesigned reasoner step on the same numbers.\n\n"
        + markdown_table(
            ["reasoner rule", "sampled correct", "greedy correct", "greedy answer, first problem"], rows
        )
    )


def greedy_batch_composition(result: dict[str, Any]) -> str:
    settings, reference = result["settings"], result["reference"]
    rows = [
        [name, f"{row['successes']}/{reference['num_episodes']}", f"{row['outcome_flips']} (+{row['gained']} -{row['lost']})",
         f"{row['completions_differing']}/{row['prompts_compared']}", row["prompts_only_here"],
         f"{row['wall_seconds']:.0f}", f"{row['time_ratio_to_reference']:.2f}"]
        for name, row in result["comparisons"].items()
    ]  # fmt: skip
    return (
        f"{settings['model']}, `{settings['config_file']}`, greedy, {settings['max_tokens']} tokens,"
        f" {settings['problems']} distinct test problems, {settings['threads']} torch thread(s). Reference"
        f" (`natural`): the problems in order, {settings['reference_batch_size']} rows per `generate` call:"
        f" {reference['successes']}/{reference['num_episodes']} solved in {reference['wall_seconds']:.0f} s."
        " Each other composition evaluates the same problems; `batch_1` computes every prompt alone, which no"
        " other prompt can change."
        + (
            " **Partial run**: the compositions below finished before it was stopped."
            if result.get("partial")
            else ""
        )
        + "\n\n"
        + markdown_table(
            [
                "composition",
                "solved",
                "outcome flips",
                "completions differing",
                "prompts only here",
                "seconds",
                "time / reference",
            ],
            rows,
        )
    )
