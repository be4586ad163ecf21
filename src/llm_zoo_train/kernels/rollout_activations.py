"""The update's forward pass takes the products by the frozen weights from the rollout that sampled
the tokens, instead of computing them again.

On-policy GRPO samples completions and then, with the same weights, runs the policy over the same
tokens again to get their log-probabilities and gradients. Every linear layer's output at every
completion position was already computed once, by the decode step that fed that token; the update
computes it again, and on a CPU those products are most of the update's forward pass.
:class:`RolloutActivations` keeps them: while the transformers engine decodes
(:class:`DecodeRecorder`), each linear layer's output of every one-token pass is kept with the rows
it served; per sampled row they are stored under the adapter, the prompt and the generated tokens,
with a fingerprint of the adapter's weights. The update's completion pass
(:func:`replayed_completion_pass`) then gives each linear layer the recorded output instead of
computing it. Everything else (norms, rotary embeddings, attention, activations, residual sums,
the log-softmax) runs as before, so autograd keeps what the backward needs; each layer's backward
is the one of ``y = x W^T + s (x A^T) B^T`` (:class:`ReplayedLoRA`: the input's gradient by the
frozen weight, the product :func:`~llm_zoo_train.kernels.frozen_linear.input_gradient` gives, and
the LoRA matrices' own gradients).

The prompts likewise: the engine's shared prefill (each distinct prompt once, left-padded, the
vocabulary head at the last position only) runs the same layers over the same prompt tokens as the
update's prompt pass. :meth:`DecodeRecorder.prefill` keeps each layer's output of that pass (the
tensors themselves: no copy), stored per adapter and prompt (:class:`RecordedPrompt`), and
:func:`replayed_prompt_pass` gives them to the update's prompt pass, left-padded to its own width
with zeros (padding is masked and never scored). Prompts the prefix cache served from stored blocks
were not computed by the call and are not recorded; their pass is computed.

**When.** Only where the recorded outputs are those of the update's weights and tokens: the same
adapter, whose weights have not changed since (the fingerprint: each LoRA matrix's storage and
in-place version counter, which an optimizer step bumps), every row of the micro-batch recorded
for at least its completion less its last token, no LoRA dropout, no autocast. The prompt pass is
replayed where the completion pass is and every distinct prompt of the micro-batch was recorded.
Anything else (a second optimizer step on the same samples, other engines, a sample not found)
computes the pass.

**The numbers.** The recorded outputs are the decode's: oneDNN's or MKL's products, merged
adapters, a decode step's attention. They equal the update's own to float rounding (the same
function of the same tokens and weights), so the log-probabilities the loss starts from are the
rollout's rather than a recomputation of them, and the gradient is evaluated at the rollout's
activations. ``tests/test_rollout_activations.py`` checks the loss and every LoRA gradient against
the computed pass.

**Memory.** Every linear layer's output at every fed position, the vocabulary head's included:
for SmolLM2-135M in float32 about 0.8 MB per token (16 rows x 31 tokens: 495 MB), and as much per
prefilled prompt token (4 prompts of ~45 tokens: ~150 MB). The store holds
at most ``max_bytes``; a call whose records would not fit is not recorded (its rows are then
computed). Records are dropped when their adapter has been updated, any adapter's records when
newer ones of it are stored with other weights, and all of them when the trainer's step has run its
updates.

Measured on an AMD EPYC (Zen 4, one thread; the trainer-vs-TRL job: SmolLM2-135M, all-linear r=8,
4 prompts x K=4, 32 tokens; steps alternating with and without, in one process, load ~1): the
update 4.84 -> 3.34 s a step in float32 and 3.77 -> 2.96 s in bfloat16; keeping the outputs costs
generate about 0.25 s (3.38 -> 3.64 s in bfloat16, 0.10 s of it filing them per row, since cut to
one concatenation a layer). The whole job against TRL's (``benchmarks/trainer_vs_trl.py``, six
rounds): our float32 step 8.20 -> 7.09 s, ours/TRL 0.450 -> 0.393; bfloat16 0.429 -> 0.404. The
main job (``examples/math_smollm2_cpu.yaml``, bfloat16, two threads), whose update is a quarter of
its step, took as long as before (seeds 0, 1, 2: 305, 298, 297 s against 304, 288, 302 s); in
bfloat16 it is therefore off by default (``training.model_pools.rollout_activations_mb_for``). The
prompt passes too (float32, the same job, updates alternating in place with the optimizer step
left out): 3.44 -> 3.13 s an update; keeping the prefill's outputs cost generate 0.02 s (3.27
against 3.29 s, within the noise). With the replayed LoRA backward's products taking the rank as
the rows where ``training.update_kernel`` chose that for the computed ones (the EPYC): 3.14 ->
2.96 s.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from llm_zoo_train.kernels.frozen_linear import input_gradient
from llm_zoo_train.kernels.lora_forward import lora_linear_class, outermost_linear_layers

__all__ = [
    "DecodeRecorder",
    "RecordedPrompt",
    "RecordedRow",
    "ReplayedFrozen",
    "ReplayedLoRA",
    "RolloutActivations",
    "adapter_fingerprint",
    "attach",
    "attached",
    "recorded_layers",
    "replayable",
    "replayed_completion_pass",
    "replayed_prompt_pass",
]


def recorded_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers whose outputs are recorded and replayed, in module order: peft's LoRA linear
    layers (the whole layer, adapter included) and every plain ``nn.Linear`` that is not part of
    one (the vocabulary head, layers without an adapter)."""
    return outermost_linear_layers(model)


def adapter_fingerprint(model: torch.nn.Module, adapter: str | None) -> tuple[int, ...]:
    """Each LoRA matrix of ``adapter``: its storage and in-place version counter (an optimizer step
    changes the counter); equal fingerprints, unchanged weights."""
    lora = lora_linear_class()
    values: list[int] = []
    if lora is None or adapter is None:
        return tuple(values)
    for module in outermost_linear_layers(model):
        if isinstance(module, lora) and adapter in module.lora_A:
            for weight in (module.lora_A[adapter].weight, module.lora_B[adapter].weight):
                values += (weight.data_ptr(), weight._version)
    return tuple(values)


@dataclass(eq=False)  # rows compare by identity: their outputs are tensors
class RecordedRow:
    """One sampled row's recorded outputs: per recorded layer (:func:`recorded_layers` order) the
    generate call's outputs of every fed position of every row, one ``[n + 1, out]`` tensor whose
    last row is zeros (``flats``, shared by the call's rows), and where this row's positions
    ``0 .. fed - 1`` (the tokens fed back) are in them (``positions``, ``[fed]``)."""

    adapter: str | None
    fingerprint: tuple[int, ...]
    prompt: tuple[int, ...]
    tokens: tuple[int, ...]
    fed: int
    flats: list[torch.Tensor]
    positions: torch.Tensor
    nbytes: int


@dataclass(eq=False)
class RecordedPrompt:
    """One prompt's recorded prefill: per recorded layer (:func:`recorded_layers` order) the
    prefill's output for every prompt of the call (``outputs``, shared by them: ``[prompts, width,
    out]``, left-padded, and the vocabulary head's ``[prompts, 1, out]``, its last position only),
    and which of those rows is this prompt (``row``)."""

    adapter: str | None
    fingerprint: tuple[int, ...]
    prompt: tuple[int, ...]
    outputs: list[torch.Tensor]
    row: int
    nbytes: int


class RolloutActivations:
    """Recorded rows by adapter and prompt, and recorded prompt prefills (module docstring), at
    most ``max_bytes`` held."""

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self._rows: dict[tuple[str | None, tuple[int, ...]], list[RecordedRow]] = {}
        self._prompts: dict[tuple[str | None, tuple[int, ...]], RecordedPrompt] = {}
        self.nbytes = 0
        #: Rows the update took from here, and rows it looked for in vain (a metric); prompts the
        #: update's prompt pass took from here, and those it looked for in vain.
        self.replayed_rows = 0
        self.missed_rows = 0
        self.replayed_prompts = 0
        self.missed_prompts = 0

    def __len__(self) -> int:
        return sum(len(rows) for rows in self._rows.values())

    def room_for(self, nbytes: int) -> bool:
        return self.nbytes + nbytes <= self.max_bytes

    def add(self, rows: Sequence[RecordedRow], nbytes: int) -> None:
        """Store ``rows`` (sharing ``nbytes`` of buffers); an adapter's rows recorded with other
        weights are dropped first."""
        for adapter, fingerprint in {(row.adapter, row.fingerprint) for row in rows}:
            self.drop(adapter, keep=fingerprint)
        for row in rows:
            self._rows.setdefault((row.adapter, row.prompt), []).append(row)
        self.nbytes += nbytes

    def add_prompts(self, prompts: Sequence[RecordedPrompt]) -> None:
        """Store ``prompts`` (each holding its share of the outputs' bytes); an adapter's records
        made with other weights are dropped first."""
        for adapter, fingerprint in {(p.adapter, p.fingerprint) for p in prompts}:
            self.drop(adapter, keep=fingerprint)
        for prompt in prompts:
            old = self._prompts.pop((prompt.adapter, prompt.prompt), None)
            self.nbytes -= old.nbytes if old is not None else 0
            self._prompts[(prompt.adapter, prompt.prompt)] = prompt
            self.nbytes += prompt.nbytes

    def find_prompt(
        self, adapter: str | None, prompt: Sequence[int], fingerprint: tuple[int, ...]
    ) -> RecordedPrompt | None:
        """``adapter``'s recorded prefill of ``prompt`` with these weights, if any."""
        found = self._prompts.get((adapter, tuple(prompt)))
        return found if found is not None and found.fingerprint == fingerprint else None

    def find(
        self,
        adapter: str | None,
        prompt: Sequence[int],
        completion: Sequence[int],
        fingerprint: tuple[int, ...],
    ) -> RecordedRow | None:
        """A row of ``adapter`` recorded with these weights, this prompt, and generated tokens that
        start with ``completion`` and fed all of it but its last token."""
        for row in self._rows.get((adapter, tuple(prompt)), ()):
            if (
                row.fingerprint == fingerprint
                and row.fed >= len(completion) - 1
                and row.tokens[: len(completion)] == tuple(completion)
            ):
                return row
        return None

    def drop(self, adapter: str | None, keep: tuple[int, ...] | None = None) -> None:
        """Forget ``adapter``'s rows and prompts (those with another fingerprint than ``keep``)."""
        for key in [k for k in self._rows if k[0] == adapter]:
            kept = [row for row in self._rows[key] if keep is not None and row.fingerprint == keep]
            self.nbytes -= sum(row.nbytes for row in self._rows[key] if row not in kept)
            if kept:
                self._rows[key] = kept
            else:
                del self._rows[key]
        for key in [k for k, p in self._prompts.items() if k[0] == adapter and p.fingerprint != keep]:
            self.nbytes -= self._prompts.pop(key).nbytes
        if not self._rows and not self._prompts:
            self.nbytes = 0

    def clear(self) -> None:
        self._rows.clear()
        self._prompts.clear()
        self.nbytes = 0


_attached: weakref.WeakKeyDictionary[torch.nn.Module, RolloutActivations] = weakref.WeakKeyDictionary()


def attach(model: torch.nn.Module, max_bytes: int) -> RolloutActivations:
    """A store for ``model``, shared by the engine that records and the updater that replays."""
    store = _attached.get(model)
    if store is None or store.max_bytes != int(max_bytes):
        store = _attached[model] = RolloutActivations(max_bytes)
    return store


def attached(model: torch.nn.Module) -> RolloutActivations | None:
    """The store :func:`attach` gave ``model``, if any."""
    return _attached.get(model)


class DecodeRecorder:
    """While an engine's decode loop runs: every recorded layer's output of each one-token pass
    that :meth:`before_forward` announced (which rows it computes and which completion position
    they feed). :meth:`keep` then files them per row."""

    def __init__(self, model: torch.nn.Module, store: RolloutActivations, adapter: str | None, rows: int):
        self.activations, self.adapter, self.rows = store, adapter, int(rows)
        self.layers = recorded_layers(model)
        self.fingerprint = adapter_fingerprint(model, adapter)
        # Per recorded pass: the computed rows that feed a completion token (None: all of them), their
        # batch rows, the position.
        self._passes: list[tuple[torch.Tensor | None, torch.Tensor, int]] = []
        self._outputs: list[list[torch.Tensor]] = [[] for _ in self.layers]
        self._armed = False
        self._thread = threading.get_ident()
        self._nbytes = 0
        self._overflow = False
        self._hooks: list[Any] = []
        self._prefill: list[list[torch.Tensor]] | None = None  # per layer, while a prefill runs

    def __enter__(self) -> DecodeRecorder:
        for index, layer in enumerate(self.layers):
            self._hooks.append(layer.register_forward_hook(self._hook(index)))
        return self

    def __exit__(self, *exc: object) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        self._armed = False

    def _hook(self, index: int) -> Callable[..., None]:
        def keep(module: Any, args: Any, output: Any) -> None:
            # Only the decode's own passes: another thread's call of the same layers is not one.
            if not isinstance(output, torch.Tensor) or threading.get_ident() != self._thread:
                return
            if self._armed:
                self._outputs[index].append(output.detach())
                self._nbytes += output.numel() * output.element_size()
            elif self._prefill is not None:
                self._prefill[index].append(output.detach())

        return keep

    @contextmanager
    def prefill(self, prompts: Sequence[Sequence[int]]) -> Iterator[None]:
        """Around the prefill of ``prompts`` (one forward pass, left-padded, the vocabulary head at
        the last position only): each recorded layer's output is kept per prompt for the update's
        prompt pass (:func:`replayed_prompt_pass`). Nothing is kept if the pass raised, a layer ran
        other than once, or the store has no room."""
        self._armed = False
        self._thread = threading.get_ident()
        outputs: list[list[torch.Tensor]] = [[] for _ in self.layers]
        self._prefill = outputs
        try:
            yield
        finally:
            self._prefill = None
        if any(len(o) != 1 or o[0].dim() != 3 or o[0].shape[0] != len(prompts) for o in outputs):
            return
        kept = [o[0] for o in outputs]
        nbytes = sum(o.numel() * o.element_size() for o in kept)
        if not self.activations.room_for(nbytes):
            return
        self.activations.add_prompts(
            [
                RecordedPrompt(self.adapter, self.fingerprint, tuple(p), kept, row, nbytes // len(prompts))
                for row, p in enumerate(prompts)
            ]
        )

    def before_forward(self, computed_rows: torch.Tensor, live: torch.Tensor, position: int) -> None:
        """The next forward pass computes ``computed_rows`` (the batch row each computed row holds),
        of which ``live`` (indices into them) feed their completion token ``position``; a
        ``position`` below 0 (a prompt token) is not recorded."""
        self._armed = False
        if position < 0 or self._overflow:
            return
        if not self.activations.room_for(self._nbytes):
            self._overflow = True  # this call's rows would not fit: none of them is stored
            self._outputs = [[] for _ in self.layers]
            return
        # Where the pass's live rows are all its rows, in order, its outputs are taken whole (a view).
        everyone = live.numel() == computed_rows.numel() and bool(
            (live == torch.arange(live.numel(), device=live.device)).all()
        )
        self._passes.append((None if everyone else live.clone(), computed_rows[live].cpu(), int(position)))
        self._thread = threading.get_ident()
        self._armed = True

    def keep(self, prompts: Sequence[Sequence[int]], tokens: Sequence[Sequence[int]]) -> int:
        """File the recorded passes per row (``prompts``/``tokens``: each batch row's); returns the
        rows stored (0 when the records would not fit or no pass was recorded)."""
        self._armed = False
        passes = self._passes
        if self._overflow or not passes or any(len(o) != len(passes) for o in self._outputs):
            return 0
        # Each layer's outputs of every pass, the rows that fed a token only, one after another,
        # and a row of zeros (padding) at the end: one concatenation a layer, no other copy.
        flats = [
            torch.cat(
                [
                    output[:, -1] if live is None else output[live, -1]
                    for (live, _, _), output in zip(passes, outputs, strict=True)
                ]
                + [outputs[0].new_zeros((1, outputs[0].shape[-1]))]
            )
            for outputs in self._outputs
        ]
        self._outputs = [[] for _ in self.layers]  # the flat tensors hold them now
        nbytes = sum(flat.numel() * flat.element_size() for flat in flats)
        if not self.activations.room_for(nbytes):
            return 0
        where: list[list[int]] = [[] for _ in range(self.rows)]  # each row's flat index by position
        start = 0
        for _, rows, position in passes:
            for offset, row in enumerate(rows.tolist()):
                if len(where[row]) == position:  # positions come in order, each once per row
                    where[row].append(start + offset)
            start += rows.numel()
        device = flats[0].device
        recorded = [
            RecordedRow(
                self.adapter,
                self.fingerprint,
                tuple(prompts[row]),
                tuple(tokens[row]),
                len(where[row]),
                flats,
                torch.tensor(where[row], dtype=torch.long, device=device),
                nbytes // self.rows,
            )
            for row in range(self.rows)  # a row that ended at its first token fed none: nothing to replay
        ]
        self.activations.add(recorded, sum(r.nbytes for r in recorded))
        return len(recorded)


class ReplayedFrozen(torch.autograd.Function):
    """``y = x W^T (+ b)`` with ``y`` recorded: the forward returns it; the backward is the input's
    gradient by the frozen weight (``input_gradient``)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, recorded: torch.Tensor, gradient: Callable[..., Any]
    ) -> torch.Tensor:
        ctx.gradient = gradient
        return recorded

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, None]:
        return (ctx.gradient(grad) if ctx.needs_input_grad[0] else None), None, None


class ReplayedLoRA(torch.autograd.Function):
    """``y = x W^T + s (x A^T) B^T`` with ``y`` recorded (peft's LoRA layer, one adapter, no
    dropout): the forward returns it; the backward gives ``x``, ``A`` and ``B`` their gradients
    (the LoRA products in the adapter's dtype, as peft casts them; with ``rank_rows``, the three
    with the rank as a side computed with it as the rows, as
    :mod:`~llm_zoo_train.kernels.lora_rank_rows` does)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight_a: torch.Tensor,
        weight_b: torch.Tensor,
        recorded: torch.Tensor,
        scaling: float,
        gradient: Callable[..., Any],
        rank_rows: bool = False,
    ) -> torch.Tensor:
        ctx.scaling, ctx.gradient, ctx.rank_rows = float(scaling), gradient, bool(rank_rows)
        ctx.save_for_backward(x, weight_a, weight_b)
        return recorded

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, weight_a, weight_b = ctx.saved_tensors
        scaling = ctx.scaling
        grad_lora = grad.to(weight_b.dtype)
        rows_grad = grad_lora.reshape(-1, grad_lora.shape[-1])
        rank_rows = ctx.rank_rows
        # [rows, r]; with the rank as the rows, a view of the [r, rows] product
        through_b = torch.mm(weight_b.t(), rows_grad.t()).t() if rank_rows else rows_grad @ weight_b
        grad_x = grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = ctx.gradient(grad)
            lora_part = (through_b @ weight_a).mul_(scaling)
            grad_x = grad_x + lora_part.view(*grad.shape[:-1], -1).to(grad_x.dtype)
        rows_x = x.reshape(-1, x.shape[-1]).to(weight_a.dtype)
        if ctx.needs_input_grad[1]:
            grad_a = (through_b.t() @ rows_x).mul_(scaling)
        if ctx.needs_input_grad[2] and rank_rows:
            hidden = torch.mm(weight_a, rows_x.t())  # [r, rows]
            grad_b = torch.mm(hidden, rows_grad).mul_(scaling).t()
        elif ctx.needs_input_grad[2]:
            grad_b = (rows_grad.t() @ (rows_x @ weight_a.t())).mul_(scaling)
        return grad_x, grad_a, grad_b, None, None, None, None


def _replays_lora(layer: Any, adapter: str | None) -> bool | None:
    """``True``: ``layer`` (peft LoRA) computes ``adapter`` as :class:`ReplayedLoRA` does; ``False``:
    it is its base layer alone (the adapter is not on it); ``None``: something else (dropout,
    variants, merged or several adapters)."""
    if adapter is None or adapter not in layer.lora_A:
        return False if not layer.merged else None
    dropout = layer.lora_dropout[adapter]
    plain = (
        list(layer.active_adapters) == [adapter]
        and not layer.merged
        and not layer.disable_adapters
        and not getattr(layer, "use_dora", {}).get(adapter, False)
        and not getattr(layer, "lora_bias", {}).get(adapter, False)
        and not getattr(layer, "fan_in_fan_out", False)
        and (isinstance(dropout, torch.nn.Identity) or not dropout.training or dropout.p == 0)
    )
    return True if plain else None


def replayable(model: torch.nn.Module, adapter: str | None) -> bool:
    """Whether :func:`replayed_completion_pass` can stand for ``model``'s pass with ``adapter``
    active (module docstring's conditions on the layers; autocast off)."""
    if torch.is_autocast_enabled("cpu") or (torch.cuda.is_available() and torch.is_autocast_enabled("cuda")):
        return False
    lora = lora_linear_class()
    return all(
        _replays_lora(m, adapter) is not None for m in recorded_layers(model) if lora and isinstance(m, lora)
    )


def _stacked(rows: Sequence[RecordedRow], index: int, width: int) -> torch.Tensor:
    """``[len(rows), width, out]``: layer ``index``'s recorded outputs of ``rows`` at positions
    ``0 .. width - 1``, zeros past a row's record (padding, never scored)."""
    parts: list[tuple[torch.Tensor, torch.Tensor]] = []
    for row in rows:
        flat = row.flats[index]
        positions = row.positions[:width]
        if positions.numel() < width:
            padding = positions.new_full((width - positions.numel(),), flat.shape[0] - 1)
            positions = torch.cat([positions, padding])
        parts.append((flat, positions))
    flat = parts[0][0]
    if all(f is flat for f, _ in parts):  # rows of one generate call: one gather
        return flat.index_select(0, torch.cat([p for _, p in parts])).view(len(rows), width, -1)
    return torch.stack([f.index_select(0, p) for f, p in parts])


def _prompt_outputs(prompts: Sequence[RecordedPrompt], index: int, width: int) -> torch.Tensor:
    """``[len(prompts), width, out]``: layer ``index``'s recorded prefill outputs of ``prompts``,
    left-padded to ``width`` with zeros (masked, never scored); ``[len(prompts), 1, out]`` for a
    layer recorded at the last position only (the vocabulary head)."""
    outputs = [(p.outputs[index], p.row, len(p.prompt)) for p in prompts]
    if outputs[0][0].shape[1] == 1 and all(o.shape[1] == 1 for o, _, _ in outputs):
        return torch.stack([o[row] for o, row, _ in outputs])
    first = outputs[0][0]
    replayed = first.new_zeros((len(prompts), width, first.shape[-1]))
    for target, (output, row, length) in zip(replayed, outputs, strict=True):
        target[width - length :] = output[row, output.shape[1] - length :]
    return replayed


@contextmanager
def replayed_completion_pass(
    model: torch.nn.Module,
    adapter: str | None,
    rows: Sequence[RecordedRow],
    width: int,
    *,
    rank_rows: bool = False,
) -> Iterator[None]:
    """Within the block, each recorded layer of ``model`` called on ``[len(rows), width, in]`` (the
    update's completion pass) returns ``rows``' recorded outputs, differentiably
    (:class:`ReplayedLoRA`, :class:`ReplayedFrozen`); any other call computes as before. The
    caller checked :func:`replayable` and that every row fed at least ``width`` positions that it
    scores. ``rank_rows``: the LoRA products' backward with the rank as the rows (float32 adapters
    on a CPU; ``training.update_kernel``'s choice)."""
    layers = recorded_layers(model)
    if any(len(row.flats) != len(layers) for row in rows):
        raise ValueError("the recorded rows are not of this model's layers")
    outputs = [_stacked(rows, index, width) for index in range(len(layers))]
    with _replayed(model, adapter, layers, outputs, rank_rows):
        yield


@contextmanager
def replayed_prompt_pass(
    model: torch.nn.Module,
    adapter: str | None,
    records: Mapping[tuple[int, ...], RecordedPrompt],
    prompts: Sequence[Sequence[int]],
    width: int,
    *,
    rank_rows: bool = False,
) -> Iterator[None]:
    """Within the block, each recorded layer of ``model`` called on the update's prompt pass over
    ``prompts`` (``[len(prompts), width, in]``, left-padded; the vocabulary head on the last
    position) returns their recorded prefill outputs (``records``, by prompt), differentiably;
    any other call computes as before. A prompt without a record: the block computes the pass.
    ``rank_rows``: as for :func:`replayed_completion_pass`."""
    chosen = [record for record in map(records.get, map(tuple, prompts)) if record is not None]
    layers = recorded_layers(model)
    if len(chosen) < len(prompts) or any(len(record.outputs) != len(layers) for record in chosen):
        yield
        return
    if any(len(record.prompt) > width for record in chosen):
        raise ValueError("a recorded prompt is longer than the prompt pass")
    outputs = [_prompt_outputs(chosen, index, width) for index in range(len(layers))]
    with _replayed(model, adapter, layers, outputs, rank_rows):
        yield


@contextmanager
def _replayed(
    model: torch.nn.Module,
    adapter: str | None,
    layers: list[torch.nn.Module],
    outputs: list[torch.Tensor],
    rank_rows: bool,
) -> Iterator[None]:
    """Each of ``layers`` returns its entry of ``outputs`` for an input of that shape (less the
    features), differentiably; any other call computes as before."""
    lora = lora_linear_class()
    replaced: list[tuple[Any, Any]] = []
    for layer, recorded in zip(layers, outputs, strict=True):
        gradient = input_gradient(layer.base_layer if lora is not None and isinstance(layer, lora) else layer)
        if lora is not None and isinstance(layer, lora) and _replays_lora(layer, adapter):
            weight_a = layer.lora_A[adapter].weight
            takes_rank_rows = rank_rows and weight_a.dtype == torch.float32 and weight_a.device.type == "cpu"
            weights = (weight_a, layer.lora_B[adapter].weight, float(layer.scaling[adapter]), takes_rank_rows)
        else:
            weights = None
        previous = vars(layer).get("forward")
        compute = previous if previous is not None else type(layer).forward.__get__(layer)

        def forward(
            x: torch.Tensor,
            *args: Any,
            _recorded=recorded,
            _weights=weights,
            _gradient=gradient,
            _compute=compute,
            **kwargs: Any,
        ) -> torch.Tensor:
            if args or kwargs or x.shape[:-1] != _recorded.shape[:-1]:
                return _compute(x, *args, **kwargs)
            if _weights is None:
                return ReplayedFrozen.apply(x, _recorded, _gradient)
            return ReplayedLoRA.apply(x, *_weights[:2], _recorded, _weights[2], _gradient, _weights[3])

        layer.forward = forward
        replaced.append((layer, previous))
    try:
        yield
    finally:
        for layer, previous in replaced:
            if previous is None:
                del layer.forward
            else:
                layer.forward = previous
