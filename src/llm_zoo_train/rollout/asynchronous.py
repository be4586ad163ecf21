"""Asynchronous rollouts: the next steps' rollouts are generated while the current step updates.

With ``rollout.async_steps = k > 0`` the trainer does not roll out itself. A generation process
(:mod:`llm_zoo_train.rollout.worker`, started on the first step) plays the rollouts, with its own
copy of the base model and the adapters (engine ``hf``) or its own server engine (engine
``vllm_server``); :class:`AsyncRollouts` is the trainer's side of it.
At the start of step ``t`` the trainer asks for every step up to ``t + k`` not yet asked for, with
the adapters it holds at that moment (version ``t - 1``: the number of updates they have had), and
then waits for step ``t``'s rollout. With ``k = 1``:

* step 1 is generated with version 0, and so is step 2 (asked for before step 1 updates);
* step ``t + 1`` is generated with version ``t - 1`` while step ``t`` updates, so step ``t``'s
  samples come from version ``t - 2`` and the update that consumes them starts from version
  ``t - 1``: one version stale (``rollout/staleness`` 1 from step 2 on).

With ``rollout.async_trainer_envs = n > 0`` the work is shared: each rollout the trainer asks
for, it also plays the first ``n`` of that step's tasks itself, with the same adapter version,
right after sending the request and before it updates; the generation process plays the others
(:func:`~llm_zoo_train.rollout.step.play_step` parts, joined by
:func:`~llm_zoo_train.rollout.step.merge_parts`). When generation takes longer than the update,
the trainer would otherwise wait for it.

Every sample records its ``policy_version``; the per-token behaviour logprobs recorded at generation
feed the truncated importance-sampling correction (``algorithm.importance_sampling``, on by default
when async). Adapters reach the process the way the vLLM engine gets them: saved as versions under
``output_dir/engine_adapters/async-rankR/vN`` and loaded by version.

Determinism: a step's rollout depends only on the run seed, the step and the adapter version that
generated it, which the schedule above fixes, so an asynchronous run is determined by its seed (and
its thread counts and the kernels its ``"auto"`` options measured, which change float rounding:
the generation process starts from the trainer's choices, reports its own with each rollout, and
checkpoints keep them for the process a resumed run starts; :mod:`llm_zoo_train.kernels.choices`).

Checkpoints keep the rollouts in flight: saving a checkpoint waits for them and writes them into
the checkpoint (``async_rollouts/``); a resumed run uses them instead of generating them again, so
it continues exactly as the uninterrupted run (tested). The checkpoint's trainer state lists the
steps saved; a rollout missing or emptied on resume is an error naming the file (the checkpoint is
damaged and an older one is used), never a rollout generated again with newer adapters. Rollouts
in flight when the run stops without a checkpoint are dropped (the checkpoint it resumes from has
its own).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llm_zoo.remote import RemoteEnvError
from llm_zoo_train.config import AlgorithmConfig, Config
from llm_zoo_train.kernels.choices import measured_kernel_choices
from llm_zoo_train.models.policy import Policy
from llm_zoo_train.rollout.samples import read_jsonl, write_jsonl
from llm_zoo_train.rollout.step import StepRollout, merge_parts
from llm_zoo_train.rollout.worker import WorkerSpec, run_worker
from llm_zoo_train.runs.manifest import CheckpointDamagedError

__all__ = ["AsyncRollouts", "RolloutWorkerError", "algorithm_settings"]

#: The checkpoint's subdirectory holding the rollouts in flight.
CHECKPOINT_DIR = "async_rollouts"
#: Seconds a stopped generation process gets to exit before it is terminated, then killed.
STOP_GRACE_S = 5.0


class RolloutWorkerError(RuntimeError):
    """The generation process failed or exited; the message carries its traceback or exit code."""


def algorithm_settings(config: Config) -> AlgorithmConfig:
    """``config.algorithm`` with ``importance_sampling`` decided: ``None`` means on exactly when
    rollouts are asynchronous (their behaviour policy is older than the one being updated)."""
    if config.algorithm.importance_sampling is not None:
        return config.algorithm
    return dataclasses.replace(config.algorithm, importance_sampling=config.rollout.async_steps > 0)


class AsyncRollouts:
    """The trainer's side of asynchronous rollouts (see the module docstring).

    Args:
        config: The run's configuration (``rollout.async_steps`` > 0).
        policy: The trainer's policy: its adapters are saved for the generation process.
        output_dir: The run's output directory (adapter versions go under ``engine_adapters/``).
        rank: The trainer's process index.
        num_processes: The trainer's process count.
        device: Where the generation process puts its model copy.
        play_own: Plays a part of a step in the trainer: ``play_own(step, envs)`` with the
            adapters the trainer holds (required when ``rollout.async_trainer_envs`` > 0).

    Call :meth:`close` when done (the trainer does when :meth:`~llm_zoo_train.trainer.Trainer.train`
    returns or raises): it stops the generation process.
    """

    def __init__(
        self,
        config: Config,
        policy: Policy,
        *,
        output_dir: str | Path,
        rank: int = 0,
        num_processes: int = 1,
        device: str = "cpu",
        play_own: Callable[[int, range], StepRollout] | None = None,
    ):
        rollout = config.rollout
        if rollout.async_steps < 1:
            raise ValueError(f"rollout.async_steps must be >= 1 here, got {rollout.async_steps}")
        if rollout.async_trainer_envs and play_own is None:
            raise ValueError("rollout.async_trainer_envs > 0 needs play_own: the trainer plays its part")
        self.config = config
        self.policy = policy
        self.rank, self.num_processes, self.device = rank, num_processes, device
        self.ahead = rollout.async_steps
        self._play_own = play_own
        self._own_envs = range(rollout.async_trainer_envs)
        self._worker_envs = range(rollout.async_trainer_envs, rollout.envs_per_step)
        self._own_parts: dict[int, StepRollout] = {}  # step -> the part the trainer played
        #: Seconds the trainer spent in its last :meth:`take` playing its own parts.
        self.own_seconds = 0.0
        self._root = Path(output_dir) / "engine_adapters" / f"async-rank{rank}"
        self._latest: dict[str, str] = {}  # adapter -> path of its newest saved version
        self._saved_version: int | None = None
        self._in_flight: dict[int, dict[str, str]] = {}  # step -> the adapter paths it was asked with
        self._ready: dict[int, StepRollout] = {}
        self._process: Any = None
        self._connection: Any = None
        #: The ``"auto"`` kernels the generation process chose (its newest report, or a resumed
        #: run's checkpoint; :mod:`llm_zoo_train.kernels.choices`). ``None``: none yet; a
        #: process then starts from the trainer's own.
        self.kernel_choices: dict[str, Any] | None = None

    # ------------------------------------------------------------------ the trainer's calls

    def take(self, step: int, version: int, last_step: int) -> tuple[StepRollout, float]:
        """Step ``step``'s rollout and the seconds spent waiting for the generation process.

        First asks for every step up to ``min(step + async_steps, last_step)`` not yet asked for,
        generated with the current adapters (``version``), so the process never idles while the
        trainer updates; with ``rollout.async_trainer_envs`` the trainer then plays its part of
        those steps (:attr:`own_seconds`, not counted as waiting)."""
        start = time.perf_counter()
        self.own_seconds = 0.0
        wanted = range(step, min(step + self.ahead, last_step) + 1)
        missing = [s for s in wanted if s not in self._in_flight and s not in self._ready]
        if missing:
            paths = self._publish(version)
            self._start()
            for s in missing:
                try:
                    self._connection.send(("rollout", s, version, paths, self._worker_envs))
                except OSError as err:  # a broken pipe: the process is gone
                    raise self._lost(f"could not send it a request ({err})") from None
                self._in_flight[s] = paths
            if self._play_own is not None and self._own_envs:
                own_start = time.perf_counter()
                for s in missing:
                    self._own_parts[s] = self._play_own(s, self._own_envs)
                self.own_seconds = time.perf_counter() - own_start
        while step not in self._ready:
            self._receive()
        produced = self._ready.pop(step)
        self._remove_unused_versions()
        return produced, time.perf_counter() - start - self.own_seconds

    def wait_for_in_flight(self) -> None:
        """Receive every rollout asked for (a checkpoint saves them)."""
        while self._in_flight:
            self._receive()

    def save(self, directory: str | Path) -> None:
        """Write the received rollouts not yet taken into checkpoint ``directory`` (call
        :meth:`wait_for_in_flight` first, or rollouts still in flight are not saved)."""
        target = Path(directory) / CHECKPOINT_DIR
        target.mkdir(parents=True, exist_ok=True)
        index = []
        for step, produced in sorted(self._ready.items()):
            write_jsonl(produced.samples, target / f"step_{step:06d}.jsonl")
            index.append(
                {
                    "step": step,
                    "samples": len(produced.samples),
                    "policy_version": produced.policy_version,
                    "generation_seconds": produced.generation_seconds,
                    "seconds": produced.seconds,
                }
            )
        (target / "rollouts.json").write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")

    @property
    def ready_steps(self) -> list[int]:
        """The steps whose rollouts have arrived and are not yet taken (what :meth:`save` writes)."""
        return sorted(self._ready)

    @property
    def requested_steps(self) -> set[int]:
        """The steps asked for and not yet taken (arrived or still in flight)."""
        return set(self._ready) | set(self._in_flight)

    def keep_only(self, steps: set[int]) -> None:
        """Forget the arrived rollouts of steps not in ``steps`` (call :meth:`wait_for_in_flight`
        first): a checkpoint of an interrupted run keeps only those its step had asked for."""
        for step in [s for s in self._ready if s not in steps]:
            del self._ready[step]
        for step in [s for s in self._own_parts if s not in steps]:
            del self._own_parts[step]

    def restore(self, checkpoint: str | Path, expected: list[int] | None = None) -> None:
        """Take the rollouts a checkpoint saved as received. ``expected``: the steps its trainer
        state lists; each must be there with every sample it was saved with, else
        :class:`~llm_zoo_train.runs.manifest.CheckpointDamagedError` naming the file (a rollout is
        never generated again with newer adapters). ``None``: whatever the checkpoint holds."""
        source = Path(checkpoint) / CHECKPOINT_DIR
        index_file = source / "rollouts.json"
        if not index_file.is_file():
            if expected:
                raise CheckpointDamagedError(
                    f"{index_file} is missing: the rollouts of steps {expected} were in flight", index_file
                )
            return
        try:
            index = [dict(entry) for entry in json.loads(index_file.read_text(encoding="utf-8"))]
        except (ValueError, TypeError) as err:
            raise CheckpointDamagedError(
                f"{index_file} is unreadable ({type(err).__name__})", index_file
            ) from None
        listed = sorted(int(entry["step"]) for entry in index)
        if expected is not None and listed != sorted(expected):
            raise CheckpointDamagedError(
                f"{index_file} lists the rollouts of steps {listed}, the trainer state {sorted(expected)}",
                index_file,
            )
        for entry in index:
            step = int(entry["step"])
            count = entry.pop("samples", None)
            path = source / f"step_{step:06d}.jsonl"
            try:
                samples = list(read_jsonl(path))
            except (OSError, ValueError, TypeError, KeyError) as err:
                raise CheckpointDamagedError(f"cannot read {path} ({type(err).__name__})", path) from None
            if len(samples) != (count if count is not None else max(len(samples), 1)):
                raise CheckpointDamagedError(
                    f"{path} holds {len(samples)} samples, the rollout had {count if count is not None else 'some'}",
                    path,
                )
            self._ready[step] = StepRollout(samples=samples, **entry)

    @property
    def pid(self) -> int | None:
        """The generation process's pid (``None``: not running)."""
        return self._process.pid if self._process is not None else None

    def close(self) -> None:
        """Stop the generation process (rollouts in flight are dropped) and delete the adapter
        versions saved for it; safe to call twice."""
        process, connection, busy = self._process, self._connection, bool(self._in_flight)
        self._process = self._connection = None
        self._in_flight.clear()
        self._own_parts.clear()
        try:
            if process is not None:
                _stop(process, connection, busy)
        finally:
            # The versions were only for the process: a later start saves the adapters again.
            shutil.rmtree(self._root, ignore_errors=True)
            with contextlib.suppress(OSError):  # engine_adapters/, when nothing else is in it
                self._root.parent.rmdir()
            self._latest, self._saved_version = {}, None

    # ------------------------------------------------------------------ internals

    def _publish(self, version: int) -> dict[str, str]:
        """Save the adapters as ``version`` (all the first time, then the trainable ones) and
        return every adapter's newest path."""
        if self._saved_version != version:
            names = self.policy.adapter_names if not self._latest else self.policy.trainable
            if names:
                self._latest.update(self.policy.save_adapters(self._root / f"v{version}", names))
            self._saved_version = version
        return dict(self._latest)

    def _start(self) -> None:
        if self._process is not None:
            return
        rollout = self.config.rollout
        spec = WorkerSpec(
            config=self.config,
            adapter_paths=dict(self._latest),
            version=int(self._saved_version or 0),
            rank=self.rank,
            num_processes=self.num_processes,
            device=self.device,
            threads=rollout.async_worker_threads,
            cores=rollout.async_worker_cores,
            parent_pid=os.getpid(),
            kernel_choices=self.kernel_choices
            if self.kernel_choices is not None
            else measured_kernel_choices(),
        )
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(
            target=run_worker, args=(child, spec), name=f"llm-zoo-rollouts-rank{self.rank}", daemon=True
        )
        self._process.start()
        child.close()

    def _receive(self) -> None:
        """Wait for the process's next message and file it; raise if the process failed."""
        while not self._connection.poll(0.2):
            if not self._process.is_alive():
                raise self._lost("no rollout came back")
        try:
            kind, payload, *rest = self._connection.recv()
        except (EOFError, OSError) as err:
            raise self._lost(f"its pipe broke ({err})") from None
        if kind == "error":
            self.close()
            failure = RolloutWorkerError(f"the rollout generation process failed:\n{payload}")
            what = rest[0] if rest else {}
            if what.get("type") == "RemoteEnvError":  # env servers lost: the same error as in a sync run
                raise RemoteEnvError(
                    what["message"], connection_lost=bool(what["connection_lost"])
                ) from failure
            raise failure
        if kind == "rollout":
            if rest:  # its "auto" kernels, for the checkpoint: a resumed run generates as this one did
                self.kernel_choices = rest[0]
            self._in_flight.pop(payload.step, None)
            own = self._own_parts.pop(payload.step, None)
            self._ready[payload.step] = payload if own is None else merge_parts([own, payload])

    def _lost(self, what: str) -> RolloutWorkerError:
        """The error for a generation process that went away (closed here, exit code named)."""
        process = self._process
        process.join(1.0)
        self.close()
        return RolloutWorkerError(
            f"the rollout generation process exited with code {process.exitcode}: {what}"
        )

    def _remove_unused_versions(self) -> None:
        """Delete saved versions that neither a request in flight nor the newest adapters use."""
        in_use = {
            Path(p).parent for paths in [self._latest, *self._in_flight.values()] for p in paths.values()
        }
        for old in self._root.glob("v*"):
            if old not in in_use:
                shutil.rmtree(old, ignore_errors=True)


def _stop(process: Any, connection: Any, busy: bool) -> None:
    """Stop the generation process: a stop message when idle, else SIGTERM, then SIGKILL."""
    try:
        if process.is_alive() and not busy:
            connection.send(("stop",))
            process.join(STOP_GRACE_S)
    except (OSError, EOFError):
        pass
    if process.is_alive():
        process.terminate()  # mid-rollout: its result would be dropped anyway
        process.join(STOP_GRACE_S)
    if process.is_alive():
        process.kill()
        process.join()
    connection.close()
