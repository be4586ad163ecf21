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
from train_helpers import one_line_error, write_toy_config

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
    """Data parallel on CPU (gloo): each process rolls out its own tasks, gradients are summed;
    both end with identical adapters, they played disjoint tasks, and one checkpoint is written."""
    torch = pytest.importorskip("torch")
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
    assert rollouts == sorted(
        f"step_00000{s}-rank{r}{kind}.jsonl" for s in (1, 2) for r in (0, 1) for kind in ("", ".generations")
    )
    first, second = (
        (tmp_path / "run" / "rollouts" / f"step_000001-rank{r}.jsonl").read_text() for r in (0, 1)
    )
    assert first != second  # the processes played different tasks
    from llm_zoo_train.rollout.samples import read_jsonl
    from llm_zoo_train.runs.checkpoint import list_checkpoints, read_trainer_state

    for step in (1, 2):
        tasks = [
            {s.task_id for s in read_jsonl(tmp_path / "run" / "rollouts" / f"step_00000{step}-rank{r}.jsonl")}
            for r in (0, 1)
        ]
        assert tasks[0] and tasks[1] and not tasks[0] & tasks[1]  # disjoint tasks
    # One checkpoint, written once (by the main process), holding both processes' RNG states.
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["checkpoint-2"]
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(".")]
    assert read_trainer_state(tmp_path / "run" / "checkpoint-2")["num_processes"] == 2
    rng = torch.load(tmp_path / "run" / "checkpoint-2" / "rng_state.pt", weights_only=True)
    assert len(rng["ranks"]) == 2


_one_line_error = one_line_error


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--lora.r", "0"], "lora.r must be >= 1 (the LoRA rank, e.g. 8), got 0"),
        (["--agents.adapter_lora", "{bob: {r: 0}}"], "agents.adapter_lora.bob.r must be >= 1"),
        (
            ["--model.name_or_path", "/no/such/model_dir"],
            "model.name_or_path: no such directory /no/such/model_dir",
        ),
    ],
)
def test_bad_lora_rank_and_missing_model_path_are_one_line_errors(tmp_path, capsys, extra, message):
    import toy_envs_trainer  # noqa: F401

    config = write_toy_config(tmp_path / "no_model", tmp_path / "run", tmp_path / "c.yaml")
    assert main([str(config), *extra]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert message in line
    if "name_or_path" in message:
        assert "smollm2-135m-instruct" in line


def test_a_directory_that_is_not_a_model_is_a_one_line_error(tmp_path, capsys):
    import toy_envs_trainer  # noqa: F401

    (tmp_path / "not_a_model").mkdir()
    (tmp_path / "not_a_model" / "notes.txt").write_text("hello")
    config = write_toy_config(tmp_path / "not_a_model", tmp_path / "run", tmp_path / "c.yaml")
    assert main([str(config)]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "is a directory but not a model (no config.json)" in line and "smollm2-135m-instruct" in line


def test_unknown_lora_target_module_is_a_one_line_error(tiny_model_dir, tmp_path, capsys):
    import toy_envs_trainer  # noqa: F401

    config = write_toy_config(tiny_model_dir, tmp_path / "run", tmp_path / "c.yaml")
    assert main([str(config), "--lora.target_modules", "[q_proj, qkv_proj]"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "lora.target_modules: ['qkv_proj'] (adapter 'alice') are not modules of this model" in line
    assert "q_proj" in line and "'all-linear'" in line


def test_without_the_train_extra_the_cli_says_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)  # `import yaml` now fails as if PyYAML were missing
    for name in [m for m in sys.modules if m.startswith("llm_zoo_train.") and m != "llm_zoo_train.__main__"]:
        monkeypatch.delitem(sys.modules, name)
    assert main([str(tmp_path / "c.yaml")]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "missing module 'yaml'" in line and 'pip install "llm-zoo[train]"' in line


def test_a_new_run_refuses_a_non_empty_output_dir_unless_told_to_overwrite(tiny_model_dir, tmp_path, capsys):
    import toy_envs_trainer  # noqa: F401

    output = tmp_path / "run"
    config = write_toy_config(tiny_model_dir, output, tmp_path / "c.yaml")
    quick = ["--eval.num_episodes", "0"]
    assert main([str(config), *quick, "--training.max_steps", "2"]) == 0
    before = (output / "metrics.jsonl").read_text()
    assert main([str(config), *quick, "--training.max_steps", "1"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert (
        f"training.output_dir {output} is not empty (adapters, checkpoint-2, config.yaml, metrics.jsonl)"
        in line
    )
    assert "--resume" in line and "--training.overwrite_output_dir true" in line
    assert (output / "metrics.jsonl").read_text() == before  # nothing was touched

    (output / "notes.txt").write_text("mine")
    argv = [str(config), *quick, "--training.max_steps", "1", "--training.overwrite_output_dir", "true"]
    assert main(argv) == 0
    assert (
        "removed the earlier run's adapters, checkpoint-2, config.yaml, metrics.jsonl"
        in capsys.readouterr().out
    )
    # No stale checkpoint-2 beside the new checkpoint-1; files that are not run outputs are kept.
    assert sorted(p.name for p in output.iterdir()) == [
        "adapters",
        "checkpoint-1",
        "config.yaml",
        "metrics.jsonl",
        "notes.txt",
    ]


def test_resume_says_where_it_resumes_refuses_another_run_and_knows_a_finished_run(
    tiny_model_dir, tmp_path, capsys
):
    import toy_envs_trainer  # noqa: F401

    output = tmp_path / "run"
    config = write_toy_config(tiny_model_dir, output, tmp_path / "c.yaml")
    assert main([str(config), "--eval.num_episodes", "0", "--training.max_steps", "1"]) == 0
    capsys.readouterr()

    assert main([str(config), "--resume", "--eval.num_episodes", "0", "--rollout.temperature", "0.7"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "checkpoint-1 belongs to a different run: rollout.temperature 1.0 -> 0.7" in line

    assert main(["--resume", str(output)]) == 0  # its own config: max_steps 1, already done
    out = capsys.readouterr().out
    assert f"the run in {output} is finished: checkpoint-1 is step 1 of training.max_steps 1" in out
    assert "success rate" not in out

    assert main(["--resume", str(output), "--training.max_steps", "2"]) == 0
    out = capsys.readouterr().out
    assert (
        f"resuming from {output / 'checkpoint-1'} (step 1 of 2) with changed settings: training.max_steps"
        in out
    )
    assert (output / "checkpoint-2").is_dir()


def test_a_full_disk_while_checkpointing_is_a_one_line_error(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import errno

    import toy_envs_trainer  # noqa: F401
    from llm_zoo_train.runs import checkpoint

    def full_disk(directory, **kwargs):
        (directory / "optimizers.pt").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_training_state", full_disk)
    monkeypatch.setattr("llm_zoo_train.trainer_state.save_training_state", full_disk)
    config = write_toy_config(tiny_model_dir, tmp_path / "run", tmp_path / "c.yaml")
    assert main([str(config), "--eval.num_episodes", "0", "--training.max_steps", "1"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "checkpoint-1: no space left on device" in line and "--resume" in line
    assert not any(p.name.startswith(".tmp-") for p in (tmp_path / "run").iterdir())


def test_a_disk_full_before_the_first_step_names_the_file(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """At 0 bytes free the first write fails while writing an open file (config.yaml), whose
    OSError carries no file name: the line still names the file, not just the run's directory."""
    import errno
    import pathlib

    import toy_envs_trainer  # noqa: F401

    real_write = pathlib.Path.write_text

    def full_disk(self, data, *args, **kwargs):
        if self.name == "config.yaml" and self.parent == tmp_path / "run":
            raise OSError(errno.ENOSPC, "No space left on device")  # as a write or close raises it
        return real_write(self, data, *args, **kwargs)

    config = write_toy_config(tiny_model_dir, tmp_path / "run", tmp_path / "c.yaml")
    monkeypatch.setattr(pathlib.Path, "write_text", full_disk)
    assert main([str(config), "--eval.num_episodes", "0", "--training.max_steps", "1"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert f"cannot write {tmp_path / 'run' / 'config.yaml'}: No space left on device" in line, line


def test_accelerate_launch_cpu_with_two_processes_says_it_started_one(tiny_model_dir, tmp_path):
    from llm_zoo_train.runs.launch_check import process_count_warning, requested_processes

    assert (
        requested_processes(["/venv/bin/accelerate", "launch", "--cpu", "--num_processes", "2", "-m", "x"])
        == 2
    )
    assert requested_processes(["/venv/bin/accelerate", "launch", "--num_processes=3", "train.py"]) == 3
    assert requested_processes(["python", "-m", "llm_zoo_train", "c.yaml"]) is None
    assert requested_processes(["torchrun", "--nproc_per_node", "2", "x.py"]) is None
    assert process_count_warning(2, ["accelerate", "launch", "--num_processes", "2", "x.py"]) is None

    config = write_toy_config(tiny_model_dir, tmp_path / "run", tmp_path / "toy.yaml")
    launch = [_bin("accelerate"), "launch", "--cpu", "--num_processes", "2", "--num_machines", "1"]
    launch += ["--mixed_precision", "no", "--dynamo_backend", "no", "-m", "llm_zoo_train", str(config)]
    launch += ["--training.max_steps", "0", "--eval.num_episodes", "0"]
    result = subprocess.run(launch, capture_output=True, text=True, env=_env(), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "accelerate launch was asked for 2 processes but this run has 1" in result.stderr
    assert "ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 -m llm_zoo_train" in result.stderr


def test_a_run_stopped_before_its_first_checkpoint_is_not_sent_round_in_circles(
    tiny_model_dir, tmp_path, capsys
):
    """An outside fault matrix: a run killed before its first checkpoint left config.yaml and
    metrics.jsonl; the same command said "continue that run with --resume", and --resume said "no
    checkpoint to resume from". Both now name the way out, which works."""
    import toy_envs_trainer  # noqa: F401

    output = tmp_path / "run"
    config = write_toy_config(tiny_model_dir, output, tmp_path / "c.yaml")
    quick = ["--eval.num_episodes", "0", "--training.max_steps", "1"]
    output.mkdir()
    (output / "config.yaml").write_text("training: {}\n")
    (output / "metrics.jsonl").write_text('{"step": 0}\n')
    assert main([str(config), *quick]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "stopped before its first checkpoint" in line and "--training.overwrite_output_dir true" in line
    assert "--resume" not in line
    assert main([str(config), *quick, "--resume"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "no checkpoint to resume from" in line and "without --resume" in line
    assert main([str(config), *quick, "--training.overwrite_output_dir", "true"]) == 0
    assert (output / "checkpoint-1").is_dir()
