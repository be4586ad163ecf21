"""Finite or nothing: a non-finite loss, gradient or adapter weight stops the run.

A NaN or infinite value that reached an optimizer step would turn the adapters into NaN while the
step's metrics still look normal; every later step and every checkpoint would carry the poison.
So the updater checks each adapter's gradient norm before its optimizer step (a NaN loss gives a
NaN gradient), the trainer checks the adapter's weights after it, and every save checks the
weights again. Any non-finite value raises :class:`NonFiniteError`, a one-line message naming the
adapter and the step; nothing of that step is saved, so the last checkpoint stays intact.

There is deliberately no skip-and-continue option: a step whose update is non-finite usually
means the learning rate, the gradient clipping or the data is wrong, and skipping it would only
move the failure to a later step with less evidence. Lower ``training.learning_rate``, set
``training.max_grad_norm`` > 0, or check the rewards, and start again (or resume from the last
checkpoint with settings that may change on resume).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch

from llm_zoo_train.runs.sharded_state import full_tensor

__all__ = ["NonFiniteError", "check_finite_metrics", "check_finite_weights", "gradient_error"]


class NonFiniteError(FloatingPointError):
    """A non-finite loss, gradient or weight; ``str(error)`` is one line naming adapter and step."""


def check_finite_metrics(adapter: str, metrics: Mapping[str, float], step: int | None = None) -> None:
    """NonFiniteError if any ``update/{adapter}/...`` value in ``metrics`` is NaN or infinite."""
    prefix = f"update/{adapter}/"
    bad = {
        k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix) and not math.isfinite(v)
    }
    if bad:
        shown = ", ".join(f"{name} {value}" for name, value in sorted(bad.items()))
        raise NonFiniteError(f"{_where(adapter, step)}: non-finite {shown}; {_ADVICE}")


def check_finite_weights(adapter: str, parameters: Iterable[torch.Tensor], step: int | None = None) -> None:
    """NonFiniteError if any of ``adapter``'s ``parameters`` holds a NaN or an infinity. Sharded
    parameters are checked whole, so every process reaches the same verdict (a collective: all
    processes call it together)."""
    with torch.no_grad():
        bad = sum(int((~torch.isfinite(full_tensor(p))).sum()) for p in parameters)
    if bad:
        raise NonFiniteError(f"{_where(adapter, step)}: {bad} adapter weights are non-finite; {_ADVICE}")


def gradient_error(adapter: str, norm: float) -> NonFiniteError:
    """The error for a non-finite gradient norm found before ``adapter``'s optimizer step."""
    return NonFiniteError(
        f"adapter {adapter!r}: non-finite gradient norm {norm} before its optimizer step; {_ADVICE}"
    )


def _where(adapter: str, step: int | None) -> str:
    return f"adapter {adapter!r}" + (f" at step {step}" if step is not None else "")


_ADVICE = (
    "stopped before anything of this step was saved (the last checkpoint is intact): lower "
    "training.learning_rate, set training.max_grad_norm > 0 or check the rewards"
)
