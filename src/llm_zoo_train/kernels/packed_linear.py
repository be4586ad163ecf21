"""Linear layers pre-packed while an engine decodes on a CPU: float32 for MKL (the same bits) or
oneDNN, bfloat16 for oneDNN (the same bits, probed); less time per decode step.

A decode step multiplies a few rows by every weight matrix of the model. In float32 on a CPU,
torch hands each product to MKL's ``sgemm``, which re-packs the weight matrix into its kernel's
layout on every call; at a few rows that copy is a large share of the product. MKL can pack a
matrix once (``cblas_sgemm_pack``) and multiply by the packed copy after that; torch exposes it as
``torch.ops.mkl._mkl_reorder_linear_weight`` and ``torch.ops.mkl._mkl_linear`` (what
``torch.compile`` uses for frozen CPU linear layers).

:class:`PackedLinearWeights` packs, for one row count, every float32 ``nn.Linear`` on the CPU
whose sides are both at least :data:`MIN_SIDE` (the base model's projections and the vocabulary
head; never a LoRA matrix), and :meth:`PackedLinearWeights.applied` routes a layer's
forward to its packed copy while the block runs, for inputs of exactly that many rows without
autograd. Anything else runs ``F.linear`` as before.

**Same bits, checked.** MKL's packed product uses the kernel of the unpacked one only from some
row count up (16 on the project's Xeon: at 1, 4 and 8 rows the last bits differ). Each packing is
therefore probed: a random input of the row count is multiplied both ways and the packed copy is
used only if every output bit is equal; otherwise layers of that shape keep ``F.linear`` for that
row count (remembered: MKL's choice of kernel depends on the shape, so it is not packed again).
Tokens and logprobs are thus the same as without packing.

Measured on the project's Xeon (one thread, SmolLM2-135M, float32, weights cycled so they come
from memory as in a real step): 16 rows by the 576 x 49152 vocabulary head 25.3 -> 14.2 ms, by a
576 x 1536 projection 548 -> 460 us; a whole decode step of 16 rows 115 -> 89 ms; the
trainer-vs-TRL benchmark's generation 4.9 -> 4.5 s per step. Cost: a packed copy per layer and row
count (:data:`MAX_ROW_COUNTS` kept, least recently used dropped), about the layer's own size again
(SmolLM2-135M: +0.52 GB resident), and 0.4-1.2 s to pack and probe SmolLM2-135M's 211 layers for
a new row count (more the first time, while the memory is new). A job whose calls cycle through
more than two row counts of 16 or more re-packs often; ``rollout.pack_base_weights: false`` turns
packing off. A copy is
re-packed when its weight's storage or in-place version counter changed (a write through
``weight.data`` bypasses the counter: call :meth:`PackedLinearWeights.clear`).

**oneDNN's packed product, where it is faster.** MKL's ``sgemm`` is tuned for Intel processors.
On the AMD EPYC (Zen 4) machines this project also runs on, one thread, the same products took
(weights cycled): 16 rows by a 576 x 1536 projection 0.68 ms with ``F.linear``, 0.75 ms with MKL's
packed copy and 0.38 ms with oneDNN's (``torch.ops.mkldnn._reorder_linear_weight`` /
``_linear_pointwise``, what ``torch.compile`` uses for frozen linear layers); by the vocabulary
head 24.9, 23.9 and 11.7 ms. oneDNN sums in another order, so its outputs differ from
``F.linear``'s in the last bits (float32 rounding, about 1e-7 relative), and sampled tokens can
then differ from ``generate``'s where two tokens are that close. :class:`PackedLinearWeights`
takes a ``kernel``:

* ``"exact"``: MKL's packed copies where their bits equal ``F.linear``'s (above);
* ``"onednn"``: oneDNN's packed copies for every packable layer and any row count (the count
  a copy is packed for is only a tuning hint): the decode's rows, those left after others
  finished, and a prompt's prefill inside the block;
* ``"auto"`` (the default): measured once per process, row count and set of layer shapes
  (so two engines on one model agree), not assumed from the
  processor: one untimed and :data:`TIMED_PASSES` timed passes over every packable layer with
  each, alternating, and oneDNN's only if its fastest pass is at least :data:`ONEDNN_MIN_SPEEDUP`
  times faster than the exact one's; then a pass of :data:`PREFILL_ROWS` rows decides by the same
  margin whether its copies also serve more rows than the decode's (prefills) or those take
  ``F.linear`` (:attr:`PackedLinearWeights.choices` keeps the times and the choices; a log line
  at ``INFO`` says them). Where only one of the two is available it is taken. Either way,
  ``"auto"`` serves LoRA layers by copies of their merged weights
  (:mod:`~llm_zoo_train.kernels.merged_lora`): where MKL's copies are chosen they are MKL's
  too, so the tokens are ``generate``'s only until an adapter is trained (then they differ by
  float32 rounding, as oneDNN's do). The passes time the base products only; the unmerged LoRA
  layers that ``"exact"`` keeps cost more again (16 ms a decode step of the trainer-vs-TRL job on
  the AMD EPYC, 13% of its generation), so on a machine where MKL's copies are chosen (the Intel
  Xeon), merging them is what ``"auto"`` can add. ``"exact"`` keeps every bit.

On the AMD EPYC, one thread: a pass over SmolLM2-135M's 211 layers at 16 rows 103.8 ms exact
against 63.3 ms oneDNN; 128 rows through one layer's shapes 13.3 ms with ``F.linear`` against
9.7 ms with oneDNN's copies.

**bfloat16.** torch multiplies bfloat16 on a CPU with oneDNN already, but ``F.linear`` hands it
the weight unpacked, so every call reorders it first. A copy packed once skips that: on the AMD
EPYC (one thread, 16 rows) a 576 x 1536 projection 0.23 -> 0.17 ms, a 576 x 192 one 0.052 ->
0.030 ms. MKL has no bfloat16 packing, and oneDNN's packed product gave ``F.linear``'s bits there,
so bfloat16 layers are packed by oneDNN only (where it packs bfloat16 at all: not on an AVX2-only
CPU, :func:`onednn_bfloat16_packing_available`), each packing probed like MKL's (inputs of the
packed row count, of one row and of :data:`PREFILL_ROWS` rows, every output bit compared) and
unused for its shape where a bit differs: the tokens and logprobs are those of the unpacked model.
``"exact"`` and ``"onednn"`` take these copies; ``"auto"`` times a pass over the model with them
against one with ``F.linear`` and takes the faster (no margin: either gives the same tokens;
prefills by a pass of their own, as for float32). In place, the trainer-vs-TRL job's generation
in bfloat16 took 3.07 s a step with them against 3.64 s without (after 3 training steps, the same
step run alternately 6 times each with the update off, AMD EPYC, one thread; 2.78 against 3.56 s
with untrained adapters, whose products are skipped), where the pass ``"auto"`` times measured
46.5 against 54.9 ms: weights that come from memory pay the reorder more. LoRA layers keep their
adapters apart in bfloat16 (their base layer runs the packed copy): a merged bfloat16 weight would
round a small update away.
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Literal

import torch
import torch.nn.functional as F

from llm_zoo_train.kernels.merged_lora import MergedAdapterPackings

__all__ = [
    "KERNELS",
    "MAX_ROW_COUNTS",
    "MIN_SIDE",
    "ONEDNN_MIN_SPEEDUP",
    "PREFILL_ROWS",
    "TIMED_PASSES",
    "KernelChoice",
    "PackedLinearWeights",
    "adopt_measurements",
    "forget_measurements",
    "measurements",
    "mkl_packing_available",
    "onednn_bfloat16_packing_available",
    "onednn_packing_available",
]

logger = logging.getLogger(__name__)

#: Layers with a side below this are left alone (LoRA matrices: rank-sized, cheap, and trained).
MIN_SIDE = 64
#: Row counts whose packed copies are kept per layer (a tree step asks for two: K x envs, envs).
MAX_ROW_COUNTS = 2
#: The ``kernel`` settings of :class:`PackedLinearWeights` (module docstring).
KERNELS = ("auto", "exact", "onednn")
#: ``"auto"`` takes oneDNN's packed product only when a pass over the model is this much faster:
#: a margin, so that timing noise does not flip the choice (and the tokens) between runs.
ONEDNN_MIN_SPEEDUP = 1.15
#: Timed passes per kernel when ``"auto"`` measures (the fastest counts).
TIMED_PASSES = 3
#: The dtypes whose layers are packed: float32 (MKL's or oneDNN's copies) and bfloat16 (oneDNN's,
#: only where a probe gives ``F.linear``'s bits).
PACKED_DTYPES = (torch.float32, torch.bfloat16)
#: Rows of the pass ``"auto"`` times to decide whether oneDNN's copies also serve prefills (the
#: prefix cache's block).
PREFILL_ROWS = 128


def _has_ops(backend_available: bool, namespace: str, *names: str) -> bool:
    ops = getattr(torch.ops, namespace, None)
    return backend_available and ops is not None and all(hasattr(ops, name) for name in names)


def mkl_packing_available() -> bool:
    """This torch build has MKL and its packed-linear ops."""
    return _has_ops(torch.backends.mkl.is_available(), "mkl", "_mkl_linear", "_mkl_reorder_linear_weight")


def onednn_packing_available() -> bool:
    """This torch build has oneDNN and its packed-linear ops."""
    return _has_ops(
        torch.backends.mkldnn.is_available(), "mkldnn", "_reorder_linear_weight", "_linear_pointwise"
    )


@functools.cache
def onednn_bfloat16_packing_available() -> bool:
    """oneDNN packs bfloat16 weights on this CPU: it refuses where the CPU lacks AVX512-BW/VL/DQ
    and AVX-NE-CONVERT (an AVX2-only CPU, or oneDNN capped there by ``ONEDNN_MAX_CPU_ISA``)."""
    if not onednn_packing_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(MIN_SIDE, MIN_SIDE, dtype=torch.bfloat16), 1)
    except RuntimeError:
        return False
    return True


@dataclass(frozen=True)
class KernelChoice:
    """How one model's layers multiply inputs of ``rows`` rows, and why."""

    rows: int
    kernel: Literal["mkl", "onednn"] | None  # None: nothing packed (F.linear)
    exact_s: float | None = None  # ``"auto"``: the fastest pass over the model with MKL's copies
    onednn_s: float | None = None  # and with oneDNN's
    #: oneDNN's copies also serve inputs of more rows (a prompt's prefill): always with
    #: ``"onednn"``; with ``"auto"``, where a pass of :data:`PREFILL_ROWS` rows measured faster too.
    any_rows: bool = False
    prefill_exact_s: float | None = None
    prefill_onednn_s: float | None = None
    #: The layers' dtype: float32, or bfloat16 (oneDNN's copies only, where probed to F.linear's
    #: bits; "exact" there means F.linear and those copies).
    dtype: str = "float32"
    #: MKL's copies serve each LoRA layer's merged weight too (``"auto"`` in float32 where MKL's
    #: copies were chosen: one product instead of three, and other float32 rounding than
    #: ``generate``'s once an adapter is trained). False with ``"exact"``, and in a record made
    #: before this field, whose run kept its adapters apart under MKL's copies.
    mkl_merged: bool = False


@dataclass
class _Packing:
    storage: int  # the weight's data pointer when packed
    version: int  # and its in-place version counter
    packed: torch.Tensor
    kernel: str = "mkl"


def _packable(module: torch.nn.Module) -> bool:
    if type(module) is not torch.nn.Linear or "forward" in vars(module):
        return False  # a subclass or a replaced forward (accelerate's hooks) may do more
    weight = module.weight
    return (
        weight.dtype in PACKED_DTYPES
        and weight.device.type == "cpu"
        and min(weight.shape) >= MIN_SIDE
        and (module.bias is None or module.bias.dtype == weight.dtype)
    )


def _pack(module: torch.nn.Linear, rows: int, generator: torch.Generator) -> torch.Tensor | None:
    """``module``'s weight packed for ``rows`` rows, or ``None`` if a probe input multiplied by the
    packed copy differs in any bit from ``F.linear``."""
    weight = module.weight.detach()
    packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
    probe = torch.randn(rows, weight.shape[1], generator=generator)
    same = torch.equal(
        torch.ops.mkl._mkl_linear(probe, packed, weight, module.bias, rows),
        F.linear(probe, weight, module.bias),
    )
    return packed if same else None


def _pack_onednn(module: torch.nn.Linear, rows: int, generator: torch.Generator) -> torch.Tensor | None:
    """``module``'s weight packed by oneDNN for ``rows`` rows: in float32 with other bits than
    ``F.linear``; in bfloat16 ``None`` unless probe inputs of ``rows``, one and :data:`PREFILL_ROWS`
    rows multiplied by the packed copy give every bit of ``F.linear`` (torch runs bfloat16
    products on oneDNN too)."""
    weight = module.weight.detach()
    if weight.dtype != torch.float32 and not onednn_bfloat16_packing_available():
        return None
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
    if weight.dtype == torch.float32:
        return packed
    for probe_rows in sorted({rows, 1, PREFILL_ROWS}):
        probe = torch.randn(probe_rows, weight.shape[1], generator=generator).to(weight.dtype)
        if not torch.equal(
            torch.ops.mkldnn._linear_pointwise(probe, packed, module.bias, "none", [], ""),
            F.linear(probe, weight, module.bias),
        ):
            return None
    return packed


def _takes_packed(
    x: torch.Tensor, rows: int, *, fewer: bool = False, dtype: torch.dtype = torch.float32
) -> bool:
    """``x`` may go through a copy of a ``dtype`` weight packed for ``rows`` rows (``fewer``: or for
    at least as many)."""
    return (
        not torch.is_grad_enabled()
        and x.dtype == dtype
        and x.is_contiguous()
        and x.dim() >= 2
        and (x.numel() <= rows * x.shape[-1] if fewer else x.numel() == rows * x.shape[-1])
    )


def _packed_forward(
    module: torch.nn.Linear, packed: torch.Tensor, rows: int, x: torch.Tensor
) -> torch.Tensor:
    if not _takes_packed(x, rows):
        return F.linear(x, module.weight, module.bias)
    return torch.ops.mkl._mkl_linear(x, packed, module.weight, module.bias, rows)


def _onednn_takes(x: torch.Tensor, rows: int, any_rows: bool, dtype: torch.dtype = torch.float32) -> bool:
    # oneDNN's copy serves any row count (the count it was packed for is a tuning hint), so the
    # rows a decode keeps after others finish use it too: 4 rows by a 576 x 1536 projection took
    # 220 us against 400 us for F.linear (AMD EPYC, one thread); with ``any_rows``, a prefill's
    # rows as well (128 rows through SmolLM2-135M's layer shapes 13.3 -> 9.7 ms).
    return _takes_packed(x, rows, fewer=True, dtype=dtype) or (
        any_rows and _takes_packed(x, x.numel() // x.shape[-1], dtype=dtype)
    )


def _onednn_forward(
    module: torch.nn.Linear, packed: torch.Tensor, rows: int, x: torch.Tensor, any_rows: bool = False
) -> torch.Tensor:
    if not _onednn_takes(x, rows, any_rows, module.weight.dtype):
        return F.linear(x, module.weight, module.bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, module.bias, "none", [], "")


def _pass_seconds(calls: list[Callable[[], torch.Tensor]]) -> float:
    """Wall time of one pass through ``calls`` (one product per layer, as a decode step runs)."""
    start = time.perf_counter()
    for call in calls:
        call()
    return time.perf_counter() - start


# "auto"'s measurements, per (row count, layer shapes), shared by every engine of the process: two
# engines on one model (training and evaluation, a prefix-cache view) then multiply the same way.
_measured: dict[tuple[int, str, tuple[tuple[int, ...], ...]], KernelChoice] = {}


def forget_measurements() -> None:
    """Drop ``"auto"``'s measurements: the next use of each shape measures again."""
    _measured.clear()


def measurements() -> list[dict[str, Any]]:
    """``"auto"``'s measurements in this process, JSON-ready (:func:`adopt_measurements` takes them)."""
    return [
        {"layers": [list(shape) for shape in shapes], **asdict(choice)}
        for (_, _, shapes), choice in _measured.items()
    ]


def adopt_measurements(entries: Iterable[Mapping[str, Any]], *, replace: bool = True) -> None:
    """Take ``entries`` (:func:`measurements` of another process or an earlier run) as this
    process's measurements, so that ``"auto"`` chooses as they did without measuring; with
    ``replace=False`` only for shapes not measured here yet. Engines ask at their next new row
    count or model."""
    parsed = {}  # all of them first: a malformed entry adopts none
    for entry in entries:
        choice = KernelChoice(**{k: v for k, v in entry.items() if k != "layers"})
        if choice.kernel not in ("mkl", "onednn", None):
            raise ValueError(f"unknown kernel {choice.kernel!r}")
        if choice.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"unknown dtype {choice.dtype!r}")
        shapes = tuple((int(o), int(i), bool(b)) for o, i, b in entry["layers"])
        parsed[(int(choice.rows), choice.dtype, shapes)] = choice
    for key, choice in parsed.items():
        if replace or key not in _measured:
            _measured[key] = choice


class PackedLinearWeights:
    """Packed copies of a model's float32 linear layers, kept across engine calls.

    Args:
        kernel: ``"auto"``, ``"exact"`` or ``"onednn"`` (module docstring).
        merge_adapters: Where oneDNN's copies serve, or MKL's chosen by ``"auto"``, serve each
            peft LoRA layer's one active adapter by a copy of its merged weight
            (:mod:`~llm_zoo_train.kernels.merged_lora`).
    """

    def __init__(self, kernel: str = "auto", *, merge_adapters: bool = True) -> None:
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(map(repr, KERNELS))}, got {kernel!r}")
        self.kernel = kernel
        self.merge_adapters = bool(merge_adapters)
        #: The LoRA layers' merged copies, where oneDNN's copies serve or ``"auto"``'s MKL ones
        #: (``merge_adapters``).
        self.merged = MergedAdapterPackings()
        self._by_layer: weakref.WeakKeyDictionary[torch.nn.Module, OrderedDict[int, _Packing]] = (
            weakref.WeakKeyDictionary()
        )
        self._generator = torch.Generator().manual_seed(0)
        # (out features, in features, rows, has bias) whose packed product differed in its bits.
        self._other_bits: set[tuple[int, ...]] = set()
        #: The kernel of each (row count, the packable layers' shapes), measured once with "auto".
        self.choices: dict[tuple[int, tuple[tuple[int, ...], ...]], KernelChoice] = {}

    def row_counts(self, module: torch.nn.Module) -> list[int]:
        """The row counts ``module`` holds a packed copy for, oldest first."""
        return list(self._by_layer.get(module, ()))

    def clear(self) -> None:
        """Drop every packed copy (they are made again on the next use), every probe result and
        every kernel choice."""
        self._by_layer = weakref.WeakKeyDictionary()
        self._other_bits.clear()
        self.choices.clear()
        self.merged.clear()

    def _packing(self, module: torch.nn.Linear, rows: int, kernel: str) -> _Packing | None:
        """The ``kernel`` packing of ``module`` for ``rows`` rows, packed now if missing or stale;
        ``None`` where MKL's packed product, or oneDNN's in bfloat16, gives other bits for this
        shape (probed once per shape)."""
        weight = module.weight
        probed = kernel == "mkl" or weight.dtype != torch.float32  # copies used only with F.linear's bits
        shape = (*weight.shape, rows, module.bias is not None, str(weight.dtype))
        if probed and shape in self._other_bits:
            return None
        kept = self._by_layer.setdefault(module, OrderedDict())
        packing = kept.get(rows)
        if (
            packing is None
            or packing.kernel != kernel
            or packing.storage != weight.data_ptr()
            or packing.version != weight._version
        ):
            packed = (
                _pack(module, rows, self._generator)
                if kernel == "mkl"
                else _pack_onednn(module, rows, self._generator)
            )
            if packed is None:  # the kernel's choice of algorithm depends on the shape, not the values
                self._other_bits.add(shape)
                kept.pop(rows, None)
                return None
            packing = _Packing(weight.data_ptr(), weight._version, packed, kernel)
        kept[rows] = packing
        kept.move_to_end(rows)
        while len(kept) > MAX_ROW_COUNTS:
            kept.popitem(last=False)
        return packing

    def _choice(self, layers: list[torch.nn.Linear], rows: int) -> KernelChoice:
        dtype = str(layers[0].weight.dtype).removeprefix("torch.")
        key = (rows, dtype, tuple((*layer.weight.shape, layer.bias is not None) for layer in layers))
        choice = self.choices.get(key)
        if choice is None:
            mkl, onednn = mkl_packing_available(), onednn_packing_available()
            if dtype != "float32":  # bfloat16: oneDNN's copies where probed exact, else F.linear
                mkl, onednn = False, onednn_bfloat16_packing_available()
            if dtype != "float32" and self.kernel != "auto":  # the copies give F.linear's bits
                choice = KernelChoice(rows, "onednn" if onednn else None, any_rows=onednn, dtype=dtype)
            elif self.kernel == "exact" or (self.kernel == "auto" and not onednn):
                merged = mkl and self.kernel == "auto" and dtype == "float32"
                choice = KernelChoice(rows, "mkl" if mkl else None, dtype=dtype, mkl_merged=merged)
            elif self.kernel == "onednn" or (not mkl and dtype == "float32"):
                choice = KernelChoice(rows, "onednn" if onednn else None, any_rows=onednn, dtype=dtype)
            elif key in _measured:  # another engine of this process measured these shapes
                choice = _measured[key]
            else:
                choice = _measured[key] = self._measure(layers, rows)
                exact = "MKL's exact ones" if mkl else "F.linear"
                logger.info(
                    "%s decode products at %d rows: oneDNN's packed copies took %.1f ms a pass"
                    " over the model's %d linear layers, %s %.1f ms: using %s%s",
                    dtype,
                    rows,
                    1e3 * choice.onednn_s,
                    len(layers),
                    exact,
                    1e3 * choice.exact_s,
                    "oneDNN's"
                    if choice.kernel == "onednn"
                    else exact.removesuffix(" exact ones")
                    + (", LoRA layers merged" if choice.mkl_merged else ""),
                    ""
                    if choice.prefill_onednn_s is None
                    else f"; prefills ({PREFILL_ROWS} rows: {1e3 * choice.prefill_onednn_s:.1f} ms oneDNN,"
                    f" {1e3 * choice.prefill_exact_s:.1f} ms F.linear) "
                    + ("on oneDNN's too" if choice.any_rows else "on F.linear"),
                )
            self.choices[key] = choice
        return choice

    def _measure(self, layers: list[torch.nn.Linear], rows: int) -> KernelChoice:
        """Times a pass over ``layers`` with each kernel (``"auto"``) and keeps the chosen packings:
        oneDNN's copies against MKL's exact ones in float32, against ``F.linear`` in bfloat16."""
        dtype = layers[0].weight.dtype
        exact_kernel = "mkl" if dtype == torch.float32 else None
        inputs = {
            features: torch.randn(rows, features, generator=self._generator).to(dtype)
            for features in {layer.in_features for layer in layers}
        }
        calls: dict[str, list[Callable[[], torch.Tensor]]] = {}
        onednn_packed: list[torch.Tensor | None] = []
        # MKL's copies last, so they are the ones kept when they win: packing them again would
        # probe again, while oneDNN's packing is a plain reorder.
        for kernel, forward in (("onednn", _onednn_forward), ("mkl", _packed_forward)):
            calls[kernel] = []
            for layer in layers:
                packing = self._packing(layer, rows, kernel) if kernel == "onednn" or exact_kernel else None
                if kernel == "onednn":
                    onednn_packed.append(packing.packed if packing is not None else None)
                x = inputs[layer.in_features]
                calls[kernel].append(
                    partial(forward, layer, packing.packed, rows, x)
                    if packing is not None
                    else partial(F.linear, x, layer.weight, layer.bias)
                )
        seconds: dict[str, list[float]] = {"mkl": [], "onednn": []}
        for timed in range(TIMED_PASSES + 1):
            for kernel in ("mkl", "onednn"):
                elapsed = _pass_seconds(calls[kernel])
                if timed:  # the first pass of each warms oneDNN's primitives and the caches
                    seconds[kernel].append(elapsed)
        exact_s, onednn_s = min(seconds["mkl"]), min(seconds["onednn"])
        name = str(dtype).removeprefix("torch.")
        # float32's margin keeps timing noise from flipping the rounding between runs; bfloat16's
        # copies give F.linear's bits, so the faster is taken.
        margin = ONEDNN_MIN_SPEEDUP if dtype == torch.float32 else 1.0
        if exact_s < margin * onednn_s:  # float32: MKL's copies, the LoRA layers' merged ones too
            merged = exact_kernel == "mkl"
            return KernelChoice(rows, exact_kernel, exact_s, onednn_s, dtype=name, mkl_merged=merged)
        prefill = self._prefill_seconds(layers, onednn_packed, rows)
        return KernelChoice(
            rows,
            "onednn",
            exact_s,
            onednn_s,
            any_rows=prefill["F.linear"] >= margin * prefill["onednn"],
            prefill_exact_s=prefill["F.linear"],
            prefill_onednn_s=prefill["onednn"],
            dtype=name,
        )

    def _prefill_seconds(
        self, layers: list[torch.nn.Linear], onednn_packed: list[torch.Tensor | None], rows: int
    ) -> dict[str, float]:
        """The fastest of two passes of :data:`PREFILL_ROWS` rows over ``layers`` with ``F.linear``
        and with their oneDNN copies packed for ``rows``, after one untimed pass of each."""
        inputs = {
            features: torch.randn(PREFILL_ROWS, features, generator=self._generator).to(
                layers[0].weight.dtype
            )
            for features in {layer.in_features for layer in layers}
        }
        calls = {
            "F.linear": [
                partial(F.linear, inputs[layer.in_features], layer.weight, layer.bias) for layer in layers
            ],
            "onednn": [
                partial(_onednn_forward, layer, packed, rows, inputs[layer.in_features], True)
                if packed is not None
                else partial(F.linear, inputs[layer.in_features], layer.weight, layer.bias)
                for layer, packed in zip(layers, onednn_packed, strict=True)
            ],
        }
        seconds: dict[str, list[float]] = {"F.linear": [], "onednn": []}
        for timed in range(3):
            for name in seconds:
                elapsed = _pass_seconds(calls[name])
                if timed:
                    seconds[name].append(elapsed)
        return {name: min(values) for name, values in seconds.items()}

    @contextmanager
    def applied(self, model: torch.nn.Module, rows: int) -> Iterator[None]:
        """Within the block, every packable layer of ``model`` multiplies inputs of ``rows`` rows
        (without autograd) by its packed copy, packed on first use (with ``"auto"``, the kernel
        measured first), and with oneDNN's copies (or ``"auto"``'s MKL ones) and ``merge_adapters``
        every eligible LoRA layer by its merged copy; afterwards ``F.linear`` and the LoRA layers'
        previous forwards again.
        Does nothing where neither MKL's nor oneDNN's packing is available."""
        swapped: list[torch.nn.Module] = []
        with ExitStack() as merging:
            if rows >= 1 and (mkl_packing_available() or onednn_packing_available()):
                with torch.no_grad():
                    self._swap_in(model, rows, swapped, merging)
            try:
                yield
            finally:
                for module in swapped:
                    del module.forward

    def _swap_in(
        self, model: torch.nn.Module, rows: int, swapped: list[torch.nn.Module], merging: ExitStack
    ) -> None:
        """Route ``model``'s packable layers to their packed copies (recorded in ``swapped``) and,
        with oneDNN's copies or ``"auto"``'s MKL ones, its LoRA layers to their merged ones (undone
        when ``merging`` closes)."""
        layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and _packable(m)]
        if layers:  # one dtype per pass (the model's): a layer kept in another dtype runs F.linear
            dtypes = [layer.weight.dtype for layer in layers]
            layers = [layer for layer in layers if layer.weight.dtype == max(set(dtypes), key=dtypes.count)]
        choice = self._choice(layers, rows) if layers else None
        kernel = choice.kernel if choice is not None else None
        # bfloat16 keeps its adapters apart: a merged bfloat16 weight would round a small update away.
        merges = kernel == "onednn" or (kernel == "mkl" and choice.mkl_merged)
        if merges and self.merge_adapters and choice.dtype == "float32":
            accepts = (
                partial(_onednn_takes, rows=rows, any_rows=choice.any_rows)
                if kernel == "onednn"
                else partial(_takes_packed, rows=rows)
            )
            merged = merging.enter_context(self.merged.applied(model, rows, accepts, kernel=kernel))
            served = {id(layer.base_layer) for layer in merged}
            for layer in merged:  # their base weights' own copies are not needed while merged
                self._by_layer.pop(layer.base_layer, None)
            layers = [layer for layer in layers if id(layer) not in served]
        for module in layers if kernel is not None else ():
            packing = self._packing(module, rows, kernel)
            if packing is None:
                continue
            module.forward = (  # type: ignore[method-assign]
                partial(_packed_forward, module, packing.packed, rows)
                if kernel == "mkl"
                else partial(_onednn_forward, module, packing.packed, rows, any_rows=choice.any_rows)
            )
            swapped.append(module)
