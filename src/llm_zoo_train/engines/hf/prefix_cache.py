"""Per-adapter KV prefix cache of the transformers engine: prompts that start like an earlier prompt
of the same adapter skip the prefill of the shared start.

Within one training step the engine is asked the same text again and again: the team-credit
look-ahead prefills the next agent's prompt on every branch, and on the chosen branch that agent's
candidates are then asked the very same prompt; the candidates of different envs share the system
message and the task's fixed text. :class:`PrefixKVCache` keeps the keys and values of recently
prefilled prompts, per adapter, and hands back the longest stored prefix of a new prompt.

How prompts are matched: on **token ids**, after the chat template (never on text: a text prefix
need not tokenize to a token prefix). A causal model's keys and values at positions ``0..m-1``
depend only on the tokens ``0..m-1`` (and the weights), so the first ``m`` positions of a stored
prompt are exact for any prompt that starts with the same ``m`` tokens. The engine stores each
prompt without its last token (that one is run by the decode loop), and a stored prompt that is a
prefix of a newer one is dropped (the newer one covers it).

When it is emptied:

* whenever any parameter of the model changed since the last call (:meth:`PrefixKVCache.validate`
  compares every parameter's storage and in-place version counter: an optimizer step, a
  ``load_state_dict`` or ``copy_`` into a parameter all count; the trainer's HF engine is never told
  about updates, so this check, not a call from the trainer, is what keeps the cache fresh);
* on ``HFEngine.load_adapters`` and ``HFEngine.clear_prefix_cache()``;
* entries beyond ``max_bytes`` are evicted least recently used first.

A write through ``param.data`` bypasses torch's version counter; code that edits weights that way
must call ``clear_prefix_cache()``.

Numerics: the rounding of a matrix product depends on its shapes. Reusing an arbitrary prefix would
compute the rest of a prompt with other shapes than a full prefill, so a prompt's logits would
depend on what earlier calls left in the cache, and a replayed or resumed step would not repeat the
original. The engine therefore prefills every prompt alone, in blocks of :data:`PREFIX_BLOCK` tokens
at fixed positions (0-127, 128-255, ...), and reuses whole blocks only: a prompt's keys and values
are the same bits with or without hits (``tests/test_hf_prefix_cache.py`` checks it bit for bit).
They differ from the batched prefill of the engine without the cache in the last bits (checked
against a tolerance there). A call whose prompts all fit in one block holds nothing to reuse or
keep: it takes the batched prefill, the same bits as without the cache.

Block size: one forward pass per block costs more per token the smaller the block (weights are
read again per pass; SmolLM2-135M, float32, one core, a 512-token prompt: 1.41-1.48 s in 64-token
blocks, 1.05-1.13 s in 128, 0.88-0.98 s in one pass), while a larger block reuses less of a
shared prefix. 128 made the PlanPath tree rollout at look-ahead 0 as fast as the batched prefill
(25.5 s against 27.3 s; 64-token blocks 29.1 s) and reused as many positions as 64 there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["PREFIX_BLOCK", "PrefixKVCache", "common_prefix_length", "parameter_fingerprint"]

#: Tokens per prefill block of a cached prompt (see Numerics above).
PREFIX_BLOCK = 128

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per decoder layer: keys, values [1, H, L, D]


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` (sequences of one type) share."""
    limit = min(len(a), len(b))
    if a[:limit] == b[:limit]:
        return limit
    low, high = 0, limit  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle
    return low


def parameter_fingerprint(model: Any) -> tuple[tuple[int, int], ...]:
    """Every parameter's storage address and in-place version counter: it changes when any weight
    is written in place through the tensor (optimizer steps, ``copy_``, ``load_state_dict``) or
    replaced."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    layers: Layers
    nbytes: int


class PrefixKVCache:
    """Keys and values of recently prefilled prompts, per adapter, bounded by ``max_bytes``.

    Args:
        max_bytes: Most bytes of keys and values held (all adapters together); 0 turns it off.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[tuple[str | None, tuple[int, ...]], _Entry] = OrderedDict()
        self._nbytes = 0
        self._fingerprint: tuple[tuple[int, int], ...] | None = None
        self.hit_tokens = 0
        """Prompt positions served from the cache since creation (a counter for benchmarks)."""
        self.prefilled_tokens = 0
        """Prompt positions computed by a forward pass since creation (same)."""

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values held now."""
        return self._nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()
        self._nbytes = 0

    def validate(self, model: Any) -> None:
        """Empty the cache if any parameter of ``model`` changed since the last call."""
        fingerprint = parameter_fingerprint(model)
        if fingerprint != self._fingerprint:
            self.clear()
            self._fingerprint = fingerprint

    def longest_prefix(self, adapter: str | None, tokens: Sequence[int]) -> tuple[int, Layers | None]:
        """``(m, layers)``: the most leading ``tokens`` an entry of ``adapter`` holds, and that entry's
        keys and values (``m`` or more positions; use the first ``m``). ``(0, None)`` when none."""
        tokens = tuple(tokens)  # entries hold tuples (a tuple never equals a list)
        best, best_key = 0, None
        for key, entry in self._entries.items():
            if key[0] != adapter:
                continue
            length = common_prefix_length(entry.tokens, tokens)
            if length > best:
                best, best_key = length, key
        if best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        return best, self._entries[best_key].layers

    def store(self, adapter: str | None, tokens: Sequence[int], layers: Layers) -> None:
        """Keep ``layers`` (keys and values of exactly ``tokens``); entries it extends are dropped."""
        if self.max_bytes <= 0:
            return
        key = (adapter, tuple(tokens))
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if nbytes > self.max_bytes:
            return
        if any(k[0] == adapter and k[1][: len(key[1])] == key[1] for k in self._entries):
            return  # an entry already holds these positions
        for other in [k for k in self._entries if k[0] == adapter and k[1] == key[1][: len(k[1])]]:
            self._nbytes -= self._entries.pop(other).nbytes  # a prefix of the new entry
        self._entries[key] = _Entry(key[1], layers, nbytes)
        self._nbytes += nbytes
        while self._nbytes > self.max_bytes:
            self._nbytes -= self._entries.popitem(last=False)[1].nbytes
