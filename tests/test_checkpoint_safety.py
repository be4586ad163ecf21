"""Runs that never lose work: verified checkpoints, fallback to an intact one, missing final adapters.

One finished two-step run (a checkpoint after each step) is built once per module; each test damages
a copy of it the way a crash, a full disk or a careless edit would.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import toy_envs_trainer  # noqa: E402, F401
from llm_zoo_train.__main__ import main  # noqa: E402
from llm_zoo_train.runs.checkpoint import find_checkpoint  # noqa: E402
from llm_zoo_train.runs.manifest import CheckpointDamagedError, write_manifest  # noqa: E402
from llm_zoo_train.trainer import Trainer  # noqa: E402
from train_helpers import toy_config, write_toy_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUICK = ["--eval.num_episodes", "0", "--training.max_steps", "2", "--training.save_steps", "1"]


@pytest.fixture(scope="module")
def finished_run(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("finished")
    Trainer(toy_config(tiny_model_dir, root / "run", QUICK)).train()
    return root / "run"


@pytest.fixture
def run(finished_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


def _garble_middle(path, count=64):
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + count] = os.urandom(count)
    path.write_bytes(bytes(data))


def _edit_step(path):
    state = json.loads(path.read_text())
    state["step"] = 1
    path.write_text(json.dumps(state))


CORRUPTIONS = {
    "random bytes in the adapter weights": ("adapters/alice/adapter_model.safetensors", _garble_middle),
    "edited step in trainer_state.json": ("trainer_state.json", _edit_step),
    "emptied optimizers.pt": ("optimizers.pt", lambda p: p.write_bytes(b"")),
    "truncated rng_state.pt": ("rng_state.pt", lambda p: p.write_bytes(p.read_bytes()[:100])),
    "deleted adapter weights": ("adapters/bob/adapter_model.safetensors", lambda p: p.unlink()),
    "garbled config.yaml": ("config.yaml", lambda p: p.write_text("model: [unclosed\n")),
    "deleted manifest": ("manifest.json", lambda p: p.unlink()),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_damaged_newest_checkpoint_is_named_and_the_older_one_used(run, case):
    name, damage = CORRUPTIONS[case]
    damage(run / "checkpoint-2" / name)
    warnings = []
    assert find_checkpoint(run, warnings.append) == run / "checkpoint-1"
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "checkpoint-2" in warnings[0] and name.rpartition("/")[2] in warnings[0]
    # Naming the damaged checkpoint itself also falls back.
    assert find_checkpoint(run / "checkpoint-2", warnings.append) == run / "checkpoint-1"


def _edited_state(**changes):
    def edit(path):
        state = json.loads(path.read_text())
        state.update(changes)
        path.write_text(json.dumps(state))

    return edit


#: Files that still verify (the manifest is rewritten to match) but cannot be loaded (issue 53 D7:
#: each gave a traceback during the resume instead of the one line and the fallback).
VERIFIED_BUT_WRONG = {
    "history not a list": ("trainer_state.json", _edited_state(history="oops")),
    "history records with text": ("trainer_state.json", _edited_state(history=[{"loss": "high"}])),
    "version not a number": ("trainer_state.json", _edited_state(version="two")),
    "negative version": ("trainer_state.json", _edited_state(version=-1)),
    "adapters not names": ("trainer_state.json", _edited_state(adapters=[1, 2])),
    "kernel choices not a list": ("trainer_state.json", _edited_state(kernel_choices="auto")),
    "trainer state not an object": ("trainer_state.json", lambda p: p.write_text("[2]")),
    # an outside fault matrix: a cut history resumed silently and rewrote metrics.jsonl without steps 1-2
    "history missing steps": ("trainer_state.json", _edited_state(history=[{"step": 2, "loss": 0.5}])),
    "config.yaml not YAML": ("config.yaml", lambda p: p.write_text("model: [unclosed\n")),
    "config.yaml a list": ("config.yaml", lambda p: p.write_text("- a\n- b\n")),
    # an outside fault matrix: this one stopped the resume (rc 2) although checkpoint-1 was intact
    "config.yaml with an unknown key": ("config.yaml", lambda p: p.write_text(p.read_text() + "bogus: 1\n")),
    "config.yaml with a wrong type": (
        "config.yaml",
        lambda p: p.write_text(re.sub(r"max_steps: \d+", "max_steps: many", p.read_text())),
    ),
}


@pytest.mark.parametrize("case", sorted(VERIFIED_BUT_WRONG))
def test_a_verified_file_that_cannot_be_loaded_is_damage_too(run, case, capsys):
    name, damage = VERIFIED_BUT_WRONG[case]
    damage(run / "checkpoint-2" / name)
    write_manifest(run / "checkpoint-2")  # the file verifies: only its content is wrong
    warnings = []
    assert find_checkpoint(run, warnings.append) == run / "checkpoint-1"
    assert len(warnings) == 1 and "checkpoint-2" in warnings[0] and name in warnings[0]
    # The command line resumes from the older checkpoint with one warning, no traceback.
    capsys.readouterr()
    assert main(["--resume", str(run)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "skipped damaged checkpoint" in err


def test_no_intact_checkpoint_left_is_one_line_error(run, capsys):
    for step in (1, 2):
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text('{"step": ')
    assert main(["--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("llm-zoo-train: error:")]
    assert "no intact checkpoint to resume from" in line and "trainer_state.json" in line


@pytest.mark.parametrize(
    ("name", "damage", "reported"),
    [
        ("optimizers.pt", lambda p: p.write_bytes(b"not a pickle at all"), "optimizers.pt"),
        ("rng_state.pt", lambda p: p.write_bytes(b""), "rng_state.pt"),
        ("adapters/bob/adapter_model.safetensors", lambda p: p.unlink(), "adapters/bob"),
    ],
)
def test_a_checkpoint_that_verifies_but_cannot_load_falls_back(
    run, tiny_model_dir, capsys, name, damage, reported
):
    """A file that matches a (rewritten) manifest but does not load - a JSON decode error, an
    EOFError, an UnpicklingError, a hub lookup for a deleted adapter file - is named in one line
    and the older checkpoint is loaded instead."""
    damage(run / "checkpoint-2" / name)
    write_manifest(run / "checkpoint-2")
    config = toy_config(tiny_model_dir, run, [*QUICK, "--training.max_steps", "3"])
    trainer = Trainer(config, resume_from=run)
    err = capsys.readouterr().err
    assert trainer.step == 1 and trainer.resume_point.step == 1
    warnings = [line for line in err.splitlines() if line.startswith("llm-zoo-train: warning:")]
    assert len(warnings) == 1 and reported in warnings[0] and "checkpoint-1" in warnings[0]
    assert "Traceback" not in err


def test_a_checkpoint_that_cannot_load_and_no_older_one_is_one_line(run, tiny_model_dir):
    shutil.rmtree(run / "checkpoint-1")
    (run / "checkpoint-2" / "optimizers.pt").write_bytes(b"")
    write_manifest(run / "checkpoint-2")
    config = toy_config(tiny_model_dir, run, [*QUICK, "--training.max_steps", "3"])
    with pytest.raises(CheckpointDamagedError) as error:
        Trainer(config, resume_from=run)
    assert "\n" not in str(error.value) and "optimizers.pt" in str(error.value)


def test_missing_final_adapters_are_written_from_the_last_checkpoint(run, capsys):
    """Killed (or out of disk) during the final save: --resume writes the adapters instead of
    only saying the run is finished."""
    shutil.rmtree(run / "adapters")
    assert main(["--resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert "is finished" in out and "the final adapters were missing" in out
    for name in ("alice", "bob"):
        saved = run / "checkpoint-2" / "adapters" / name / "adapter_model.safetensors"
        assert (run / "adapters" / name / "adapter_model.safetensors").read_bytes() == saved.read_bytes()


def test_async_rollouts_in_flight_must_all_be_in_the_checkpoint(tmp_path):
    """A missing or emptied rollout in flight is an error naming the file, never regenerated."""
    from llm_zoo_train.rollout.asynchronous import AsyncRollouts

    config = toy_config("no-model", tmp_path / "run", ["--rollout.async_steps", "1"])
    rollouts = AsyncRollouts(config, policy=None, output_dir=tmp_path / "run")  # type: ignore[arg-type]
    checkpoint = tmp_path / "checkpoint-3"
    (checkpoint / "async_rollouts").mkdir(parents=True)
    with pytest.raises(CheckpointDamagedError, match=r"rollouts.json is missing"):
        rollouts.restore(checkpoint, [4])
    (checkpoint / "async_rollouts" / "rollouts.json").write_text("[]")
    with pytest.raises(CheckpointDamagedError, match=r"lists the rollouts of steps \[\]"):
        rollouts.restore(checkpoint, [4])
    entry = {"step": 4, "samples": 3, "policy_version": 2, "generation_seconds": 1.0, "seconds": 1.5}
    (checkpoint / "async_rollouts" / "rollouts.json").write_text(json.dumps([entry]))
    (checkpoint / "async_rollouts" / "step_000004.jsonl").write_text("")
    with pytest.raises(CheckpointDamagedError, match=r"step_000004.jsonl holds 0 samples, the rollout had 3"):
        rollouts.restore(checkpoint, [4])
    assert rollouts.ready_steps == []


def test_a_new_run_writes_its_config_before_the_first_step(tiny_model_dir, tmp_path):
    config = toy_config(tiny_model_dir, tmp_path / "run", QUICK)
    trainer = Trainer(config)
    assert (tmp_path / "run" / "config.yaml").is_file() and trainer.step == 0
    trainer.run_lock.release()


def test_overwrite_waits_until_the_model_has_loaded(run, tmp_path, capsys):
    """A mistyped model path with overwrite_output_dir must leave the earlier run intact."""
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    config = write_toy_config(tmp_path / "no_such_model", run, tmp_path / "c.yaml")
    assert main([str(config), "--training.overwrite_output_dir", "true", *QUICK]) == 2
    err = capsys.readouterr().err
    assert "model.name_or_path" in err and "Traceback" not in err
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_final_adapters_of_an_older_step_are_replaced_by_the_last_checkpoint_s(run, capsys):
    """A run extended past an earlier end and stopped before its final save kept the earlier end's
    adapters in output_dir/adapters; --resume of the finished run now replaces them."""
    shutil.rmtree(run / "adapters")
    shutil.copytree(run / "checkpoint-1" / "adapters", run / "adapters")
    assert main(["--resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert "is finished" in out and "the final adapters were an older step's" in out
    for name in ("alice", "bob"):
        saved = run / "checkpoint-2" / "adapters" / name / "adapter_model.safetensors"
        assert (run / "adapters" / name / "adapter_model.safetensors").read_bytes() == saved.read_bytes()
    assert main(["--resume", str(run)]) == 0
    assert "final adapters" not in capsys.readouterr().out  # the same weights: nothing rewritten
