"""Sampling loop of the transformers engine that stops computing rows as soon as they finish.

``model.generate`` keeps every row of a batch in every forward pass until the last row ends, so a
batch where one answer runs to ``max_tokens`` and the others stop after a few tokens costs as much
as if all of them ran to the limit. :func:`decode_compacting` drops a row from the KV cache and
from the forward passes at the step it emits an end-of-sequence token. On the CPU demo's reasoner
turns (answers of ~30 tokens in batches that run to 48) that is a third of the forward work.

It samples from ``generate``'s distribution:

* the same scores: raw float32 logits of the last position; the logprob is
  ``log_softmax(logits / temperature)`` at the chosen token (temperature 1 when greedy), and
  sampling applies transformers' own temperature, top-k and top-p warpers in ``generate``'s order;
* the same attention: left padding, position ids from the attention mask, one cache.

Two ways to draw a token from those probabilities (``draws_as_generate``):

* by default, :func:`draw_per_row`: one uniform number per generating row, looked up in the
  row's cumulative distribution (float64). Each step costs ``rows`` random numbers.
* ``draws_as_generate=True``: ``generate``'s own random numbers. ``torch.multinomial`` draws one
  sample per row from a ``[B, V]`` probability tensor with ``B x V`` exponential variates whatever
  the values (the Gumbel trick), so the loop keeps the full-batch tensor shape and gives finished
  rows a one-hot row; active rows then draw exactly what they would have drawn inside
  ``generate`` (``tests/test_hf_decode.py`` checks it token for token). Those variates are costly
  on a CPU: at 32 rows of SmolLM2-135M's 49k vocabulary, 30.6 ms per step against 2.4 ms for
  :func:`draw_per_row` (one thread, the project's Xeon). In the demo's bfloat16 sampling (32 rows,
  48 tokens) they were a fifth of the generation's CPU time (torch profiler).

Both draw from the same distribution (the lookup rounds in float64), with other random numbers,
so the two give different tokens for one seed; each is reproducible for a seed.

Whether a row's logits are bit-identical with fewer rows in the batch depends on the matmul
kernels; ``tests/test_hf_decode.py`` checks tokens and logprobs against ``generate``.

Dropping rows is not always cheaper on a CPU. torch's float32 matrix product (MKL) takes a slower
path for fewer than 16 rows: on SmolLM2-135M's vocabulary projection ([M, 576] x [576, 49152], one
thread, the project's Xeon) 16 rows took 30.6 ms, 14 rows 61.6 ms, 10 rows 52.0 ms and 4 rows
26.0 ms; an MLP projection 0.60 ms at 16 rows against 0.91-1.0 ms at 13-15. So in float32 on a
CPU the loop keeps :data:`CPU_FLOAT32_FLOOR_ROWS` rows in the forward passes while at least
:data:`CPU_FLOAT32_FLOOR_FROM` rows still generate: finished rows stay in as placeholders (fed the
pad token, their outputs unread) rather than leave one by one. bfloat16 (oneDNN) has no such step
(11.6-13.3 ms for 1-16 rows), and there every finished row leaves at once.

With ``compact_finished_rows`` off the engine runs ``model.generate`` itself;
:class:`GenerateLogprobRecorder` and :class:`GenerateStepReporter` are the logits processors that
record its logprobs and report its progress.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection
from typing import Any

import torch
from transformers import LogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from llm_zoo_train.engines.base import report_generated
from llm_zoo_train.engines.hf.kv_buffer import preallocate

__all__ = [
    "CPU_FLOAT32_FLOOR_FROM",
    "CPU_FLOAT32_FLOOR_ROWS",
    "DRAW_BLOCK",
    "GenerateLogprobRecorder",
    "GenerateStepReporter",
    "decode_compacting",
    "draw_per_row",
    "last_logits_only",
    "rows_to_keep",
    "sampling_warpers",
]

#: Rows a float32 forward pass on a CPU keeps while enough rows still generate (module docstring).
CPU_FLOAT32_FLOOR_ROWS = 16
#: Generating rows from which the floor applies: below it, placeholders' attention costs more than
#: the slower product (4 rows: 26.0 ms against 30.6 ms at 16 on the vocabulary projection).
CPU_FLOAT32_FLOOR_FROM = 10
#: Tokens per block of :func:`draw_per_row`'s two-step lookup.
DRAW_BLOCK = 256


def last_logits_only(model: Any, length: int | None = None, device: Any = None) -> dict[str, Any]:
    """``{"logits_to_keep": ...}`` for a forward pass that needs only the last position's logits,
    when the (base) model's ``forward`` accepts it, else ``{}``.

    A prompt's forward pass then projects only its last position onto the vocabulary, as
    ``generate`` does: for a 135M model with a 49k vocabulary the projection of every prompt
    position costs about a fifth of the forward pass, and nothing reads those logits.

    With ``length`` (the pass's sequence length) the position is given as an index tensor, which
    gathers the hidden states into a contiguous block; the int form slices them, and ``F.linear``
    on that non-contiguous slice multiplies by an expanded copy of the vocabulary matrix, one per
    row: on a CPU in bfloat16, 11.4 s against 0.015 s for 32 rows of SmolLM2-135M, with the same
    bits (float32: 0.40 against 0.05 s, other rounding). Passes whose logits are not read (the
    prefill) use the index; the decode loop's pass over whole prompts uses it outside float32 and
    keeps the int in float32, whose rounding is ``generate``'s.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if "logits_to_keep" not in inspect.signature(base.forward).parameters:
        return {}
    if length is None:
        return {"logits_to_keep": 1}
    return {"logits_to_keep": torch.tensor([int(length) - 1], device=device)}


def sampling_warpers(temperature: float, top_k: int, top_p: float) -> list[Any]:
    """``generate``'s sampling warpers for these settings, in its order."""
    warpers: list[Any] = []
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k > 0:
        warpers.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    return warpers


def draw_per_row(probs: torch.Tensor, block: int = DRAW_BLOCK) -> torch.Tensor:
    """One token per row of ``probs`` ``[rows, V]`` (non-negative, each row summing to more than
    zero), drawn with probability proportional to its entry, from one ``torch.rand`` number per row.

    The number, scaled to the row's total, is looked up in two steps: first among the row's
    ``block``-token blocks (float64 sums), then within the block it falls in (float64 cumulative
    sum): at 32 rows of a 49k vocabulary, 2.4 ms against 6.7 ms for one float64 cumulative sum
    over the whole vocabulary. A token of probability zero is never drawn: each lookup takes the
    first position whose cumulative sum exceeds the number, and a zero entry never raises the sum.
    """
    rows, vocabulary = probs.shape
    padding = -vocabulary % block
    padded = torch.nn.functional.pad(probs, (0, padding)) if padding else probs
    blocks = padded.view(rows, -1, block)
    block_cumulative = blocks.sum(dim=-1, dtype=torch.float64).cumsum(dim=-1)
    numbers = torch.rand((rows, 1), dtype=torch.float64, device=probs.device) * block_cumulative[:, -1:]
    chosen_block = _first_above(block_cumulative, numbers)
    block_starts = torch.nn.functional.pad(block_cumulative[:, :-1], (1, 0))  # the mass before each block
    below = block_starts.gather(1, chosen_block[:, None])
    within = blocks[torch.arange(rows, device=probs.device), chosen_block].cumsum(dim=-1, dtype=torch.float64)
    return chosen_block * block + _first_above(within, numbers - below)


def _first_above(cumulative: torch.Tensor, numbers: torch.Tensor) -> torch.Tensor:
    """Per row, the first position whose cumulative sum exceeds the row's number; where rounding
    put the number at or past the row's total, the last position that adds mass."""
    chosen = torch.searchsorted(cumulative, numbers, right=True).squeeze(1)
    past_the_end = chosen >= cumulative.shape[-1]
    if bool(past_the_end.any()):
        chosen = torch.where(past_the_end, cumulative.argmax(dim=-1), chosen)
    return chosen


def rows_to_keep(generating: torch.Tensor, computed: int, floor: int, floor_from: int) -> torch.Tensor:
    """Which of the ``computed`` rows of the forward passes to keep (sorted positions): the rows in
    ``generating`` (positions still sampling), plus the first other rows as placeholders until there
    are ``min(floor, computed)`` rows, when at least ``floor_from`` rows generate (``floor`` 0: no
    placeholders)."""
    count = int(generating.numel())
    target = min(floor, computed) if floor_from <= count < floor else count
    if target <= count:
        return generating
    others = torch.ones(computed, dtype=torch.bool, device=generating.device)
    others[generating] = False
    placeholders = others.nonzero().squeeze(1)[: target - count]
    return torch.sort(torch.cat([generating, placeholders])).values


@torch.no_grad()
def decode_compacting(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    cache: Any,
    first_logits: torch.Tensor | None = None,
    max_new_tokens: int,
    eos_token_ids: Collection[int],
    pad_token_id: int,
    greedy: bool,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    preallocate_kv: bool = True,
    floor_rows: int | None = None,
    draws_as_generate: bool = False,
    before_forward: Callable[[torch.Tensor, torch.Tensor, int], None] | None = None,
) -> tuple[list[list[int]], list[list[float]]]:
    """Generate up to ``max_new_tokens`` per row; each row's tokens and their logprobs.

    Args:
        model: A causal LM (plain or peft) whose cache supports ``batch_select_indices``.
        input_ids: ``[B, L]`` left-padded prompts.
        attention_mask: ``[B, L]``, 0 on padding.
        cache: ``None`` (the prompts are prefilled here), or a ``DynamicCache`` holding every
            prompt position but the last (then only the last prompt token is run first), or every
            position when ``first_logits`` is given.
        first_logits: ``[B, V]``: each row's logits at its last prompt position, from the pass that
            filled ``cache`` with whole prompts: the first token is sampled from them, without a
            forward pass.
        max_new_tokens: Most tokens per row.
        eos_token_ids: Tokens that end a row (kept as its last token).
        pad_token_id: Not emitted; rows never produce it after they end because they are dropped.
        greedy: Argmax instead of sampling (the logprobs then use temperature 1).
        temperature: Sampling temperature, as in ``SamplingParams``.
        top_k: Keep the ``top_k`` most likely tokens (0: off).
        top_p: Nucleus sampling mass (1.0: off).
        preallocate_kv: After the first forward pass, move the cache into buffers with room for
            every remaining token (:mod:`~llm_zoo_train.engines.hf.kv_buffer`), so decode steps
            write in place instead of re-copying the cache. Same numbers; plain
            ``DynamicLayer`` caches only (others are left as they are).
        floor_rows: Rows kept in the forward passes while at least :data:`CPU_FLOAT32_FLOOR_FROM`
            rows generate (finished ones as placeholders); 0: every finished row leaves at once.
            ``None``: :data:`CPU_FLOAT32_FLOOR_ROWS` for a float32 model on a CPU, else 0.
        draws_as_generate: Draw with ``generate``'s random numbers (the same tokens as
            ``generate`` for a seed) instead of :func:`draw_per_row` (the same distribution, at a
            fraction of the cost; module docstring).
        before_forward: Called before each forward pass with the batch row each computed row
            holds, the computed rows still generating (indices into them) and the index of the
            completion token they feed (-1 for prompt tokens): what
            :class:`~llm_zoo_train.kernels.rollout_activations.DecodeRecorder` records by.

    Returns:
        ``(tokens, logprobs)``: per row, the generated ids (ending with the end-of-sequence token
        when one came) and ``log_softmax(logits / temperature)`` at each of them.

    Each decode step reports its tokens and the rows that ended with an end-of-sequence token
    through :func:`~llm_zoo_train.engines.base.report_generated` (live progress; it changes nothing).
    """
    device = input_ids.device
    batch = input_ids.shape[0]
    eos = torch.tensor(sorted(eos_token_ids), dtype=torch.long, device=device)
    record_temperature = 1.0 if greedy else float(temperature)
    # The temperature warper's division is the logprobs' own (the same op, the same bits): done once.
    warpers = [] if greedy else sampling_warpers(1.0, int(top_k), float(top_p))

    if cache is None:
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
        step_ids, step_mask = input_ids, attention_mask
    else:
        step_ids, step_mask = input_ids[:, -1:], attention_mask
    if floor_rows is None:
        on_cpu_float32 = device.type == "cpu" and getattr(model, "dtype", None) == torch.float32
        floor_rows = CPU_FLOAT32_FLOOR_ROWS if on_cpu_float32 else 0
    mask = attention_mask
    row_of = torch.arange(batch, device=device)  # the full-batch row each computed row holds
    live = torch.arange(batch, device=device)  # computed rows still generating (the rest: placeholders)
    tokens: list[list[int]] = [[] for _ in range(batch)]
    logprobs: list[list[float]] = [[] for _ in range(batch)]
    full_probs: torch.Tensor | None = None
    only_last = last_logits_only(model)
    # A pass over whole prompts (no prefilled cache) gathers its last positions: the slice would
    # cost seconds per call outside float32, with the same bits (last_logits_only). Float32 keeps
    # the slice, whose rounding is generate's.
    gather_prompts = getattr(model, "dtype", torch.float32) != torch.float32
    grow_in_place = preallocate_kv

    for _ in range(max_new_tokens):
        if first_logits is not None:  # the prefill's: no pass for the last prompt token
            logits, first_logits = first_logits, None
        else:
            positions = (step_mask.cumsum(-1) - 1).clamp(min=0)[:, -step_ids.shape[1] :]
            if before_forward is not None:
                fed = len(tokens[int(row_of[live[0]])]) - 1 if step_ids.shape[1] == 1 else -1
                before_forward(row_of, live, fed)
            logits = model(
                input_ids=step_ids,
                attention_mask=step_mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                **(
                    last_logits_only(model, step_ids.shape[1], device)
                    if gather_prompts and step_ids.shape[1] > 1
                    else only_last
                ),
            ).logits[:, -1]
        if live.numel() < logits.shape[0]:
            logits = logits[live]
        logits = logits.to(copy=True, dtype=torch.float32)
        if grow_in_place:
            preallocate(cache, max_new_tokens - 1)
            grow_in_place = False
        active = row_of[live]
        scaled = logits / record_temperature
        log_probs = torch.log_softmax(scaled, dim=-1)
        if greedy:
            chosen = torch.argmax(logits, dim=-1)
        else:
            scores = scaled
            for warper in warpers:
                scores = warper(step_ids[live], scores)
            probs = torch.softmax(scores, dim=-1)
            if draws_as_generate:
                if full_probs is None:
                    full_probs = torch.zeros((batch, probs.shape[-1]), dtype=probs.dtype, device=device)
                    full_probs[:, pad_token_id] = 1.0  # rows that have ended: a one-hot, any value will do
                full_probs[active] = probs
                chosen = torch.multinomial(full_probs, num_samples=1).squeeze(1)[active]
                full_probs[active] = 0.0
                full_probs[active, pad_token_id] = 1.0
            else:
                chosen = draw_per_row(probs)
        chosen_logprobs = log_probs.gather(1, chosen[:, None]).squeeze(1)
        for row, token, logprob in zip(
            active.tolist(), chosen.tolist(), chosen_logprobs.tolist(), strict=True
        ):
            tokens[row].append(token)
            logprobs[row].append(logprob)

        going = ~torch.isin(chosen, eos)
        # Live progress for a caller: this step's tokens and the rows that ended with them (rows cut
        # at max_new_tokens are reported by the caller, which sees them end).
        report_generated(chosen.shape[0], chosen.shape[0] - int(going.sum()))
        if not bool(going.any()):
            break
        mask = torch.cat([mask, torch.ones((mask.shape[0], 1), dtype=mask.dtype, device=device)], dim=-1)
        next_ids = torch.full((mask.shape[0],), pad_token_id, dtype=chosen.dtype, device=device)
        next_ids[live] = chosen
        if not bool(going.all()):
            still = live[going]
            keep = rows_to_keep(still, mask.shape[0], floor_rows, CPU_FLOAT32_FLOOR_FROM)
            if keep.numel() < mask.shape[0]:
                cache.batch_select_indices(keep)
                mask, row_of, next_ids = mask[keep], row_of[keep], next_ids[keep]
            live = torch.searchsorted(keep, still)
        step_ids, step_mask = next_ids[:, None], mask
    return tokens, logprobs


class GenerateLogprobRecorder(LogitsProcessor):
    """Records ``log_softmax(raw_logits / temperature)`` of each sampled token, without changing
    the scores. At step t it sees the token chosen at step t-1 (last column of ``input_ids``); the
    last step's token is read from the final sequences by :meth:`finish`. Keeps one [B, V] tensor,
    not the whole [B, T, V] history."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.steps: list[torch.Tensor] = []
        self._previous: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._previous is not None:
            self.steps.append(self._previous.gather(1, input_ids[:, -1:]).squeeze(1))
        self._previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """The [B, T] logprobs of the ``new_tokens`` [B, T] generated."""
        if self._previous is not None:
            self.steps.append(self._previous.gather(1, new_tokens[:, -1:]).squeeze(1))
            self._previous = None
        if len(self.steps) != new_tokens.shape[1]:
            raise RuntimeError(
                f"recorded {len(self.steps)} logprob steps for {new_tokens.shape[1]} generated tokens"
            )
        return (
            torch.stack(self.steps, dim=1)
            if self.steps
            else new_tokens.new_zeros(new_tokens.shape, dtype=torch.float)
        )


class GenerateStepReporter(LogitsProcessor):
    """Reports each decode step's rows as generated tokens (live progress of ``model.generate``;
    rows that have ended count until the batch ends). Leaves the scores unchanged."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        report_generated(scores.shape[0])
        return scores
