"""Asynchronous rollouts (rollout.async_steps): which adapters generate each step, exact resume with
rollouts in flight, and no generation process left behind, on the tiny model and the toy env."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import toy_envs_trainer  # noqa: E402, F401  (registers test/Scripted-v0)
from llm_zoo_train.config import ConfigError, validate  # noqa: E402
from llm_zoo_train.kernels.attention import forget_decode_attention_choices  # noqa: E402
from llm_zoo_train.kernels.choices import adopt_kernel_choices  # noqa: E402
from llm_zoo_train.rollout.asynchronous import RolloutWorkerError, algorithm_settings  # noqa: E402
from llm_zoo_train.rollout.samples import read_jsonl  # noqa: E402
from llm_zoo_train.rollout.step import merge_parts, play_step  # noqa: E402
from llm_zoo_train.runs.checkpoint import read_trainer_state  # noqa: E402
from llm_zoo_train.trainer import Trainer  # noqa: E402
from train_helpers import history_without_timing, toy_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 4

#: The decode attention every process of these runs starts from. Each run starts generation
#: processes of its own, and the tests compare runs: a process that timed the attention itself
#: could choose otherwise than another one and round differently.
PINNED = {"decode_attention": {"cpu/float32": {"kernel": "sdpa", "sdpa_s": 1.0, "grouped_s": 1.0}}}


@pytest.fixture(scope="module", autouse=True)
def pinned_kernels():
    forget_decode_attention_choices()
    adopt_kernel_choices(PINNED)
    yield
    forget_decode_attention_choices()


ASYNC = ["--rollout.async_steps", "1", "--rollout.async_worker_threads", "1"]
COMMON = ["--training.max_steps", str(STEPS), "--eval.num_episodes", "0", "--training.save_steps", "1"]


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not reaped) counts as gone.
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split(")")[-1].split()[0] == "Z")


def _records(samples) -> list[str]:
    return [json.dumps(dataclasses.asdict(s), sort_keys=True) for s in samples]


def _adapters(directory: Path) -> dict[str, dict[str, torch.Tensor]]:
    from peft.utils import load_peft_weights

    return {
        name: load_peft_weights(str(directory / "adapters" / name), device="cpu") for name in ("alice", "bob")
    }


def _record_pids(trainer: Trainer) -> list[int]:
    """The generation process's pid after each step's rollout arrived (it is None once closed)."""
    pids: list[int] = []
    take = trainer.async_rollouts.take

    def recording_take(*args):
        result = take(*args)
        pids.append(trainer.async_rollouts.pid)
        return result

    trainer.async_rollouts.take = recording_take
    return pids


def _train_on_one_thread(trainer: Trainer) -> None:
    """Train with one torch thread (the module-scoped runs outlive the per-test thread fixture)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer.train()
    finally:
        torch.set_num_threads(threads)


def _same_adapters(a, b) -> bool:
    return all(a[n].keys() == b[n].keys() and all(torch.equal(a[n][k], b[n][k]) for k in a[n]) for n in a)


@pytest.fixture(scope="module")
def async_run(tiny_model_dir, tmp_path_factory):
    """A 4-step run with async_steps 1, every step checkpointed and its rollout saved."""
    from llm_zoo_train.engines.hf.engine import HFEngine  # noqa: F401  (import cost outside the timing)

    root = tmp_path_factory.mktemp("async")
    trainer = Trainer(
        toy_config(tiny_model_dir, root / "run", [*COMMON, *ASYNC, "--rollout.save_rollouts", "true"])
    )
    _train_on_one_thread(trainer)
    return trainer, root


# ---------------------------------------------------------------------------------------- config


def test_config_checks_and_importance_sampling_default(tiny_model_dir, tmp_path):
    sync = toy_config(tiny_model_dir, tmp_path / "a")
    assert sync.rollout.async_steps == 0 and algorithm_settings(sync).importance_sampling is False
    on = toy_config(tiny_model_dir, tmp_path / "b", ASYNC)
    assert algorithm_settings(on).importance_sampling is True  # behaviour policy is one version old
    off = toy_config(tiny_model_dir, tmp_path / "c", [*ASYNC, "--algorithm.importance_sampling", "false"])
    assert algorithm_settings(off).importance_sampling is False  # an explicit choice wins
    for overrides, message in [
        (["--rollout.async_steps", "-1"], "rollout.async_steps must be >= 0"),
        (["--rollout.async_worker_threads", "0"], "rollout.async_worker_threads must be > 0"),
        (["--rollout.async_worker_cores", "[4096]"], r"not cores of this machine \[4096\]; choose from"),
        (
            [
                "--rollout.async_steps",
                "1",
                "--rollout.engine",
                "replay",
                "--rollout.replay_path",
                str(tmp_path),
            ],
            "needs rollout.engine 'hf'",
        ),
    ]:
        with pytest.raises(ConfigError, match=message):
            validate(toy_config(tiny_model_dir, tmp_path / "d", overrides))


def test_trainer_envs_config_checks(tiny_model_dir, tmp_path):
    validate(toy_config(tiny_model_dir, tmp_path / "ok", [*ASYNC, "--rollout.async_trainer_envs", "7"]))
    for overrides, message in [
        (["--rollout.async_trainer_envs", "2"], "set rollout.async_steps >= 1, or async_trainer_envs 0"),
        ([*ASYNC, "--rollout.async_trainer_envs", "8"], r"must be in \[0, 7\] .* got 8"),
        ([*ASYNC, "--rollout.async_trainer_envs", "-1"], r"must be in \[0, 7\]"),
        (
            [*ASYNC, "--rollout.async_trainer_envs", "2", "--rollout.save_rollouts", "true"],
            "split between two: set one to 0",
        ),
    ]:
        with pytest.raises(ConfigError, match=message):
            validate(toy_config(tiny_model_dir, tmp_path / "bad", overrides))


# ---------------------------------------------------------------------------------------- behaviour


def test_synchronous_runs_start_no_process_and_record_the_current_version(tiny_model_dir, tmp_path):
    trainer = Trainer(
        toy_config(
            tiny_model_dir,
            tmp_path / "run",
            ["--training.max_steps", "2", "--eval.num_episodes", "0", "--rollout.save_rollouts", "true"],
        )
    )
    assert trainer.async_rollouts is None
    trainer.train()
    for step in (1, 2):
        samples = list(read_jsonl(tmp_path / "run" / "rollouts" / f"step_{step:06d}.jsonl"))
        assert {s.policy_version for s in samples} == {step - 1}
    assert not any("rollout/staleness" in record for record in trainer.history)


def test_every_sample_of_step_t_was_generated_by_version_t_minus_2(async_run):
    trainer, root = async_run
    assert trainer.async_rollouts.pid is None  # train() stopped the process
    assert not (root / "run" / "engine_adapters").exists()  # and deleted the versions saved for it
    for step in range(1, STEPS + 1):
        samples = list(read_jsonl(root / "run" / "rollouts" / f"step_{step:06d}.jsonl"))
        assert samples and {s.policy_version for s in samples} == {max(step - 2, 0)}, step
    history = [r for r in trainer.history if r["step"] > 0]
    assert [r["rollout/policy_version"] for r in history] == [0, 0, 1, 2]
    assert [r["rollout/staleness"] for r in history] == [0, 1, 1, 1]  # the update starts from version t-1
    assert all("time/rollout_wait" in r for r in history)


def test_async_samples_are_what_the_recorded_version_generates_here(async_run, tiny_model_dir, tmp_path):
    """Replayed in this process with the adapters of the recorded version, each step's rollout is
    bit-identical; with the next version's adapters it is not (so the label is not just a label)."""
    _, root = async_run
    fresh = Trainer(toy_config(tiny_model_dir, tmp_path / "fresh", [*COMMON, *ASYNC]))  # version 0 adapters

    def replay(step: int, version: int) -> list[str]:
        if version > 0:
            for name in fresh.plan.trainable:
                fresh.policy.load_adapter_weights(
                    name, root / "run" / f"checkpoint-{version}" / "adapters" / name
                )
        return _records(
            play_step(fresh.config, fresh.plan.agent_adapters, fresh.engine, step, 0, version).samples
        )

    for step in range(1, STEPS + 1):
        recorded = _records(read_jsonl(root / "run" / "rollouts" / f"step_{step:06d}.jsonl"))
        version = max(step - 2, 0)
        assert replay(step, version) == recorded, step
        if step >= 2:
            newer = replay(step, step - 1)  # what a synchronous step would have generated
            assert [json.loads(r)["completion_token_ids"] for r in newer] != [
                json.loads(r)["completion_token_ids"] for r in recorded
            ], step


def test_resume_with_a_rollout_in_flight_is_exact(async_run, tiny_model_dir, tmp_path):
    """Checkpoints keep the rollouts generated ahead; the resumed run uses them and equals the
    uninterrupted run: same metrics, same adapters."""
    straight, root = async_run
    checkpoint = root / "run" / "checkpoint-2"
    kept = list(read_jsonl(checkpoint / "async_rollouts" / "step_000003.jsonl"))
    assert kept and {s.policy_version for s in kept} == {1}

    config = toy_config(tiny_model_dir, tmp_path / "resumed", [*COMMON, *ASYNC])
    first = Trainer(config)
    pids = _record_pids(first)
    first.train(stop_after_step=2)
    assert pids and not _alive(pids[-1])
    resumed = Trainer(config, resume_from=tmp_path / "resumed")
    assert resumed.step == 2
    # The generation process's kernel choices came back with its rollouts and went into the checkpoint.
    [recorded] = [
        r["rollout_process"]
        for r in read_trainer_state(tmp_path / "resumed" / "checkpoint-2")["kernel_choices"]
    ]
    assert recorded["decode_attention"] == PINNED["decode_attention"]
    assert resumed.async_rollouts.kernel_choices == recorded
    forget_decode_attention_choices()  # the new process must start from the checkpoint's, not from here
    try:
        resumed.train()
    finally:
        adopt_kernel_choices(PINNED)
    assert resumed.async_rollouts.kernel_choices["decode_attention"] == PINNED["decode_attention"]
    assert history_without_timing(resumed.history) == history_without_timing(straight.history)
    assert _same_adapters(_adapters(tmp_path / "resumed"), _adapters(root / "run"))


# ---------------------------------------------------------------------------------------- shared work

SPLIT = [*ASYNC, "--rollout.async_trainer_envs", "3"]


def _record_rollouts(trainer: Trainer) -> dict[int, list[str]]:
    """The samples each step took, as JSON records (filled as the run goes)."""
    taken: dict[int, list[str]] = {}
    take = trainer.async_rollouts.take

    def recording_take(step, *args):
        produced, waited = take(step, *args)
        taken[step] = _records(produced.samples)  # now: the update sets each sample's advantage
        return produced, waited

    trainer.async_rollouts.take = recording_take
    return taken


@pytest.fixture(scope="module")
def split_run(tiny_model_dir, tmp_path_factory):
    """A 4-step run with async_steps 1 where the trainer plays 3 of each step's 8 tasks."""
    root = tmp_path_factory.mktemp("split")
    trainer = Trainer(toy_config(tiny_model_dir, root / "run", [*COMMON, *SPLIT]))
    taken = _record_rollouts(trainer)
    _train_on_one_thread(trainer)
    return trainer, root, taken


def test_play_step_parts_play_the_steps_tasks_with_seeds_of_their_own(tiny_model_dir, tmp_path):
    trainer = Trainer(toy_config(tiny_model_dir, tmp_path / "run", COMMON))
    config, adapters, engine = trainer.config, trainer.plan.agent_adapters, trainer.engine
    whole = play_step(config, adapters, engine, 3, 0, 0)
    assert _records(play_step(config, adapters, engine, 3, 0, 0, range(8)).samples) == _records(whole.samples)
    first, rest = (play_step(config, adapters, engine, 3, 0, 0, envs) for envs in (range(3), range(3, 8)))
    assert {s.env_index for s in first.samples} == {0, 1, 2}
    assert {s.env_index for s in rest.samples} == set(range(3, 8))
    merged = merge_parts([rest, first])
    assert _records(merged.samples) == _records(first.samples) + _records(rest.samples)  # task order
    tasks = lambda samples: sorted({(s.env_index, s.task_id) for s in samples})  # noqa: E731
    assert tasks(merged.samples) == tasks(whole.samples)  # the same tasks, in the same places
    groups = [s.group_key for s in merged.samples]
    assert sorted(set(groups)) == sorted({s.group_key for s in whole.samples})
    # Each part samples with its own seed: the first part is not the first 3 tasks of the whole step.
    whole_first = [s.completion_token_ids for s in whole.samples if s.env_index < 3]
    assert [s.completion_token_ids for s in first.samples] != whole_first
    assert merged.generation_seconds == first.generation_seconds + rest.generation_seconds
    for bad in (range(0), range(5, 9), range(0, 8, 2)):
        with pytest.raises(ValueError, match="non-empty slice of range"):
            play_step(config, adapters, engine, 3, 0, 0, bad)
    with pytest.raises(ValueError, match="all of one step and adapter version"):
        merge_parts([first, play_step(config, adapters, engine, 4, 0, 0, range(3, 8))])


def test_the_trainer_plays_its_share_with_the_same_version(split_run, tiny_model_dir, tmp_path):
    """Every step's 8 tasks are played once (3 by the trainer, 5 by the generation process), all by
    version max(t-2, 0); replaying both parts here with that version's adapters gives the same
    samples."""
    trainer, root, taken = split_run
    assert sorted(taken) == list(range(1, STEPS + 1))
    history = [r for r in trainer.history if r["step"] > 0]
    assert [r["rollout/staleness"] for r in history] == [0, 1, 1, 1]
    # Step t plays the trainer's part of step t+1 (step 1: of steps 1 and 2); the last step none.
    assert [r["time/trainer_rollout"] > 0 for r in history] == [True, True, True, False]
    fresh = Trainer(toy_config(tiny_model_dir, tmp_path / "fresh", [*COMMON, *SPLIT]))
    for step, records in taken.items():
        version = max(step - 2, 0)
        samples = [json.loads(r) for r in records]
        assert {s["policy_version"] for s in samples} == {version}, step
        assert sorted({s["env_index"] for s in samples}) == list(range(8)), step
        if version > 0:
            for name in fresh.plan.trainable:
                fresh.policy.load_adapter_weights(
                    name, root / "run" / f"checkpoint-{version}" / "adapters" / name
                )
        parts = [
            play_step(fresh.config, fresh.plan.agent_adapters, fresh.engine, step, 0, version, envs)
            for envs in (range(3), range(3, 8))
        ]
        assert _records(merge_parts(parts).samples) == records, step


def test_resume_with_a_shared_rollout_in_flight_is_exact(split_run, tiny_model_dir, tmp_path):
    straight, root, _ = split_run
    kept = list(read_jsonl(root / "run" / "checkpoint-2" / "async_rollouts" / "step_000003.jsonl"))
    assert sorted({s.env_index for s in kept}) == list(range(8))  # both parts of the step in flight
    config = toy_config(tiny_model_dir, tmp_path / "resumed", [*COMMON, *SPLIT])
    Trainer(config).train(stop_after_step=2)
    resumed = Trainer(config, resume_from=tmp_path / "resumed")
    resumed.train()
    assert history_without_timing(resumed.history) == history_without_timing(straight.history)
    assert _same_adapters(_adapters(tmp_path / "resumed"), _adapters(root / "run"))


@pytest.mark.parametrize(
    "error", [RuntimeError("update failed"), KeyboardInterrupt()], ids=["error", "ctrl-c"]
)
def test_the_process_is_gone_after_the_trainer_raises(error, tiny_model_dir, tmp_path, monkeypatch):
    trainer = Trainer(toy_config(tiny_model_dir, tmp_path / "run", [*COMMON, *ASYNC]))
    pids = []

    def update(adapter, samples, phase=None):
        pids.append(trainer.async_rollouts.pid)
        assert _alive(pids[-1])  # generating step 2 while step 1 updates
        raise error

    monkeypatch.setattr(trainer.updater, "update", update)
    with pytest.raises(type(error)):
        trainer.train()
    assert pids and not _alive(pids[0])


def test_a_dead_generation_process_is_a_clear_error(tiny_model_dir, tmp_path, monkeypatch):
    trainer = Trainer(toy_config(tiny_model_dir, tmp_path / "run", [*COMMON, *ASYNC]))
    update = trainer.updater.update

    def kill_then_update(adapter, samples, phase=None):
        os.kill(trainer.async_rollouts.pid, signal.SIGKILL)
        return update(adapter, samples, phase)

    monkeypatch.setattr(trainer.updater, "update", kill_then_update)
    with pytest.raises(RolloutWorkerError, match="exited with code -9"):
        trainer.train()


def test_the_process_dies_with_a_killed_trainer(tiny_model_dir, tmp_path):
    """SIGKILL gives the trainer no chance to clean up: the kernel stops the generation process."""
    config_path = tmp_path / "run.yaml"
    toy_config(tiny_model_dir, tmp_path / "run", [*COMMON, *ASYNC])  # writes run.yaml next to the run
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import toy_envs_trainer
        from llm_zoo_train.config import load_config
        from llm_zoo_train.trainer import Trainer

        if __name__ == "__main__":
            trainer = Trainer(load_config({str(config_path)!r}, {[*COMMON, *ASYNC]!r}))
            def update(adapter, samples, phase=None):
                print("PID", trainer.async_rollouts.pid, flush=True)
                time.sleep(600)
            trainer.updater.update = update
            trainer.train()
        """
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        line = ""
        while not line.startswith("PID "):
            line = process.stdout.readline()
            assert line, "the training script ended before its generation process started"
        pid = int(line.split()[1])
        assert _alive(pid)
        process.kill()
        process.wait(30)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid)
    finally:
        process.kill()
        process.wait()
