"""``training.strategy: fsdp2`` (issue 55): the toy job under ``torchrun --nproc_per_node 2`` on
CPU + gloo, against ddp's run, through checkpoints, a kill -9 and resumes under either strategy."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

from train_helpers import write_toy_config  # noqa: E402

TESTS = Path(__file__).parent
#: ddp and fsdp2 sum the same gradients in another order: float32 rounding, after Adam's
#: sign-like first steps, stays far below this; a wrong gradient or a lost update moves a
#: weight by a learning rate (0.02).
TOLERANCE = 1e-4

#: Runs the CLI's main, killing rank 0 with SIGKILL right after the checkpoint of step KILL_AT.
_KILLING_MAIN = """
import os, signal, sys
import llm_zoo_train.trainer as trainer_module
from llm_zoo_train.__main__ import main

saved = trainer_module.save_trainer_checkpoint
def save_then_die(trainer, *args, **kwargs):
    path = saved(trainer, *args, **kwargs)
    if trainer.step == int(os.environ["KILL_AT"]) and trainer.accelerator.process_index == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return path
trainer_module.save_trainer_checkpoint = save_then_die
sys.exit(main(sys.argv[1:]))
"""


def _torchrun(config: Path, *overrides: str, script: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", ACCELERATE_USE_CPU="1", KILL_AT="2")
    launcher = Path(sys.executable).parent / "torchrun"
    command = [str(launcher if launcher.exists() else shutil.which("torchrun")), "--nproc_per_node", "2"]
    command += [str(script)] if script is not None else ["-m", "llm_zoo_train"]
    command += [str(config), "--eval.num_episodes", "2", "--training.save_steps", "1", *overrides]
    # Its own process group: a run stuck in a collective is killed whole, workers included.
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            pytest.fail(f"torchrun did not finish in 300 s (a collective mismatch?):\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def _weights(adapters: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {
        f"{agent}/{key}": value
        for agent in ("alice", "bob")
        for key, value in load_file(adapters / agent / "adapter_model.safetensors").items()
    }


def _largest_difference(a: Path, b: Path) -> float:
    first, second = _weights(a), _weights(b)
    assert first.keys() == second.keys()
    return max(float((first[k] - second[k]).abs().max()) for k in first)


def _under_both_strategies(config: Path, output_root: Path, *overrides: str) -> dict[str, str]:
    """The job of ``config`` with ``overrides`` under ddp and under fsdp2 (2 processes each), into
    ``output_root/<strategy>``; each run's stdout by strategy."""
    return {
        strategy: _ok(
            _torchrun(
                config,
                *overrides,
                "--training.strategy",
                strategy,
                "--training.output_dir",
                str(output_root / strategy),
            )
        )
        for strategy in ("ddp", "fsdp2")
    }


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """The toy job, 3 steps, 2 processes: under ddp, and under fsdp2 (full sharding)."""
    root = tmp_path_factory.mktemp("fsdp2")
    config = write_toy_config(tiny_model_dir, root / "unused", root / "toy.yaml")
    stdouts = _under_both_strategies(config, root, "--training.max_steps", "3")
    return {
        "root": root,
        "config": config,
        **{f"{strategy}_stdout": out for strategy, out in stdouts.items()},
    }


def test_fsdp2_trains_the_adapters_ddp_trains(runs):
    root = runs["root"]
    assert "(2 processes x 8, fsdp2 fully sharded)" in runs["fsdp2_stdout"]
    assert "(2 processes x 8, ddp)" in runs["ddp_stdout"]
    # Every weight moved (a unit whose optimizer held a stale copy kept its start, as lm_head's did).
    start = _weights(root / "fsdp2" / "checkpoint-1" / "adapters")
    end = _weights(root / "fsdp2" / "adapters")
    assert all(float((end[k] - start[k]).abs().max()) > 1e-3 for k in end if "lora_B" in k)
    assert _largest_difference(root / "ddp" / "adapters", root / "fsdp2" / "adapters") < TOLERANCE
    # the same rollouts: the step lines agree (the timing at their end aside)
    steps = {
        s: [
            line.split(" | clip")[0]
            for line in runs[f"{s}_stdout"].splitlines()
            if line.startswith("step ") and " | " in line
        ]
        for s in ("ddp", "fsdp2")
    }
    assert len(steps["fsdp2"]) == 3 and steps["ddp"] == steps["fsdp2"]


def test_the_adapters_load_in_plain_peft(runs, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(
        base, runs["root"] / "fsdp2" / "adapters" / "alice", adapter_name="alice"
    )
    saved = _weights(runs["root"] / "fsdp2" / "adapters")
    loaded = {k: v for k, v in model.named_parameters() if ".lora_B.alice." in k}
    assert loaded and all(float(v.abs().max()) > 0 for v in loaded.values())
    key = next(k for k in saved if k.startswith("alice/") and "lm_head.lora_B" in k)
    assert torch.equal(saved[key], next(v for k, v in loaded.items() if "lm_head" in k).detach())


def test_a_killed_fsdp2_run_resumes_exactly(runs, tmp_path):
    """kill -9 right after the checkpoint of step 2, then --resume: the same adapters, bit for bit."""
    output = tmp_path / "killed"
    common = (
        "--training.max_steps",
        "3",
        "--training.strategy",
        "fsdp2",
        "--training.output_dir",
        str(output),
    )
    script = tmp_path / "killing_main.py"
    script.write_text(_KILLING_MAIN)
    killed = _torchrun(runs["config"], *common, script=script)
    assert killed.returncode != 0
    assert (output / "checkpoint-2").is_dir() and not (output / "checkpoint-3").exists()
    _ok(_torchrun(runs["config"], *common, "--resume"))
    assert _largest_difference(runs["root"] / "fsdp2" / "adapters", output / "adapters") == 0.0


@pytest.mark.parametrize(("written", "resumed"), [("fsdp2", "ddp"), ("ddp", "fsdp2")])
def test_a_checkpoint_resumes_under_the_other_strategy(runs, tmp_path, written, resumed):
    output = tmp_path / "run"
    shutil.copytree(runs["root"] / written / "checkpoint-1", output / "checkpoint-1")
    shutil.copy(runs["root"] / written / "config.yaml", output / "config.yaml")
    stdout = _ok(
        _torchrun(
            runs["config"],
            "--training.max_steps",
            "3",
            "--training.strategy",
            resumed,
            "--training.output_dir",
            str(output),
            "--resume",
        )
    )
    assert f"resuming under {resumed if resumed == 'ddp' else 'fsdp2/full'}" in stdout
    assert _largest_difference(runs["root"] / resumed / "adapters", output / "adapters") < TOLERANCE


def test_no_shard_trains_the_same_adapters(runs, tmp_path):
    output = tmp_path / "no_shard"
    overrides = ("--training.strategy", "fsdp2", "--training.fsdp_sharding", "no_shard")
    stdout = _ok(
        _torchrun(
            runs["config"], *overrides, "--training.max_steps", "3", "--training.output_dir", str(output)
        )
    )
    assert "fsdp2 not sharded (no_shard)" in stdout
    assert _largest_difference(runs["root"] / "ddp" / "adapters", output / "adapters") < TOLERANCE


def test_fsdp2_with_one_process_is_a_one_line_error(tiny_model_dir, tmp_path, capsys):
    import toy_envs_trainer  # noqa: F401
    from llm_zoo_train.__main__ import main

    config = write_toy_config(tiny_model_dir, tmp_path / "run", tmp_path / "c.yaml")
    assert main([str(config), "--training.strategy", "fsdp2"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "training.strategy 'fsdp2' shards the model across trainer processes and this run has one" in err
    assert not (tmp_path / "run" / "checkpoint-1").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["--training.fsdp_sharding", "no_shard"],
            "training.fsdp_sharding 'no_shard' applies to training.strategy 'fsdp2'",
        ),
        (["--training.strategy", "fsdp2", "--training.update_kernel", "onednn"], "update_kernel 'onednn'"),
        (["--training.strategy", "fsdp2", "--rollout.async_steps", "1"], "with rollout.async_steps > 0"),
        (["--training.strategy", "fsdp"], "training.strategy"),
    ],
)
def test_bad_strategy_settings_are_config_errors(tiny_model_dir, tmp_path, overrides, message):
    from llm_zoo_train.config import ConfigError, load_config, validate

    config = write_toy_config(tiny_model_dir, tmp_path / "run", tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match=message):
        validate(load_config(config, overrides))


def test_two_base_models_train_under_fsdp2_as_under_ddp(runs, tmp_path):
    """agents.base_models: alice on the tiny Llama, bob on a tiny GPT-2, each sharded on its own.
    GPT-2's dropout is turned off: fsdp2's padding and unshared prompt passes draw other dropout
    masks than ddp's passes, so with dropout the runs agree only in distribution."""
    import json

    from test_base_models import build_tiny_gpt2_dir, two_model_overrides

    gpt2 = build_tiny_gpt2_dir(tmp_path / "gpt2")
    settings = json.loads((gpt2 / "config.json").read_text())
    settings.update(attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0)
    (gpt2 / "config.json").write_text(json.dumps(settings))
    overrides = [*two_model_overrides(gpt2), "--training.max_steps", "2"]
    _under_both_strategies(runs["config"], tmp_path, *overrides)
    assert _largest_difference(tmp_path / "ddp" / "adapters", tmp_path / "fsdp2" / "adapters") < TOLERANCE


def test_accumulation_iterations_and_the_reference_stay_exact(runs, tmp_path):
    """One optimizer step per micro-batch of 4 (processes with fewer micro-batches pad them), two
    passes (old logprobs first), a KL term (a reference forward per micro-batch): the same
    rollouts as ddp, and adapters within Adam's amplification of float rounding over 14 optimizer
    steps per adapter (a lost or doubled micro-batch moves weights by ~ the learning rate, 0.02)."""
    overrides = ["--training.max_steps", "2", "--training.gradient_accumulation_steps", "1"]
    overrides += ["--training.per_device_train_batch_size", "4", "--algorithm.num_iterations", "2"]
    overrides += ["--algorithm.beta", "0.04"]
    lines = {
        strategy: [
            line.split(" | clip")[0]
            for line in stdout.splitlines()
            if line.startswith("step ") and " | " in line
        ]
        for strategy, stdout in _under_both_strategies(runs["config"], tmp_path, *overrides).items()
    }
    assert len(lines["fsdp2"]) == 2 and lines["ddp"] == lines["fsdp2"]
    assert _largest_difference(tmp_path / "ddp" / "adapters", tmp_path / "fsdp2" / "adapters") < 2e-3
