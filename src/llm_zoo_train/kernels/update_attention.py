"""The update's attention in bfloat16 on a CPU: grouped batched products where torch's kernel is slower.

In the update (autograd on, every position of a sequence at once) transformers' ``sdpa`` copies
each key/value head once per query head (``repeat_kv``, since a left-padded batch has a mask) and
calls torch's flash-attention kernel. On a CPU in bfloat16 that kernel's backward is slow at the
update's small shapes: in the trainer-vs-TRL job (SmolLM2-135M, 8 completions of 31 tokens after a
45-token prompt, one thread, AMD EPYC with AVX512-BF16) one layer's attention backward took
6.4 ms, a twentieth of its arithmetic's speed, and the attention was 0.55 s of a 3.9 s update
(torch's profiler, shapes recorded). transformers' eager attention (the products of
``Q K^T`` and of the weights by ``V``, the softmax in float32) made the same update 4.30 -> 3.77 s
(4 alternating updates each, median), and the grouped form below 4.14 -> 3.66 s (the same way).

:func:`grouped_update_attention` computes that eager attention with each key/value head's query
heads as the rows of one product, so the keys and values are neither copied nor summed back per
query head in the backward. :data:`UPDATE_ATTENTION` chooses where it runs:

* ``"auto"`` (the default): for a bfloat16 or float16 update on the CPU, both ways are timed
  (forward and backward, on the first call's tensors, once per device type and dtype in the
  process) and the grouped products taken where torch's kernel is at least
  :data:`GROUPED_MIN_SPEEDUP` times slower; float32 keeps ``sdpa`` unmeasured: there the two
  took the same time (AMD EPYC, the same job: 5.20 against 5.21 s an update), and ``sdpa`` keeps
  transformers' bits;
* ``"sdpa"``: transformers' sdpa always; ``"grouped"``: the grouped products for every dtype.

The two round differently (eager's softmax in float32, its weights cast back before the second
product), so the update's gradients differ in the last bits of the dtype. What ``"auto"``
measured travels with a checkpoint (:mod:`llm_zoo_train.kernels.choices`), so a resumed run
chooses as the first did. A query position that sees no key (padding) gets equal weights on
every key, as with eager attention's additive mask: finite values, zero gradient once the loss
masks it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import torch

from llm_zoo_train.kernels.attention_choices import AttentionChoices

__all__ = [
    "GROUPED_MIN_SPEEDUP",
    "UPDATE_ATTENTION",
    "UPDATE_ATTENTIONS",
    "adopt_update_attention_choices",
    "forget_update_attention_choices",
    "grouped_update_attention",
    "set_update_attention",
    "update_attention_choices",
    "update_uses_grouped",
]

logger = logging.getLogger(__name__)

#: The choices of :func:`set_update_attention`.
UPDATE_ATTENTIONS = ("auto", "sdpa", "grouped")
#: How the update's attention is computed on a CPU in this process (module docstring);
#: ``model.update_attention`` sets it (:func:`set_update_attention`).
UPDATE_ATTENTION = "auto"
#: ``"auto"`` takes the grouped products only when torch's kernel is this much slower.
GROUPED_MIN_SPEEDUP = 1.15
#: Timed forward-and-backward passes of each way in ``"auto"``'s measurement (after one untimed).
TIMED_PASSES = 3

# "auto"'s choice per (device type, dtype): whether the grouped products won, and the seconds of one
# forward and backward (torch's kernel, the grouped products).
_measured = AttentionChoices("update attention")


def set_update_attention(choice: str) -> None:
    """Set :data:`UPDATE_ATTENTION` for the whole process; a ``ValueError`` naming the choices for
    anything else."""
    global UPDATE_ATTENTION
    if choice not in UPDATE_ATTENTIONS:
        raise ValueError(
            f"update attention must be one of {', '.join(map(repr, UPDATE_ATTENTIONS))}, got {choice!r}"
        )
    UPDATE_ATTENTION = choice


def forget_update_attention_choices() -> None:
    """Drop ``"auto"``'s measurements (each dtype is measured again at its next update)."""
    _measured.clear()


def update_attention_choices() -> dict[str, dict[str, Any]]:
    """What ``"auto"`` measured and chose in this process, by ``"device/dtype"``."""
    return _measured.record()


def adopt_update_attention_choices(choices: Mapping[str, Mapping[str, Any]], *, replace: bool = True) -> None:
    """Take ``choices`` (:func:`update_attention_choices` of another process or an earlier run) as
    this process's; with ``replace=False`` only for device types and dtypes not measured here yet.
    A malformed entry raises ``ValueError`` and adopts none."""
    _measured.adopt(choices, replace=replace)


def grouped_update_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    """Eager attention of ``[B, H, Q, D]`` queries over ``[B, H_kv, K, D]`` keys and values (``H``
    a multiple of ``H_kv``) under ``attention_mask`` (boolean keep-mask or additive float mask,
    broadcastable to ``[B, 1, Q, K]``), with each key/value head's query heads as the rows of one
    product; the softmax in float32, as transformers' eager attention. Returns ``[B, Q, H, D]``
    (contiguous), the attention functions' layout."""
    batch, heads, length, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    rows = query.reshape(batch, kv_heads, groups * length, dim)  # head h = kv * groups + g, as repeat_kv
    scores = (torch.matmul(rows, key.transpose(-1, -2)) * scaling).view(batch, kv_heads, groups, length, keys)
    mask = attention_mask.expand(attention_mask.shape[0], 1, length, keys).unsqueeze(2)  # [B, 1, 1, Q, K]
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    else:
        scores = scores + mask.to(scores.dtype)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    output = torch.matmul(weights.view(batch, kv_heads, groups * length, keys), value)
    return output.view(batch, heads, length, dim).transpose(1, 2).contiguous()


def _sdpa(query, key, value, attention_mask, scaling) -> torch.Tensor:
    """transformers' sdpa for a masked call: the keys and values copied per query head."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=scaling
    )
    return output.transpose(1, 2).contiguous()


def _seconds_per_pass(call, tensors: list[torch.Tensor]) -> float:
    best = float("inf")
    for timed in range(TIMED_PASSES + 1):
        start = time.perf_counter()
        output = call(*tensors)
        output.backward(torch.ones_like(output))
        if timed:  # the first of each warms the kernels
            best = min(best, time.perf_counter() - start)
        for tensor in tensors:
            tensor.grad = None
    return best


def _grouped_faster(query, key, value, attention_mask, scaling) -> bool:
    """``"auto"``: time both ways (forward and backward) on this call's tensors, once per device type
    and dtype."""
    where = (query.device.type, query.dtype)
    if where not in _measured:
        tensors = [t.detach().clone().requires_grad_(True) for t in (query, key, value)]
        with torch.enable_grad():
            sdpa_s = _seconds_per_pass(lambda q, k, v: _sdpa(q, k, v, attention_mask, scaling), tensors)
            grouped_s = _seconds_per_pass(
                lambda q, k, v: grouped_update_attention(q, k, v, attention_mask, scaling), tensors
            )
        _measured.choose(where, sdpa_s, grouped_s, GROUPED_MIN_SPEEDUP)
        logger.info(
            "update attention in %s on the %s (%d rows of %d positions over %d): torch's sdpa %.0f us a"
            " layer forward and backward, grouped products %.0f us: using %s",
            str(query.dtype).removeprefix("torch."),
            query.device.type,
            query.shape[0],
            query.shape[2],
            key.shape[2],
            1e6 * sdpa_s,
            1e6 * grouped_s,
            "the grouped products" if _measured.grouped(where) else "sdpa",
        )
    return _measured.grouped(where)


def update_uses_grouped(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float,
    scaling: float,
    kwargs: dict[str, Any],
) -> bool:
    """Whether this attention call of the update (autograd on, on the CPU) runs
    :func:`grouped_update_attention` (module docstring): plain attention with a mask over the key
    positions, and the grouped products chosen for its dtype."""
    if UPDATE_ATTENTION == "sdpa" or query.device.type != "cpu" or not torch.is_grad_enabled():
        return False
    if dropout != 0.0 or kwargs.get("output_attentions", False):
        return False
    if any(kwargs.get(name) is not None for name in ("position_bias", "cache", "sinks", "s_aux")):
        return False
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 4:
        return False
    batch, heads, length, _ = query.shape
    if heads % key.shape[1] or getattr(module, "num_key_value_groups", 1) * key.shape[1] != heads:
        return False
    if attention_mask.shape[0] not in (1, batch) or attention_mask.shape[1] != 1:
        return False
    if attention_mask.shape[2] not in (1, length) or attention_mask.shape[3] != key.shape[2]:
        return False
    if UPDATE_ATTENTION == "grouped":
        return True
    if query.dtype == torch.float32:
        return False
    return _grouped_faster(query, key, value, attention_mask, scaling)
