"""Live progress of the transformers engine's prompt pass: a report after each decoder layer.

Before a ``generate`` call's first token the model reads the prompts: one forward pass over every
prompt position of a batch, which takes tens of seconds for dozens of prompts on a busy CPU and
has no decode step to count. Splitting that pass into chunks would change the matmul shapes (and
possibly the sampled tokens), so :func:`reading_progress` watches it instead: a forward hook on
each decoder layer reports, through :func:`llm_zoo_train.engines.base.report_reading`, the pass's
rows and positions and how many of the layers have run.

The hooks change no computation: each reads the shape of its layer's input and returns ``None``,
so the layer's output is the one it computes without them. Decode steps (one new position per
row) are not reported; they count as generated tokens. The hooks are installed only while a
caller listens (:func:`~llm_zoo_train.engines.base.reading_watched`) and are removed when the
block ends, error or not.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from llm_zoo_train.engines.base import reading_watched, report_reading

__all__ = ["decoder_layers", "forward_hooks", "reading_progress"]


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The model's decoder layers in order (empty if none are found).

    They are the modules of the classes the (base) transformers model names in
    ``_no_split_modules`` (e.g. ``LlamaDecoderLayer``), else the longest ``ModuleList``.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kinds = set(getattr(base, "_no_split_modules", None) or ())
    layers = [module for module in base.modules() if type(module).__name__ in kinds]
    if layers:
        return layers
    lists = [list(module) for module in base.modules() if isinstance(module, torch.nn.ModuleList)]
    return max(lists, key=len) if lists else []


class _LayerDone:
    """Forward hook of decoder layer ``index`` (of ``total``): reports a prompt pass's progress."""

    def __init__(self, index: int, total: int):
        self.index, self.total = index, total

    def __call__(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        hidden = args[0] if args else kwargs.get("hidden_states")
        if isinstance(hidden, torch.Tensor) and hidden.dim() == 3 and hidden.shape[1] > 1:
            report_reading(hidden.shape[0], hidden.shape[1], self.index + 1, self.total)


@contextmanager
def reading_progress(model: Any) -> Iterator[None]:
    """Within the block, every forward pass of ``model`` over more than one position per row (a
    prompt pass) reports after each decoder layer; nothing is installed when no caller listens."""
    if not reading_watched():
        yield
        return
    layers = decoder_layers(model)
    with forward_hooks(
        {layer: _LayerDone(index, len(layers)) for index, layer in enumerate(layers)}, kwargs=True
    ):
        yield


@contextmanager
def forward_hooks(hooks: dict[torch.nn.Module, Any], *, kwargs: bool = False) -> Iterator[None]:
    """``hooks[module]`` is ``module``'s forward hook within the block (``kwargs``: it also gets
    the call's keyword arguments); all are removed when the block ends, error or not."""
    handles = [module.register_forward_hook(hook, with_kwargs=kwargs) for module, hook in hooks.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
