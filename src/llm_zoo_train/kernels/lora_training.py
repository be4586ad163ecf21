"""peft's LoRA linear layers in the update: the same bits, less memory traffic per layer.

peft's LoRA layer returns ``result + lora_B(lora_A(x)) * scaling``. With autograd on, the product
by ``scaling`` and the sum each read and write a tensor of the layer's output size, and the
backward multiplies the output gradient by ``scaling`` over that size again. At the update's
shapes (SmolLM2-135M, 248 rows by 576-1536 outputs, 210 layers) those passes are a measurable
share of a micro-batch. :func:`fused_lora_forward` gives each plain LoRA layer a forward that
folds both into ``lora_B``'s product: ``torch.addmm(result, lora_A(x), lora_B.weight.T,
alpha=scaling)`` (BLAS's ``C + alpha * A @ B``).

**The same bits, where it is used.** With a ``scaling`` that is a power of two and at least 1
(``lora_alpha = 2 * r``, the project's default, gives 2), multiplying by it is exact, so
``alpha * (h @ B^T)`` equals ``(h @ B^T) * scaling`` bit for bit, and the gradients
``(g @ B) * alpha`` and ``(g * scaling) @ B`` are equal too (barring overflow, and products in the
subnormal range, ~1e-38 in float32). What remains is the BLAS library's: that ``addmm`` adds ``C``
after the product's sum, and that its products, the gradients' included, run the plain products'
kernels. That is probed once per shape (device, dtype, output size, rank, rows, scaling): a random input
runs both ways, forward and backward, and the fused form is used only if the output and every
gradient agree in every bit; otherwise that shape keeps peft's operations. Any other scaling, and
anything peft's plain path does not cover (several or disabled adapters, merged weights, variants
such as DoRA, dropout, a ``lora_B`` bias, an input of another dtype than the adapter's, autocast,
extra forward arguments, a ``forward`` already replaced on the instance), keeps peft's own forward.

That is ``training.update_kernel: exact``. Under ``auto`` (where measured faster) and ``onednn``,
float32 adapters on a CPU instead compute the products that have the rank as a side with the rank
as the rows (:mod:`~llm_zoo_train.kernels.lora_rank_rows`, any scaling): faster, other rounding.
That includes a bfloat16 model's float32 adapters (peft's default), with peft's casts: the input
cast to float32, the base output promoted, the sum cast back. In the trainer-vs-TRL job in
bfloat16 on the AMD EPYC (one thread, 4 alternating updates each) the update took 3.64 s with
peft's products there and 3.42 s with the rank as the rows.

Measured on the project's Xeon (one thread, SmolLM2-135M in float32, all-linear r=8 adapters,
load ~0.9): one micro-batch of 8 completions of 32 tokens, forward and backward, 1.80 -> 1.70 s
with the same logprobs and gradients; the trainer-vs-TRL job's whole update, alternating steps,
median 3.68 -> 3.61 s on top of the loss's unjoined logits
(:func:`~llm_zoo_train.training.loss.completion_logprobs`; 3.94 s with neither). This form in the
engine's decode (16 rows, ``F.linear``'s transposed views) was slower, 3.99 -> 4.05 s a call; the
decode's own version (:mod:`~llm_zoo_train.kernels.lora_inference`) multiplies by contiguous
transposed copies instead, which pays.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from llm_zoo_train.kernels.lora_forward import (
    ProbeVerdicts,
    lora_linear_class,
    outermost_linear_layers,
    replaced_lora_forwards,
)
from llm_zoo_train.kernels.lora_rank_rows import RankRowsLoRA, rank_rows_chosen

__all__ = ["exact_scaling", "fused_lora_forward", "fused_matches_peft", "rank_rows_for"]

_probed = ProbeVerdicts()


def exact_scaling(scaling: float) -> bool:
    """``scaling`` is a power of two of at least 1: multiplying a float by it is exact (barring
    overflow), so where the multiplication happens does not change the bits."""
    return math.isfinite(scaling) and scaling >= 1 and math.frexp(scaling)[0] == 0.5


def fused_matches_peft(
    rows: int, out_features: int, rank: int, scaling: float, dtype: torch.dtype, device: torch.device
) -> bool:
    """Whether ``addmm(C, h, W^T, alpha=scaling)`` gives the bits of ``C + F.linear(h, W) * scaling``,
    forward and backward, at these shapes (probed on random values once, then remembered)."""

    def probe() -> bool:
        generator = torch.Generator().manual_seed(0)

        def random(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

        inputs = (random(rows, out_features), random(rows, rank), random(out_features, rank))
        grad = random(rows, out_features)
        results = []
        with torch.inference_mode(False), torch.enable_grad():
            for fused in (False, True):
                result, hidden, weight = (t.clone().requires_grad_() for t in inputs)
                if fused:
                    output = torch.addmm(result, hidden, weight.t(), alpha=scaling)
                else:
                    output = result + F.linear(hidden, weight) * scaling
                output.backward(grad)
                results.append((output.detach(), result.grad, hidden.grad, weight.grad))
        return all(torch.equal(a, b) for a, b in zip(*results, strict=True))

    return _probed.verdict(
        (device.type, device.index, dtype, rows, out_features, rank, float(scaling)), probe
    )


def _plain_adapter(layer: Any, x: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The one active adapter when this call is a plain LoRA forward with autograd on, else ``None``
    (peft's forward runs)."""
    if args or kwargs or not torch.is_grad_enabled() or layer.disable_adapters or layer.merged:
        return None
    if torch.is_autocast_enabled(x.device.type):
        return None
    active = layer.active_adapters
    if len(active) != 1 or active[0] not in layer.lora_A:
        return None
    adapter = active[0]
    lora_a, lora_b = layer.lora_A[adapter], layer.lora_B[adapter]
    if (
        adapter in layer.lora_variant
        or not isinstance(layer.lora_dropout[adapter], torch.nn.Identity)
        or getattr(lora_b, "bias", None) is not None
        or lora_a.weight.dtype != lora_b.weight.dtype
    ):
        return None
    return adapter


def _fused_forward(layer: Any, rank_rows: bool, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    adapter = _plain_adapter(layer, x, args, kwargs)
    if adapter is None:
        return type(layer).forward(layer, x, *args, **kwargs)
    scaling = float(layer.scaling[adapter])
    lora_a, lora_b = layer.lora_A[adapter], layer.lora_B[adapter]
    takes_rank_rows = rank_rows and lora_a.weight.dtype == torch.float32 and x.device.type == "cpu"
    if x.dtype != lora_a.weight.dtype:
        if not takes_rank_rows:
            return type(layer).forward(layer, x, *args, **kwargs)
        # A bfloat16 model's float32 adapters (peft's default): peft casts the input to float32,
        # adds its float32 product to the base output promoted to float32, and casts the sum back.
        # The same operations with the rank as the rows (lora_rank_rows' rounding).
        result = layer.base_layer(x)
        summed = RankRowsLoRA.apply(result.float(), x.float(), lora_a.weight, lora_b.weight, scaling)
        return summed.to(result.dtype)
    if not (takes_rank_rows or exact_scaling(scaling)):
        return type(layer).forward(layer, x, *args, **kwargs)
    result = layer.base_layer(x)
    if result.dtype != x.dtype:  # peft would promote and cast back: keep its operations
        return (result + lora_b(lora_a(x)) * scaling).to(result.dtype)
    if takes_rank_rows:  # training.update_kernel chose other rounding for speed (lora_rank_rows)
        return RankRowsLoRA.apply(result, x, lora_a.weight, lora_b.weight, scaling)
    hidden = lora_a(x)
    out_features, rank = lora_b.weight.shape
    rows = hidden.numel() // rank
    if not fused_matches_peft(rows, out_features, rank, scaling, x.dtype, x.device):
        return result + lora_b(hidden) * scaling  # peft's operations, without recomputing the base
    fused = torch.addmm(
        result.reshape(rows, out_features), hidden.reshape(rows, rank), lora_b.weight.t(), alpha=scaling
    )
    return fused.view(result.shape)


def _rank_rows_shapes(model: Any) -> dict[tuple[int, int, int], int]:
    """The (input, output, rank) shapes of ``model``'s float32 CPU LoRA products, with their counts."""
    lora_linear = lora_linear_class()
    shapes: dict[tuple[int, int, int], int] = {}
    if lora_linear is None:
        return shapes
    layers: list[Any] = [m for m in outermost_linear_layers(model) if type(m) is lora_linear]
    for module in layers:
        for name, lora_a in module.lora_A.items():
            lora_b = module.lora_B[name]
            if lora_a.weight.dtype == torch.float32 and lora_a.weight.device.type == "cpu":
                shape = (lora_a.in_features, lora_b.out_features, lora_a.out_features)
                shapes[shape] = shapes.get(shape, 0) + 1
    return shapes


def rank_rows_for(model: Any, kernel: str) -> bool:
    """Whether ``training.update_kernel`` ``kernel`` multiplies ``model``'s float32 CPU LoRA
    layers with the rank as the rows in the update (:mod:`~llm_zoo_train.kernels.lora_rank_rows`;
    measured once per process and set of shapes with ``"auto"``)."""
    return kernel != "exact" and rank_rows_chosen(kernel, _rank_rows_shapes(model))


def fused_lora_forward(model: Any, kernel: str = "exact") -> AbstractContextManager[None]:
    """Within the block, every peft LoRA linear layer of ``model`` runs the fused forward (module
    docstring) where it applies, peft's own elsewhere; afterwards peft's own again. The graph built
    inside the block can be differentiated after it. ``kernel`` (``training.update_kernel``):
    ``"exact"`` keeps peft's bits; ``"auto"`` and ``"onednn"`` may multiply with the rank as the
    rows instead (:mod:`~llm_zoo_train.kernels.lora_rank_rows`, other rounding)."""
    rank_rows = rank_rows_for(model, kernel)
    return replaced_lora_forwards(model, lambda layer: partial(_fused_forward, layer, rank_rows))
