"""The GRPO-family policy loss: token log-probabilities, clipped surrogate, aggregation, KL.

Two functions, used by the trainer in this order:

* :func:`completion_logprobs` runs the policy over prompt + completion and returns the
  log-probability of every completion token (and optionally the entropy at each position).
* :func:`policy_loss` turns log-probabilities, advantages and a mask into the scalar loss.

Semantics follow TRL's ``GRPOTrainer`` (a TRL user's config means the same here). Per token ``t``
of sequence ``i`` with advantage ``A_i``::

    ratio      = exp(logp - old_logp)
    surrogate  = -min(ratio * A_i, clamp(ratio, 1 - epsilon, 1 + epsilon_high) * A_i)
    surrogate *= min(exp(old_logp - behaviour_logp), importance_sampling_cap)   # optional TIS
    per_token  = surrogate + beta * (exp(ref_logp - logp) - (ref_logp - logp) - 1)   # k3 KL

and the loss aggregates ``per_token`` over the completion tokens (``mask``) by ``loss_type``:

* ``grpo``: mean over each sequence's tokens, then mean over sequences;
* ``bnpo``: sum over all tokens / number of tokens in this batch;
* ``dapo``: sum over all tokens / ``total_tokens`` (the token count of the whole accumulated batch,
  so gradient accumulation does not reweight micro-batches; defaults to this batch's count, which
  makes it equal to ``bnpo``);
* ``dr_grpo``: sum over all tokens / (number of sequences x ``max_completion_length``).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from llm_zoo_train.training.token_logprobs import token_entropy, token_logprobs

__all__ = ["LOSS_TYPES", "completion_logprobs", "policy_loss"]

#: Valid ``loss_type`` values.
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo")


def _accepts_logits_to_keep(model: Any) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


# Model classes whose cache could not be shared (warned once; they use the plain forward).
_shared_prompts_unsupported: set[str] = set()


def _first_rows_of_each_prompt(prompt_ids: list[list[int]]) -> list[int]:
    """For each distinct prompt (by token ids), the first row that has it, in row order."""
    first: dict[tuple[int, ...], int] = {}
    for row, prompt in enumerate(prompt_ids):
        first.setdefault(tuple(prompt), row)
    return list(first.values())


def _can_share_prompts(model: Any) -> bool:
    """The shared-prompt forward needs a KV cache that carries gradients: not with gradient
    checkpointing (which turns the cache off in training)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if type(model).__name__ in _shared_prompts_unsupported:
        return False
    return not getattr(base, "is_gradient_checkpointing", False) and _accepts_logits_to_keep(model)


def _logits_with_shared_prompts(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    unique_rows: list[int],
    prompt_ids: list[list[int]],
    prompt_width: int,
    completion_pass: Callable[[int], AbstractContextManager[Any]] | None = None,
    prompt_pass: Callable[[list[list[int]], int], AbstractContextManager[Any]] | None = None,
) -> list[torch.Tensor] | None:
    """The logits that predict each completion token, running each distinct prompt through the
    model once (GRPO's K samples of a group share their prompt): ``[B, 1, V]`` from the prompt
    pass, then ``[B, T - 1, V]`` from the completion pass (absent when ``T`` is 1). They are kept
    apart: joining them would copy every logit (50 MB at 8 rows x 32 tokens of a 49k vocabulary)
    forward and backward, and the caller scores each position on its own anyway.

    The prompts' KV cache (with its autograd graph) is computed once per distinct prompt and
    copied to every row that continues it; the rows then run only their completion tokens on top.
    The same attention, positions and masks as one forward over prompt + completion, so the values
    and gradients are the same up to float rounding. ``None`` (the caller falls back to the plain
    forward) for models whose cache cannot be built or indexed this way. ``completion_pass(width)``,
    when given, is entered around the completion pass (``width`` positions), and
    ``prompt_pass(prompts, width)`` around the prompt pass (its distinct prompts, in row order)."""
    try:
        from transformers import DynamicCache

        device = input_ids.device
        index = {tuple(prompt_ids[row]): position for position, row in enumerate(unique_rows)}
        row_to_unique = torch.tensor([index[tuple(p)] for p in prompt_ids], dtype=torch.long, device=device)
        unique = torch.tensor(unique_rows, dtype=torch.long, device=device)
        config = model.get_base_model().config if hasattr(model, "get_base_model") else model.config
        cache = DynamicCache(config=config)
        # The prompt pass: its last position predicts the first completion token.
        prompts = [prompt_ids[row] for row in unique_rows]
        with prompt_pass(prompts, prompt_width) if prompt_pass is not None else nullcontext():
            first = model(
                input_ids=input_ids[unique, :prompt_width],
                attention_mask=attention_mask[unique, :prompt_width],
                position_ids=position_ids[unique, :prompt_width],
                past_key_values=cache,
                use_cache=True,
                # An index, not the int 1: a slice of the last position is non-contiguous, and
                # F.linear then copies the vocabulary matrix once per row
                # (engines.hf.decode.last_logits_only).
                logits_to_keep=torch.tensor([prompt_width - 1], device=device),
            ).logits[row_to_unique]
        width = input_ids.shape[1] - prompt_width
        if width == 1:
            return [first]
        cache.batch_select_indices(row_to_unique)
        # The completion pass: every completion token but the last (whose prediction is unused).
        with completion_pass(width - 1) if completion_pass is not None else nullcontext():
            rest = model(
                input_ids=input_ids[:, prompt_width:-1],
                attention_mask=attention_mask[:, :-1],
                position_ids=position_ids[:, prompt_width:-1],
                past_key_values=cache,
                use_cache=True,
            ).logits
    except (AttributeError, NotImplementedError, TypeError, ValueError) as err:
        _shared_prompts_unsupported.add(type(model).__name__)
        warnings.warn(
            f"completion_logprobs: cannot share the prompt pass between rows for {type(model).__name__} "
            f"({type(err).__name__}: {err}); each row runs its whole prompt",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return [first, rest]


def completion_logprobs(
    model: Any,
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    *,
    pad_token_id: int,
    temperature: float | Sequence[float] = 1.0,
    with_entropy: bool = False,
    share_prompts: bool = True,
    completion_pass: Callable[[int], AbstractContextManager[Any]] | None = None,
    prompt_pass: Callable[[list[list[int]], int], AbstractContextManager[Any]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of each completion token given its prompt.

    Prompts are left-padded and completions right-padded, so every completion starts at the same
    column and only the last ``T + 1`` positions need logits (``logits_to_keep``); position ids
    count real tokens only, exactly as ``generate`` numbers them, so the values match the
    engine's recorded logprobs. Rows with the same prompt (a GRPO group's K samples) share one
    pass over it: its KV cache, gradient graph included, is computed once and continued by each
    row's completion, which gives the same values and gradients as one forward per row (up to
    float rounding) for a fraction of the prompt's compute.

    Args:
        model: A causal LM (peft or plain); gradients flow unless the caller disables them.
        prompt_ids: Templated prompt token ids per sequence (``Completion.prompt_token_ids``).
        completion_ids: Generated token ids per sequence (may be empty).
        pad_token_id: Token used for padding (masked out, never scored).
        temperature: Logits are divided by it before the softmax (the sampling temperature; a
            value <= 0, i.e. greedy, scores at temperature 1, as the engines record it); one per
            sequence when the rows were sampled at different temperatures (per-agent sampling).
        with_entropy: Also return the entropy of the (tempered) next-token distribution at
            each completion position (computed without gradient: it is a metric).
        share_prompts: Run each distinct prompt once for the rows that share it (two forwards,
            or one); ``False``: exactly one forward over every row (``training.strategy: fsdp2``,
            whose processes must run the same forwards).
        completion_pass: With ``share_prompts``, a context entered around the pass over the
            completions, given its number of positions (the updater's
            :func:`~llm_zoo_train.kernels.rollout_activations.replayed_completion_pass`).
        prompt_pass: With ``share_prompts``, a context entered around the pass over the distinct
            prompts, given them (in the pass's row order) and its number of positions (the
            updater's :func:`~llm_zoo_train.kernels.rollout_activations.replayed_prompt_pass`).

    Returns:
        ``(logprobs, mask, entropy)``: ``[B, T]`` float tensors with ``T`` the longest completion;
        ``mask`` is 1 on completion tokens and 0 on padding (where ``logprobs`` and ``entropy``
        are 0); ``entropy`` is ``None`` unless asked for.
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"got {len(prompt_ids)} prompts but {len(completion_ids)} completions")
    if not prompt_ids:
        raise ValueError("completion_logprobs needs at least one sequence")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError(
            "every prompt needs at least one token (the first completion token is predicted from it)"
        )
    device = next(model.parameters()).device
    batch = len(prompt_ids)
    prompt_width = max(len(p) for p in prompt_ids)
    width = max(len(c) for c in completion_ids)
    if width == 0:
        empty = torch.zeros((batch, 0), device=device)
        return empty, empty.clone(), (empty.clone() if with_entropy else None)

    input_ids = torch.full((batch, prompt_width + width), int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, (prompt, completion) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        start = prompt_width - len(prompt)
        input_ids[row, start:prompt_width] = torch.as_tensor(prompt, dtype=torch.long)
        input_ids[row, prompt_width : prompt_width + len(completion)] = torch.as_tensor(
            completion, dtype=torch.long
        )
        attention_mask[row, start : prompt_width + len(completion)] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    input_ids, attention_mask, position_ids = (
        t.to(device) for t in (input_ids, attention_mask, position_ids)
    )

    pieces = None
    unique_rows = _first_rows_of_each_prompt(prompt_ids)
    # Replaying a pass needs the two apart even where no prompt repeats.
    if (
        share_prompts
        and (len(unique_rows) < batch or completion_pass is not None or prompt_pass is not None)
        and _can_share_prompts(model)
    ):
        pieces = _logits_with_shared_prompts(
            model,
            input_ids,
            attention_mask,
            position_ids,
            unique_rows,
            prompt_ids,
            prompt_width,
            completion_pass,
            prompt_pass,
        )
    if pieces is None:
        kwargs: dict[str, Any] = dict(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        if _accepts_logits_to_keep(model):
            # Positions as an index (a contiguous gather), not a slice: see _logits_with_shared_prompts.
            kwargs["logits_to_keep"] = torch.arange(prompt_width - 1, prompt_width + width, device=device)
            pieces = [model(**kwargs).logits[:, :-1, :]]
        else:
            pieces = [model(**kwargs).logits[:, prompt_width - 1 : -1, :]]

    targets = input_ids[:, prompt_width:]
    # Every position is scored on its own (gather - logsumexp, softmax for the entropy; the same
    # bits as over the whole tensor), so each piece of logits is scored where it is and only the
    # [B, T] results are joined.
    divisor = _temperature_divisor(temperature, batch, device)
    scored, entropies, start = [], [], 0
    for logits in pieces:
        logits = logits.float()
        if divisor is not None:
            logits = logits / divisor
        stop = start + logits.shape[1]
        piece_logprobs, log_normalizer = token_logprobs(logits.contiguous(), targets[:, start:stop])
        scored.append(piece_logprobs)
        if with_entropy:
            entropies.append(token_entropy(logits, log_normalizer))
        start = stop
    mask = attention_mask[:, prompt_width:].to(scored[0].dtype)
    logprobs = _joined(scored) * mask
    entropy = _joined(entropies) * mask if with_entropy else None
    return logprobs, mask, entropy


def _temperature_divisor(
    temperature: float | Sequence[float], batch: int, device: Any
) -> float | torch.Tensor | None:
    """What the logits are divided by: ``None`` (temperature 1 or greedy), one number, or a
    ``[B, 1, 1]`` tensor of per-row temperatures (greedy rows at 1)."""
    if isinstance(temperature, int | float):
        return float(temperature) if temperature > 0 and temperature != 1 else None
    rows = [float(t) if t > 0 else 1.0 for t in temperature]
    if len(rows) != batch:
        raise ValueError(f"got {len(rows)} temperatures for {batch} sequences")
    if all(t == 1.0 for t in rows):
        return None
    if len(set(rows)) == 1:
        return rows[0]
    return torch.tensor(rows, dtype=torch.float32, device=device).view(batch, 1, 1)


def _joined(pieces: list[torch.Tensor]) -> torch.Tensor:
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    count = mask.sum()
    return float((values * mask).sum() / count) if count > 0 else 0.0


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str = "dapo",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    max_completion_length: int | None = None,
    behaviour_logprobs: torch.Tensor | None = None,
    importance_sampling_cap: float | None = None,
    total_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped-surrogate loss of a batch of completions (formulas in the module docstring).

    Args:
        logprobs: ``[B, T]`` current-policy token logprobs (with gradient).
        old_logprobs: ``[B, T]`` logprobs of the policy that the ratio is taken against (detached).
        advantages: ``[B]`` (one per sequence) or ``[B, T]``.
        mask: ``[B, T]``, 1 on completion tokens.
        loss_type: One of :data:`LOSS_TYPES`.
        epsilon: Lower clip range: ratios below ``1 - epsilon`` are clipped.
        epsilon_high: Upper clip range (DAPO's clip-higher); ``None`` = ``epsilon``.
        beta: Weight of the k3 KL estimate to the reference (base) policy; 0 = no KL.
        ref_logprobs: ``[B, T]`` reference-policy logprobs; required when ``beta > 0``; when given
            with ``beta == 0`` the KL is still reported as a metric.
        max_completion_length: The normaliser of ``dr_grpo`` (required for it).
        behaviour_logprobs: ``[B, T]`` logprobs recorded by the engine that sampled the tokens;
            used for truncated importance sampling and the ``logp_mismatch`` metric.
        importance_sampling_cap: When set (requires ``behaviour_logprobs``), each token's loss is
            weighted by ``min(exp(old_logprobs - behaviour_logprobs), cap)``: truncated importance
            sampling, correcting the mismatch between the inference engine and the trainer.
        total_tokens: ``dapo`` only: the number of completion tokens in the whole accumulated batch
            (all micro-batches and processes); defaults to ``mask.sum()``.

    Returns:
        ``(loss, metrics)``. Metrics (masked token means): ``clip_fraction_low`` (ratio below
        ``1 - epsilon`` with a negative advantage), ``clip_fraction_high`` (above
        ``1 + epsilon_high`` with a positive advantage), ``clip_fraction`` (either), ``ratio_mean``,
        ``ratio_min``, ``ratio_max``; ``kl`` when ``ref_logprobs`` is given; ``logp_mismatch``
        (mean ``|old_logprobs - behaviour_logprobs|``: the engine's and the trainer's logprobs of
        the same tokens under the same weights, so it measures the inference/training mismatch and
        not the policy's drift over several updates) and, with a cap, ``is_weight_mean`` and
        ``is_capped_fraction`` when ``behaviour_logprobs`` is given.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; valid: {', '.join(LOSS_TYPES)}")
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must have one shape [B, T]"
        )
    if epsilon < 0 or (epsilon_high is not None and epsilon_high < 0):
        raise ValueError(f"epsilon and epsilon_high must be >= 0, got {epsilon!r}, {epsilon_high!r}")
    if beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs (the base model's logprobs of the same tokens)")
    if importance_sampling_cap is not None and behaviour_logprobs is None:
        raise ValueError("importance_sampling_cap needs behaviour_logprobs (the engine's recorded logprobs)")
    if loss_type == "dr_grpo" and not max_completion_length:
        raise ValueError("loss_type 'dr_grpo' needs max_completion_length (its constant normaliser)")
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    mask = mask.to(logprobs.dtype)
    if advantages.dim() == 1:
        if advantages.shape[0] != logprobs.shape[0]:
            raise ValueError(f"{advantages.shape[0]} advantages for {logprobs.shape[0]} sequences")
        advantages = advantages.unsqueeze(1)
    advantages = advantages.to(logprobs.dtype)

    ratio = torch.exp(logprobs - old_logprobs.detach())
    clipped_ratio = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high)
    per_token = -torch.min(ratio * advantages, clipped_ratio * advantages)

    metrics: dict[str, float] = {}
    if behaviour_logprobs is not None:
        behaviour_logprobs = behaviour_logprobs.to(logprobs.dtype).detach()
        # Engine vs trainer on the same weights: old_logprobs, not logprobs (which drift with updates).
        metrics["logp_mismatch"] = _masked_mean((old_logprobs.detach() - behaviour_logprobs).abs(), mask)
        if importance_sampling_cap is not None:
            raw_weight = torch.exp(old_logprobs.detach() - behaviour_logprobs)
            weight = torch.clamp(raw_weight, max=float(importance_sampling_cap))
            per_token = per_token * weight
            metrics["is_weight_mean"] = _masked_mean(weight, mask)
            metrics["is_capped_fraction"] = _masked_mean(
                (raw_weight > importance_sampling_cap).to(mask.dtype), mask
            )

    if ref_logprobs is not None:
        delta = ref_logprobs.detach().to(logprobs.dtype) - logprobs
        kl = torch.exp(delta) - delta - 1
        metrics["kl"] = _masked_mean(kl.detach(), mask)
        if beta > 0:
            per_token = per_token + beta * kl

    masked = per_token * mask
    if loss_type == "grpo":
        loss = (masked.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    elif loss_type == "bnpo":
        loss = masked.sum() / mask.sum().clamp(min=1)
    elif loss_type == "dapo":
        count = mask.sum().clamp(min=1) if total_tokens is None else max(float(total_tokens), 1.0)
        loss = masked.sum() / count
    else:  # dr_grpo
        loss = masked.sum() / (logprobs.shape[0] * int(max_completion_length))  # type: ignore[arg-type]

    with torch.no_grad():
        low = ((ratio < 1 - epsilon) & (advantages < 0)).to(mask.dtype)
        high = ((ratio > 1 + epsilon_high) & (advantages > 0)).to(mask.dtype)
        metrics["clip_fraction_low"] = _masked_mean(low, mask)
        metrics["clip_fraction_high"] = _masked_mean(high, mask)
        metrics["clip_fraction"] = _masked_mean(torch.clamp(low + high, max=1), mask)
        metrics["ratio_mean"] = _masked_mean(ratio, mask)
        active = mask > 0
        metrics["ratio_min"] = float(ratio[active].min()) if active.any() else 1.0
        metrics["ratio_max"] = float(ratio[active].max()) if active.any() else 1.0
    return loss, metrics
