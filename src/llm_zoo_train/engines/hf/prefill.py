"""The transformers engine's prompt pass: each prompt's keys and values computed once for its samples.

A :meth:`~llm_zoo_train.engines.hf.engine.HFEngine.generate` call asks ``n`` samples of each
prompt. Its rows repeat each prompt ``n`` times, but the keys and values of a prompt are the same
for all of them, so the engine computes them once per prompt and copies them to the prompt's rows
(``share_prefill``), as vLLM's prefix cache would:

* :func:`shared_prefill`: one left-padded forward pass over the batch's distinct prompts;
* :func:`prefill_from_prefixes`: one prompt per forward pass, in fixed blocks, each starting from
  the longest whole-block prefix that a :class:`~llm_zoo_train.engines.hf.prefix_cache.PrefixKVCache`
  holds of it, and stored there afterwards (``prefix_cache_mb``).

Both return ``None`` where the model's cache cannot be built or kept that way, with a warning; the
engine then stops trying and prefills every row as ``model.generate`` would.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from llm_zoo_train.engines.hf.decode import last_logits_only
from llm_zoo_train.engines.hf.prefix_cache import PrefixKVCache

__all__ = ["prefill_from_prefixes", "shared_prefill"]


def shared_prefill(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    index: torch.Tensor,
    *,
    with_logits: bool = False,
) -> tuple[Any, torch.Tensor | None] | None:
    """The KV cache of the prompts ``input_ids`` (each unique prompt once: every token but the
    last for ``generate``, which then runs the last one per row, or whole prompts for the
    compacting loop), copied to the rows (``index``) that sample from it; with ``with_logits``
    also each row's logits at its last position (``[rows, vocabulary]``). ``None`` (no sharing)
    for models whose cache cannot be built or indexed this way, with a warning."""
    try:
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            output = model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                **last_logits_only(model, input_ids.shape[1], input_ids.device),
            )
        cache.batch_select_indices(index)
        logits = output.logits[:, -1][index] if with_logits else None
    except (AttributeError, NotImplementedError, TypeError, ValueError) as err:
        warnings.warn(
            f"HFEngine: cannot share the prompt prefill between samples for "
            f"{type(model).__name__} ({type(err).__name__}: {err}); each sample prefills its prompt",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return cache, logits


def prefill_from_prefixes(
    model: Any,
    store: PrefixKVCache,
    block: int,
    unique: list[list[int]],
    adapter: str | None,
    span: int,
    index: torch.Tensor,
) -> Any:
    """Like :func:`shared_prefill`, but each prompt of ``unique`` prefills (one prompt per forward
    pass, in ``block``-token blocks) only what follows its longest prefix in ``store`` for
    ``adapter``, and is stored there afterwards; the prompts are then left-padded to ``span``
    positions and copied to their rows (``index``). ``None`` for models whose cache is not one
    plain ``DynamicLayer`` per layer (sliding windows, linear attention), with a warning: the
    caller turns the prefix cache off."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    device = index.device
    per_prompt = []
    for ids in unique:
        tokens = ids[:-1]
        reused, layers = store.longest_prefix(adapter, tokens)
        if layers is not None and reused == len(tokens) == layers[0][0].shape[2]:
            store.hit_tokens += reused  # this very prompt, computed in the same blocks
            per_prompt.append(layers)
            continue
        # Blocks start at fixed positions and a stored block was computed whole, so only whole
        # blocks are reused: the rest is computed in the same blocks as without any hit, and
        # the result does not depend on what the cache held.
        reused -= reused % block
        store.hit_tokens += reused
        cache = DynamicCache(config=model.config)
        for layer, (k, v) in enumerate(layers if reused else []):
            cache.update(k[:, :, :reused], v[:, :, :reused], layer)
        for start in range(reused, len(tokens), block):
            end = min(start + block, len(tokens))
            with torch.no_grad():
                model(
                    input_ids=torch.tensor([tokens[start:end]], dtype=torch.long, device=device),
                    attention_mask=torch.ones((1, end), dtype=torch.long, device=device),
                    position_ids=torch.arange(start, end, device=device)[None],
                    past_key_values=cache,
                    use_cache=True,
                    **last_logits_only(model, end - start, device),  # only the cache is read
                )
        if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
            warnings.warn(
                f"HFEngine: no prefix cache for {type(model).__name__}: its KV cache is not one "
                "plain DynamicLayer per layer; every prompt is prefilled in full",
                RuntimeWarning,
                stacklevel=4,
            )
            return None
        store.prefilled_tokens += len(tokens) - reused
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        if len(tokens) >= block:  # shorter ones hold no whole block to reuse
            store.store(adapter, tokens, layers)
        per_prompt.append(layers)

    # One left-padded batch (padding positions hold zeros; the attention mask hides them),
    # then one row per sample.
    batch = DynamicCache(config=model.config)
    for layer in range(len(per_prompt[0])):
        first = per_prompt[0][layer][0]
        shape = (len(unique), first.shape[1], span, first.shape[3])
        keys, values = first.new_zeros(shape), first.new_zeros(shape)
        for row, layers in enumerate(per_prompt):
            k, v = layers[layer]
            keys[row, :, span - k.shape[2] :] = k[0]
            values[row, :, span - v.shape[2] :] = v[0]
        batch.update(keys[index], values[index], layer)
    return batch
