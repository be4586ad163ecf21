"""Where a colocated vLLM engine runs: its own GPU per trainer process, or a tensor-parallel group.

The ``vllm`` engine (:mod:`llm_zoo_train.engines.vllm.engine`) starts vLLM's engine-core process from the
trainer's process. That child picks its GPUs from ``CUDA_VISIBLE_DEVICES`` as it is when it starts,
so :func:`engine_gpus` says which devices this process's engine gets and :func:`visible_devices`
sets them for the start only (the trainer's own CUDA context is already made and keeps its device):

* one process, ``tensor_parallel_size`` n: the first n visible GPUs (vLLM's own default);
* N data-parallel processes, n = 1: each process's engine on that process's own GPU (the one
  Accelerate gave it), next to its training;
* N processes and n > 1: refused. Each process plays its own envs, so processes call the engine a
  different number of times per step, while the processes of one tensor-parallel group would have
  to call it in lockstep. For large models in data-parallel runs use the ``vllm_server`` engine with
  tensor-parallel servers (``--tensor-parallel-size``).

On CPU nothing is set: every process's engine runs on the machine's cores.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["check_placement", "engine_gpus", "visible_devices"]


def check_placement(world_size: int, tensor_parallel_size: int) -> None:
    """Raise ``ValueError`` for a placement the colocated engine cannot serve (see the module docs)."""
    if int(tensor_parallel_size) < 1:
        raise ValueError(f"vllm.tensor_parallel_size must be >= 1, got {tensor_parallel_size!r}")
    if int(world_size) > 1 and int(tensor_parallel_size) > 1:
        raise ValueError(
            f"vllm.tensor_parallel_size {tensor_parallel_size} with {world_size} trainer processes: a colocated "
            "tensor-parallel engine needs its processes to generate in lockstep, which rollouts do not. Use "
            "tensor_parallel_size 1 (one engine per process, on its own GPU), or rollout.engine vllm_server "
            "with servers started with --tensor-parallel-size."
        )


def engine_gpus(world_size: int, tensor_parallel_size: int) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for this process's engine; ``None``: leave it as it is (CPU, or one
    process, where vLLM takes the first ``tensor_parallel_size`` visible GPUs itself)."""
    check_placement(world_size, tensor_parallel_size)
    import torch

    if not torch.cuda.is_available():
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = (
        [d.strip() for d in visible.split(",") if d.strip()]
        if visible
        else [str(i) for i in range(torch.cuda.device_count())]
    )
    first = torch.cuda.current_device() if world_size > 1 else 0
    group = devices[first : first + int(tensor_parallel_size)]
    if len(group) < int(tensor_parallel_size):
        raise ValueError(
            f"vllm.tensor_parallel_size {tensor_parallel_size} needs {tensor_parallel_size} GPUs from GPU {first}; "
            f"this process sees {len(devices)} ({','.join(devices)})"
        )
    return None if world_size == 1 else ",".join(group)


@contextmanager
def visible_devices(devices: str | None) -> Iterator[None]:
    """Set ``CUDA_VISIBLE_DEVICES`` to ``devices`` inside the block (``None``: leave it)."""
    if devices is None:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = devices
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
