"""``benchmarks/learning_math.py --merge``: seeds trained apart are pooled as one run would pool them."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
PROBLEMS = [f"p{i}" for i in range(6)]


@pytest.fixture()
def learning_math(monkeypatch):
    pytest.importorskip("torch", reason="the benchmark needs the train extra")
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delitem(sys.modules, "learning_math", raising=False)
    return importlib.import_module("learning_math")


def evaluation(solved: list[bool]) -> dict:
    successes = sum(solved)
    return {"success_rate": successes / len(solved), "successes": successes, "num_episodes": len(solved),
            "distinct_problems": len(solved), "ci_low": 0.0, "ci_high": 1.0,
            "solved": dict(zip(PROBLEMS, solved, strict=True))}  # fmt: skip


def part(module, seed: int, team: list[bool], tool: list[bool], before: list[bool] | None = None) -> dict:
    """The JSON one ``--seeds SEED`` run writes, cut to what the merge reads."""
    settings = {"config_file": "examples/math_smollm2_cpu.yaml", "env_id": "Math-v0", "overrides": [],
                "threads": 1, "steps": 8, "seeds": [seed], "description": f"8 steps; training seeds [{seed}]; eval"}  # fmt: skip
    before = evaluation(before or [False] * 6)
    return {
        "command": f"python benchmarks/learning_math.py --seeds {seed}", "quick": False, "settings": settings,
        "labels": module.LABELS, "before_of": module.BEFORE, "befores": {"team": before, "tool_alone": before},
        "variants": {"per_agent": [{"seed": seed, "after": evaluation(team), "wall_seconds": 60.0}],
                     "tool_alone": [{"seed": seed, "after": evaluation(tool), "wall_seconds": 30.0}]},
        "wall_seconds": 90.0, "partial": False,
    }  # fmt: skip


def test_merged_seeds_pool_like_one_run(learning_math):
    team0, tool0 = [True, True, False, True, False, False], [True, False, False, False, False, False]
    team1, tool1 = [True, True, True, False, False, False], [False, True, False, False, False, False]
    merged = learning_math.merge_results(
        [part(learning_math, 0, team0, tool0), part(learning_math, 1, team1, tool1)]
    )
    # What one run with --seeds 0,1 computes from the same evaluations.
    variants = {"per_agent": [{"seed": 0, "after": evaluation(team0)}, {"seed": 1, "after": evaluation(team1)}],
                "tool_alone": [{"seed": 0, "after": evaluation(tool0)}, {"seed": 1, "after": evaluation(tool1)}]}  # fmt: skip
    befores = {"team": evaluation([False] * 6), "tool_alone": evaluation([False] * 6)}
    assert merged["summary"] == learning_math.summarize(variants, befores)
    assert merged["summary"]["table"]["per_agent"]["successes"] == 6
    assert merged["summary"]["comparisons"]["per_agent vs tool_alone"]["pairs"] == 12
    assert (
        merged["settings"]["seeds"] == [0, 1] and "training seeds [0, 1]" in merged["settings"]["description"]
    )
    assert merged["wall_seconds"] == 180.0 and merged["result_name"] == "learning_math"
    assert [p["command"] for p in merged["parts"]] == [
        "python benchmarks/learning_math.py --seeds 0",
        "python benchmarks/learning_math.py --seeds 1",
    ]
    json.dumps(merged)  # it is written as JSON


@pytest.mark.parametrize(
    "spoil, message",
    [
        (lambda p: p["settings"].update(steps=9), "other settings than result 1: ['steps']"),
        (lambda p: p.update(partial=True), "result 2 is partial"),
        (lambda p: p["befores"]["team"]["solved"].update(p0=True), "'before' of team differs"),
        (
            lambda p: p["variants"]["per_agent"][0].update(seed=0),
            "seed 0 of per_agent is in more than one result",
        ),
        (lambda p: p.update(quick=True), "differs from result 1 in 'quick'"),
    ],
)
def test_results_that_are_not_other_seeds_of_one_comparison_are_refused(learning_math, spoil, message):
    first, second = (
        part(learning_math, 0, [True] * 6, [False] * 6),
        part(learning_math, 1, [True] * 6, [False] * 6),
    )
    spoil(second)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        learning_math.merge_results([first, second])


def test_the_command_line_names_a_bad_merge(learning_math, tmp_path):
    good = tmp_path / "a.json"
    good.write_text(json.dumps(part(learning_math, 0, [True] * 6, [False] * 6)))
    with pytest.raises(SystemExit, match="give at least two result files"):
        learning_math.main(["--merge", str(good), "--output-dir", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match=r"learning_math\.py --merge: .*missing\.json"):
        learning_math.main(
            ["--merge", str(good), str(tmp_path / "missing.json"), "--output-dir", str(tmp_path)]
        )


def test_the_merged_file_is_written_with_its_plot(learning_math, tmp_path):
    files = []
    for seed in (0, 1):
        path = tmp_path / f"s{seed}.json"
        path.write_text(json.dumps(part(learning_math, seed, [seed == 0] * 6, [False] * 6)))
        files.append(str(path))
    learning_math.main(["--merge", *files, "--output-dir", str(tmp_path / "out")])
    merged = json.loads((tmp_path / "out" / "learning_math.json").read_text())
    assert merged["summary"]["table"]["per_agent"]["successes"] == 6
    assert merged["merged_from"] == files
    assert (tmp_path / "out" / "learning_math.png").stat().st_size > 0


def with_config(run_part: dict, teammate: str) -> dict:
    """Record each run's config, as the benchmark does, with this team-credit teammate."""
    for runs in run_part["variants"].values():
        for run in runs:
            run["config"] = {
                "rollout": {"team_credit_teammate": teammate},
                "training": {"seed": run["seed"], "output_dir": f"/tmp/run-{run['seed']}"},
            }
    return run_part


def test_variants_can_be_taken_from_other_runs_when_their_configs_agree(learning_math, tmp_path):
    team, tool = [True, True, False, False, False, False], [True, False, False, False, False, False]
    old = [with_config(part(learning_math, seed, [False] * 6, tool), "sampled") for seed in (0, 1)]
    new = [with_config(part(learning_math, seed, team, tool), "auto") for seed in (0, 1)]
    for run_part in new:
        del run_part["variants"]["tool_alone"]
    merged = learning_math.merge_results([*old, *new], [{"tool_alone"}, {"tool_alone"}, None, None])
    assert merged["summary"]["table"]["per_agent"]["successes"] == 4  # the new runs' team, not the old
    assert merged["summary"]["table"]["tool_alone"]["successes"] == 2
    assert [p["variants"] for p in merged["parts"]] == [
        ["tool_alone"],
        ["tool_alone"],
        ["per_agent"],
        ["per_agent"],
    ]
    # Pooling one variant's seeds from runs with different configs is refused, naming the section.
    with pytest.raises(
        ValueError, match=r"seed 1 of per_agent \(result 2\) ran another config .*\['rollout'\]"
    ):
        learning_math.merge_results([new[0], old[1]])
    with pytest.raises(ValueError, match=r"result 1 has no \['shared'\]"):
        learning_math.merge_results(old, [{"shared"}, None])
    files = []
    for index, run_part in enumerate([*old, *new]):
        files.append(tmp_path / f"{index}.json")
        files[-1].write_text(json.dumps(run_part))
    args = [f"{files[0]}:tool_alone", f"{files[1]}:tool_alone", str(files[2]), str(files[3])]
    learning_math.main(["--merge", *args, "--output-dir", str(tmp_path / "out")])
    written = json.loads((tmp_path / "out" / "learning_math.json").read_text())
    assert written["summary"]["table"]["per_agent"]["successes"] == 4 and written["merged_from"] == args
    with pytest.raises(SystemExit, match=r"unknown variants \['team'\]; variants: per_agent"):
        learning_math.main(
            ["--merge", f"{files[0]}:team", str(files[1]), "--output-dir", str(tmp_path / "x")]
        )


def test_a_run_recorded_before_a_field_existed_pools_with_runs_at_its_default(learning_math):
    """The published results predate fields added since; at their defaults they are the same config."""
    from llm_zoo_train.config import Config, config_to_dict

    default = config_to_dict(Config())["rollout"]["team_credit_teammate"]
    old, new = (with_config(part(learning_math, seed, [True] * 6, [False] * 6), default) for seed in (0, 1))
    for runs in old["variants"].values():
        for run in runs:
            del run["config"]["rollout"]["team_credit_teammate"]  # recorded before the field existed
    assert learning_math.merge_results([old, new])["summary"]["table"]["per_agent"]["successes"] == 12
    changed = with_config(part(learning_math, 1, [True] * 6, [False] * 6), "not-the-default")
    with pytest.raises(ValueError, match=r"seed 1 of per_agent \(result 2\) ran another config"):
        learning_math.merge_results([old, changed])


def test_a_later_version_naming_more_variants_still_merges(learning_math):
    first, second = (part(learning_math, seed, [True] * 6, [False] * 6) for seed in (0, 1))
    first["labels"] = {k: v for k, v in first["labels"].items() if k != "plan_alone"}
    merged = learning_math.merge_results([first, second])
    assert "plan_alone" in merged["labels"]
    second["labels"] = {**second["labels"], "per_agent": "renamed"}
    with pytest.raises(ValueError, match="differs from result 1 in 'labels'"):
        learning_math.merge_results([first, second])
