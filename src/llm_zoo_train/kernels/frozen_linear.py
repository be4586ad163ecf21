"""The update's frozen float32 linear layers multiplied by oneDNN's packed copies: the forward
product and the input's gradient, with other float32 rounding than ``F.linear``.

The update trains LoRA adapters on a frozen base model, so each base layer's weight ``W`` gets
no gradient: autograd runs ``y = x W^T`` forward and ``dx = dy W`` backward, two products per
layer by the same fixed matrix. On a CPU, ``F.linear`` and ``mm`` hand both to the BLAS library,
which packs ``W`` into its kernel's layout again on every call. :class:`FrozenLinearPackings`
packs ``W`` and ``W^T`` once with oneDNN (``torch.ops.mkldnn._reorder_linear_weight``, what
``torch.compile`` uses for frozen layers) and, while :meth:`FrozenLinearPackings.applied` runs,
routes each frozen layer through an autograd function that multiplies by those copies both ways.
The copies are kept across steps (the weights do not change; a changed storage or in-place
version counter packs them again). Cost: twice the frozen layers' float32 size in memory
(SmolLM2-135M: +1.1 GB).

oneDNN sums in another order than MKL's ``sgemm``, so the logits, the loss and the gradients
differ from ``F.linear``'s by float32 rounding (about 1e-7 relative per product). ``kernel``:

* ``"exact"``: nothing packed, ``F.linear``'s bits (the update before this module);
* ``"onednn"``: oneDNN's copies wherever they apply;
* ``"auto"`` (the default): measured once per process and set of layer shapes: one layer of each
  shape, :data:`MEASURED_ROWS` rows, forward and input gradient, one untimed and
  :data:`~llm_zoo_train.kernels.packed_linear.TIMED_PASSES` timed passes each way (weighted by how
  many layers have the shape), and oneDNN's only where it is at least
  :data:`~llm_zoo_train.kernels.packed_linear.ONEDNN_MIN_SPEEDUP` times faster; the choice is
  logged at ``INFO``.

Applies to plain ``nn.Linear`` layers whose weight needs no gradient (and whose bias, if any,
neither), on the CPU, float32, both sides at least
:data:`~llm_zoo_train.kernels.packed_linear.MIN_SIDE`; inputs must be float32 with autocast off.
Anything else runs ``F.linear``.

Measured on an AMD EPYC (Zen 4, one thread, SmolLM2-135M, all-linear r=8 adapters, load ~1):
forward and backward of 8 sequences of 76 tokens (32 scored), alternating, 4.8-5.6 s with
``F.linear`` against 4.0-4.4 s with the packed copies.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Literal

import torch
import torch.nn.functional as F

from llm_zoo_train.kernels.packed_linear import (
    KERNELS,
    MIN_SIDE,
    ONEDNN_MIN_SPEEDUP,
    TIMED_PASSES,
    onednn_packing_available,
)

__all__ = [
    "MEASURED_ROWS",
    "FrozenLinearChoice",
    "FrozenLinearPackings",
    "adopt_frozen_measurements",
    "forget_frozen_measurements",
    "frozen_measurements",
    "input_gradient",
]

logger = logging.getLogger(__name__)

#: Rows of the products ``"auto"`` times (an update micro-batch has a few hundred).
MEASURED_ROWS = 128


@dataclass(frozen=True)
class FrozenLinearChoice:
    """How one model's frozen layers multiply in the update, and why."""

    kernel: Literal["onednn"] | None  # None: F.linear
    f_linear_s: float | None = None  # "auto": a weighted forward-and-gradient pass with F.linear
    onednn_s: float | None = None  # and with oneDNN's copies


# "auto"'s measurements per set of layer shapes, shared by the whole process.
_measured: dict[tuple[tuple[int, int], ...], FrozenLinearChoice] = {}


def forget_frozen_measurements() -> None:
    """Drop ``"auto"``'s measurements: the next use of each set of shapes measures again."""
    _measured.clear()


def frozen_measurements() -> list[dict[str, Any]]:
    """``"auto"``'s measurements in this process, JSON-ready (:func:`adopt_frozen_measurements` takes them)."""
    return [
        {"layers": [list(shape) for shape in shapes], **asdict(choice)}
        for shapes, choice in _measured.items()
    ]


def adopt_frozen_measurements(entries: Iterable[Mapping[str, Any]], *, replace: bool = True) -> None:
    """Take ``entries`` (:func:`frozen_measurements` of another process or an earlier run) as
    this process's measurements, so that ``"auto"`` chooses as they did without measuring; with
    ``replace=False`` only for shapes not measured here yet. Packings that already chose keep
    their choice."""
    parsed = {}  # all of them first: a malformed entry adopts none
    for entry in entries:
        choice = FrozenLinearChoice(**{k: v for k, v in entry.items() if k != "layers"})
        if choice.kernel not in ("onednn", None):
            raise ValueError(f"unknown kernel {choice.kernel!r}")
        parsed[tuple(sorted((int(o), int(i)) for o, i in entry["layers"]))] = choice
    for key, choice in parsed.items():
        if replace or key not in _measured:
            _measured[key] = choice


class _PackedProduct(torch.autograd.Function):
    """``x W^T + b`` by ``W``'s packed copy; the input's gradient by ``W^T``'s."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, packed: torch.Tensor, packed_t: torch.Tensor, bias: Any
    ) -> torch.Tensor:
        ctx.packed_t = packed_t
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        grad_x = torch.ops.mkldnn._linear_pointwise(grad.contiguous(), ctx.packed_t, None, "none", [], "")
        return grad_x, None, None, None


def input_gradient(module: torch.nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
    """``grad -> grad W``, the input's gradient through the frozen layer ``module``: by ``W^T``'s
    packed copy while :meth:`FrozenLinearPackings.applied` serves the layer with them, else
    ``matmul`` (autograd's own for ``F.linear``)."""
    forward = vars(module).get("forward")
    if isinstance(forward, partial) and forward.func is _packed_forward:
        packed_t = forward.args[2]
        return lambda grad: torch.ops.mkldnn._linear_pointwise(
            grad.contiguous(), packed_t, None, "none", [], ""
        )
    weight = module.weight
    return lambda grad: torch.matmul(grad, weight.detach())


def _frozen(module: torch.nn.Module) -> bool:
    if type(module) is not torch.nn.Linear or "forward" in vars(module):
        return False  # a subclass or a replaced forward (accelerate's hooks) may do more
    weight, bias = module.weight, module.bias
    return (
        not weight.requires_grad
        and weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and min(weight.shape) >= MIN_SIDE
        and (bias is None or (not bias.requires_grad and bias.dtype == torch.float32))
    )


def _packed_forward(
    module: torch.nn.Linear, packed: torch.Tensor, packed_t: torch.Tensor, x: torch.Tensor
) -> torch.Tensor:
    if x.dtype != torch.float32 or x.dim() < 2 or torch.is_autocast_enabled("cpu"):
        return F.linear(x, module.weight, module.bias)
    return _PackedProduct.apply(x.contiguous(), packed, packed_t, module.bias)


@dataclass
class _Packing:
    versions: tuple[int, int]  # the weight's storage and in-place version when packed
    packed: torch.Tensor
    packed_t: torch.Tensor


def _pack(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    weight = weight.detach()
    return (
        torch.ops.mkldnn._reorder_linear_weight(weight, MEASURED_ROWS),
        torch.ops.mkldnn._reorder_linear_weight(weight.t().contiguous(), MEASURED_ROWS),
    )


def _pass_seconds(products: list[tuple[int, Any, Any]]) -> float:
    """A pass: each (layer count, forward, gradient) product run once, weighted by its count."""
    total = 0.0
    for count, forward, gradient in products:
        start = time.perf_counter()
        forward()
        gradient()
        total += count * (time.perf_counter() - start)
    return total


class FrozenLinearPackings:
    """oneDNN-packed copies of a model's frozen linear layers for the update (module docstring).

    Args:
        kernel: ``"auto"``, ``"exact"`` or ``"onednn"``.
    """

    def __init__(self, kernel: str = "auto") -> None:
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(map(repr, KERNELS))}, got {kernel!r}")
        self.kernel = kernel
        self._by_layer: weakref.WeakKeyDictionary[torch.nn.Module, _Packing] = weakref.WeakKeyDictionary()
        #: The choice for each set of frozen layer shapes this object has served.
        self.choices: dict[tuple[tuple[int, int], ...], FrozenLinearChoice] = {}

    def clear(self) -> None:
        """Drop every packed copy (made again on the next use)."""
        self._by_layer = weakref.WeakKeyDictionary()

    def _packing(self, module: torch.nn.Linear) -> _Packing:
        weight = module.weight
        versions = (weight.data_ptr(), weight._version)
        packing = self._by_layer.get(module)
        if packing is None or packing.versions != versions:
            packing = self._by_layer[module] = _Packing(versions, *_pack(weight))
        return packing

    def _choice(self, layers: list[torch.nn.Linear]) -> FrozenLinearChoice:
        shapes = tuple(sorted(tuple(layer.weight.shape) for layer in layers))
        choice = self.choices.get(shapes)
        if choice is None:
            if self.kernel == "exact" or not onednn_packing_available():
                choice = FrozenLinearChoice(None)
            elif self.kernel == "onednn":
                choice = FrozenLinearChoice("onednn")
            else:
                choice = _measured.get(shapes)
                if choice is None:
                    choice = _measured[shapes] = _measure(layers)
                    logger.info(
                        "update products (%d frozen linear layers, %d rows, forward and input gradient):"
                        " F.linear %.1f ms a pass, oneDNN's packed copies %.1f ms: using %s",
                        len(layers),
                        MEASURED_ROWS,
                        1e3 * choice.f_linear_s,
                        1e3 * choice.onednn_s,
                        "oneDNN's" if choice.kernel else "F.linear",
                    )
            self.choices[shapes] = choice
        return choice

    @contextmanager
    def applied(self, model: torch.nn.Module) -> Iterator[FrozenLinearChoice | None]:
        """Within the block, every frozen linear layer of ``model`` (module docstring) multiplies by
        its packed copies where the kernel chosen is oneDNN's; yields the choice (``None`` when
        the model has no such layer). Afterwards ``F.linear`` again."""
        layers = [m for m in model.modules() if _frozen(m)]
        choice = self._choice(layers) if layers else None
        swapped = []
        if choice is not None and choice.kernel == "onednn":
            for module in layers:
                packing = self._packing(module)
                module.forward = partial(_packed_forward, module, packing.packed, packing.packed_t)
                swapped.append(module)
        try:
            yield choice
        finally:
            for module in swapped:
                if "forward" in vars(module):
                    del module.forward


def _measure(layers: list[torch.nn.Linear]) -> FrozenLinearChoice:
    """Times one layer of each shape both ways (module docstring)."""
    generator = torch.Generator().manual_seed(0)
    count: dict[tuple[int, int], int] = {}
    first: dict[tuple[int, int], torch.nn.Linear] = {}
    for layer in layers:
        shape = tuple(layer.weight.shape)
        count[shape] = count.get(shape, 0) + 1
        first.setdefault(shape, layer)
    plain, packed = [], []
    for shape, layer in first.items():
        out_features, in_features = shape
        x = torch.randn(MEASURED_ROWS, in_features, generator=generator)
        grad = torch.randn(MEASURED_ROWS, out_features, generator=generator)
        weight = layer.weight.detach()
        w, w_t = _pack(weight)
        plain.append((count[shape], partial(F.linear, x, weight), partial(torch.mm, grad, weight)))
        packed.append(
            (
                count[shape],
                partial(torch.ops.mkldnn._linear_pointwise, x, w, None, "none", [], ""),
                partial(torch.ops.mkldnn._linear_pointwise, grad, w_t, None, "none", [], ""),
            )
        )
    seconds: dict[str, list[float]] = {"F.linear": [], "onednn": []}
    with torch.no_grad():
        for timed in range(TIMED_PASSES + 1):
            for name, products in (("F.linear", plain), ("onednn", packed)):
                elapsed = _pass_seconds(products)
                if timed:  # the first pass of each warms oneDNN's primitives and the caches
                    seconds[name].append(elapsed)
    f_linear_s, onednn_s = min(seconds["F.linear"]), min(seconds["onednn"])
    kernel = "onednn" if f_linear_s >= ONEDNN_MIN_SPEEDUP * onednn_s else None
    return FrozenLinearChoice(kernel, f_linear_s, onednn_s)
