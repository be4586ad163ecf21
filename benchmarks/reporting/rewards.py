"""RESULTS.md sections on what the rewards pay for: the reward-hack search, the cheating rate on
impossible problems, and team credit against what a candidate caused."""

from __future__ import annotations

from typing import Any

from reporting.format import markdown_table


def reward_hack_search(result: dict[str, Any]) -> str:
    rows = []
    for env_id, entry in result["envs"].items():
        margins = "; ".join(
            f"{key} {entry['best_failing'][key]:+.2f} vs {entry['worst_succeeding'][key]:+.2f}"
            for key in entry["best_failing"]
        )
        rows.append(
            [env_id, f"{entry['seconds']:.2f}", entry["episodes"], entry["violations"], margins or "-"]
        )
    text = markdown_table(
        ["env", "seconds (best)", "episodes", "violations", "best non-solving vs worst solving return"], rows
    )
    worst = [
        f"{env_id}: {e['worst_violation']}" for env_id, e in result["envs"].items() if e["worst_violation"]
    ]
    return (
        f"The search `check_env` and `llm-zoo check ID` run (task seeds {result['seeds']}), best of"
        f" {result['repeats']} per env. A violation is a non-solving episode that earned any agent (its"
        " teammates' steps included) or the team as much as or more than the lowest-paid solving one of"
        " its group, or an agent holding its own oracle answers fixed that earned as much when a teammate"
        " made the task fail.\n\n"
        + text
        + ("\n\nWorst violations:\n\n" + "\n".join(f"- {line}" for line in worst) if worst else "")
    )


def _percent(value: float | None) -> str:
    return "?" if value is None else f"{100 * value:.0f}%"


def _signed(value: float | None) -> str:
    return "?" if value is None else f"{value:+.2f}"


def cheating_rate(result: dict[str, Any]) -> str:
    rows = [
        [
            row["policy"],
            f"{100 * row['cheating_rate']:.1f}% ({100 * row['ci_low']:.1f}-{100 * row['ci_high']:.1f})",
            f"{row['cheats']}/{row['episodes']}",
            row["distinct_problems"],
            f"{100 * row['format_ok_rate']:.0f}%",
        ]
        for row in result["rows"]
    ]
    steps = result.get("training_steps", 0)
    note = (
        f"Greedy, {result['max_completion_length']} new tokens; `adapters` is the policy after "
        f"{steps} Code-v0 training steps of the benchmark's own run (not the main job's)."
        if steps
        else f"Greedy, {result['max_completion_length']} new tokens; base model only (no training run)."
    )
    training = result.get("training")
    if training:
        changes = "; ".join(
            f"{agent} format ok {_percent(first)} -> {_percent(last)}, mean reward {_signed(training['reward'][agent][0])}"
            f" -> {_signed(training['reward'][agent][1])}"
            for agent, (first, last) in training["format_ok"].items()
        )
        sizes = result.get("training_sizes")
        shape = f" (K={sizes['num_generations']}, {sizes['envs_per_step']} envs a step)" if sizes else ""
        note += (
            f" The training run{shape} trained on {training['samples_trained']} samples in {training['steps']} steps"
            f" ({training['steps_without_samples']} of them trained nothing: every group's rewards were equal);"
            f" from its first to its last step: {changes}."
        )
    missing = result.get("missing")
    seconds = ", ".join(f"{name} {value:.0f} s" for name, value in result.get("seconds", {}).items())
    if seconds:
        note += f" Wall time: {seconds}."
    return (
        markdown_table(["policy", "cheating rate (95% CI)", "cheats", "distinct problems", "format ok"], rows)
        + f"\n\n{note}"
        + (f" {missing}" if missing else "")
    )


def team_credit_disagreement(result: dict[str, Any]) -> str:
    """Per credit rule, how often the credited global disagrees with the candidate's own outcome."""
    settings = result["settings"]
    rows = [
        [rule, f"{r['disagreements']}/{r['candidates']}", r["credited_failed"], r["withheld_correct"],
         f"{r['pairs_misordered']} / {r['pairs_tied']} of {r['pairs']}", f"{r['groups_flipped']}/{r['groups']}",
         f"{r['groups_spurious']}/{r['groups']}",
         f"{r['lookahead_seconds']:.0f}", r["lookahead_tokens"]]
        for rule, r in result["rules"].items()
    ]  # fmt: skip
    adapters = ", ".join(settings["adapters"]) or "none: the base model"
    if settings.get("adapters_dir"):
        adapters += f" from `{settings['adapters_dir']}`"
    return (
        f"{settings.get('env_id', 'Math-v0')} (config `{settings['config_file']}`), the {settings['agent']}'s"
        f" K={settings['k']} candidates for the tasks of the first {settings['steps']} training steps"
        f" ({result['candidates']} candidates, {result['own_correct']} of them right by `{settings['own_key']}`),"
        f" T={settings['temperature']}; trained adapters: {adapters}. Every rule credits the same branches."
        " A failed candidate is credited when its credited global is at least 0.5; a group has the wrong sign"
        " when an advantage's global part points against the candidate's own outcome; a group has noise only when"
        " its candidates were all equally right (or wrong) yet were credited differently.\n\n"
        + markdown_table(
            [
                "rule",
                "disagree",
                "failed credited",
                "correct withheld",
                "sibling pairs misordered / tied",
                "groups with the wrong sign",
                "groups with noise only",
                "look-ahead s",
                "look-ahead tokens",
            ],
            rows,
        )
    )
