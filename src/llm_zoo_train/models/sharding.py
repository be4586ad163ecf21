"""Sharding a policy's base model and adapters across the trainer processes with PyTorch's FSDP2
(``training.strategy: fsdp2``).

**Units.** Each decoder block (the classes transformers lists in the model's
``_no_split_modules``) is one ``fully_shard`` unit, with the LoRA weights inside it; the root
unit holds the rest: the embeddings, the final norm and the LM head (tied weights stay in one
unit). With ``fsdp_sharding: full`` each process keeps 1/N of every weight and gathers a block's
weights for its forward and again for its backward; with ``no_shard`` every process keeps the
whole model (a device mesh of N replicas of one shard) and gradients are all-reduced, DDP's cost.

**Gradients are summed** across processes, not averaged: the update's loss weights already divide
by the step's counts over all processes, as under ddp (:mod:`llm_zoo_train.training.update`).

**Lockstep.** A sharded forward gathers its unit from every process, so every process must run
the same forwards and backwards: the updater pads a process that has fewer micro-batches with
weightless ones (``AdapterUpdater(lockstep=True)``).

**Generation.** :func:`gathered` gathers every unit once when a rollout or an evaluation starts
and keeps it whole until it ends. The transformers engine then generates as under ddp: each
process at its own pace, without collectives, with the same kernels. The cost: while it
generates, each process holds the whole model, as under ddp; only training holds slices.

**Saving.** :func:`saveable` gathers the adapters whole (megabytes; the base is never gathered)
so a checkpoint holds the files a ddp run writes (:mod:`llm_zoo_train.runs.sharded_state`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from llm_zoo_train.config import ConfigError
from llm_zoo_train.runs.sharded_state import is_sharded

__all__ = [
    "WholeAdapters",
    "gathered",
    "is_sharded_model",
    "policy_models",
    "saveable",
    "shard_model",
    "sharded_units",
]

#: Whether a unit reshards after its forward when training (restored after :func:`gathered`).
_RESHARD_ATTRIBUTE = "llm_zoo_reshard_after_forward"


def shard_model(peft_model: Any, sharding: Literal["full", "no_shard"], device: torch.device) -> int:
    """Shard ``peft_model`` (a PEFT model whose base is a transformers model) across the processes
    of the default process group, in place; returns the number of decoder blocks sharded.

    Call it on every process, before the optimizers are built (they must hold the sharded
    parameters). A model whose class names no decoder block is a :class:`ConfigError`."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world == 1 and not (dist.is_available() and dist.is_initialized()):
        raise ConfigError(
            "training.strategy 'fsdp2' needs the processes of a launcher: `torchrun --nproc_per_node N` "
            "or `accelerate launch --num_processes N` (with one process use strategy 'ddp')"
        )
    if sharding == "full":
        mesh = init_device_mesh(device.type, (world,))
    else:  # N replicas of one shard: FSDP's hybrid mode with nothing to split
        mesh = init_device_mesh(device.type, (world, 1), mesh_dim_names=("replicate", "shard"))
    root = peft_model.get_base_model()
    block_names = set(getattr(root, "_no_split_modules", None) or ())
    blocks = [module for module in root.modules() if type(module).__name__ in block_names]
    if not blocks:
        raise ConfigError(
            f"training.strategy 'fsdp2': {type(root).__name__} names no decoder block class "
            "(transformers' _no_split_modules) to shard by; use strategy 'ddp'"
        )
    for block in blocks:
        reshard = sharding == "full"
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        setattr(block, _RESHARD_ATTRIBUTE, reshard)
    fully_shard(root, mesh=mesh, reshard_after_forward=False)  # its backward follows at once
    setattr(root, _RESHARD_ATTRIBUTE, False)
    for unit in sharded_units(peft_model):
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
    # FSDP settles which unit is the root at the first forward: make it the model's own forward,
    # on every process at once, before any engine calls a part of the model.
    # Then every unit back to its slices: the optimizers must be built on the sharded parameters
    # (the root stays whole after a forward).
    with torch.no_grad():
        peft_model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device))
    for unit in sharded_units(peft_model):
        unit.reshard()
    return len(blocks)


def sharded_units(model: torch.nn.Module) -> list[Any]:
    """The FSDP units within ``model`` (none: not sharded)."""
    from torch.distributed.fsdp import FSDPModule

    return [module for module in model.modules() if isinstance(module, FSDPModule)]


def is_sharded_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` was sharded by :func:`shard_model`."""
    return any(is_sharded(parameter) for parameter in model.parameters())


@contextlib.contextmanager
def gathered(models: Iterable[torch.nn.Module]) -> Iterator[None]:
    """Within the block, every sharded unit of ``models`` is whole and stays whole through its
    forwards (module docstring: generation). A collective on entry: every process enters
    together; the engine's calls inside need not be matched. Nothing happens for a model that is
    not sharded."""
    units = [unit for model in models for unit in sharded_units(model)]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(getattr(unit, _RESHARD_ATTRIBUTE, True), recurse=False)


class WholeAdapters:
    """The adapters of a sharded policy, gathered whole: what a checkpoint or the final save
    writes (``save_adapters``) and checks (``adapter_parameters``), as a :class:`Policy` does.

    Args:
        policy: A ``Policy`` or ``PolicyGroup`` (``whole_adapter_weights``, ``save_adapters``).
        names: The adapters to gather (default: all).
    """

    def __init__(self, policy: Any, names: Sequence[str] | None = None):
        self.policy = policy
        self.adapter_names = list(policy.adapter_names)
        self.trainable = list(policy.trainable)
        #: Adapter name -> its weights under the model's parameter names, whole.
        self.weights = {name: policy.whole_adapter_weights(name) for name in (names or self.adapter_names)}

    def adapter_parameters(self, name: str) -> list[torch.Tensor]:
        return list(self.weights[name].values())

    def save_adapters(self, directory: str | Path, names: Sequence[str] | None = None) -> dict[str, str]:
        """Save the gathered adapters (all by default) as ``directory/<name>/``; returns name -> path."""
        return self.policy.save_adapters(directory, names or list(self.weights), self.weights)


def saveable(policy: Any, names: Sequence[str] | None = None) -> Any:
    """``policy`` itself when none of its adapters is sharded, else :class:`WholeAdapters` of it
    (a collective: every process calls this together)."""
    if not any(is_sharded(p) for name in policy.adapter_names for p in policy.adapter_parameters(name)):
        return policy
    return WholeAdapters(policy, names)


def policy_models(policy: Any) -> list[torch.nn.Module]:
    """The PEFT model of each base model of ``policy`` (a Policy or a PolicyGroup)."""
    members: Mapping[str, Any] | None = getattr(policy, "policies", None)
    return [member.model for member in members.values()] if members is not None else [policy.model]
