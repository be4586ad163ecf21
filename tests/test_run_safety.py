"""Runs that never go silently wrong: non-finite updates, interrupts, the run lock and full disks."""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import toy_envs_trainer  # noqa: E402
from llm_zoo_train.__main__ import main  # noqa: E402
from llm_zoo_train.trainer import Trainer  # noqa: E402
from train_helpers import history_without_timing, one_line_error, toy_config, write_toy_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUICK = ["--eval.num_episodes", "0"]


class _Accelerator:
    """What RunLogger needs of an Accelerator."""

    is_main_process = True

    def log(self, values, step):
        pass


# --------------------------------------------------------------------------- finite or nothing


def test_a_nan_loss_stops_the_step_before_anything_is_saved(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import llm_zoo_train.training.update as update

    real = update.policy_loss

    def poisoned(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(update, "policy_loss", poisoned)
    config = write_toy_config(tiny_model_dir, tmp_path / "run", tmp_path / "c.yaml")
    assert main([str(config), *QUICK, "--training.max_steps", "2", "--training.save_steps", "1"]) == 1
    line = one_line_error(capsys.readouterr().err)
    assert "step 1" in line and "adapter 'alice'" in line and "non-finite gradient norm" in line
    names = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert not [n for n in names if n.startswith("checkpoint-")] and "adapters" not in names


def test_non_finite_weights_are_never_saved(tiny_model_dir, tmp_path):
    from llm_zoo_train.runs.finite import NonFiniteError

    config = toy_config(tiny_model_dir, tmp_path / "run", [*QUICK, "--training.max_steps", "1"])
    trainer = Trainer(config)
    with torch.no_grad():
        trainer.policy.adapter_parameters("bob")[0].view(-1)[0] = float("inf")
    trainer.step = 1
    with pytest.raises(NonFiniteError, match=r"adapter 'bob' at step 1: 1 adapter weights are non-finite"):
        trainer.save_checkpoint()
    assert not (tmp_path / "run" / "checkpoint-1").exists()
    trainer.run_lock.release()


def test_metrics_jsonl_records_non_finite_values(tmp_path):
    from llm_zoo_train.reporting.tracking import RunLogger

    logger = RunLogger(_Accelerator(), tmp_path, [], total_steps=1, logging_steps=1, progress_bar=False)
    logger.log(1, {"update/alice/loss": float("nan"), "update/alice/grad_norm": float("inf"), "x": 1.0})
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert record == {"step": 1, "update/alice/loss": "nan", "update/alice/grad_norm": "inf", "x": 1.0}
    assert math.isnan(logger.history[-1]["update/alice/loss"])


# --------------------------------------------------------------------------- interrupts


@pytest.mark.parametrize(
    ("phase", "signum", "saved_step", "code"),
    [("rollout", signal.SIGINT, 2, 130), ("update", signal.SIGTERM, 3, 143)],
)
def test_an_interrupted_run_saves_its_last_step_and_resumes_identically(
    tiny_model_dir, tmp_path, capsys, monkeypatch, phase, signum, saved_step, code
):
    """save_steps 0: without the save on interrupt nothing could be resumed. A signal during a
    rollout stops at once (the adapters are those of the last step); during an update the step is
    finished first. The resumed run equals an uninterrupted one."""
    # The command chooses torch's threads from the machine's load; both runs and the reference
    # must use the same number, or float diagnostics (logp_mismatch) differ in the last bits.
    threads = str(torch.get_num_threads())
    monkeypatch.setenv("OMP_NUM_THREADS", threads)
    overrides = [*QUICK, "--training.max_steps", "4"]
    straight = Trainer(toy_config(tiny_model_dir, tmp_path / "straight", overrides))
    straight.train()

    import llm_zoo_train.training.update as update

    steps = iter(range(1, 100))
    real_update = update.AdapterUpdater.update
    calls = {}

    def counting(self, adapter, samples, phase_=None):
        if adapter == "alice":
            calls["step"] = next(steps)
        if phase == "update" and adapter == "bob" and calls["step"] == 3:
            os.kill(os.getpid(), signum)
        return real_update(self, adapter, samples, phase_)

    monkeypatch.setattr(update.AdapterUpdater, "update", counting)
    if phase == "rollout":
        real_rollout = Trainer._rollout

        def rollout(self, at, envs=None):
            if at == 3:
                os.kill(os.getpid(), signum)
            return real_rollout(self, at, envs)

        monkeypatch.setattr(Trainer, "_rollout", rollout)
    config = write_toy_config(tiny_model_dir, tmp_path / "run", tmp_path / "c.yaml")
    assert main([str(config), *overrides]) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    name = signal.Signals(signum).name
    (line,) = [line for line in err.splitlines() if line.startswith(f"llm-zoo-train: {name}: stopped")]
    assert f"saved {tmp_path / 'run' / f'checkpoint-{saved_step}'}" in line and "--resume" in line
    monkeypatch.undo()
    monkeypatch.setenv("OMP_NUM_THREADS", threads)

    assert main(["--resume", str(tmp_path / "run")]) == 0
    resumed = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert history_without_timing(resumed) == history_without_timing(straight.history)


def test_interrupted_eval_is_one_line(capsys, monkeypatch):
    import llm_zoo_train.evaluation.cli as eval_cli

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(eval_cli, "main", interrupted)
    assert main(["eval", "somewhere"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "llm-zoo-train eval: interrupted; nothing was written"


def test_sigterm_while_the_model_loads_or_eval_runs_is_one_line(
    tiny_model_dir, tmp_path, capsys, monkeypatch
):
    """Issue 53 D11: SIGTERM during the model load or ``eval`` killed the process with no line (-15)."""
    import llm_zoo_train.evaluation.cli as eval_cli
    import llm_zoo_train.trainer as trainer_module

    def terminated_while_loading(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM was not handled")  # pragma: no cover

    monkeypatch.setattr(trainer_module.Trainer, "__init__", terminated_while_loading)
    config = write_toy_config(tiny_model_dir, tmp_path / "run", tmp_path / "c.yaml")
    assert main([str(config), *QUICK]) == 143
    assert (
        capsys.readouterr().err.strip().endswith("llm-zoo-train: SIGTERM while loading; nothing was trained")
    )
    monkeypatch.setattr(eval_cli, "main", terminated_while_loading)
    assert main(["eval", "somewhere"]) == 143
    assert capsys.readouterr().err.strip() == "llm-zoo-train eval: SIGTERM; nothing was written"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored after each command


def test_the_command_ignores_ctrl_c_once_its_work_is_done(monkeypatch, capsys):
    """An outside fault matrix: Ctrl-C while `llm-zoo-train eval` exited, its results written,
    printed a KeyboardInterrupt traceback from an atexit hook. The command (argv from sys.argv)
    ignores SIGINT once main returns; a caller passing argv (a test, a script) keeps its own."""
    previous = signal.getsignal(signal.SIGINT)
    try:
        assert main(["--help"]) == 0
        assert signal.getsignal(signal.SIGINT) is previous
        monkeypatch.setattr(sys, "argv", ["llm-zoo-train", "--help"])
        assert main() == 0
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    capsys.readouterr()


def test_an_evaluation_stopped_by_sigterm_is_run_again_on_resume(
    tiny_model_dir, tmp_path, capsys, monkeypatch
):
    """Issue 53 D12: an evaluation interrupted by SIGTERM was dropped from metrics.jsonl and never
    re-run, without a word."""
    from llm_zoo_train.trainer import Trainer as RealTrainer

    calls = []
    real = RealTrainer._evaluation_metrics

    def stopped_once(self):
        calls.append(self.step)
        if calls.count(1) == 1 and self.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the trainer's own handler stops the run here
        return real(self)

    monkeypatch.setattr(RealTrainer, "_evaluation_metrics", stopped_once)
    config = write_toy_config(tiny_model_dir, tmp_path / "run", tmp_path / "c.yaml")
    argv = [str(config), "--eval.num_episodes", "2", "--eval.eval_steps", "1", "--training.max_steps", "2"]
    assert main(argv) == 143
    assert "SIGTERM: stopped after step 1" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 0
    out = capsys.readouterr().out
    assert "the evaluation of step 1 was interrupted: running it again" in out
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evaluated = sorted({r["step"] for r in records if "eval/success_rate" in r})
    assert evaluated == [0, 1, 2]  # before training, the interrupted step 1 (run again), step 2


def test_a_final_evaluation_stopped_by_sigterm_is_run_again_and_the_final_adapters_written(
    tiny_model_dir, tmp_path, capsys, monkeypatch
):
    """An outside fault matrix: a run extended past an earlier end (1 -> 2 steps) and stopped by
    SIGTERM during its final evaluation wrote checkpoint-2, so the next --resume called the run
    finished: the final evaluation was never run and output_dir/adapters kept step 1's weights,
    without a word."""
    from llm_zoo_train.trainer import Trainer as RealTrainer

    config = write_toy_config(tiny_model_dir, tmp_path / "run", tmp_path / "c.yaml")
    argv = [str(config), "--eval.num_episodes", "2", "--training.max_steps", "1"]
    assert main(argv) == 0
    calls = []
    real = RealTrainer._evaluation_metrics

    def stopped_once(self):
        calls.append(self.step)
        if calls == [2]:
            os.kill(os.getpid(), signal.SIGTERM)  # the trainer's own handler stops the run here
        return real(self)

    monkeypatch.setattr(RealTrainer, "_evaluation_metrics", stopped_once)
    extended = [*argv[:-1], "2", "--resume"]
    assert main(extended) == 143
    capsys.readouterr()
    final = tmp_path / "run" / "adapters"
    checkpoint = tmp_path / "run" / "checkpoint-2" / "adapters"
    weights = "adapter_model.safetensors"
    assert (final / "alice" / weights).read_bytes() != (checkpoint / "alice" / weights).read_bytes()

    assert main(extended) == 0
    out = capsys.readouterr().out
    assert "the evaluation of step 2 was interrupted: running it again" in out
    for name in ("alice", "bob"):
        assert (final / name / weights).read_bytes() == (checkpoint / name / weights).read_bytes()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert 2 in {r["step"] for r in records if "eval/success_rate" in r}
    assert main(extended) == 0  # now finished, said before any model loads
    assert "is finished" in capsys.readouterr().out
    assert calls == [2, 2]


def test_the_finishing_resume_of_an_interrupted_final_save_leaves_nothing_behind(
    tiny_model_dir, tmp_path, capsys
):
    """Issue 53 D11: after an interrupted final adapter save, the finishing --resume wrote the
    adapters without the run's lock and left the temporary directory and the dead run's lock."""
    import shutil

    config = write_toy_config(tiny_model_dir, tmp_path / "run", tmp_path / "c.yaml")
    argv = [str(config), *QUICK, "--training.max_steps", "2", "--training.save_steps", "1"]
    assert main(argv) == 0
    run = tmp_path / "run"
    shutil.copytree(run / "adapters", run / ".tmp-adapters-abc123")  # the save was cut here
    shutil.rmtree(run / "adapters")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = {"pid": dead.pid, "host": socket.gethostname(), "started": "2026-01-01T00:00:00+00:00"}
    (run / ".llm-zoo-train.lock").write_text(json.dumps(lock))
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 0
    out = capsys.readouterr().out
    assert "took over the stale lock" in out and "removed an unfinished write" in out
    assert sorted(p.name for p in run.iterdir()) == [
        "adapters",
        "checkpoint-1",
        "checkpoint-2",
        "config.yaml",
        "metrics.jsonl",
    ]
    # A live run holding the lock is not disturbed: the finishing resume refuses in one line.
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / ".llm-zoo-train.lock").write_text(json.dumps({**lock, "pid": holder.pid}))
        shutil.rmtree(run / "adapters")
        assert main([*argv, "--resume"]) == 2
        assert "is in use by a run still going" in one_line_error(capsys.readouterr().err)
        assert not (run / "adapters").exists()
    finally:
        holder.kill()
        holder.wait()


# --------------------------------------------------------------------------- the run lock


def test_a_second_live_run_is_refused_and_deletes_nothing(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    config = write_toy_config(tiny_model_dir, run, tmp_path / "c.yaml")
    assert main([str(config), *QUICK, "--training.max_steps", "1"]) == 0
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = {"pid": holder.pid, "host": socket.gethostname(), "started": "2026-01-01T00:00:00+00:00"}
        (run / ".llm-zoo-train.lock").write_text(json.dumps(lock))
        before = sorted(p.name for p in run.iterdir())
        argv = [str(config), *QUICK, "--training.max_steps", "1", "--training.overwrite_output_dir", "true"]
        assert main(argv) == 2
        line = one_line_error(capsys.readouterr().err)
        assert f"is in use by a run still going (pid {holder.pid} on {socket.gethostname()}" in line
        assert sorted(p.name for p in run.iterdir()) == before
    finally:
        holder.kill()
        holder.wait()
    # The holder is gone: its lock is stale, reported and taken over.
    assert main(argv) == 0
    assert f"took over the stale lock of a run that is gone (pid {holder.pid}" in capsys.readouterr().out
    assert not (run / ".llm-zoo-train.lock").exists()  # released at the end


def test_a_lock_of_another_host_is_refused(tmp_path):
    from llm_zoo_train.runs.lock import RunLock, RunLockedError

    (tmp_path / ".llm-zoo-train.lock").write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "x"}))
    with pytest.raises(RunLockedError, match="used by a run on another host"):
        RunLock(tmp_path).acquire()


# --------------------------------------------------------------------------- env servers


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_env_servers_that_do_not_answer_stop_the_run_before_anything_is_deleted(
    tiny_model_dir, tmp_path, capsys
):
    """Issue 53 D1: with overwrite_output_dir, env.servers that do not answer deleted the earlier
    run after the model loaded, then died at the first rollout with a raw RemoteEnvError."""
    run = tmp_path / "run"
    config = write_toy_config(tiny_model_dir, run, tmp_path / "c.yaml")
    assert main([str(config), *QUICK, "--training.max_steps", "1"]) == 0
    capsys.readouterr()
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    dead = f"http://127.0.0.1:{_free_port()}"
    argv = [str(config), *QUICK, "--training.max_steps", "1", "--training.overwrite_output_dir", "true",
            "--env.servers", f"[{dead}]"]  # fmt: skip
    assert main(argv) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "1 of 1 env server(s) in env.servers did not make and reset" in line and dead in line
    assert "nothing was started or deleted" in line
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # the earlier run is intact
    assert not (run / ".llm-zoo-train.lock").exists()  # and the directory is free again


@pytest.mark.parametrize("rollouts", ["sync", "async"])
def test_every_env_server_lost_mid_run_is_one_line(tiny_model_dir, tmp_path, capsys, rollouts):
    """Issue 53 D3: with every configured server killed mid-run, a sync run ended in a raw
    RemoteEnvError traceback and an async one in RolloutWorkerError; both now stop with one line
    naming the servers, and the last checkpoint is kept."""
    import threading
    import time

    from llm_zoo.serve import ServerProcess

    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])
    )
    run = tmp_path / "run"
    config = write_toy_config(tiny_model_dir, run, tmp_path / "c.yaml")
    servers = [ServerProcess("--plugin", "toy_envs_trainer", env=env) for _ in range(2)]
    with servers[0] as first, servers[1] as second:

        def kill_both_after_step_2() -> None:
            metrics = run / "metrics.jsonl"
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:  # eval, steps 1 and 2
                    break
                time.sleep(0.005)
            for server in servers:
                os.killpg(server.process.pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_both_after_step_2, daemon=True)
        killer.start()
        argv = [str(config), "--training.max_steps", "40", "--training.save_steps", "1",
                "--env.servers", f"[{first}, {second}]"]  # fmt: skip
        if rollouts == "async":
            argv += ["--rollout.async_steps", "1", "--rollout.async_worker_threads", "1"]
        assert main(argv) == 2
        killer.join()
    line = one_line_error(capsys.readouterr().err)
    assert "no env server left to play on" in line and "continue with --resume" in line, line
    assert first in line and second in line, line
    assert list(run.glob("checkpoint-*")), list(run.iterdir())  # the last checkpoint is kept


def test_a_run_stopped_without_servers_says_how_to_go_on_from_what_was_written(tmp_path):
    """An outside fault matrix: an async run whose servers were both stopped ended "the last
    checkpoint is kept: continue with --resume" with no checkpoint written (the first one waits
    for rollouts a lost server never sends); --resume then found none."""
    from llm_zoo_train.__main__ import _how_to_continue

    when = "once a server in env.servers answers"
    line = _how_to_continue(str(tmp_path), when)
    assert "no checkpoint was written yet" in line and "--training.overwrite_output_dir true" in line
    assert "--resume" not in line
    for step in (1, 2):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"step": step}))
    assert _how_to_continue(str(tmp_path), when) == f"checkpoint-2 is kept: continue with --resume {when}"
    assert "no checkpoint" in _how_to_continue(str(tmp_path / "absent"), when)


# --------------------------------------------------------------------------- full disks


def test_a_full_disk_while_logging_metrics_is_one_line(tmp_path, monkeypatch):
    import builtins

    from llm_zoo_train.reporting.tracking import RunLogger
    from llm_zoo_train.runs.checkpoint import CheckpointWriteError

    logger = RunLogger(_Accelerator(), tmp_path, [], total_steps=1, logging_steps=1, progress_bar=False)
    real_open = builtins.open

    def full(path, mode="r", *args, **kwargs):
        if str(path).endswith("metrics.jsonl") and "a" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full)
    with pytest.raises(CheckpointWriteError) as error:
        logger.log(1, {"x": 1.0})
    assert str(error.value).startswith(f"cannot write {tmp_path / 'metrics.jsonl'}: no space left on device")


def test_torch_save_enforce_fail_names_the_checkpoint(tmp_path):
    from llm_zoo_train.runs.checkpoint import CheckpointWriteError, checkpoint_path, write_checkpoint

    def failing(directory):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 470")

    with pytest.raises(CheckpointWriteError) as error:
        write_checkpoint(checkpoint_path(tmp_path, 1), failing)
    message = str(error.value)
    assert message.startswith(f"cannot write {tmp_path / 'checkpoint-1'}:") and "\n" not in message
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_while_safetensors_writes_names_the_checkpoint(tmp_path):
    """safetensors reports a full disk as its own SafetensorError, neither OSError nor RuntimeError
    (found by a real full tmpfs during the final adapter save: a raw traceback)."""
    from safetensors import SafetensorError

    from llm_zoo_train.runs.checkpoint import CheckpointWriteError, write_checkpoint

    def failing(directory):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    with pytest.raises(CheckpointWriteError) as error:
        write_checkpoint(tmp_path / "adapters", failing, manifest=False)
    message = str(error.value)
    assert message.startswith(f"cannot write {tmp_path / 'adapters'}: no space left on device")
    assert "\n" not in message and list(tmp_path.iterdir()) == []


def test_non_finite_env_rewards_stop_the_run_with_one_line_naming_the_step(
    tiny_model_dir, tmp_path, capsys, monkeypatch
):
    real = toy_envs_trainer.ScriptedEnv._act

    def nan_rewards(self, agent, action):
        outcome = real(self, agent, action)
        outcome.role_reward = float("nan")
        return outcome

    monkeypatch.setattr(toy_envs_trainer.ScriptedEnv, "_act", nan_rewards)
    config = write_toy_config(tiny_model_dir, tmp_path / "run", tmp_path / "c.yaml")
    assert main([str(config), *QUICK, "--training.max_steps", "2", "--training.save_steps", "1"]) == 1
    line = one_line_error(capsys.readouterr().err)
    assert line.startswith("llm-zoo-train: error: step 1:") and "non-finite rewards" in line
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith("checkpoint-")]


def _race_for_the_lock(directory, barrier, results):
    from llm_zoo_train.runs.lock import RunLock, RunLockedError

    lock = RunLock(directory)
    barrier.wait()
    try:
        lock.acquire()
    except RunLockedError:
        results.put(False)
        barrier.wait()
        return
    results.put(True)
    barrier.wait()  # hold it until every racer has tried
    lock.release()


def test_processes_taking_the_lock_in_the_same_instant_get_it_once(tmp_path):
    """Issue 53 (D4): two processes calling acquire() at once both got the lock in 432 of 450
    trials on a quiet machine: the second read the first's still-empty file as unreadable and
    took it over. Fresh, stale and unreadable lock files alike."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    racers = 4
    for trial in range(24):
        directory = tmp_path / f"run{trial}"
        directory.mkdir()
        kind = trial % 3
        if kind == 1:  # stale: a holder that is gone
            (directory / ".llm-zoo-train.lock").write_text(
                json.dumps({"pid": 2**22 + 12345, "host": socket.gethostname(), "started": "x"})
            )
        elif kind == 2:  # unreadable
            (directory / ".llm-zoo-train.lock").write_text("{not json")
        barrier, results = context.Barrier(racers), context.Queue()
        processes = [
            context.Process(target=_race_for_the_lock, args=(directory, barrier, results))
            for _ in range(racers)
        ]
        for process in processes:
            process.start()
        got = [results.get(timeout=30) for _ in range(racers)]
        for process in processes:
            process.join(timeout=30)
        assert sum(got) == 1, (trial, got)
        assert not (directory / ".llm-zoo-train.lock").exists()  # the winner released it


def test_a_lock_held_by_a_live_process_is_refused_and_freed_by_its_death(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from llm_zoo_train.runs.lock import RunLock; RunLock(sys.argv[1]).acquire();"
         " print('held', flush=True); time.sleep(60)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        from llm_zoo_train.runs.lock import RunLock, RunLockedError

        with pytest.raises(RunLockedError, match=f"in use by a run still going \\(pid {holder.pid} "):
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()  # -9: no release, the file stays
        holder.wait()
    assert (tmp_path / ".llm-zoo-train.lock").exists()
    lock = RunLock(tmp_path)
    assert "took over the stale lock of a run that is gone" in lock.acquire()
    lock.release()


def test_resuming_a_copied_run_writes_into_the_copy_and_leaves_the_original_alone(
    tiny_model_dir, tmp_path, capsys
):
    """Issue 53 (D2): `--resume COPY_DIR` without a config wrote into the output_dir its config
    recorded, replacing the original run's config, checkpoints, adapters and metrics."""
    import shutil

    run, copy = tmp_path / "run", tmp_path / "copy"
    config = write_toy_config(tiny_model_dir, run, tmp_path / "c.yaml")
    assert main([str(config), *QUICK, "--training.max_steps", "1"]) == 0
    shutil.copytree(run, copy)
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["--resume", str(copy), "--training.max_steps", "2"]) == 0
    assert f"resuming in {copy}, where the checkpoint is" in capsys.readouterr().out
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert (copy / "checkpoint-2").is_dir() and not (run / "checkpoint-2").exists()
    assert len((copy / "metrics.jsonl").read_text().splitlines()) > len(
        (run / "metrics.jsonl").read_text().splitlines()
    )


# --------------------------------------------------------------------------- symbolic links


def _link_to_a_file(link, target):
    target.write_text("x")
    link.symlink_to(target)


@pytest.mark.parametrize(
    ("make_link", "message"),
    [
        (lambda run, tmp: run.symlink_to(tmp / "nowhere"), "is a symbolic link that points to nothing"),
        (lambda run, tmp: run.symlink_to(run), "is a symbolic link that loops"),
        (
            lambda run, tmp: _link_to_a_file(run, tmp / "file"),
            "not a directory",
        ),
    ],
)
def test_an_output_dir_link_that_cannot_hold_a_run_is_one_line(
    make_link, message, tiny_model_dir, tmp_path, capsys
):
    """Issue 53 D10: a dangling or looping symlink as output_dir gave a traceback."""
    run = tmp_path / "run"
    config = write_toy_config(tiny_model_dir, tmp_path / "elsewhere", tmp_path / "c.yaml")
    make_link(run, tmp_path)
    assert main([str(config), *QUICK, "--training.max_steps", "1", "--training.output_dir", str(run)]) == 2
    assert message in one_line_error(capsys.readouterr().err)


def test_overwrite_removes_links_among_the_outputs_never_what_they_point_to(tiny_model_dir, tmp_path, capsys):
    """Issue 53 D10: overwrite_output_dir over symlinked outputs deleted through the link (or raised)."""
    real = tmp_path / "real"
    real.mkdir()
    config = write_toy_config(tiny_model_dir, real, tmp_path / "c.yaml")
    assert main([str(config), *QUICK, "--training.max_steps", "1"]) == 0
    linked = tmp_path / "linked"
    linked.mkdir()
    for name in ("checkpoint-1", "adapters", "metrics.jsonl"):
        (real / name).rename(tmp_path / f"kept-{name}")
        (linked / name).symlink_to(tmp_path / f"kept-{name}")
    (linked / "config.yaml").write_text((real / "config.yaml").read_text())
    kept = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("kept-*/**/*"))
    argv = [str(config), *QUICK, "--training.max_steps", "1", "--training.output_dir", str(linked),
            "--training.overwrite_output_dir", "true"]  # fmt: skip
    assert main(argv) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("kept-*/**/*")) == kept  # untouched
    assert not (linked / "checkpoint-1").is_symlink() and (linked / "adapters").is_dir()  # the new run's own
