"""The main job's figures quoted in README.md and docs/getting-started.md are those of
benchmarks/RESULTS.md (row (b) of the learning_math section: examples/math_smollm2_cpu.yaml), so
the docs cannot drift from the one measured source."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "RESULTS.md"
README = REPO / "README.md"
GETTING_STARTED = REPO / "docs" / "getting-started.md"
MAIN_JOB_ROW = "(b) AT-GRPO, per-agent adapters"
#: A success figure: "10.9% (5.4-20.9, 7/64)" in RESULTS.md, "10.9% (95% CI 5.4-20.9%, 7/64)" in prose.
SUCCESS = r"(\d+\.\d)% \((?:95% CI )?(\d+\.\d)-(\d+\.\d)%?, (\d+/\d+)\)"


def main_job_row() -> dict[str, str]:
    text = RESULTS.read_text(encoding="utf-8")
    section = text.split("## Two agents learning together: Math-v0 on CPU", 1)[1].split("\n## ", 1)[0]
    header = next(line for line in section.splitlines() if line.startswith("| variant |"))
    row = next(line for line in section.splitlines() if line.startswith(f"| {MAIN_JOB_ROW} |"))
    names = [cell.strip() for cell in header.strip("|").split("|")]
    return dict(zip(names, (cell.strip() for cell in row.strip("|").split("|")), strict=True))


def _main_job_paragraph(text: str) -> str:
    return next(p for p in text.split("\n\n") if "went from" in p and "held-out" in p).replace("\n", " ")


def test_the_readme_quotes_the_main_job_as_results_md_has_it():
    row = main_job_row()
    paragraph = _main_job_paragraph(README.read_text(encoding="utf-8"))
    quoted = re.search(rf"went from {SUCCESS} to {SUCCESS}", paragraph)
    assert quoted, paragraph
    before = re.fullmatch(SUCCESS, row["success before (95% CI, solved/tasks)"])
    after = re.fullmatch(SUCCESS, row["after"])
    assert quoted.groups() == before.groups() + after.groups()
    tool_format = re.search(r"tool_agent (\d+%) -> (\d+%)", row["format"])
    assert f"printed an answer went from {tool_format[1]} to {tool_format[2]}" in paragraph
    assert f"{row['minutes']} minutes wall" in paragraph
    steps = re.search(r"All (\d+) steps trained both adapters", paragraph)
    # RESULTS.md is generated from this file; the per-step samples are in its history.
    history = json.loads((REPO / "benchmarks/results/learning_math.json").read_text())["variants"][
        "per_agent"
    ]
    trained = [r for r in history["history"] if "update/reasoner/samples" in r]
    assert steps and int(steps[1]) == len(trained)
    assert all(r["update/reasoner/samples"] > 0 and r["update/tool_agent/samples"] > 0 for r in trained)


def test_getting_started_quotes_the_same_success_figures():
    row = main_job_row()
    text = GETTING_STARTED.read_text(encoding="utf-8").replace("\n", " ")
    before = row["success before (95% CI, solved/tasks)"].split()[0]
    after = row["after"].split()[0]
    quoted = re.findall(r"went from (\d+\.\d%) to (\d+\.\d%)", text)
    assert quoted == [(before, after)]
    # What the docs once said of this job and RESULTS.md contradicts.
    assert "not a good planner" not in text and "rarely answers in the environment's format" not in text
    assert "was measured with one thread" not in text
