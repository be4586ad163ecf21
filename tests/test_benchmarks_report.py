"""benchmarks/RESULTS.md stays true to the JSON results it is generated from."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import report  # noqa: E402
import reporting.format  # noqa: E402
import reporting.learning  # noqa: E402
import reporting.rewards  # noqa: E402
import reproduce_paper  # noqa: E402


def test_results_md_is_generated_from_the_committed_results():
    assert (BENCHMARKS / "RESULTS.md").read_text() == report.render(), (
        "benchmarks/RESULTS.md is out of date: run `python benchmarks/report.py`"
    )


@pytest.mark.parametrize("name", [name for name, _, _ in report.SECTIONS])
def test_every_published_result_is_summarized_with_its_plot(name):
    path = BENCHMARKS / "results" / f"{name}.json"
    if not path.exists():
        assert name in report.NOT_RUN or f"benchmarks/{name}.py" in report.render()
        return
    result = json.loads(path.read_text())
    assert not result.get("quick"), f"{path.name} holds a --quick smoke run, not published figures"
    formatter = next(f for n, _, f in report.SECTIONS if n == name)
    text = formatter(result)
    assert "could not be summarized" not in text and "|" in text
    assert reporting.format.created(result), f"{path.name} lacks its date: rerun the benchmark"
    for key in ("command", "machine"):
        assert key in result, f"{path.name} lacks {key!r}: rerun the benchmark"
    assert (BENCHMARKS / "results" / f"{name}.png").exists(), f"{name}.png missing"


def test_reproduce_paper_reads_evaluations_from_metrics(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 0, "eval/success_rate": 0.25, "eval/success_ci_low": 0.1, "eval/success_ci_high": 0.5,
         "eval/num_episodes": 8},
        {"step": 1, "train/loss": 0.3},
        {"step": 2, "eval/success_rate": 0.75, "eval/success_ci_low": 0.4, "eval/success_ci_high": 0.9,
         "eval/num_episodes": 8},
    ]  # fmt: skip
    metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
    evals = reproduce_paper.evaluations(metrics)
    assert [e["step"] for e in evals] == [0, 2]
    assert evals[1] == {"step": 2, "success_rate": 0.75, "ci_low": 0.4, "ci_high": 0.9, "episodes": 8}


def test_reproduce_paper_rejects_malformed_overrides_and_rows():
    assert reproduce_paper.parse_overrides(["training.max_steps=3"]) == {"training.max_steps": "3"}
    with pytest.raises(SystemExit, match=r"section\.field=VALUE"):
        reproduce_paper.parse_overrides(["training.max_steps"])
    with pytest.raises(SystemExit):
        reproduce_paper.main(["--rows", "chess"])


def test_reproduce_paper_configs_exist_and_validate():
    from llm_zoo_train.config import load_config, validate

    for row in reproduce_paper.ROWS.values():
        config = load_config(BENCHMARKS.parent / row["config"], [])
        validate(config)
        assert config.model.name_or_path == "Qwen/Qwen3-1.7B"
        assert config.agents.adapters == "per_agent"


def test_the_paired_math_comparison_is_summarized_with_its_p_values():
    evaluation = {"success_rate": 0.25, "ci_low": 0.1, "ci_high": 0.5, "successes": 1, "num_episodes": 4}
    row = {"successes": 3, "episodes": 8, "success_rate": 0.375, "ci_low": 0.1, "ci_high": 0.7,
           "per_seed": [0.25, 0.5], "seeds": [0, 1]}  # fmt: skip
    paired = {"pairs": 8, "both": 1, "only_a": 2, "only_b": 1, "neither": 4, "success_a": 0.375,
              "success_b": 0.25, "p_value": 1.0}  # fmt: skip
    result = {
        "settings": {"description": "tiny", "config_file": "examples/x.yaml", "threads": 1},
        "labels": {"per_agent": "team", "tool_alone": "tool agent alone"},
        "before_of": {"per_agent": "team", "tool_alone": "tool_alone"},
        "befores": {"team": evaluation},
        "variants": {"per_agent": [{"seed": 0, "wall_seconds": 60.0}], "tool_alone": [{"seed": 0}]},
        "summary": {
            "table": {"per_agent": row, "tool_alone": row},
            "comparisons": {"per_agent vs tool_alone": paired},
            "verdict": {"team above the tool agent alone's interval": False, "met": False},
        },
    }
    text = reporting.learning.learning_math(result)
    # No per-step history in this result: its budget columns say so.
    assert "| team | 25.0% (10.0-50.0, 1/4) | 37.5% (10.0-70.0, 3/8) | 25.0%, 50.0% | - | - | 1.0 |" in text
    assert "| tool agent alone | - |" in text
    assert "| per_agent vs tool_alone | 8 | 2 | 1 | 1 |" in text and "**not met**" in text


def test_the_reward_hack_search_benchmark_reports_time_and_margins(tmp_path):
    import reward_hack_search

    result = reward_hack_search.main(["--env", "Math-v0", "--repeats", "1", "--output-dir", str(tmp_path)])
    entry = result["envs"]["Math-v0"]
    assert entry["violations"] == 0 and entry["episodes"] > 10 and entry["seconds"] > 0
    # solving pays more than anything else the search tried
    assert entry["worst_succeeding"]["team"] > entry["best_failing"]["team"]
    text = reporting.rewards.reward_hack_search(
        json.loads((tmp_path / "reward_hack_search.json").read_text())
    )
    assert "| Math-v0 |" in text and (tmp_path / "reward_hack_search.png").exists()
    with pytest.raises(SystemExit):
        reward_hack_search.main(["--env", "Nope-v0", "--output-dir", str(tmp_path)])


@pytest.mark.parametrize("name", ["trainer_vs_trl", "rollout_speed"])
def test_the_decode_attention_choice_is_reported_where_recorded(name):
    result = json.loads((BENCHMARKS / "results" / f"{name}.json").read_text())
    formatter = next(f for n, _, f in report.SECTIONS if n == name)
    result.pop("decode_attention_choices", None)
    assert "A decode step's attention" not in formatter(result)
    result["decode_attention_choices"] = {
        "cpu/float32": {"kernel": "grouped", "sdpa_s": 0.0013, "grouped_s": 0.0011}
    }
    assert (
        "A decode step's attention (measured on this machine): float32 grouped products (1300 us a layer sdpa, 1100 us grouped)."
        in formatter(result)
    )


def test_the_update_lora_choice_is_reported_where_recorded():
    result = json.loads((BENCHMARKS / "results" / "trainer_vs_trl.json").read_text())
    formatter = next(f for n, _, f in report.SECTIONS if n == "trainer_vs_trl")
    result.pop("update_lora_choices", None)
    assert "Its LoRA products" not in formatter(result)
    result["update_lora_choices"] = [
        {"layers": [[576, 576, 8]], "rank_rows": True, "peft_s": 0.097, "rank_rows_s": 0.068}
    ]
    assert "Its LoRA products: the rank as the rows (68 ms a pass, peft's 97 ms)." in formatter(result)


def test_the_math_comparison_shows_budgets_and_each_seeds_paired_test():
    step = {"a/completion_length": 10.0, "a/samples": 8.0, "b/completion_length": 5.0, "b/samples": 8.0,
            "rollout/lookahead_tokens": 20.0, "update/a/samples": 6.0, "update/b/samples": 2.0}  # fmt: skip
    run = {"seed": 0, "wall_seconds": 60.0, "history": [step, step]}
    row = {
        "successes": 1,
        "episodes": 2,
        "success_rate": 0.5,
        "ci_low": 0.1,
        "ci_high": 0.9,
        "per_seed": [0.5],
    }
    paired = {"pairs": 2, "only_a": 1, "only_b": 0, "p_value": 1.0,
              "per_seed": [{"seed": 0, "only_a": 1, "only_b": 0, "p_value": 1.0}]}  # fmt: skip
    result = {
        "labels": {"per_agent": "team"}, "before_of": {"per_agent": "team"}, "befores": {},
        "variants": {"per_agent": [run]},
        "settings": {"description": "tiny", "config_file": "x.yaml", "threads": 1},
        "summary": {"table": {"per_agent": row}, "comparisons": {"per_agent vs tool_alone": paired},
                    "verdict": {"met": False}},
    }  # fmt: skip
    text = reporting.learning.learning_math(result)
    # (10*8 + 5*8 + 20) tokens a step, two steps: 280 tokens; 8 samples trained a step.
    assert "| 0.3k | 16 | 1.0 |" in text, text
    assert "| per_agent vs tool_alone | 2 | 1 | 0 | 1 | 0: 1/0, p=1 |" in text, text
