"""Live progress within an update's micro-batch: the decoder layers its forward and backward have run.

A micro-batch of an adapter's update is one forward and one backward pass over its samples, tens
of seconds on a busy CPU, while the update's own count (micro-batches done) moves only when one
ends. :func:`update_layer_progress` shows the layers moving meanwhile: a forward hook on each
decoder layer (:func:`llm_zoo_train.engines.hf.reading.decoder_layers`) and on the projection onto
the vocabulary reports that it has run forward and, when its output takes part in the gradient,
puts a hook on that output tensor that reports when the backward pass has reached it. The
projection and the loss over the vocabulary are one stage without a count (one matmul).

Nothing is changed: the forward hook returns ``None`` (the layer's output is its own) and the tensor
hook returns ``None`` (the gradient flows on unchanged). Every hook is removed when the block ends;
the tensor hooks go with the graph their tensors belong to.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from llm_zoo_train.engines.hf.reading import decoder_layers, forward_hooks

__all__ = ["update_layer_progress"]


class _LayerWatch:
    """Forward hook of decoder layer ``index`` of ``total`` (``index == total``: the output
    projection onto the vocabulary); writes the phase's ``info``."""

    def __init__(self, phase: Any, index: int, total: int):
        self.phase, self.index, self.total = phase, index, total

    def _stage(self, direction: str) -> str:
        if self.index == self.total:
            return f"{direction}, vocabulary projection and loss"
        done = self.index + 1 if direction == "forward" else self.total - self.index
        return f"{direction}, {done}/{self.total} layers"

    def __call__(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        self.phase.update(info=self._stage("forward"))
        hidden = output[0] if isinstance(output, tuple) else output
        if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
            hidden.register_hook(self._backward)

    def _backward(self, grad: torch.Tensor) -> None:
        # The gradient of this module's output is ready: backward has come down to it (it starts
        # at the vocabulary projection, then the last layer).
        self.phase.update(info=self._stage("backward"))


@contextmanager
def update_layer_progress(model: Any, phase: Any) -> Iterator[None]:
    """Within the block, ``phase.update(info=...)`` says which decoder layer of ``model`` the
    forward or backward pass has reached (e.g. ``backward, 12/30 layers``)."""
    layers = decoder_layers(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    # The projection onto a large vocabulary and the loss over it can take as long as all layers.
    watched = [*layers, head] if isinstance(head, torch.nn.Module) else layers
    try:
        with forward_hooks(
            {module: _LayerWatch(phase, index, len(layers)) for index, module in enumerate(watched)}
        ):
            yield
    finally:
        phase.update(info="")
