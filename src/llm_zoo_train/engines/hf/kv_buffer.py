"""A KV cache layer written in place into preallocated buffers, for the engine's decode loop.

transformers' ``DynamicLayer`` appends each decode step's keys and values with ``torch.cat``, which
allocates and copies the whole cache of the layer every step: at batch 16 and a 556-token context
on SmolLM2-135M that is about 400 MB copied per decode step in float32. :class:`PreallocatedLayer`
holds buffers with room for every token the loop can still generate, writes each step's keys and
values into the next free positions, and hands attention a view of the filled part. The values
attention sees are the same numbers (only their storage differs), so the sampled tokens and their
logprobs do not change (``tests/test_hf_decode.py`` checks them bit for bit).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

__all__ = ["PreallocatedLayer", "preallocate"]


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views of the first positions of buffers with
    room for ``capacity`` positions (it grows, by copying, only if a step would overflow it).

    Args:
        keys: ``[B, H, L, D]`` keys so far.
        values: Their values.
        capacity: Positions to allocate (at least ``L``).
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int):
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._length = 0
        self._key_buffer = self._allocate(keys, capacity)
        self._value_buffer = self._allocate(values, capacity)
        self.update(keys, values)

    @staticmethod
    def _allocate(like: torch.Tensor, capacity: int) -> torch.Tensor:
        batch, heads, _, dim = like.shape
        return like.new_empty((batch, heads, max(int(capacity), like.shape[2]), dim))

    def _views(self) -> None:
        self.keys = self._key_buffer[:, :, : self._length]
        self.values = self._value_buffer[:, :, : self._length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._length + key_states.shape[-2]
        if end > self._key_buffer.shape[2]:
            for name in ("_key_buffer", "_value_buffer"):
                old = getattr(self, name)
                new = self._allocate(old, 2 * end)
                new[:, :, : self._length] = old[:, :, : self._length]
                setattr(self, name, new)
        self._key_buffer[:, :, self._length : end] = key_states
        self._value_buffer[:, :, self._length : end] = value_states
        self._length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._key_buffer = self._key_buffer[indices]
        self._value_buffer = self._value_buffer[indices]
        self._views()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("PreallocatedLayer is only for the engine's decode loop")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("PreallocatedLayer is only for the engine's decode loop")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("PreallocatedLayer is only for the engine's decode loop")


def preallocate(cache: Any, extra: int) -> bool:
    """Replace every plain ``DynamicLayer`` of ``cache`` (filled) by a :class:`PreallocatedLayer` with
    room for ``extra`` more positions. ``False`` (and nothing changed) unless every layer is one."""
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer or not layer.is_initialized for layer in layers):
        return False
    for index, layer in enumerate(layers):
        layers[index] = PreallocatedLayer(layer.keys, layer.values, layer.keys.shape[2] + int(extra))
    return True
