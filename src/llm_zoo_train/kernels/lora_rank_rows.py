"""The update's LoRA products with the rank as the rows: the same sums, a few times less time on a CPU.

A LoRA layer of rank ``r`` adds ``scaling * (x A^T) B^T`` to the frozen layer's output ``x W^T``
(``A``: ``r x in``, ``B``: ``out x r``). Four of its six products in the update have ``r`` columns
and a long side of a few hundred rows: ``h = x A^T`` forward, and backward ``dh = dy B`` and
``dB = dy^T h`` (``dA = dh^T x`` and ``dx = dh A`` have no ``r``-wide output). MKL's ``sgemm`` is
slow at eight columns: on an AMD EPYC (Zen 4, one thread, 248 rows) ``dB`` for a 1536-wide layer
took 477 us as ``[1536, 248] @ [248, 8]`` (peft's, through autograd) against 113 us as
``([8, 248] @ [248, 1536])^T``, and ``h`` for a 1536-wide input 203 against 103 us.
:class:`RankRowsLoRA` computes each of the three as the transposed product, with ``r`` rows,
forward and backward, and adds the scaled product to ``x W^T`` in one ``addmm``.

**Other rounding.** The sums are the same but MKL adds them in another order, so the logprobs and
gradients differ from peft's by float32 rounding (about 1e-7 relative per product). It is therefore
part of ``training.update_kernel`` with the frozen layers' oneDNN copies
(:mod:`~llm_zoo_train.kernels.frozen_linear`): ``"exact"`` never takes it (peft's bits, through
:mod:`~llm_zoo_train.kernels.lora_training`'s fused form), ``"onednn"`` always does for float32
adapters on a CPU (a bfloat16 model's too: its input is cast to float32, as peft does), and
``"auto"`` times one forward and backward of each of the model's LoRA shapes both ways at :data:`~llm_zoo_train.kernels.frozen_linear.MEASURED_ROWS` rows, once per process and set
of shapes (weighted by how many layers have the shape), and takes the rank as the rows only where
it is at least :data:`~llm_zoo_train.kernels.packed_linear.ONEDNN_MIN_SPEEDUP` times faster; an
``INFO`` line says which. Like the other timed choices, the measurement travels with the run
(:mod:`~llm_zoo_train.kernels.choices`: :func:`rank_rows_measurements`,
:func:`adopt_rank_rows_measurements`), so a resumed run repeats the uninterrupted one bit for bit.

Measured in the trainer-vs-TRL job (SmolLM2-135M in float32, all-linear r=8 adapters, 8 completions
of 31 tokens on 2 prompts of 45, one thread, alternating, load ~0.9): one micro-batch's forward and
backward, median 2.46 s with peft's products against 2.35 s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from llm_zoo_train.kernels.frozen_linear import MEASURED_ROWS
from llm_zoo_train.kernels.packed_linear import KERNELS, ONEDNN_MIN_SPEEDUP, TIMED_PASSES

__all__ = [
    "RankRowsChoice",
    "RankRowsLoRA",
    "adopt_rank_rows_measurements",
    "forget_rank_rows_measurements",
    "rank_rows_chosen",
    "rank_rows_measurements",
]

logger = logging.getLogger(__name__)

#: A LoRA shape: (input features, output features, rank).
Shape = tuple[int, int, int]


@dataclass(frozen=True)
class RankRowsChoice:
    """Whether a model's LoRA products in the update take the rank as the rows, and why."""

    rank_rows: bool
    peft_s: float | None = None  # "auto": a weighted forward-and-backward pass with peft's products
    rank_rows_s: float | None = None  # and with the rank as the rows


# "auto"'s measurements per set of LoRA shapes, shared by the whole process.
_measured: dict[tuple[Shape, ...], RankRowsChoice] = {}


class RankRowsLoRA(torch.autograd.Function):
    """``result + scaling * (x A^T) B^T`` with ``x A^T``, ``dy B`` and ``dy^T h`` computed with the
    rank as the rows (module docstring). ``x``: ``[..., in]``; ``result``: ``[..., out]``."""

    @staticmethod
    def forward(
        ctx: Any,
        result: torch.Tensor,
        x: torch.Tensor,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        scaling: float,
    ) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        flat_x = x.reshape(rows, x.shape[-1])
        hidden = torch.mm(lora_a, flat_x.t()).t()  # [rows, r], a view of the [r, rows] product
        output = torch.addmm(result.reshape(rows, -1), hidden, lora_b.t(), alpha=scaling)
        ctx.save_for_backward(flat_x, hidden, lora_a, lora_b)
        ctx.scaling, ctx.x_shape = scaling, x.shape
        return output.view(result.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        flat_x, hidden, lora_a, lora_b = ctx.saved_tensors
        needs_result, needs_x, needs_a, needs_b = ctx.needs_input_grad[:4]
        flat_grad = grad.reshape(-1, grad.shape[-1])
        grad_hidden = torch.mm(lora_b.t(), flat_grad.t()).mul_(ctx.scaling).t()  # [rows, r]
        grad_a = torch.mm(grad_hidden.t(), flat_x) if needs_a else None
        grad_b = torch.mm(hidden.t(), flat_grad).mul_(ctx.scaling).t() if needs_b else None
        grad_x = torch.mm(grad_hidden, lora_a).view(ctx.x_shape) if needs_x else None
        return grad if needs_result else None, grad_x, grad_a, grad_b, None


def forget_rank_rows_measurements() -> None:
    """Drop ``"auto"``'s measurements: the next use of each set of shapes measures again."""
    _measured.clear()


def rank_rows_measurements() -> list[dict[str, Any]]:
    """``"auto"``'s measurements in this process, JSON-ready (:func:`adopt_rank_rows_measurements`
    takes them)."""
    return [
        {"layers": [list(shape) for shape in shapes], **asdict(choice)}
        for shapes, choice in _measured.items()
    ]


def adopt_rank_rows_measurements(entries: Iterable[Mapping[str, Any]], *, replace: bool = True) -> None:
    """Take ``entries`` (:func:`rank_rows_measurements` of another process or an earlier run) as
    this process's measurements, so that ``"auto"`` chooses as they did without measuring; with
    ``replace=False`` only for sets of shapes not measured here yet."""
    parsed = {}  # all of them first: a malformed entry adopts none
    for entry in entries:
        choice = RankRowsChoice(**{k: v for k, v in entry.items() if k != "layers"})
        if not isinstance(choice.rank_rows, bool):
            raise ValueError(f"rank_rows must be true or false, got {choice.rank_rows!r}")
        shapes = tuple(sorted((int(i), int(o), int(r)) for i, o, r in entry["layers"]))
        parsed[shapes] = choice
    for key, choice in parsed.items():
        if replace or key not in _measured:
            _measured[key] = choice


def rank_rows_chosen(kernel: str, shapes: Mapping[Shape, int]) -> bool:
    """Whether the update's LoRA products take the rank as the rows for a model whose float32 CPU
    LoRA layers have ``shapes`` (with how many layers have each), under ``training.update_kernel``
    ``kernel`` (module docstring)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(map(repr, KERNELS))}, got {kernel!r}")
    if kernel == "exact" or not shapes:
        return False
    if kernel == "onednn":
        return True
    key = tuple(sorted(shapes))
    choice = _measured.get(key)
    if choice is None:
        choice = _measured[key] = _measure(shapes)
        logger.info(
            "update LoRA products (%d layers, %d rows, forward and backward): peft's %.1f ms a pass,"
            " the rank as the rows %.1f ms: using %s",
            sum(shapes.values()),
            MEASURED_ROWS,
            1e3 * (choice.peft_s or 0.0),
            1e3 * (choice.rank_rows_s or 0.0),
            "the rank as the rows" if choice.rank_rows else "peft's",
        )
    return choice.rank_rows


def _pass_seconds(calls: list[tuple[int, Callable[[], None]]]) -> float:
    """A pass: each (layer count, forward and backward) call run once, weighted by its count."""
    total = 0.0
    for count, call in calls:
        start = time.perf_counter()
        call()
        total += count * (time.perf_counter() - start)
    return total


def _peft_pass(
    result: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, grad: torch.Tensor
) -> None:
    """peft's products (the fused ``addmm`` of :mod:`~llm_zoo_train.kernels.lora_training`), forward
    and backward."""
    output = torch.addmm(result, F.linear(x, lora_a), lora_b.t(), alpha=2.0)
    torch.autograd.grad(output, (result, x, lora_a, lora_b), grad)


def _rank_rows_pass(
    result: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, grad: torch.Tensor
) -> None:
    """:class:`RankRowsLoRA`, forward and backward."""
    output = RankRowsLoRA.apply(result, x, lora_a, lora_b, 2.0)
    torch.autograd.grad(output, (result, x, lora_a, lora_b), grad)


def _measure(shapes: Mapping[Shape, int]) -> RankRowsChoice:
    """Times one forward and backward of each shape both ways (module docstring)."""
    generator = torch.Generator().manual_seed(0)
    passes: dict[str, list[tuple[int, Callable[[], None]]]] = {"peft": [], "rank_rows": []}
    for (in_features, out_features, rank), count in sorted(shapes.items()):
        result, x = (torch.randn(MEASURED_ROWS, n, generator=generator) for n in (out_features, in_features))
        lora_a = torch.randn(rank, in_features, generator=generator)
        lora_b = torch.randn(out_features, rank, generator=generator)
        grad = torch.randn(MEASURED_ROWS, out_features, generator=generator)
        result, x, lora_a, lora_b = (t.requires_grad_() for t in (result, x, lora_a, lora_b))
        passes["peft"].append((count, partial(_peft_pass, result, x, lora_a, lora_b, grad)))
        passes["rank_rows"].append((count, partial(_rank_rows_pass, result, x, lora_a, lora_b, grad)))
    seconds: dict[str, list[float]] = {name: [] for name in passes}
    with torch.enable_grad():
        for timed in range(TIMED_PASSES + 1):
            for name, calls in passes.items():
                elapsed = _pass_seconds(calls)
                if timed:  # the first pass of each warms the kernels and the caches
                    seconds[name].append(elapsed)
    peft_s, rank_rows_s = min(seconds["peft"]), min(seconds["rank_rows"])
    return RankRowsChoice(peft_s >= ONEDNN_MIN_SPEEDUP * rank_rows_s, peft_s, rank_rows_s)
