"""peft's LoRA linear layers with another ``forward`` for the length of a block.

The engine's lean inference forward (:mod:`~llm_zoo_train.models.lora_inference`) and the
update's fused forward (:mod:`~llm_zoo_train.models.lora_training`) replace each plain peft
``lora.Linear``'s ``forward`` on the instance while a block runs and give peft's back after it.
:func:`replaced_lora_forwards` does that for both; a layer whose ``forward`` someone else already
replaced on the instance (accelerate's hooks) is left alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["lora_linear_class", "replaced_lora_forwards"]


def lora_linear_class() -> type | None:
    """peft's LoRA linear layer class, or ``None`` without peft."""
    try:
        from peft.tuners.lora.layer import Linear
    except ImportError:  # pragma: no cover - peft is a [train] dependency
        return None
    return Linear


@contextmanager
def replaced_lora_forwards(model: Any, forward_of: Callable[[Any], Callable[..., Any]]) -> Iterator[None]:
    """Within the block, every peft LoRA linear layer of ``model`` (exactly that class, its
    ``forward`` not replaced on the instance) runs ``forward_of(layer)``; afterwards its class's
    ``forward`` again."""
    lora_linear = lora_linear_class()
    layers = (
        [
            module
            for module in model.modules()
            if type(module) is lora_linear and "forward" not in vars(module)
        ]
        if lora_linear is not None
        else []
    )
    for layer in layers:
        layer.forward = forward_of(layer)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward
