"""sdpa attention that reads grouped key/value heads in place when nothing needs a gradient (CPU).

Models with grouped-query attention (SmolLM2-135M: 9 query heads, 3 key/value heads) give each
key/value head to several query heads. transformers' ``sdpa`` passes that to torch's kernel as
``enable_gqa=True`` only when there is no attention mask (and on a few accelerators); with a mask,
which every left-padded batch has, it first copies every key and value head once per query head
(``repeat_kv``). In a decode step that copy is most of the attention's work: at batch 16 with a
556-token cache, one layer's attention took 12.8 ms with the copy and 2.0 ms without it in
float32 (6.1 and 1.3 ms in bfloat16), one thread, and the outputs were the same bits.

:data:`SDPA_SHARED_KV` (``"llm_zoo_sdpa"``) is registered with transformers as an attention
implementation. It differs from ``sdpa`` in one case only: a mask is given, the tensors are on the
CPU, the model groups its heads, and autograd is off (generation). It then calls torch's
``scaled_dot_product_attention`` with the mask and ``enable_gqa=True``, which on the CPU computes
each query head from its shared key/value head without copying and gives the same numbers
(``tests/test_attention.py`` checks an engine's tokens and logprobs bit for bit). Everywhere else
(the update's forward and backward, GPUs, no mask) it is transformers' ``sdpa`` unchanged: with
autograd on, the backward through ``enable_gqa`` sums the key/value gradients of a group in another
order (different rounding) and was not faster in bfloat16, so the update keeps the measured path,
except where :mod:`llm_zoo_train.kernels.update_attention` measured its grouped products faster
(bfloat16 on the CPU).

**A decode step's attention, measured.** For one query position torch's CPU kernel is a
flash-attention loop built for many; on an AMD EPYC (Zen 4, AVX-512 BF16, no AMX) in bfloat16 it
took 9.0 ms a layer at batch 16 with 560 positions, against 0.5 ms for two batched products that
take each key/value head's query heads as the rows of one product (no copies;
:func:`grouped_decode_attention`, the softmax in float32 as transformers' eager attention), and
in float32 1.30 against 1.14 ms. :data:`DECODE_ATTENTION` ``"auto"`` (the default) times both on
the first decode step of each dtype in the process and takes the grouped products only where
torch's kernel is at least :data:`GROUPED_MIN_SPEEDUP` times slower (a log line at ``INFO`` says
which; :func:`decode_attention_choices` keeps the times). The grouped products round differently
(float32: about 1e-7; bfloat16: its own precision, as eager attention), so where they are taken a
token can differ from ``sdpa``'s where two are that close.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from llm_zoo_train.kernels.attention_choices import AttentionChoices
from llm_zoo_train.kernels.update_attention import grouped_update_attention, update_uses_grouped

__all__ = [
    "DECODE_ATTENTION",
    "DECODE_ATTENTIONS",
    "GROUPED_MIN_SPEEDUP",
    "SDPA_SHARED_KV",
    "adopt_decode_attention_choices",
    "decode_attention_choices",
    "forget_decode_attention_choices",
    "grouped_decode_attention",
    "register",
    "sdpa_shared_kv_forward",
    "set_decode_attention",
]

logger = logging.getLogger(__name__)

#: The attention implementation's name, as ``set_attn_implementation`` takes it.
SDPA_SHARED_KV = "llm_zoo_sdpa"
#: The choices of :func:`set_decode_attention`.
DECODE_ATTENTIONS = ("auto", "sdpa", "grouped")
#: How a decode step's attention (one query position) is computed while generating, in this
#: process: ``"auto"`` (measured, module docstring), ``"sdpa"`` (torch's kernel) or ``"grouped"``
#: (:func:`grouped_decode_attention`); ``model.decode_attention`` sets it
#: (:func:`set_decode_attention`). Tests that compare bits pin it.
DECODE_ATTENTION = "auto"
#: ``"auto"`` takes the grouped products only when torch's kernel is this much slower.
GROUPED_MIN_SPEEDUP = 1.15

# "auto"'s choice per (device type, dtype): whether the grouped products won, and the timings
# (seconds: torch's kernel, the grouped products) for the log and benchmarks.
_measured = AttentionChoices("decode attention")


def set_decode_attention(choice: str) -> None:
    """Set :data:`DECODE_ATTENTION` (for the whole process: every model it decodes); a
    ``ValueError`` naming the choices for anything else."""
    global DECODE_ATTENTION
    if choice not in DECODE_ATTENTIONS:
        raise ValueError(
            f"decode attention must be one of {', '.join(map(repr, DECODE_ATTENTIONS))}, got {choice!r}"
        )
    DECODE_ATTENTION = choice


def forget_decode_attention_choices() -> None:
    """Drop ``"auto"``'s measurements (each dtype is measured again at its next decode step)."""
    _measured.clear()


def decode_attention_choices() -> dict[str, dict[str, Any]]:
    """What ``"auto"`` measured and chose in this process, by ``"device/dtype"``."""
    return _measured.record()


def adopt_decode_attention_choices(choices: Mapping[str, Mapping[str, Any]], *, replace: bool = True) -> None:
    """Take ``choices`` (:func:`decode_attention_choices` of another process or an earlier run) as
    this process's, so that ``"auto"`` chooses as they did without measuring; with
    ``replace=False`` only for device types and dtypes not measured here yet."""
    _measured.adopt(choices, replace=replace)


def grouped_decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
) -> torch.Tensor:
    """One query position's attention (``[B, H, 1, D]`` query, ``[B, H_kv, K, D]`` key and value,
    no mask, a boolean keep-mask or an additive float mask broadcastable to ``[B, 1, 1, K]``) as two batched
    products with each key/value head's query heads as the rows of one product (no copy of the
    keys and values), the softmax in float32 as transformers' eager attention does; ``[B, H, 1, D]``."""
    batch, heads, _, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    rows = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # query heads kv*G .. kv*G+G-1
    scores = torch.matmul(rows, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        mask = attention_mask.reshape(attention_mask.shape[0], 1, 1, length)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value).reshape(batch, heads, 1, dim)


def _sdpa_in_place(query, key, value, attention_mask, dropout, scaling) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )


def _grouped_faster(query, key, value, attention_mask, scaling) -> bool:
    """``"auto"``: time both ways on this call's tensors once per device type and dtype."""
    where = (query.device.type, query.dtype)
    if where not in _measured:
        calls = {
            "sdpa": lambda: _sdpa_in_place(query, key, value, attention_mask, 0.0, scaling),
            "grouped": lambda: grouped_decode_attention(query, key, value, attention_mask, scaling),
        }
        seconds: dict[str, list[float]] = {name: [] for name in calls}
        for timed in range(4):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                if timed:  # the first of each warms the kernels
                    seconds[name].append(time.perf_counter() - start)
        sdpa_s, grouped_s = min(seconds["sdpa"]), min(seconds["grouped"])
        _measured.choose(where, sdpa_s, grouped_s, GROUPED_MIN_SPEEDUP)
        logger.info(
            "decode attention in %s on the %s (%d rows, %d positions): torch's sdpa %.0f us a layer,"
            " grouped products %.0f us: using %s",
            str(query.dtype).removeprefix("torch."),
            query.device.type,
            query.shape[0],
            key.shape[2],
            1e6 * sdpa_s,
            1e6 * grouped_s,
            "the grouped products" if _measured.grouped(where) else "sdpa",
        )
    return _measured.grouped(where)


def _reads_in_place(module: Any, query: torch.Tensor, attention_mask: Any, kwargs: dict[str, Any]) -> bool:
    return (
        attention_mask is not None
        and isinstance(attention_mask, torch.Tensor)
        and query.device.type == "cpu"
        and getattr(module, "num_key_value_groups", 1) > 1
        and not torch.is_grad_enabled()
        and kwargs.get("position_bias") is None
        and kwargs.get("cache") is None
        and not kwargs.get("output_attentions", False)
    )


def sdpa_shared_kv_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``[B, H, Q, D]`` query, ``[B, H_kv, K, D]`` key and
    value; returns ``([B, Q, H, D]`` output, ``None)``, like ``sdpa_attention_forward``."""
    if _decodes_grouped(module, query, key, attention_mask, dropout, kwargs):
        scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        if DECODE_ATTENTION == "grouped" or _grouped_faster(query, key, value, attention_mask, scale):
            output = grouped_decode_attention(query, key, value, attention_mask, scale)
            return output.transpose(1, 2).contiguous(), None
    if torch.is_grad_enabled():
        scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        if update_uses_grouped(module, query, key, value, attention_mask, dropout, scale, kwargs):
            return grouped_update_attention(query, key, value, attention_mask, scale), None
    if not _reads_in_place(module, query, attention_mask, kwargs):
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    # With a mask, transformers' sdpa never asks for the causal flag either: the mask holds causality.
    output = _sdpa_in_place(query, key, value, attention_mask, dropout, scaling)
    return output.transpose(1, 2).contiguous(), None


def _decodes_grouped(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: Any,
    dropout: float,
    kwargs: dict[str, Any],
) -> bool:
    """A decode step (one query position) on the CPU without autograd that the grouped products
    can compute: plain attention, a mask (if any) over the key positions."""
    if DECODE_ATTENTION == "sdpa" or query.shape[2] != 1 or dropout != 0.0 or query.device.type != "cpu":
        return False
    if torch.is_grad_enabled() or kwargs.get("output_attentions", False):
        return False
    if (
        kwargs.get("position_bias") is not None
        or kwargs.get("cache") is not None
        or kwargs.get("sinks") is not None
    ):
        return False
    if getattr(module, "num_key_value_groups", 1) * key.shape[1] != query.shape[1]:
        return False
    if attention_mask is None:
        return True
    length = key.shape[2]
    return (
        isinstance(attention_mask, torch.Tensor)
        and attention_mask.shape[-1] == length
        and attention_mask.numel() in (length, query.shape[0] * length)
    )


def register() -> str:
    """Register :data:`SDPA_SHARED_KV` (the function and sdpa's mask format) with transformers; its name.
    Idempotent."""
    AttentionInterface.register(SDPA_SHARED_KV, sdpa_shared_kv_forward)
    AttentionMaskInterface.register(SDPA_SHARED_KV, sdpa_mask)
    return SDPA_SHARED_KV
