"""peft LoRA layers served by a packed copy of their merged weight while an engine generates.

An unmerged LoRA layer runs three products per call (the base weight, ``lora_A``, ``lora_B``), a
scaling and a sum. In a decode step of SmolLM2-135M (210 LoRA layers, 16 rows) the two small
products and the work around them cost about 15 ms of a 120 ms step. With the adapter merged,
``W' = W + scaling * B @ A``, each layer is one product. Merging costs one ``addmm`` and one
repacking per layer, once per adapter and weight version (after every optimizer step), so it pays
when a call decodes more than a few tokens.

:class:`MergedAdapterPackings` keeps, per LoRA layer and adapter, a packed copy of the merged
weight (oneDNN's or MKL's), and :meth:`MergedAdapterPackings.applied` gives each eligible layer a
forward that multiplies by it. :class:`~llm_zoo_train.kernels.packed_linear.PackedLinearWeights`
uses it where its products already differ from ``F.linear``'s by float32 rounding: oneDNN's
copies (``decode_kernel: onednn``, or ``auto`` where oneDNN measured faster) and MKL's copies
chosen by ``auto`` (where MKL's base products measured as fast: the Intel Xeon). The merged
weight differs from the unmerged layer the same way (the rounding of ``W + s B A`` and of one sum
instead of two). With ``exact``, nothing is merged and the bits stay ``generate``'s. An adapter
whose ``lora_B`` is all zeros (untrained) adds exactly zero: its layers get the base weight's copy.

MKL's packed copy serves inputs of exactly the row count it was packed for (``_mkl_linear`` would
multiply any other count by the weight it is handed, the base weight here); other counts run the
layer's previous forward, unmerged.

A copy is merged and packed again when the base weight, ``lora_A`` or ``lora_B`` changed (storage
or in-place version counter: the optimizer's steps bump it), its scaling did, or the kernel. At most
:data:`MAX_MERGED_ADAPTERS` copies are kept per layer (least recently used dropped; with MKL, one
per adapter and row count): each is the base model's linear layers' size again in memory.

Eligible: a peft ``lora.Linear`` on the CPU in float32 over a plain ``nn.Linear``, with one active
adapter, not merged or disabled, no variant (DoRA, ...), no ``lora_B`` bias, no hooks on its
matrices, no dropout in training mode, and whose ``forward`` is the class's or
:func:`~llm_zoo_train.kernels.lora_forward.replaced_lora_forwards`'s (not accelerate's hooks). At
call time, anything but a plain float32 input the packing serves (autograd on, extra arguments,
another active adapter) runs the layer's previous forward.

Measured on an AMD EPYC (Zen 4, one thread, the trainer-vs-TRL job: SmolLM2-135M, all-linear r=8,
16 rows x 32 tokens, alternating calls in one process): a generate call 4.44-4.67 s unmerged,
3.79-4.04 s merged, merging and repacking included (peft's ``merge_adapter`` as the stand-in).
After two training steps, oneDNN's copies: 3.83 s a call unmerged against 3.32 s merged (median
of 3 alternating calls each): the unmerged layers cost 16 ms a decode step, where their two small
products alone, timed in a pass between the base products, take 6 ms; the rest is the work of
210 module calls around them.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from llm_zoo_train.kernels.lora_forward import lora_linear_class, replaced_by_lora_forwards

__all__ = ["MAX_MERGED_ADAPTERS", "MergedAdapterPackings", "mergeable_adapter"]

#: Adapters whose merged copies are kept per layer (one per agent of a two-agent env).
MAX_MERGED_ADAPTERS = 2


def _versions(*tensors: torch.Tensor) -> tuple[int, ...]:
    return tuple(value for t in tensors for value in (t.data_ptr(), t._version))


@dataclass
class _MergedPacking:
    versions: tuple[Any, ...]  # the base weight's, lora_A's and lora_B's storage and version, scaling
    packed: torch.Tensor


def mergeable_adapter(layer: Any) -> str | None:
    """The adapter a peft LoRA linear ``layer`` can serve merged (module docstring), else ``None``."""
    lora_linear = lora_linear_class()
    if lora_linear is None or type(layer) is not lora_linear or layer.merged or layer.disable_adapters:
        return None
    if "forward" in vars(layer) and not replaced_by_lora_forwards(layer):
        return None  # someone else's forward (accelerate's hooks) may do more
    active = layer.active_adapters
    if len(active) != 1 or active[0] not in layer.lora_A:
        return None
    adapter = active[0]
    base = layer.base_layer
    lora_a, lora_b = layer.lora_A[adapter], layer.lora_B[adapter]
    if (
        adapter in getattr(layer, "lora_variant", {})
        or getattr(layer, "fan_in_fan_out", False)
        or type(base) is not torch.nn.Linear
        or "forward" in vars(base)
        or getattr(lora_b, "bias", None) is not None
        or any(m._forward_hooks or m._forward_pre_hooks for m in (lora_a, lora_b, base))
        or (layer.training and not isinstance(layer.lora_dropout[adapter], torch.nn.Identity))
    ):
        return None
    weights = (base.weight, lora_a.weight, lora_b.weight)
    if any(w.dtype != torch.float32 or w.device.type != "cpu" for w in weights):
        return None
    if base.bias is not None and base.bias.dtype != torch.float32:
        return None
    return adapter


def _merged_forward(
    layer: Any,
    adapter: str,
    packed: torch.Tensor,
    accepts: Callable[[torch.Tensor], bool],
    previous: Callable[..., torch.Tensor],
    x: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    if args or kwargs or not accepts(x) or layer.disable_adapters or layer.active_adapters != [adapter]:
        return previous(x, *args, **kwargs)
    return torch.ops.mkldnn._linear_pointwise(x, packed, layer.base_layer.bias, "none", [], "")


def _mkl_merged_forward(
    layer: Any,
    adapter: str,
    packed: torch.Tensor,
    rows: int,
    accepts: Callable[[torch.Tensor], bool],
    previous: Callable[..., torch.Tensor],
    x: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    if (
        args
        or kwargs
        or not accepts(x)
        or x.numel() != rows * x.shape[-1]  # MKL would multiply other counts by the base weight
        or layer.disable_adapters
        or layer.active_adapters != [adapter]
    ):
        return previous(x, *args, **kwargs)
    base = layer.base_layer  # the weight only gives MKL the product's sides at this row count
    return torch.ops.mkl._mkl_linear(x, packed, base.weight, base.bias, rows)


class MergedAdapterPackings:
    """Packed copies (oneDNN's or MKL's) of LoRA layers' merged weights, per layer and adapter,
    kept across engine calls (module docstring)."""

    def __init__(self) -> None:
        # per layer: (adapter, the row count of an MKL copy, None for oneDNN's) -> its copy
        self._by_layer: weakref.WeakKeyDictionary[
            Any, OrderedDict[tuple[str, int | None], _MergedPacking]
        ] = weakref.WeakKeyDictionary()

    def adapters(self, layer: Any) -> list[str]:
        """The adapters ``layer`` holds a merged copy for, least recently used first (one entry
        per copy: an MKL copy serves one row count)."""
        return [adapter for adapter, _ in self._by_layer.get(layer, ())]

    def clear(self) -> None:
        """Drop every merged copy (made again on the next use)."""
        self._by_layer = weakref.WeakKeyDictionary()

    def _packing(self, layer: Any, adapter: str, rows: int, kernel: str) -> torch.Tensor:
        base = layer.base_layer.weight
        lora_a, lora_b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
        scaling = float(layer.scaling[adapter])
        versions = (*_versions(base, lora_a, lora_b), scaling, kernel)
        key = (adapter, rows if kernel == "mkl" else None)  # oneDNN's copy serves any row count
        kept = self._by_layer.setdefault(layer, OrderedDict())
        packing = kept.get(key)
        if packing is None or packing.versions != versions:
            with torch.no_grad():
                if lora_b.any():
                    merged = torch.addmm(base.detach(), lora_b.detach(), lora_a.detach(), alpha=scaling)
                else:  # an untrained adapter adds exactly zero
                    merged = base.detach()
                pack = (
                    torch.ops.mkl._mkl_reorder_linear_weight
                    if kernel == "mkl"
                    else torch.ops.mkldnn._reorder_linear_weight
                )
                packing = _MergedPacking(versions, pack(merged, rows))
        kept[key] = packing
        kept.move_to_end(key)
        while len(kept) > MAX_MERGED_ADAPTERS:
            kept.popitem(last=False)
        return packing.packed

    @contextmanager
    def applied(
        self,
        model: torch.nn.Module,
        rows: int,
        accepts: Callable[[torch.Tensor], bool],
        kernel: str = "onednn",
    ) -> Iterator[list[Any]]:
        """Within the block, every eligible LoRA layer of ``model`` multiplies the inputs that
        ``accepts`` takes by its merged copy, packed for ``rows`` rows by ``kernel``: ``"onednn"``
        (the count a tuning hint) or ``"mkl"`` (exactly that many rows; others run unmerged);
        yields the layers served so. Afterwards each layer's previous forward again."""
        if kernel not in ("onednn", "mkl"):
            raise ValueError(f"kernel must be 'onednn' or 'mkl', got {kernel!r}")
        swapped: list[tuple[Any, Any, Any]] = []  # layer, our forward, the instance's previous one
        for layer in model.modules():
            adapter = mergeable_adapter(layer)
            if adapter is None:
                continue
            own = vars(layer).get("forward")
            previous = own if own is not None else partial(type(layer).forward, layer)
            packed = self._packing(layer, adapter, rows, kernel)
            forward = (
                partial(_mkl_merged_forward, layer, adapter, packed, rows, accepts, previous)
                if kernel == "mkl"
                else partial(_merged_forward, layer, adapter, packed, accepts, previous)
            )
            layer.forward = forward
            swapped.append((layer, forward, own))
        try:
            yield [layer for layer, _, _ in swapped]
        finally:
            for layer, forward, own in swapped:
                if vars(layer).get("forward") is not forward:
                    continue  # never undo what someone set since
                if own is None:
                    del layer.forward
                else:
                    layer.forward = own
