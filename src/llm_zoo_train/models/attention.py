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
order (different rounding) and was not faster in bfloat16, so the update keeps the measured path.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

__all__ = ["SDPA_SHARED_KV", "register", "sdpa_shared_kv_forward"]

#: The attention implementation's name, as ``set_attn_implementation`` takes it.
SDPA_SHARED_KV = "llm_zoo_sdpa"


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
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register :data:`SDPA_SHARED_KV` (the function and sdpa's mask format) with transformers; its name.
    Idempotent."""
    AttentionInterface.register(SDPA_SHARED_KV, sdpa_shared_kv_forward)
    AttentionMaskInterface.register(SDPA_SHARED_KV, sdpa_mask)
    return SDPA_SHARED_KV
