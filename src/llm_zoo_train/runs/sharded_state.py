"""Whole tensors from sharded ones and back, for checkpoints written under ``training.strategy:
fsdp2``.

FSDP2 keeps each weight, and the optimizer's moments beside it, as a ``DTensor`` of which every
process holds a slice. A checkpoint holds whole tensors instead, the files a ``ddp`` run writes,
so either strategy, any process count and plain PEFT can load it. Only the adapters and their
optimizer states are gathered (megabytes), never the frozen base: no redundant full-model save.

Gathering is a collective: every process calls these functions, in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["full_state", "full_tensor", "is_sharded", "local_part", "shard_optimizer_state"]


def is_sharded(tensor: Any) -> bool:
    """Whether ``tensor`` is a distributed tensor (a slice per process)."""
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole of ``tensor`` (gathered from every process when sharded), detached."""
    if is_sharded(tensor):
        return tensor.detach().full_tensor()  # type: ignore[attr-defined]
    return tensor.detach()


def full_state(tree: Any) -> Any:
    """``tree`` (dicts, lists, tuples of tensors and plain values) with every sharded tensor whole."""
    if isinstance(tree, torch.Tensor):
        return full_tensor(tree) if is_sharded(tree) else tree
    if isinstance(tree, dict):
        return {key: full_state(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(full_state(value) for value in tree)
    return tree


def local_part(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``whole`` cut as ``like`` is sharded (this process's slice, as a DTensor), with no
    communication: every process holds the same ``whole``. ``whole`` itself when ``like`` is
    not sharded."""
    if not is_sharded(like):
        return whole
    from torch.distributed.tensor import distribute_tensor

    cut = distribute_tensor(
        whole.to(device=like.device, dtype=like.dtype),
        like.device_mesh,  # type: ignore[attr-defined]
        like.placements,  # type: ignore[attr-defined]
        src_data_rank=None,
    )
    # The slice is a view into ``whole``: give it storage of its own, laid out as ``like``'s, as
    # the tensors torch's optimizers and FSDP make themselves.
    part = torch.zeros_like(like)
    with torch.no_grad():
        part.to_local().copy_(cut.to_local())  # type: ignore[attr-defined]
    return part


def shard_optimizer_state(optimizer: Any) -> None:
    """After ``optimizer.load_state_dict`` of whole tensors: cut each moment of a sharded
    parameter to the parameter's slice (an optimizer step refuses whole and sliced tensors mixed)."""
    inner = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper holds torch's
    parameters: Iterable[torch.Tensor] = (p for group in inner.param_groups for p in group["params"])
    for parameter in parameters:
        if not is_sharded(parameter):
            continue
        state = inner.state.get(parameter, {})
        for key, value in list(state.items()):
            if isinstance(value, torch.Tensor) and not is_sharded(value) and value.shape == parameter.shape:
                state[key] = local_part(value, parameter)
