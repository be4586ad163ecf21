"""Checkpoints: atomic writes, finding the newest, RNG round trips, and exact resume."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import toy_envs_trainer  # noqa: E402, F401
from llm_zoo_train.checkpoint import (  # noqa: E402
    capture_rng_state,
    checkpoint_path,
    find_checkpoint,
    list_checkpoints,
    restore_rng_state,
    rotate_checkpoints,
    write_checkpoint,
)
from llm_zoo_train.trainer import Trainer  # noqa: E402
from train_helpers import history_without_timing, toy_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _fake_checkpoint(directory, step):
    def write(tmp):
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step}))

    return write_checkpoint(checkpoint_path(directory, step), write)


def test_write_is_atomic_and_replaces(tmp_path):
    def broken(tmp):
        (tmp / "half_written").write_text("x")
        raise RuntimeError("killed while saving")

    with pytest.raises(RuntimeError):
        write_checkpoint(tmp_path / "checkpoint-3", broken)
    assert list(tmp_path.iterdir()) == []  # neither the checkpoint nor a temporary directory

    first = _fake_checkpoint(tmp_path, 3)
    assert json.loads((first / "trainer_state.json").read_text()) == {"step": 3}

    def rewrite(tmp):
        (tmp / "trainer_state.json").write_text(json.dumps({"step": 3, "again": True}))

    write_checkpoint(first, rewrite)
    assert json.loads((first / "trainer_state.json").read_text())["again"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3"]


def test_find_list_and_rotate(tmp_path):
    for step in (2, 10, 4):
        _fake_checkpoint(tmp_path, step)
    (tmp_path / "checkpoint-12").mkdir()  # incomplete: no trainer_state.json
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-4", "checkpoint-10"]
    assert find_checkpoint(tmp_path).name == "checkpoint-10"
    assert find_checkpoint(tmp_path / "checkpoint-4").name == "checkpoint-4"
    rotate_checkpoints(tmp_path, 2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-4", "checkpoint-10"]
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        find_checkpoint(tmp_path / "elsewhere")


def test_rng_state_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    random.seed(2)
    np.random.seed(3)
    torch.manual_seed(4)
    torch.save(capture_rng_state(rng), tmp_path / "rng.pt")
    first = (rng.random(), random.random(), np.random.rand(), torch.rand(1).item())
    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True), rng)
    assert (rng.random(), random.random(), np.random.rand(), torch.rand(1).item()) == first


def _adapter_weights(directory):
    from peft.utils import load_peft_weights

    return {
        name: load_peft_weights(str(directory / "adapters" / name), device="cpu") for name in ("alice", "bob")
    }


def test_resumed_run_equals_uninterrupted_run(tiny_model_dir, tmp_path):
    # Several optimizer steps per rollout and two iterations: the trainer's shuffling generator,
    # Adam's moments and the LR schedule all have to survive the interruption.
    overrides = [
        "--training.max_steps",
        "4",
        "--training.save_steps",
        "2",
        "--eval.num_episodes",
        "4",
        "--training.per_device_train_batch_size",
        "8",
        "--training.gradient_accumulation_steps",
        "2",
        "--algorithm.num_iterations",
        "2",
        "--training.lr_scheduler_type",
        "linear",
    ]
    straight = Trainer(toy_config(tiny_model_dir, tmp_path / "straight", overrides))
    straight.train()

    interrupted_config = toy_config(tiny_model_dir, tmp_path / "resumed", overrides)
    # Killed after step 3: step 3's metrics reached metrics.jsonl but the newest checkpoint is step 2.
    Trainer(interrupted_config).train(stop_after_step=3)
    assert find_checkpoint(tmp_path / "resumed").name == "checkpoint-2"
    resumed = Trainer(interrupted_config, resume_from=tmp_path / "resumed")
    assert resumed.step == 2
    resumed.train()

    assert history_without_timing(resumed.history) == history_without_timing(straight.history)
    assert [r["step"] for r in resumed.history] == [0, 1, 2, 3, 4]
    for directory in (".", "checkpoint-4"):  # final adapters, and those of the last checkpoint
        a = _adapter_weights(tmp_path / "straight" / directory)
        b = _adapter_weights(tmp_path / "resumed" / directory)
        for name in a:
            assert a[name].keys() == b[name].keys()
            assert all(torch.equal(a[name][k], b[name][k]) for k in a[name]), name
    # metrics.jsonl was rewritten from the checkpoint: no duplicated step 3.
    lines = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1, 2, 3, 4]
    assert history_without_timing(lines) == history_without_timing(straight.history)
    # The adapters really trained (the equality above is not the trivial one).
    initial = Trainer(toy_config(tiny_model_dir, tmp_path / "fresh", overrides))
    assert not torch.equal(
        initial.policy.adapter_state_dict("alice")["base_model.model.lm_head.lora_B.weight"],
        b["alice"]["base_model.model.lm_head.lora_B.weight"],
    )


def test_checkpoint_contents_and_config_mismatch(tiny_model_dir, tmp_path):
    from llm_zoo_train.config import ConfigError

    config = toy_config(
        tiny_model_dir, tmp_path / "run", ["--training.max_steps", "1", "--eval.num_episodes", "0"]
    )
    Trainer(config).train()
    checkpoint = tmp_path / "run" / "checkpoint-1"
    names = sorted(p.name for p in checkpoint.iterdir())
    assert names == [
        "adapters",
        "config.yaml",
        "optimizers.pt",
        "rng_state.pt",
        "schedulers.pt",
        "trainer_state.json",
    ]
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["step"] == 1 and state["adapters"] == ["alice", "bob"]

    shared = toy_config(tiny_model_dir, tmp_path / "run", ["--agents.adapters", "shared"])
    with pytest.raises(ConfigError, match="holds adapters"):
        Trainer(shared, resume_from=checkpoint)


def test_checkpoint_directory_gets_normal_permissions(tmp_path):
    import os
    import stat

    umask = os.umask(0o022)
    try:
        path = _fake_checkpoint(tmp_path, 1)
    finally:
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o755  # not mkdtemp's 0700
