"""Float32 linear layers pre-packed for MKL while an engine decodes on a CPU: the same bits,
less time per decode step.

A decode step multiplies a few rows by every weight matrix of the model. In float32 on a CPU,
torch hands each product to MKL's ``sgemm``, which re-packs the weight matrix into its kernel's
layout on every call; at a few rows that copy is a large share of the product. MKL can pack a
matrix once (``cblas_sgemm_pack``) and multiply by the packed copy after that; torch exposes it as
``torch.ops.mkl._mkl_reorder_linear_weight`` and ``torch.ops.mkl._mkl_linear`` (what
``torch.compile`` uses for frozen CPU linear layers).

:class:`PackedLinearWeights` packs, for one row count, every float32 ``nn.Linear`` on the CPU
whose sides are both at least :data:`MIN_SIDE` (the base model's projections and the vocabulary
head; never a LoRA matrix), and :meth:`PackedLinearWeights.applied` routes a layer's
forward to its packed copy while the block runs, for inputs of exactly that many rows without
autograd. Anything else runs ``F.linear`` as before.

**Same bits, checked.** MKL's packed product uses the kernel of the unpacked one only from some
row count up (16 on the project's Xeon: at 1, 4 and 8 rows the last bits differ). Each packing is
therefore probed: a random input of the row count is multiplied both ways and the packed copy is
used only if every output bit is equal; otherwise layers of that shape keep ``F.linear`` for that
row count (remembered: MKL's choice of kernel depends on the shape, so it is not packed again).
Tokens and logprobs are thus the same as without packing.

Measured on the project's Xeon (one thread, SmolLM2-135M, float32, weights cycled so they come
from memory as in a real step): 16 rows by the 576 x 49152 vocabulary head 25.3 -> 14.2 ms, by a
576 x 1536 projection 548 -> 460 us; a whole decode step of 16 rows 115 -> 89 ms; the
trainer-vs-TRL benchmark's generation 4.9 -> 4.5 s per step. Cost: a packed copy per layer and row
count (:data:`MAX_ROW_COUNTS` kept, least recently used dropped), about the layer's own size again
(SmolLM2-135M: +0.52 GB resident), and 0.4-1.2 s to pack and probe SmolLM2-135M's 211 layers for
a new row count (more the first time, while the memory is new). A job whose calls cycle through
more than two row counts of 16 or more re-packs often; ``rollout.pack_base_weights: false`` turns
packing off. A copy is
re-packed when its weight's storage or in-place version counter changed (a write through
``weight.data`` bypasses the counter: call :meth:`PackedLinearWeights.clear`).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

__all__ = ["MAX_ROW_COUNTS", "MIN_SIDE", "PackedLinearWeights", "mkl_packing_available"]

#: Layers with a side below this are left alone (LoRA matrices: rank-sized, cheap, and trained).
MIN_SIDE = 64
#: Row counts whose packed copies are kept per layer (a tree step asks for two: K x envs, envs).
MAX_ROW_COUNTS = 2


def mkl_packing_available() -> bool:
    """This torch build has MKL and its packed-linear ops."""
    mkl = getattr(torch.ops, "mkl", None)
    return (
        torch.backends.mkl.is_available()
        and mkl is not None
        and hasattr(mkl, "_mkl_linear")
        and hasattr(mkl, "_mkl_reorder_linear_weight")
    )


@dataclass
class _Packing:
    storage: int  # the weight's data pointer when packed
    version: int  # and its in-place version counter
    packed: torch.Tensor


def _packable(module: torch.nn.Module) -> bool:
    if type(module) is not torch.nn.Linear or "forward" in vars(module):
        return False  # a subclass or a replaced forward (accelerate's hooks) may do more
    weight = module.weight
    return (
        weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and min(weight.shape) >= MIN_SIDE
        and (module.bias is None or module.bias.dtype == torch.float32)
    )


def _pack(module: torch.nn.Linear, rows: int, generator: torch.Generator) -> torch.Tensor | None:
    """``module``'s weight packed for ``rows`` rows, or ``None`` if a probe input multiplied by the
    packed copy differs in any bit from ``F.linear``."""
    weight = module.weight.detach()
    packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
    probe = torch.randn(rows, weight.shape[1], generator=generator)
    same = torch.equal(
        torch.ops.mkl._mkl_linear(probe, packed, weight, module.bias, rows),
        F.linear(probe, weight, module.bias),
    )
    return packed if same else None


def _packed_forward(
    module: torch.nn.Linear, packed: torch.Tensor, rows: int, x: torch.Tensor
) -> torch.Tensor:
    if (
        torch.is_grad_enabled()
        or x.dtype != torch.float32
        or not x.is_contiguous()
        or x.dim() < 2
        or x.numel() != rows * x.shape[-1]
    ):
        return F.linear(x, module.weight, module.bias)
    return torch.ops.mkl._mkl_linear(x, packed, module.weight, module.bias, rows)


class PackedLinearWeights:
    """Packed copies of a model's float32 linear layers, kept across engine calls."""

    def __init__(self) -> None:
        self._by_layer: weakref.WeakKeyDictionary[torch.nn.Module, OrderedDict[int, _Packing]] = (
            weakref.WeakKeyDictionary()
        )
        self._generator = torch.Generator().manual_seed(0)
        # (out features, in features, rows, has bias) whose packed product differed in its bits.
        self._other_bits: set[tuple[int, ...]] = set()

    def row_counts(self, module: torch.nn.Module) -> list[int]:
        """The row counts ``module`` holds a packed copy for, oldest first."""
        return list(self._by_layer.get(module, ()))

    def clear(self) -> None:
        """Drop every packed copy (they are made again on the next use) and every probe result."""
        self._by_layer = weakref.WeakKeyDictionary()
        self._other_bits.clear()

    def _packing(self, module: torch.nn.Linear, rows: int) -> _Packing | None:
        """The packing of ``module`` for ``rows`` rows, packed now if missing or stale; ``None``
        where MKL's packed product gives other bits for this shape (probed once per shape)."""
        weight = module.weight
        shape = (*weight.shape, rows, module.bias is not None)
        if shape in self._other_bits:
            return None
        kept = self._by_layer.setdefault(module, OrderedDict())
        packing = kept.get(rows)
        if packing is None or packing.storage != weight.data_ptr() or packing.version != weight._version:
            packed = _pack(module, rows, self._generator)
            if packed is None:  # MKL's kernel choice depends on the shape, not the values
                self._other_bits.add(shape)
                return None
            packing = _Packing(weight.data_ptr(), weight._version, packed)
        kept[rows] = packing
        kept.move_to_end(rows)
        while len(kept) > MAX_ROW_COUNTS:
            kept.popitem(last=False)
        return packing

    @contextmanager
    def applied(self, model: torch.nn.Module, rows: int) -> Iterator[None]:
        """Within the block, every packable layer of ``model`` multiplies inputs of ``rows`` rows
        (without autograd) by its packed copy, packed on first use; afterwards ``F.linear`` again.
        Does nothing where MKL's packing is missing."""
        swapped: list[torch.nn.Module] = []
        if rows >= 1 and mkl_packing_available():
            with torch.no_grad():
                for module in model.modules():
                    if not isinstance(module, torch.nn.Linear) or not _packable(module):
                        continue
                    packing = self._packing(module, rows)
                    if packing is not None:
                        module.forward = partial(_packed_forward, module, packing.packed, rows)  # type: ignore[method-assign]
                        swapped.append(module)
        try:
            yield
        finally:
            for module in swapped:
                del module.forward
