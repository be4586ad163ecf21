"""peft's LoRA linear layers while an engine generates: the same numbers, less work per layer.

A decode step of SmolLM2-135M runs 210 LoRA linear layers (all-linear targets), each on a few
rows, so the per-layer work around the two small products counts. :func:`lean_lora_forward`
swaps each plain LoRA layer's ``forward`` for one that computes what peft's computes, in the same
dtypes and the same order of operations, with less around it:

* peft's ``result + lora_B(lora_A(x)) * scaling`` allocates two tensors; here the scaling and the
  sum are written in place into ``lora_B``'s output (``a + b == b + a`` bit for bit in IEEE
  arithmetic, so the sum is the same);
* an adapter whose ``lora_B`` weight is all zeros (an untrained adapter: peft's default
  initialisation) adds exactly zero, so its layers return the base layer's output alone. The
  evaluation before training and the first step's rollouts then cost what the base model costs;
* the two products run as ``torch.mm`` by contiguous transposed copies of ``lora_A`` and
  ``lora_B``, made once per block, instead of ``F.linear``'s transposed views, and with a scaling
  that is a power of two of at least 1 and one dtype throughout, the scaled sum runs inside the
  second product (``addmm``; exact, see :mod:`~llm_zoo_train.kernels.lora_training`). Between the
  base model's large products a decode step finds the caches cold, and there ``F.linear`` on a
  16 x 576 input by a rank-8 matrix took 29 us against 8 us for the copy's ``mm``. MKL's kernels
  for the two layouts could round differently, so each shape (rows, sizes, dtypes, scaling) is
  probed once against peft's formula on random values, and the copies are used only where every
  bit agrees. Layers with hooks on their LoRA matrices, a ``lora_B`` bias, or an input in another
  dtype than the adapter's keep the products above.

Measured on the project's Xeon (one thread, bfloat16 base, float32 adapters, 32 rows, 150-token
context): a decode step took 188 ms with peft's forward, 180 ms with the lean one and 168 ms with
the adapter disabled; 32 prompts x 48 sampled tokens took 7.92 against 7.51 CPU seconds, with the
same tokens. In float32 the gain is about 1%. The transposed copies and the fused sum, in float32
(SmolLM2-135M, all-linear r=8, 16 rows x 32 tokens, alternating calls in one process, load ~0.8):
4.05 -> 3.95 s a call, the same tokens and logprobs.

Anything else keeps peft's own forward: autograd on (the update), merged or disabled adapters,
several active adapters, LoRA variants (DoRA, ...), dropout modules, extra forward arguments, and
layers whose ``forward`` someone else has already replaced (accelerate's hooks). The exception to
"the same numbers": a non-finite activation times an all-zero ``lora_B`` is NaN in peft's forward
and is skipped here.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from llm_zoo_train.kernels.lora_forward import ProbeVerdicts, replaced_lora_forwards
from llm_zoo_train.kernels.lora_training import exact_scaling

__all__ = ["lean_lora_forward", "zero_adapters"]

_probed = ProbeVerdicts()


def zero_adapters(layer: Any) -> frozenset[str]:
    """The adapters of a peft LoRA linear ``layer`` whose ``lora_B`` weight (and bias, if any) is
    all zeros: their contribution to the layer's output is exactly zero."""
    zero = set()
    for name, lora_b in layer.lora_B.items():
        bias = getattr(lora_b, "bias", None)
        if not bool(lora_b.weight.any()) and (bias is None or not bool(bias.any())):
            zero.add(name)
    return frozenset(zero)


def _plain_adapter(layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The one active adapter when this call is plain LoRA inference (the lean forward applies),
    else ``None`` (peft's forward runs)."""
    if args or kwargs or torch.is_grad_enabled() or layer.disable_adapters or layer.merged:
        return None
    active = layer.active_adapters
    if len(active) != 1 or active[0] not in layer.lora_A:
        return None
    adapter = active[0]
    if (
        adapter in layer.lora_variant
        or not isinstance(layer.lora_dropout[adapter], torch.nn.Identity)
        or not getattr(layer, "cast_input_dtype_enabled", True)
    ):
        return None
    return adapter


def _mm_matches_peft(
    rows: int,
    in_features: int,
    out_features: int,
    rank: int,
    scaling: float,
    fused: bool,
    dtypes: tuple[torch.dtype, torch.dtype],
    device: torch.device,
) -> bool:
    """Whether :func:`_lora_by_mm` gives peft's bits at these shapes and dtypes (the adapter's,
    the base output's): probed on random values once, then remembered."""

    def probe() -> bool:
        generator = torch.Generator().manual_seed(0)
        adapter_dtype, result_dtype = dtypes

        def random(dtype: torch.dtype, *shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

        x, result = random(adapter_dtype, rows, in_features), random(result_dtype, rows, out_features)
        lora_a, lora_b = random(adapter_dtype, rank, in_features), random(adapter_dtype, out_features, rank)
        peft = (result + F.linear(F.linear(x, lora_a), lora_b) * scaling).to(result_dtype)
        transposed = (lora_a.t().contiguous(), lora_b.t().contiguous())
        return torch.equal(_lora_by_mm(x, result, transposed, scaling, fused), peft)

    key = (device.type, device.index, *dtypes, rows, in_features, out_features, rank, scaling, fused)
    return _probed.verdict(key, probe)


def _lora_by_mm(
    x: torch.Tensor,
    result: torch.Tensor,
    transposed: tuple[torch.Tensor, torch.Tensor],
    scaling: float,
    fused: bool,
) -> torch.Tensor:
    """``result + x @ A^T @ B^T * scaling`` (2-D ``x`` and ``result``) from contiguous ``A^T``
    and ``B^T``: the scaled sum inside the second product when ``fused``."""
    hidden = torch.mm(x, transposed[0])
    if fused:
        return torch.addmm(result, hidden, transposed[1], alpha=scaling)
    delta = torch.mm(hidden, transposed[1])
    delta.mul_(scaling)
    delta.add_(result)
    return delta.to(result.dtype)


def _mm_plan(
    layer: Any, adapter: str, x: torch.Tensor, result: torch.Tensor, rows: int
) -> tuple[Any, ...] | None:
    """``((A^T, B^T), scaling, fused)`` for :func:`_lora_by_mm` when it gives peft's bits for this
    layer, adapter and row count, else ``None``."""
    lora_a, lora_b = layer.lora_A[adapter], layer.lora_B[adapter]
    hooked = any(m._forward_hooks or m._forward_pre_hooks for m in (lora_a, lora_b))
    if hooked or getattr(lora_b, "bias", None) is not None or x.dim() < 2 or x.dtype != lora_a.weight.dtype:
        return None  # the matrices' modules must run (hooks), or the products are not plain
    scaling = float(layer.scaling[adapter])
    fused = result.dtype == x.dtype and exact_scaling(scaling)
    transposed = (lora_a.weight.t().contiguous(), lora_b.weight.t().contiguous())
    rank = transposed[0].shape[1]
    dtypes = (x.dtype, result.dtype)
    if not _mm_matches_peft(rows, x.shape[-1], result.shape[-1], rank, scaling, fused, dtypes, x.device):
        return None
    return (transposed, scaling, fused)


def _lean_forward(
    layer: Any,
    zero: frozenset[str],
    plans: dict[tuple[str, int], tuple[Any, ...] | None],
    x: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    adapter = _plain_adapter(layer, args, kwargs)
    if adapter is None:
        return type(layer).forward(layer, x, *args, **kwargs)
    result = layer.base_layer(x)
    if adapter in zero:
        return result
    rows = x.numel() // x.shape[-1] if x.dim() else 1
    key = (adapter, rows)
    if key not in plans:  # made once per block: the weights do not change inside it
        plans[key] = _mm_plan(layer, adapter, x, result, rows)
    plan = plans[key]
    if plan is not None:
        transposed, scaling, fused = plan
        out = _lora_by_mm(x.reshape(rows, -1), result.reshape(rows, -1), transposed, scaling, fused)
        return out.view(result.shape)
    lora_a, lora_b = layer.lora_A[adapter], layer.lora_B[adapter]
    delta = lora_b(lora_a(x.to(lora_a.weight.dtype)))
    delta.mul_(layer.scaling[adapter])
    delta.add_(result)
    return delta.to(result.dtype)


def lean_lora_forward(model: Any) -> AbstractContextManager[None]:
    """Within the block, every plain peft LoRA linear layer of ``model`` runs the lean forward
    (module docstring); afterwards peft's own again. The weights must not change inside the
    block: which adapters are all zeros, and the transposed copies of the LoRA matrices, are read
    once per block."""
    return replaced_lora_forwards(
        model, lambda layer: partial(_lean_forward, layer, zero_adapters(layer), {})
    )
