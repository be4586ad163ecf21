"""The generation process of asynchronous rollouts: its own engine, threads and cores.

:func:`run_worker` is the target of the process :class:`~llm_zoo_train.rollout.asynchronous.AsyncRollouts`
starts (``multiprocessing`` spawn context). It pins itself to ``rollout.async_worker_cores``, sets
its torch threads and builds its engine with the adapters the trainer saved: with
``rollout.engine: hf`` its own copy of the base model and a transformers engine; with
``vllm_server`` a server engine of its own (the tokenizer only: the servers generate), which loads
the adapters on the servers under its own names. Then it answers the trainer's messages over a
pipe, in order:

* ``("rollout", step, version, paths, envs)``: load the adapters saved at ``paths`` (adapter name
  -> PEFT directory) when ``version`` is newer than the one it serves, play tasks ``envs`` (a
  range) of step ``step`` (:func:`llm_zoo_train.rollout.step.play_step`) and send back
  ``("rollout", StepRollout, kernel choices)`` (the ``"auto"`` kernels it chose, which the
  trainer keeps: :mod:`llm_zoo_train.kernels.choices`);
* ``("stop",)``: exit.

It first sends ``("ready", pid)``; any error is sent as ``("error", traceback text)`` before it
exits. The process ignores Ctrl-C (the trainer gets it too and stops the process) and, on Linux,
asks the kernel to terminate it when the trainer dies, so it never outlives its trainer. A server
engine unloads its adapters from the servers when the process stops or is terminated (SIGTERM).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["WorkerSpec", "run_worker"]

_PR_SET_PDEATHSIG = 1


@dataclass
class WorkerSpec:
    """What the generation process needs to start.

    Attributes:
        config: The run's configuration.
        adapter_paths: Every adapter's saved directory (adapter name -> PEFT directory).
        version: The adapter version saved at ``adapter_paths``.
        rank: The trainer's process index (its rollouts' seeds).
        num_processes: The trainer's process count (rollout file names).
        device: Where the model copy goes (``"cpu"``, ``"cuda:0"``, ...).
        threads: Torch threads (``None``: one per core the process may run on).
        cores: CPU cores to pin the process to (``None``: the trainer's).
        parent_pid: The trainer's pid: the process exits if it is gone before it could be watched.
        kernel_choices: ``"auto"`` kernel choices to take before anything is measured here
            (:func:`~llm_zoo_train.kernels.choices.measured_kernel_choices`: the trainer's,
            or those of the process a resumed run replaces).
    """

    config: Any
    adapter_paths: Mapping[str, str]
    version: int
    rank: int
    num_processes: int
    device: str
    threads: int | None
    cores: list[int] | None
    parent_pid: int
    kernel_choices: Mapping[str, Any] = field(default_factory=dict)


def _exit_with_parent(parent_pid: int) -> None:
    """Have the kernel send SIGTERM when the trainer dies (Linux); exit now if it already has."""
    # Not Linux: no prctl, but the trainer's shutdown and the daemon flag still stop the process.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != parent_pid:
        os._exit(0)


def run_worker(connection: Any, spec: WorkerSpec) -> None:
    """The generation process's main function (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer handles Ctrl-C and stops this process
    _exit_with_parent(spec.parent_pid)
    try:
        _serve(connection, spec)
    except (EOFError, BrokenPipeError):
        return  # the trainer closed its end: nobody is waiting for rollouts
    except SystemExit:
        raise  # terminated by the trainer (SIGTERM): nobody is waiting for an error
    except BaseException as err:  # every failure must reach the trainer, which raises it
        what = {
            "type": type(err).__name__,
            "message": str(err),
            "connection_lost": getattr(err, "connection_lost", False),
        }
        with contextlib.suppress(OSError, EOFError):
            connection.send(("error", traceback.format_exc(), what))


def _serve(connection: Any, spec: WorkerSpec) -> None:
    if spec.cores is not None:
        os.sched_setaffinity(0, spec.cores)
    import torch

    torch.set_num_threads(spec.threads or len(os.sched_getaffinity(0)))

    from llm_zoo_train.config import validate
    from llm_zoo_train.engines.hf.engine import HFEngine, prefix_cache_mb_for
    from llm_zoo_train.kernels.choices import (
        KernelChoicesError,
        adopt_kernel_choices,
        measured_kernel_choices,
    )
    from llm_zoo_train.models.policy import Policy
    from llm_zoo_train.rollout import env_servers
    from llm_zoo_train.rollout.replay import GenerationRecorder
    from llm_zoo_train.rollout.step import play_step, save_step_rollout

    try:
        adopt_kernel_choices(spec.kernel_choices)
    except KernelChoicesError as err:  # a damaged record costs bit-identity, not the run
        logging.getLogger(__name__).warning("kernel choices not taken (%s): measuring them again", err)
    config = spec.config
    plan = validate(config)  # also imports the env plugins into this process
    env_servers.configure_env_servers(config.env.servers)
    if config.rollout.engine == "vllm_server":
        from llm_zoo_train.engines.vllm.server import server_engine
        from llm_zoo_train.models.policy import load_tokenizer

        engine: Any = server_engine(config, load_tokenizer(config.model))
        # Terminated mid-rollout: unwind, so that the finally below unloads the adapters.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        engine.load_adapters(spec.adapter_paths, spec.version)
    else:
        policy = Policy.from_config(
            config.model,
            {name: plan.lora[name] for name in plan.adapters},
            [],
            init_paths=dict(spec.adapter_paths),
            device=spec.device,
        )
        engine = HFEngine(
            policy.model,
            policy.tokenizer,
            max_batch_size=config.rollout.max_rows_per_generate_call,
            system_prompt=config.model.system_prompt,
            pack_base_weights=config.rollout.pack_base_weights,
            decode_kernel=config.rollout.decode_kernel,
            prefix_cache_mb=prefix_cache_mb_for(config.rollout.prefix_cache_mb, policy.model),
        )
    try:
        version = spec.version
        connection.send(("ready", os.getpid()))
        while True:
            message = connection.recv()
            if message[0] == "stop":
                return
            _, step, wanted, paths, envs = message
            if wanted != version:
                engine.load_adapters(paths, wanted)
                version = wanted
            recorder = GenerationRecorder(engine) if config.rollout.save_rollouts else None
            produced = play_step(
                config, plan.agent_adapters, recorder or engine, step, spec.rank, version, envs
            )
            if recorder is not None:
                save_step_rollout(
                    config.training.output_dir, produced, spec.rank, spec.num_processes, recorder
                )
            connection.send(("rollout", produced, measured_kernel_choices()))
    finally:
        close = getattr(engine, "close", None)
        if close is not None and not isinstance(engine, HFEngine):
            close()


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)
