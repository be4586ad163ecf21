"""The main job's figures quoted in README.md and docs/getting-started.md are those of
benchmarks/RESULTS.md (the learning_math section: examples/math_smollm2_cpu.yaml, the team with
one adapter per agent against the tool agent alone, pooled over training seeds), so the docs cannot
drift from the one measured source."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "RESULTS.md"
README = REPO / "README.md"
GETTING_STARTED = REPO / "docs" / "getting-started.md"
TEAM_ROW = "team, per-agent adapters (AT-GRPO)"
TOOL_ROW = "tool agent alone (GRPO, same tools)"
#: A success figure: "20.0% (13.3-28.9, 20/100)" in RESULTS.md, "20.0% (95% CI 13.3-28.9%, 20/100)" in prose.
SUCCESS = r"(\d+\.\d)% \((?:95% CI )?(\d+\.\d)-(\d+\.\d)%?, (\d+/\d+)\)"


def learning_math_rows() -> dict[str, dict[str, str]]:
    text = RESULTS.read_text(encoding="utf-8")
    section = text.split("## Two agents learning together: Math-v0 on CPU", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    header = next(line for line in lines if line.startswith("| variant |"))
    names = [cell.strip() for cell in header.strip("|").split("|")]
    rows = {}
    for line in lines:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == len(names) and cells[0] in (TEAM_ROW, TOOL_ROW):
            rows[cells[0]] = dict(zip(names, cells, strict=True))
    return rows


def _main_job_paragraph(text: str) -> str:
    return next(p for p in text.split("\n\n") if "went from" in p and "held-out" in p).replace("\n", " ")


def test_the_readme_quotes_the_main_job_as_results_md_has_it():
    rows = learning_math_rows()
    team, tool = rows[TEAM_ROW], rows[TOOL_ROW]
    paragraph = _main_job_paragraph(README.read_text(encoding="utf-8"))
    quoted = re.search(rf"went from {SUCCESS} to {SUCCESS}", paragraph)
    assert quoted, paragraph
    before = re.fullmatch(SUCCESS, team["before (95% CI)"])
    after = re.fullmatch(SUCCESS, team["after, seeds pooled (95% CI)"])
    assert quoted.groups() == before.groups() + after.groups()
    assert f"per seed {team['after per seed']}" in paragraph
    alone = re.search(rf"tool agent alone[^.]*? reached {SUCCESS}", paragraph)
    assert alone and alone.groups() == re.fullmatch(SUCCESS, tool["after, seeds pooled (95% CI)"]).groups()
    assert f"per seed {tool['after per seed']}" in paragraph
    # RESULTS.md is generated from this file: every step of every team run trained both adapters,
    # as the paragraph says.
    runs = json.loads((REPO / "benchmarks/results/learning_math.json").read_text())["variants"]["per_agent"]
    steps = re.search(
        r"every one of the (\d+) steps of (both|all three) team runs trained both adapters", paragraph
    )
    trained = [[r for r in run["history"] if "update/reasoner/samples" in r] for run in runs]
    assert steps and all(int(steps[1]) == len(run) for run in trained)
    assert {"both": 2, "all three": 3}[steps[2]] == len(runs)
    assert all(
        r["update/reasoner/samples"] > 0 and r["update/tool_agent/samples"] > 0
        for run in trained
        for r in run
    )


def test_getting_started_quotes_the_same_success_figures():
    team = learning_math_rows()[TEAM_ROW]
    text = GETTING_STARTED.read_text(encoding="utf-8").replace("\n", " ")
    before = team["before (95% CI)"].split()[0]
    after = team["after, seeds pooled (95% CI)"].split()[0]
    quoted = re.findall(r"went from (\d+\.\d%) to (\d+\.\d%)", text)
    assert quoted == [(before, after)]
    # What the docs once said of this job and RESULTS.md contradicts.
    assert "not a good planner" not in text and "rarely answers in the environment's format" not in text
    assert "was measured with one thread" not in text
