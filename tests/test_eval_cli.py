"""``llm-zoo-train eval`` on saved runs: output dirs, checkpoint dirs, configs, the role swap, bad input.

A one-step training run of the tiny model on the toy env ``test/Scripted-v0`` (alice is rewarded
for writing "a", bob for "b") gives a real output directory. The role swap is checked with a
scripted engine in place of the model, which answers "aaaa" as adapter ``alice`` and "bbbb" as
adapter ``bob``: any mix-up of adapters and roles changes the rewards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import toy_envs_trainer  # noqa: E402  (registers test/Scripted-v0)
from llm_zoo_train.__main__ import main as train_main  # noqa: E402
from llm_zoo_train.evaluation import cli as eval_cli  # noqa: E402
from llm_zoo_train.evaluation.cli import main  # noqa: E402
from llm_zoo_train.trainer import Trainer  # noqa: E402
from train_helpers import toy_config  # noqa: E402

TESTS = Path(__file__).parent
EPISODES = 3


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trained_run(tiny_model_dir, tmp_path_factory):
    """A run trained for one step, evaluated by the trainer at the end; returns (output dir, last metrics)."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("eval_cli")
    config = toy_config(
        tiny_model_dir,
        root / "run",
        [
            "--training.max_steps",
            "1",
            "--eval.num_episodes",
            str(EPISODES),
            "--eval.eval_on_start",
            "false",
            "--rollout.save_rollouts",
            "true",
        ],
    )
    trainer = Trainer(config)
    trainer.train()
    trainer.close()
    return root / "run", trainer.history[-1]


def _results(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_output_dir_reproduces_the_trainers_own_evaluation(trained_run, capsys):
    run, last = trained_run
    assert main([str(run), "--policies", "base,adapters"]) == 0
    out = capsys.readouterr().out
    assert "alice role / global" in out and f"/{EPISODES}" in out
    document = _results(run / "eval" / "eval_results.json")
    settings = document["settings"]
    assert settings["input"] == {"kind": "output_dir", "path": str(run)}
    assert settings["adapters"] == {name: str(run / "adapters" / name) for name in ("alice", "bob")}
    assert settings["policies"]["adapters"] == {"alice": "alice", "bob": "bob"}
    assert settings["policies"]["base"] == {"alice": None, "bob": None}
    assert list(settings["splits"]) == ["eval"] and settings["splits"]["eval"]["trainer_eval"]
    assert (
        settings["sampling"]["temperature"] == 1.0 and settings["config"]["env"]["id"] == "test/Scripted-v0"
    )
    assert settings["date"].startswith("20")
    rows = {row["policy"]: row for row in document["results"]}
    assert len(rows["base"]["episodes"]) == EPISODES
    # The same tasks, sampling seed and adapters as the trainer's evaluation: the same figures.
    result = rows["adapters"]["result"]
    assert result["success_rate"] == last["eval/success_rate"]
    assert result["format_ok_rate"] == last["eval/format_ok_rate"]
    for agent in ("alice", "bob"):
        assert result["mean_rewards"][agent] == pytest.approx(last[f"eval/{agent}/reward"])
        assert set(result) >= {"mean_role_rewards", "mean_global_rewards", "mean_turns", "ci_low", "ci_high"}


def test_checkpoint_dir_and_config_inputs(trained_run, tmp_path, capsys):
    run, _ = trained_run
    checkpoint = run / "checkpoint-1"
    assert main([str(checkpoint), "--splits", "train", "--eval.num_episodes", "2"]) == 0
    document = _results(checkpoint / "eval" / "eval_results.json")
    assert document["settings"]["input"]["kind"] == "checkpoint"
    assert document["settings"]["adapters"]["alice"] == str(checkpoint / "adapters" / "alice")
    train = document["settings"]["splits"]["train"]
    assert not train["trainer_eval"] and len(train["seeds"]) == 2
    # the 'train' split of a seed-generated env is the tasks of the first training step
    samples = [json.loads(line) for line in (run / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    trained_tasks = list(dict.fromkeys(s["task_id"] for s in sorted(samples, key=lambda s: s["env_index"])))
    assert [f"seed-{seed}" for seed in train["seeds"]] == trained_tasks[:2]
    assert [(r["policy"], r["split"]) for r in document["results"]] == [("adapters", "train")]

    config = checkpoint / "config.yaml"  # its training.output_dir is the run
    output = tmp_path / "from_config.json"
    assert main([str(config), "--eval.num_episodes", "1", "--output", str(output)]) == 0
    document = _results(output)
    assert document["settings"]["input"] == {"kind": "config", "path": str(config)}
    assert document["settings"]["adapters"]["bob"] == str(run / "adapters" / "bob")
    capsys.readouterr()


def _scripted_engine(loaded):
    def fake_local_engine(config, adapters):
        loaded.append(dict(adapters))
        answers = {"alice": "aaaa", "bob": "bbbb"}
        return toy_envs_trainer.ScriptedEngine(script=lambda prompt, adapter, index: answers.get(adapter, ""))

    return fake_local_engine


def test_role_swap_plays_each_adapter_in_the_other_role(trained_run, tmp_path, monkeypatch, capsys):
    run, _ = trained_run
    loaded: list[dict] = []
    monkeypatch.setattr(eval_cli, "local_engine", _scripted_engine(loaded))
    output = tmp_path / "swap.json"
    assert main([str(run), "--policies", "base,adapters,swap", "--output", str(output)]) == 0
    assert list(loaded[0]) == ["alice", "bob"]
    rows = {row["policy"]: row for row in _results(output)["results"]}
    assert rows["swap"]["agents"] == {"alice": "bob", "bob": "alice"}
    adapters, swap, base = (rows[p]["result"] for p in ("adapters", "swap", "base"))
    # Own adapters: alice writes "aaaa" (fraction of a's = 1), bob "bbbb": both >= 0.5 -> success.
    assert adapters["success_rate"] == 1.0 and adapters["mean_role_rewards"] == {"alice": 1.0, "bob": 1.0}
    assert adapters["mean_global_rewards"] == {"alice": 0.0, "bob": 1.0}  # alice acts before bob succeeds
    # Swapped: alice writes "bbbb", bob "aaaa": neither writes its own letter.
    assert swap["success_rate"] == 0.0 and swap["mean_role_rewards"] == {"alice": 0.0, "bob": 0.0}
    # Base (no adapter): the script answers "" -> format penalty.
    assert base["format_ok_rate"] == 0.0 and base["mean_role_rewards"] == {"alice": -0.5, "bob": -0.5}
    out = capsys.readouterr().out
    assert "swap" in out and "100.0%" in out


def test_adapters_of_another_run_play_beside_the_inputs(trained_run, tmp_path, monkeypatch, capsys):
    """The "trained apart, then combined" control: --adapter NAME=DIR replaces one of the input's
    adapters by a directory from elsewhere (here a copy of the input's own bob, standing in for a
    bob trained in another run), and the policies load it under that name."""
    import shutil

    run, _ = trained_run
    elsewhere = tmp_path / "other_run" / "adapters" / "bob"
    shutil.copytree(run / "adapters" / "bob", elsewhere)
    loaded: list[dict] = []
    monkeypatch.setattr(eval_cli, "local_engine", _scripted_engine(loaded))
    output = tmp_path / "combined.json"
    assert main([str(run), "--adapter", f"bob={elsewhere}", "--output", str(output)]) == 0
    assert loaded[0] == {"alice": run / "adapters" / "alice", "bob": elsewhere}
    document = _results(output)
    assert document["settings"]["adapters"] == {
        "alice": str(run / "adapters" / "alice"),
        "bob": str(elsewhere),
    }
    assert document["results"][0]["result"]["success_rate"] == 1.0
    for bad, message in (("bob", "expected NAME=DIR"), (f"bob={tmp_path}", "holds no PEFT adapter")):
        assert main([str(run), "--adapter", bad]) == 2
        assert message in capsys.readouterr().err


@pytest.fixture
def no_model_loading(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded although the input is bad")

    monkeypatch.setattr(eval_cli, "local_engine", forbidden)


def test_bad_inputs_give_one_line_errors(trained_run, tmp_path, capsys, no_model_loading):
    run, _ = trained_run
    (tmp_path / "empty").mkdir()
    no_adapters = tmp_path / "no_adapters.yaml"
    config = yaml.safe_load((run / "checkpoint-1" / "config.yaml").read_text())
    config["training"]["output_dir"] = str(tmp_path / "never_trained")
    no_adapters.write_text(yaml.safe_dump(config))
    shared = tmp_path / "shared_run"
    shutil.copytree(run / "checkpoint-1", shared / "checkpoint-1")
    shutil.copytree(run / "adapters" / "alice", shared / "adapters" / "shared")
    config["agents"]["adapters"] = "shared"
    (shared / "checkpoint-1" / "config.yaml").write_text(yaml.safe_dump(config))
    cases = [
        ([str(tmp_path / "missing")], "missing: no such file or directory"),
        ([str(tmp_path / "empty")], "holds no config.yaml and no checkpoint-N/config.yaml"),
        ([], "give a run's output dir"),
        ([str(no_adapters), "--policies", "adapters"], "need the saved adapters ['alice', 'bob']"),
        ([str(no_adapters), "--policies", "swap"], "has none (missing ['alice', 'bob'])"),
        ([str(shared), "--policies", "swap"], "two distinct adapters (or served models); here: alice -> shared, bob -> shared"),
        ([str(run), "--agents.adapters", "{alice: a, carol: b}"], "not agents of test/Scripted-v0 ['carol']"),
        ([str(run), "--agent-model", "alice=x"], "--served-model and --agent-model need --endpoint"),
        ([str(run), "--splits", "dev"], "unknown split 'dev'; choose from eval, train, test, impossible"),
        ([str(run), "--eval.num_epsiodes", "3"], "unknown config key 'eval.num_epsiodes'"),
        ([str(run), "--verbose"], "unrecognized arguments: --verbose"),
        ([str(run), "stray"], "unrecognized arguments: stray"),
    ]  # fmt: skip
    for args, message in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert message in err, (args, err)
        assert "Traceback" not in err and err.splitlines()[0].startswith("llm-zoo-train eval: error: ")


def test_dispatch_from_the_training_command_and_python_m(trained_run, capsys):
    assert train_main(["eval", "--help"]) == 0
    assert "--policies" in capsys.readouterr().out
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    script = Path(sys.executable).parent / "llm-zoo-train"
    result = subprocess.run(
        [str(script) if script.exists() else "llm-zoo-train", "eval", "no/such/run"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and "no/such/run: no such file or directory" in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "llm_zoo_train.evaluation.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and "--served-model" in result.stdout
