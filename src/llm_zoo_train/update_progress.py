"""Live progress within an update's micro-batch: the decoder layers its forward and backward have run.

A micro-batch of an adapter's update is one forward and one backward pass over its samples, tens
of seconds on a busy CPU, while the update's own count (micro-batches done) moves only when one
ends. :func:`update_layer_progress` shows the layers moving meanwhile: a forward hook on each
decoder layer (:func:`llm_zoo_train.engines.hf_reading.decoder_layers`) reports that the layer has
run forward and, when its output takes part in the gradient, puts a hook on that output tensor that
reports when the backward pass has reached the layer.

Nothing is changed: the forward hook returns ``None`` (the layer's output is its own) and the tensor
hook returns ``None`` (the gradient flows on unchanged). Every hook is removed when the block ends;
the tensor hooks go with the graph their tensors belong to.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from llm_zoo_train.engines.hf_reading import decoder_layers

__all__ = ["update_layer_progress"]


class _LayerWatch:
    """Forward hook of decoder layer ``index`` of ``total``; writes the phase's ``info``."""

    def __init__(self, phase: Any, index: int, total: int):
        self.phase, self.index, self.total = phase, index, total

    def __call__(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        self.phase.update(info=f"forward, {self.index + 1}/{self.total} layers")
        hidden = output[0] if isinstance(output, tuple) else output
        if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
            hidden.register_hook(self._backward)

    def _backward(self, grad: torch.Tensor) -> None:
        # The gradient of this layer's output is ready: backward has come down to this layer (it
        # starts at the last one).
        self.phase.update(info=f"backward, {self.total - self.index}/{self.total} layers")


@contextmanager
def update_layer_progress(model: Any, phase: Any) -> Iterator[None]:
    """Within the block, ``phase.update(info=...)`` says which decoder layer of ``model`` the
    forward or backward pass has reached (e.g. ``backward, 12/30 layers``)."""
    layers = decoder_layers(model)
    handles = [
        layer.register_forward_hook(_LayerWatch(phase, index, len(layers)))
        for index, layer in enumerate(layers)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        phase.update(info="")
