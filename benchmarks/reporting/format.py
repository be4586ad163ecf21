"""What every section of RESULTS.md shares: the results folder, a Markdown table, number and
success cells, and the preamble of a run (command, date, commit, machine, versions, plot).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent.parent
RESULTS_DIR = BENCHMARKS / "results"


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _machine(result: dict[str, Any]) -> str:
    machine = result.get("machine")
    if not isinstance(machine, dict):  # results written before the common facts existed
        cpus = result.get("cpu_count") or machine
        return f"{cpus} CPUs" if cpus else "unknown machine"
    start, end = machine.get("load_average_at_start"), machine.get("load_average_at_end")
    if isinstance(result.get("load_average_1min"), dict):  # trainer_vs_trl.py's own record
        start = start or [result["load_average_1min"].get("before")]
        end = end or [result["load_average_1min"].get("after")]
    loads = [
        f"{load[0]:.1f} at the {when}"
        for load, when in ((start, "start"), (end, "end"))
        if load and load[0] is not None
    ]
    load_text = f", load average {', '.join(loads)}" if loads else ""
    memory = f", {machine['memory_gib']} GiB" if machine.get("memory_gib") else ""
    cpus = machine.get("cpus") or machine.get("cpu_count")
    return f"{machine.get('cpu', 'CPU')} x {cpus}{memory}{load_text}"


def load_averages(result: dict[str, Any]) -> tuple[str, str] | None:
    """The run's load averages (1, 5, 15 min) at its start and end, each as ``"a, b, c"``, or
    ``None`` where the run did not record both."""
    machine = result.get("machine", {})
    start, end = machine.get("load_average_at_start"), machine.get("load_average_at_end")
    if not (start and end):
        return None
    return ", ".join(map(str, start)), ", ".join(map(str, end))


def created(result: dict[str, Any]) -> str | None:
    """When the run started (``created``; ``date_utc`` in trainer_vs_trl.py's results)."""
    return result.get("created") or result.get("date_utc")


def preamble(result: dict[str, Any], png: str | None) -> str:
    lines = [
        f"- Command: `{result.get('command', '?')}`",
        f"- Date: {created(result) or 'not recorded'}; commit {result.get('git_commit') or 'not recorded'}",
        f"- Machine: {_machine(result)}",
    ]
    if any("variants" in part for part in result.get("parts", [])):  # a merge that took variants apart
        lines[1] = "- Parts (merged with `--merge`), each run's date, commit and the variants taken from it:"
        lines[2:2] = [
            f"  - {part.get('created') or '?'}, commit {part.get('git_commit') or '?'}: {', '.join(part['variants'])}"
            for part in result["parts"]
        ]
    versions = result.get("versions")
    if versions:
        lines.append("- Versions: " + ", ".join(f"{name} {version}" for name, version in versions.items()))
    text = "\n".join(lines) + "\n"
    if png and (RESULTS_DIR / png).exists():
        text += f"\n![{png}](results/{png})\n"
    return text


def success_cell(evaluation: dict[str, Any] | None) -> str:
    if not evaluation:
        return "-"
    return (
        f"{100 * evaluation['success_rate']:.1f}% ({100 * evaluation['ci_low']:.1f}-{100 * evaluation['ci_high']:.1f},"
        f" {evaluation['successes']}/{evaluation['num_episodes']})"
    )
