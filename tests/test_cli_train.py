"""The command line: help, early config errors, and full runs under ``accelerate launch``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from llm_zoo_train.__main__ import main
from train_helpers import write_toy_config

TESTS = Path(__file__).parent


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"  # the tiny model is fastest single-threaded on a shared machine
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def _bin(name):
    found = Path(sys.executable).parent / name
    return str(found) if found.exists() else shutil.which(name)


def test_help_lists_every_field(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: llm-zoo-train" in out and "--resume [DIR]" in out
    for key in (
        "--model.name_or_path",
        "--env.kwargs",
        "--agents.frozen",
        "--lora.r",
        "--rollout.num_generations",
        "--algorithm.loss_type",
        "--training.learning_rate",
        "--eval.eval_steps",
        "--logging.log_with",
    ):
        assert key in out


@pytest.fixture
def no_model_loading(monkeypatch):
    """Fail the test if anything tries to load a model."""
    import llm_zoo_train.policy

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded although the config is bad")

    monkeypatch.setattr(llm_zoo_train.policy, "load_base_model", forbidden)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--rollout.num_generaions", "4"], "unknown config key 'rollout.num_generaions'"),
        (["--training.max_steps", "many"], "training.max_steps: expected int, got 'many'"),
        (["--env.id", "Nope-v0"], "no environment registered with id 'Nope-v0'"),
        (["--agents.adapters", "{alice: a}"], "missing ['bob']"),
        (["stray"], "unexpected argument 'stray'"),
    ],
)
def test_bad_config_fails_before_any_model_loads(tmp_path, capsys, no_model_loading, extra, message):
    import toy_envs_trainer  # noqa: F401

    config = write_toy_config(tmp_path / "no_model", tmp_path / "run", tmp_path / "c.yaml")
    assert main([str(config), *extra]) == 2
    err = capsys.readouterr().err
    assert "llm-zoo-train: error:" in err and message in err
    assert not (tmp_path / "run").exists()


def test_missing_config_and_missing_checkpoint(tmp_path, capsys, no_model_loading):
    assert main([]) == 2
    assert "give a CONFIG.yaml" in capsys.readouterr().err
    assert main(["--resume", str(tmp_path)]) == 2
    assert "no checkpoint to resume from" in capsys.readouterr().err


def test_print_config(tmp_path, capsys, no_model_loading):
    import yaml

    import toy_envs_trainer  # noqa: F401

    config = write_toy_config(tmp_path / "no_model", tmp_path / "run", tmp_path / "c.yaml")
    assert main([str(config), "--print-config", "--rollout.num_generations", "6"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["rollout"]["num_generations"] == 6 and printed["env"]["id"] == "test/Scripted-v0"


def test_console_script_rejects_a_bad_config(tmp_path):
    config = write_toy_config(tmp_path / "no_model", tmp_path / "run", tmp_path / "c.yaml")
    result = subprocess.run(
        [_bin("llm-zoo-train"), str(config), "--lora.rank", "4"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert result.returncode == 2
    assert "unknown config key 'lora.rank'" in result.stderr


def test_accelerate_launch_two_steps_then_resume_with_the_console_script(tiny_model_dir, tmp_path):
    output = tmp_path / "run"
    config = write_toy_config(tiny_model_dir, output, tmp_path / "toy.yaml")
    launch = [
        _bin("accelerate"),
        "launch",
        "--cpu",
        "--num_processes",
        "1",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        "llm_zoo_train",
        str(config),
        "--training.max_steps",
        "2",
        "--logging.plot",
        "true",
    ]
    result = subprocess.run(launch, capture_output=True, text=True, env=_env(), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "success rate before training:" in result.stdout
    assert "success rate after training:" in result.stdout
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert "eval/success_rate" in records[0] and "eval/success_rate" in records[-1]
    assert "alice/reward" in records[1] and "update/bob/loss" in records[2]
    assert (output / "learning_curve.png").stat().st_size > 10_000
    assert (output / "checkpoint-2" / "trainer_state.json").is_file()
    for agent in ("alice", "bob"):
        assert (output / "adapters" / agent / "adapter_model.safetensors").is_file()

    resume = [_bin("llm-zoo-train"), "--resume", str(output), "--training.max_steps", "3"]
    result = subprocess.run(resume, capture_output=True, text=True, env=_env(), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "changed settings: training.max_steps" in result.stdout
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert (output / "checkpoint-3" / "trainer_state.json").is_file()


@pytest.mark.slow
def test_two_cpu_processes_keep_identical_adapters(tiny_model_dir, tmp_path):
    """Data parallel on CPU (gloo): each process rolls out its own tasks, gradients are summed."""
    config = write_toy_config(tiny_model_dir, tmp_path / "run", tmp_path / "toy.yaml")
    script = tmp_path / "check.py"
    script.write_text(
        "import hashlib, sys\n"
        "from llm_zoo_train.config import load_config\n"
        "from llm_zoo_train.trainer import Trainer\n"
        f"config = load_config({str(config)!r}, ['--training.max_steps', '2', '--eval.num_episodes', '2',"
        " '--rollout.save_rollouts', 'true'])\n"
        "trainer = Trainer(config)\n"
        "trainer.train()\n"
        "digest = hashlib.sha256()\n"
        "for name in trainer.plan.adapters:\n"
        "    for value in trainer.policy.adapter_state_dict(name).values():\n"
        "        digest.update(value.numpy().tobytes())\n"
        "print('RANK', trainer.accelerator.process_index, trainer.accelerator.num_processes, digest.hexdigest())\n"
    )
    env = _env()
    env["ACCELERATE_USE_CPU"] = "1"
    command = [_bin("torchrun"), "--nproc_per_node", "2", str(script)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = sorted(line.split()[1:] for line in result.stdout.splitlines() if line.startswith("RANK"))
    assert [r[:2] for r in ranks] == [["0", "2"], ["1", "2"]]
    assert ranks[0][2] == ranks[1][2]  # identical adapters on both processes
    rollouts = sorted(p.name for p in (tmp_path / "run" / "rollouts").iterdir())
    assert rollouts == [f"step_00000{s}-rank{r}.jsonl" for s in (1, 2) for r in (0, 1)]
    first, second = (
        (tmp_path / "run" / "rollouts" / f"step_000001-rank{r}.jsonl").read_text() for r in (0, 1)
    )
    assert first != second  # the processes played different tasks
