"""Checkpoints: atomic writes, finding the newest, RNG round trips, and exact resume."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import toy_envs_trainer  # noqa: E402, F401
from llm_zoo_train.runs.checkpoint import (  # noqa: E402
    capture_rng_state,
    checkpoint_path,
    find_checkpoint,
    list_checkpoints,
    restore_rng_state,
    rotate_checkpoints,
    write_checkpoint,
)
from llm_zoo_train.trainer import Trainer  # noqa: E402
from train_helpers import history_without_timing, one_line_error, toy_config  # noqa: E402

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


@pytest.mark.parametrize("occupant", ["file", "link"])
def test_a_file_where_the_checkpoint_goes_is_replaced_and_leaves_nothing(tmp_path, occupant):
    """An outside fault matrix: with a plain file where checkpoint-2 was, the write left
    `.old-checkpoint-2-PID` behind (rmtree does not remove a file)."""
    target = tmp_path / "checkpoint-2"
    if occupant == "file":
        target.write_text("not a checkpoint")
    else:
        (tmp_path / "elsewhere").mkdir()
        target.symlink_to(tmp_path / "elsewhere")
    write_checkpoint(target, lambda tmp: (tmp / "trainer_state.json").write_text('{"step": 2}'))
    assert target.is_dir() and not target.is_symlink()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == (["checkpoint-2"] if occupant == "file" else ["checkpoint-2", "elsewhere"])


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
        "manifest.json",
        "optimizers.pt",
        "rng_state.pt",
        "schedulers.pt",
        "trainer_state.json",
    ]
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["step"] == 1 and state["adapters"] == ["alice", "bob"]

    shared = toy_config(tiny_model_dir, tmp_path / "run", ["--agents.adapters", "shared"])
    with pytest.raises(
        ConfigError, match=r"belongs to a different run: agents\.adapters 'per_agent' -> 'shared'"
    ):
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


def _learning_rates(history):
    return [r["update/alice/learning_rate"] for r in history if "update/alice/learning_rate" in r]


def test_resume_after_extending_the_run_follows_the_new_schedule(tiny_model_dir, tmp_path):
    """max_steps 1, then --resume with max_steps 3, must equal 3 straight steps (linear decay): the
    optimizer's saved learning rate (0 at the end of the 1-step schedule) must not be used."""
    common = ["--eval.num_episodes", "0", "--training.lr_scheduler_type", "linear"]
    straight = Trainer(
        toy_config(tiny_model_dir, tmp_path / "straight", [*common, "--training.max_steps", "3"])
    )
    straight.train()
    Trainer(toy_config(tiny_model_dir, tmp_path / "extended", [*common, "--training.max_steps", "1"])).train()
    extended_config = toy_config(
        tiny_model_dir, tmp_path / "extended", [*common, "--training.max_steps", "3"]
    )
    resumed = Trainer(extended_config, resume_from=tmp_path / "extended")
    assert resumed.step == 1
    # Before the first resumed step the optimizer already uses the new schedule's rate.
    assert resumed.optimizers["alice"].param_groups[0]["lr"] == pytest.approx(0.02 * 2 / 3)
    resumed.train()

    assert _learning_rates(straight.history) == pytest.approx([0.02, 0.02 * 2 / 3, 0.02 / 3])
    assert _learning_rates(resumed.history) == _learning_rates(straight.history)
    assert history_without_timing(resumed.history) == history_without_timing(straight.history)
    a = _adapter_weights(tmp_path / "straight")
    b = _adapter_weights(tmp_path / "extended")
    for name in a:
        assert all(torch.equal(a[name][k], b[name][k]) for k in a[name]), name


def test_resume_refuses_another_runs_checkpoint_and_names_the_keys(tiny_model_dir, tmp_path):
    from llm_zoo_train.config import ConfigError
    from llm_zoo_train.runs.run_dir import check_resume

    config = toy_config(
        tiny_model_dir, tmp_path / "run", ["--training.max_steps", "1", "--eval.num_episodes", "0"]
    )
    Trainer(config).train()
    checkpoint = tmp_path / "run" / "checkpoint-1"
    other = toy_config(
        tiny_model_dir,
        tmp_path / "run",
        ["--training.learning_rate", "0.5", "--rollout.num_generations", "8", "--training.seed", "3"],
    )
    with pytest.raises(ConfigError) as error:
        check_resume(checkpoint, other)
    message = str(error.value)
    assert "\n" not in message
    for part in (
        "rollout.num_generations 4 -> 8",
        "training.learning_rate 0.02 -> 0.5",
        "training.seed 0 -> 3",
    ):
        assert part in message
    # Keys that only change how long the run goes and what it records may change.
    longer = toy_config(
        tiny_model_dir,
        tmp_path / "run",
        ["--training.max_steps", "5", "--eval.num_episodes", "2", "--logging.logging_steps", "3"],
    )
    point = check_resume(checkpoint, longer)
    assert point.step == 1 and not point.finished(5)
    assert point.changed == ["eval.num_episodes", "logging.logging_steps", "training.max_steps"]
    assert point.describe(5).startswith(f"resuming from {checkpoint} (step 1 of 5) with changed settings:")
    assert "is finished" in point.describe(1)


#: A changed value of each resumable key (issue 53: each must be proven not to change the adapters).
RESUMED_WITH = {
    "training.save_steps": "2",
    "training.save_total_limit": "1",
    "training.keep_freed_memory": "false",
    "rollout.save_rollouts": "true",
    "eval.num_episodes": "2",
    "eval.eval_steps": "1",
    "logging.logging_steps": "2",
}


@pytest.mark.parametrize("key", sorted(RESUMED_WITH))
def test_each_resumable_key_leaves_the_adapters_bit_identical(key, tiny_model_dir, tmp_path):
    common = ["--eval.num_episodes", "0", "--training.save_steps", "1"]
    Trainer(toy_config(tiny_model_dir, tmp_path / "straight", [*common, "--training.max_steps", "2"])).train()
    Trainer(toy_config(tiny_model_dir, tmp_path / "resumed", [*common, "--training.max_steps", "1"])).train()
    changed = toy_config(
        tiny_model_dir,
        tmp_path / "resumed",
        [*common, "--training.max_steps", "2", f"--{key}", RESUMED_WITH[key]],
    )
    resumed = Trainer(changed, resume_from=tmp_path / "resumed")
    assert key in resumed.resume_point.changed
    resumed.train()
    a, b = _adapter_weights(tmp_path / "straight"), _adapter_weights(tmp_path / "resumed")
    for name in a:
        assert all(torch.equal(a[name][k], b[name][k]) for k in a[name]), (key, name)


@pytest.mark.parametrize(
    "key, value", [("rollout.max_rows_per_generate_call", "3"), ("vllm.gpu_memory_utilization", "0.5")]
)
def test_keys_that_can_change_the_adapters_are_refused_on_resume(key, value, tiny_model_dir, tmp_path):
    """Issue 53 D8: rollout.max_rows_per_generate_call was accepted on resume ("what it records,
    not what it trains") yet changes the trained adapters."""
    from llm_zoo_train.config import ConfigError
    from llm_zoo_train.runs.run_dir import check_resume

    Trainer(
        toy_config(
            tiny_model_dir, tmp_path / "run", ["--training.max_steps", "1", "--eval.num_episodes", "0"]
        )
    ).train()
    other = toy_config(tiny_model_dir, tmp_path / "run", [f"--{key}", value])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_resume(tmp_path / "run" / "checkpoint-1", other)


def test_a_finished_run_says_so_and_trains_nothing(tiny_model_dir, tmp_path, capsys):
    config = toy_config(
        tiny_model_dir, tmp_path / "run", ["--training.max_steps", "1", "--eval.num_episodes", "2"]
    )
    Trainer(config).train()
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    capsys.readouterr()
    result = Trainer(config, resume_from=tmp_path / "run").train()
    out = capsys.readouterr().out
    assert result["finished"] is True and result["before"] is None and result["after"] is None
    assert "is finished: checkpoint-1 is step 1 of training.max_steps 1" in out
    assert "success rate" not in out  # no before/after made up from the old records
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == metrics


def test_a_full_disk_during_a_checkpoint_is_one_clear_error(tmp_path, monkeypatch):
    import errno

    from llm_zoo_train.runs.checkpoint import CheckpointWriteError

    _fake_checkpoint(tmp_path, 1)

    def full(tmp):
        (tmp / "optimizers.pt").write_text("partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointWriteError) as error:
        write_checkpoint(checkpoint_path(tmp_path, 2), full)
    message = str(error.value)
    assert message.startswith(f"cannot write {tmp_path / 'checkpoint-2'}: no space left on device")
    assert "training.save_total_limit" in message and error.value.errno == errno.ENOSPC
    assert "\n" not in message
    # The older checkpoint is intact and nothing half-written is left.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]
    assert find_checkpoint(tmp_path).name == "checkpoint-1"


def test_stale_temporary_checkpoints_are_removed_at_start(tmp_path):
    from llm_zoo_train.runs.run_dir import prepare_output_dir
    from train_helpers import toy_config as make_config

    run = tmp_path / "run"
    _fake_checkpoint(run, 2)
    (run / ".tmp-checkpoint-3-abc").mkdir()
    (run / ".tmp-checkpoint-3-abc" / "optimizers.pt").write_text("half")
    (run / ".old-checkpoint-2-123").mkdir()
    (run / ".tmp-adapters-k9x").mkdir()  # a run killed while it wrote its final adapters
    (run / ".tmp-adapters-k9x" / "adapter_model.safetensors").write_text("half")
    config = make_config("no-model", run)
    notes = prepare_output_dir(config, resuming=True)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint-2"]
    assert len(notes) == 3 and all("removed an unfinished write (checkpoint or adapters)" in n for n in notes)


def test_a_manifest_that_covers_less_than_the_checkpoint_is_damage(tmp_path):
    """Issue 53 (D6): a manifest listing no files, or missing an entry, still verified, so a
    garbled adapter resumed silently."""
    from llm_zoo_train.runs.manifest import CheckpointDamagedError, verify_manifest, write_manifest

    checkpoint = tmp_path / "checkpoint-3"
    (checkpoint / "adapters" / "alice").mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"step": 3}))
    (checkpoint / "adapters" / "alice" / "adapter_model.safetensors").write_bytes(b"weights")
    manifest = write_manifest(checkpoint)
    verify_manifest(checkpoint)
    (checkpoint / "eval").mkdir()
    (checkpoint / "eval" / "eval_results.json").write_text("{}")  # llm-zoo-train eval writes here later
    verify_manifest(checkpoint)
    listed = json.loads(manifest.read_text())
    empty = {"format": 1, "files": {}}
    manifest.write_text(json.dumps(empty))
    with pytest.raises(CheckpointDamagedError, match=r"does not list trainer_state\.json"):
        verify_manifest(checkpoint)
    partial = {"format": 1, "files": {"trainer_state.json": listed["files"]["trainer_state.json"]}}
    manifest.write_text(json.dumps(partial))
    (checkpoint / "adapters" / "alice" / "adapter_model.safetensors").write_bytes(b"garbled")
    with pytest.raises(CheckpointDamagedError, match=r"adapter_model\.safetensors is not listed"):
        verify_manifest(checkpoint)


def test_a_base_model_replaced_under_its_path_is_refused_on_resume(tiny_model_dir, tmp_path, capsys):
    """Issue 53 D9: the checkpoint recorded the base model's path only, so a different base at the
    same path resumed silently."""
    import shutil

    from llm_zoo_train.__main__ import main

    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    common = ["--eval.num_episodes", "0", "--training.save_steps", "1"]
    config = toy_config(base, tmp_path / "run", [*common, "--training.max_steps", "1"])
    Trainer(config).train()
    state = json.loads((tmp_path / "run" / "checkpoint-1" / "trainer_state.json").read_text())
    assert set(state["base_models"]["model"]) >= {"config.json"}
    weights = next(p for p in base.iterdir() if p.suffix in (".safetensors", ".bin"))
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte in the middle (an outside fault matrix: it resumed silently)
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    argv = [str(tmp_path / "run.yaml"), *common, "--training.max_steps", "2", "--resume"]
    assert main(argv) == 2
    line = one_line_error(capsys.readouterr().err)
    assert f"is not the one the checkpoint was trained on: {weights.name} changed (content)" in line
    assert not (tmp_path / "run" / ".llm-zoo-train.lock").exists()


def test_base_fingerprints_read_what_their_record_says(tmp_path, monkeypatch):
    """Small models are hashed whole; larger ones sampled; records of older checkpoints (size and
    the first and last 64 KiB) still compare, so their resumes are not refused."""
    from llm_zoo_train.runs import base_fingerprint as bf

    model = tmp_path / "model"
    model.mkdir()
    weights = model / "model.safetensors"
    weights.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    (model / "config.json").write_text("{}")
    paths = {"model": str(model)}
    recorded = bf.fingerprint(model)
    assert {entry[2] for entry in recorded.values()} == {"whole"}
    assert bf.base_model_problem({"model": recorded}, {"model": bf.fingerprint(model)}, paths) is None

    older = {name: entry[:2] for name, entry in recorded.items()}  # an older checkpoint's record
    for name in older:
        older[name][1] = bf._digest(model / name, "edges")
    assert bf.base_model_problem({"model": older}, {"model": bf.fingerprint(model)}, paths) is None

    monkeypatch.setattr(bf, "WHOLE_BYTES", 1024)  # as for a model larger than the whole-hash budget
    sampled = bf.fingerprint(model)
    assert sampled["model.safetensors"][2] == "sampled"
    assert bf.base_model_problem({"model": recorded}, {"model": sampled}, paths) is None  # same bytes

    data = bytearray(weights.read_bytes())
    data[len(data) // 2 + 7] ^= 1
    weights.write_bytes(bytes(data))
    for record in (recorded, sampled):
        problem = bf.base_model_problem({"model": record}, {"model": bf.fingerprint(model)}, paths)
        assert problem and "model.safetensors changed (content)" in problem
