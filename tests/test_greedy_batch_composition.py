"""benchmarks/greedy_batch_composition.py: how flips and differing completions are counted, and a smoke run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def benchmark(monkeypatch):
    pytest.importorskip("llm_zoo_train.trainer", reason="the trainer is not installed")
    import importlib

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delitem(sys.modules, "greedy_batch_composition", raising=False)
    return importlib.import_module("greedy_batch_composition")


def test_compare_counts_flips_and_differing_completions(benchmark):
    reference = {"successes": 2, "wall_seconds": 10.0, "solved": {"a": True, "b": True, "c": False},
                 "texts": {"p1": "x", "p2": "y", "p3": "z"}}  # fmt: skip
    run = {"successes": 2, "wall_seconds": 25.0, "solved": {"a": True, "b": False, "c": True},
           "texts": {"p1": "x", "p2": "y2", "p4": "w"}}  # fmt: skip
    row = benchmark.compare(run, reference)
    assert row["outcome_flips"] == 2 and row["flipped_problems"] == ["b", "c"]
    assert (row["gained"], row["lost"]) == (1, 1)
    assert (row["prompts_compared"], row["completions_differing"], row["prompts_only_here"]) == (2, 1, 1)
    assert row["time_ratio_to_reference"] == 2.5


@pytest.mark.slow
def test_quick_run_writes_every_composition(benchmark, tmp_path):
    benchmark.main(["--quick", "--output-dir", str(tmp_path), "--batch-sizes", "1", "--repeat"])
    result = json.loads((tmp_path / "greedy_batch_composition.json").read_text())
    assert set(result["comparisons"]) == {"batch_1", "shuffled", "natural_again"}
    assert result["comparisons"]["natural_again"]["outcome_flips"] == 0  # one composition, one result
    assert result["comparisons"]["natural_again"]["completions_differing"] == 0
    assert (tmp_path / "greedy_batch_composition.png").stat().st_size > 0
