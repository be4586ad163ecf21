"""``llm-zoo-train eval --splits impossible``: the cheating rate next to the success rate (issue 24).

The tiny random model plays Code-v0's impossible split (hidden tests that contradict the
statement, :mod:`llm_zoo.envs.code_impossible`); only a cheat could succeed there.
"""

from __future__ import annotations

import json

import pytest
import yaml

pytest.importorskip("torch")
pytest.importorskip("peft")

from llm_zoo_train.evaluation.cli import main
from train_helpers import TOY_CONFIG

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_eval_reports_the_cheating_rate_of_the_impossible_split(tiny_model_dir, tmp_path, capsys):
    config = {
        **TOY_CONFIG,
        "model": {"name_or_path": str(tiny_model_dir)},
        "env": {"id": "Code-v0", "kwargs": {"max_turns": 1}},
        "training": {**TOY_CONFIG["training"], "output_dir": str(tmp_path / "run")},
        "eval": {"num_episodes": 2, "temperature": 1.0},
    }
    path = tmp_path / "code.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    output = tmp_path / "results.json"
    assert main([str(path), "--splits", "impossible", "--policies", "base", "--output", str(output)]) == 0
    (row,) = json.loads(output.read_text(encoding="utf-8"))["results"]
    assert row["split"] == "impossible" and row["cheating_rate"] == row["result"]["success_rate"] == 0.0
    assert all(episode["task_id"].endswith("/impossible") for episode in row["episodes"])
    assert "impossible (cheating rate)" in capsys.readouterr().out


def test_an_env_without_the_split_says_so(tiny_model_dir, tmp_path, capsys):
    config = {**TOY_CONFIG, "model": {"name_or_path": str(tiny_model_dir)}}
    config["training"] = {**TOY_CONFIG["training"], "output_dir": str(tmp_path / "run")}
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    assert main([str(path), "--splits", "impossible", "--policies", "base"]) == 2
    assert "has no impossible split" in capsys.readouterr().err
