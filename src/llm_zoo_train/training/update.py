"""One adapter's policy-gradient update from its samples.

:meth:`AdapterUpdater.update` trains one adapter (its LoRA weights only; the base and the other
adapters never receive gradients) on the samples of the agents it acts for:

* ``num_iterations`` passes; each pass shuffles the samples (with the trainer's generator) into
  micro-batches of ``per_device_train_batch_size``: whole groups of samples sharing a prompt
  (``training.micro_batches: groups``, the default), so a micro-batch holds few distinct prompts
  and :func:`~llm_zoo_train.training.loss.completion_logprobs` runs each of them once for all its rows, or
  sample by sample (``samples``);
* every ``gradient_accumulation_steps`` micro-batches (default: all) make one AdamW step, after the
  gradients are summed over processes and clipped to ``max_grad_norm``;
* each micro-batch's loss (:func:`~llm_zoo_train.training.loss.policy_loss`) is weighted so the accumulated
  gradient equals the gradient of the loss over the whole optimizer step, whatever the micro-batch
  sizes: ``grpo``/``dr_grpo`` by the micro-batch's share of the step's sequences, ``dapo`` through
  the step's total token count, ``bnpo`` by 1 / (micro-batches in the step) (its definition);
* ``old_logprobs`` are computed once before the first optimizer step when the policy can move
  under a sample (several optimizer steps or iterations); otherwise they are the micro-batch's own
  logprobs, detached (the same weights: one forward pass less), the ratio is exactly 1 and the
  loss gradient is the plain policy gradient, weighted by the importance-sampling correction when
  it is on;
* with ``beta > 0`` the reference log-probabilities come from the same model with its adapters
  disabled (no second model in memory).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from llm_zoo_train.config import AlgorithmConfig, TrainingConfig
from llm_zoo_train.kernels.frozen_linear import FrozenLinearPackings
from llm_zoo_train.kernels.lora_training import fused_lora_forward, rank_rows_for
from llm_zoo_train.kernels.rollout_activations import (
    RecordedPrompt,
    RecordedRow,
    adapter_fingerprint,
    attached,
    replayable,
    replayed_completion_pass,
    replayed_prompt_pass,
)
from llm_zoo_train.models.policy import Policy
from llm_zoo_train.rollout.samples import Sample
from llm_zoo_train.runs.finite import gradient_error
from llm_zoo_train.runs.sharded_state import full_tensor
from llm_zoo_train.training.loss import completion_logprobs, policy_loss

__all__ = ["AdapterUpdater", "mean_across_processes", "reduce_value", "rows_by_prompt"]


class AdapterUpdater:
    """Updates the trainable adapters of ``policy``.

    Args:
        policy: The policy holding the adapters.
        optimizers: One (Accelerate-prepared) optimizer per trainable adapter.
        accelerator: The run's Accelerator (autocast, backward, clipping, cross-process sums).
        algorithm: Loss settings.
        training: Batch sizes, accumulation, clipping.
        temperature: The rollout's sampling temperature (divides the logits, as in TRL).
        agent_temperatures: Agents sampled at another temperature (``agents.sampling``): their
            samples' logits are divided by it instead.
        max_completion_length: The ``dr_grpo`` normaliser.
        rng: Shuffles micro-batches (the trainer's generator, saved in checkpoints).
        lockstep: Every process must run the same forwards and backwards (``training.strategy:
            fsdp2``, whose forwards gather weights from every process): a process with fewer
            micro-batches runs weightless ones, and FSDP sums the gradients in the backward.
    """

    def __init__(
        self,
        policy: Policy,
        optimizers: Mapping[str, Any],
        accelerator: Any,
        algorithm: AlgorithmConfig,
        training: TrainingConfig,
        *,
        temperature: float,
        agent_temperatures: Mapping[str, float] | None = None,
        max_completion_length: int,
        rng: np.random.Generator,
        lockstep: bool = False,
    ):
        self.policy = policy
        self.optimizers = optimizers
        self.accelerator = accelerator
        self.algorithm = algorithm
        self.training = training
        self.temperature = temperature
        self.agent_temperatures = dict(agent_temperatures or {})
        self.max_completion_length = max_completion_length
        self.rng = rng
        self.lockstep = lockstep
        self.pad_token_id = int(policy.tokenizer.pad_token_id)
        #: The frozen base layers' packed copies (``training.update_kernel``), kept across steps.
        self.frozen_linear = FrozenLinearPackings(training.update_kernel)
        self._adapter: str | None = None  # the adapter being updated

    def update(
        self, adapter: str, samples: list[Sample], progress: Callable[[int, int], None] | None = None
    ) -> dict[str, float]:
        """Train ``adapter`` on ``samples`` (its agents' samples, advantages set); returns metrics
        ``update/{adapter}/...`` (token-weighted means over micro-batches, averaged over processes).

        ``progress(done, total)`` is called before the first and after each of this process's
        micro-batches (``total``: its micro-batches over all iterations); it only watches."""
        algorithm, training = self.algorithm, self.training
        samples = [s for s in samples if s.completion_token_ids]
        micro_size = training.per_device_train_batch_size
        micro_batches = int(reduce_value(self.accelerator, math.ceil(len(samples) / micro_size), "max"))
        if micro_batches == 0:
            return {}
        self.policy.activate(adapter)
        self.policy.model.train()
        self._adapter = adapter
        per_step = training.gradient_accumulation_steps or micro_batches
        optimizer_steps = math.ceil(micro_batches / per_step)
        # One optimizer step on one pass: nothing moves before each micro-batch's own forward pass,
        # whose detached logprobs are the old ones (importance sampling included).
        need_old = algorithm.num_iterations > 1 or optimizer_steps > 1
        old = self._logprobs_without_grad(samples) if need_old else None

        totals: dict[str, float] = defaultdict(float)
        tokens_seen = 0.0
        local_batches = math.ceil(len(samples) / micro_size) * algorithm.num_iterations
        batches_done = 0
        if progress is not None:
            progress(0, local_batches)  # the phase shows its micro-batches before the first ends
        grad_norms = []
        for _ in range(algorithm.num_iterations):
            order = self._pass_order(samples)
            batches = [order[i : i + micro_size] for i in range(0, len(order), micro_size)]
            for index in range(optimizer_steps):
                chunk = batches[index * per_step : (index + 1) * per_step]
                counts = {
                    "tokens": reduce_value(
                        self.accelerator, sum(len(samples[i].completion_token_ids) for b in chunk for i in b)
                    ),
                    "sequences": reduce_value(self.accelerator, sum(len(b) for b in chunk)),
                    "micro_batches": reduce_value(self.accelerator, len(chunk)),
                }
                padding = self._lockstep_padding(len(chunk))  # asked before any pass: a collective
                for batch in chunk:
                    loss, batch_metrics, tokens = self._micro_batch_loss(
                        [samples[i] for i in batch], [old[i] for i in batch] if old else None, counts
                    )
                    self.accelerator.backward(loss)
                    for key, value in batch_metrics.items():
                        totals[key] += value * tokens
                    tokens_seen += tokens
                    batches_done += 1
                    if progress is not None:
                        progress(batches_done, local_batches)
                for _ in range(padding):
                    loss, _, _ = self._micro_batch_loss([self._placeholder()], None, counts)
                    self.accelerator.backward(loss * 0.0)
                grad_norms.append(self._optimizer_step(adapter))
        store = attached(self.policy.model)
        if store is not None:  # its rows were sampled with the weights this update has just changed
            store.drop(adapter)
        metrics = {f"update/{adapter}/{k}": v / max(tokens_seen, 1.0) for k, v in totals.items()}
        metrics[f"update/{adapter}/grad_norm"] = float(np.mean(grad_norms))
        metrics[f"update/{adapter}/optimizer_steps"] = float(len(grad_norms))
        metrics[f"update/{adapter}/samples"] = float(len(samples))
        return mean_across_processes(self.accelerator, metrics)

    def _pass_order(self, samples: list[Sample]) -> list[int]:
        """One pass's sample order (cut into micro-batches in turn): the groups of samples sharing
        a prompt in random order, each kept whole, or (``micro_batches: samples``) every sample
        shuffled on its own."""
        if self.training.micro_batches == "samples":
            return self.rng.permutation(len(samples)).tolist()
        groups = rows_by_prompt(samples)
        return [row for group in self.rng.permutation(len(groups)).tolist() for row in groups[group]]

    def _micro_batch_loss(
        self, batch: list[Sample], old: list[torch.Tensor] | None, counts: Mapping[str, float]
    ) -> tuple[torch.Tensor, dict[str, float], float]:
        algorithm = self.algorithm
        prompts = [s.prompt_token_ids for s in batch]
        completions = [s.completion_token_ids for s in batch]
        with self.accelerator.autocast():
            recorded = self._recorded_rows(batch)  # inside: autocast rules it out
            # The rows found carry the adapter's present fingerprint: the prompts must match it too.
            prompts_recorded = (
                self._recorded_prompts(batch, recorded[0].fingerprint) if recorded is not None else None
            )
            # The replayed layers' LoRA products as the computed ones take them (update_kernel).
            rank_rows = recorded is not None and rank_rows_for(self.policy.model, self.training.update_kernel)
            # peft's LoRA forward with fewer passes over each layer's output (its bits, or the rank
            # as the rows), the frozen base layers by packed copies: as training.update_kernel chose.
            with (
                fused_lora_forward(self.policy.model, self.training.update_kernel),
                self.frozen_linear.applied(self.policy.model),
            ):
                logprobs, mask, entropy = completion_logprobs(
                    self.policy.model,
                    prompts,
                    completions,
                    pad_token_id=self.pad_token_id,
                    temperature=self._temperatures(batch),
                    share_prompts=not self.lockstep,
                    with_entropy=True,
                    completion_pass=(
                        partial(
                            replayed_completion_pass,
                            self.policy.model,
                            self._adapter,
                            recorded,
                            rank_rows=rank_rows,
                        )
                        if recorded is not None
                        else None
                    ),
                    prompt_pass=(
                        partial(
                            replayed_prompt_pass,
                            self.policy.model,
                            self._adapter,
                            prompts_recorded,
                            rank_rows=rank_rows,
                        )
                        if prompts_recorded is not None
                        else None
                    ),
                )
            reference = None
            if algorithm.beta > 0:
                with torch.no_grad(), self.policy.model.disable_adapter():
                    reference, _, _ = completion_logprobs(
                        self.policy.model,
                        prompts,
                        completions,
                        pad_token_id=self.pad_token_id,
                        temperature=self._temperatures(batch),
                        share_prompts=not self.lockstep,
                    )
        device, width = logprobs.device, logprobs.shape[1]
        old_logprobs = (
            _pad([o.tolist() for o in old], width, device) if old is not None else logprobs.detach()
        )
        loss, metrics = policy_loss(
            logprobs,
            old_logprobs,
            torch.tensor([s.advantage for s in batch], dtype=torch.float32, device=device),
            mask,
            loss_type=algorithm.loss_type,
            epsilon=algorithm.epsilon,
            epsilon_high=algorithm.epsilon_high,
            beta=algorithm.beta,
            ref_logprobs=reference,
            max_completion_length=self.max_completion_length,
            behaviour_logprobs=_pad([s.behaviour_logprobs for s in batch], width, device),
            importance_sampling_cap=algorithm.importance_sampling_cap
            if algorithm.importance_sampling
            else None,
            total_tokens=counts["tokens"] if algorithm.loss_type == "dapo" else None,
        )
        # Weight so the accumulated gradient is that of the loss over the whole optimizer step.
        if algorithm.loss_type in ("grpo", "dr_grpo"):
            weight = len(batch) / counts["sequences"]
        elif algorithm.loss_type == "bnpo":
            weight = 1.0 / counts["micro_batches"]
        else:  # dapo: policy_loss already divides by the step's token count
            weight = 1.0
        tokens = float(mask.sum())
        assert entropy is not None
        metrics["entropy"] = float((entropy * mask).sum()) / max(tokens, 1.0)
        metrics["loss"] = float(loss.detach())
        metrics["completion_length"] = tokens / len(batch)
        return loss * weight, metrics, tokens

    def _recorded_rows(self, batch: list[Sample]) -> list[RecordedRow] | None:
        """The rollout's recorded outputs of every row of ``batch``, where the engine kept them
        with the adapter's present weights (:mod:`~llm_zoo_train.kernels.rollout_activations`);
        ``None`` when any row lacks them or the pass cannot be replayed (dropout, autocast:
        :func:`~llm_zoo_train.kernels.rollout_activations.replayable`); the passes are then computed."""
        store = attached(self.policy.model)
        if (
            store is None
            or self.lockstep
            or not len(store)
            or not replayable(self.policy.model, self._adapter)
        ):
            return None
        fingerprint = adapter_fingerprint(self.policy.model, self._adapter)
        rows = [
            store.find(self._adapter, s.prompt_token_ids, s.completion_token_ids, fingerprint) for s in batch
        ]
        found = [row for row in rows if row is not None]
        if len(found) < len(rows):
            store.missed_rows += len(rows) - len(found)
            return None
        store.replayed_rows += len(found)
        return found

    def _recorded_prompts(
        self, batch: list[Sample], fingerprint: tuple[int, ...]
    ) -> dict[tuple[int, ...], RecordedPrompt] | None:
        """The rollout's recorded prefill of every distinct prompt of ``batch`` with the adapter's
        present weights (``fingerprint``), by prompt; ``None`` when any lacks one (the prompt pass
        is then computed). Asked only where :meth:`_recorded_rows` found the batch's rows (its
        conditions hold)."""
        store = attached(self.policy.model)
        if store is None:
            return None
        prompts = {tuple(s.prompt_token_ids) for s in batch}
        found = {prompt: store.find_prompt(self._adapter, prompt, fingerprint) for prompt in prompts}
        missing = sum(record is None for record in found.values())
        if missing:
            store.missed_prompts += missing
            return None
        store.replayed_prompts += len(found)
        return {prompt: record for prompt, record in found.items() if record is not None}

    @torch.no_grad()
    def _logprobs_without_grad(self, samples: list[Sample]) -> list[torch.Tensor]:
        """Per-sample token logprobs of the current adapter (the ratio's fixed denominator)."""
        size = self.training.per_device_train_batch_size
        rows = list(range(len(samples)))
        if self.training.micro_batches == "groups":  # rows sharing a prompt share its forward pass
            rows = [row for group in rows_by_prompt(samples) for row in group]
        out: list[torch.Tensor | None] = [None] * len(samples)
        padding = self._lockstep_padding(math.ceil(len(rows) / size))  # before any pass: a collective
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]
            batch = [samples[row] for row in chunk]
            with self.accelerator.autocast(), self.frozen_linear.applied(self.policy.model):
                logprobs, _, _ = completion_logprobs(
                    self.policy.model,
                    [s.prompt_token_ids for s in batch],
                    [s.completion_token_ids for s in batch],
                    pad_token_id=self.pad_token_id,
                    temperature=self._temperatures(batch),
                    share_prompts=not self.lockstep,
                )
            for position, (row, sample) in enumerate(zip(chunk, batch, strict=True)):
                out[row] = logprobs[position, : len(sample.completion_token_ids)].float().cpu()
        for _ in range(padding):
            with self.accelerator.autocast():
                completion_logprobs(
                    self.policy.model,
                    [[self.pad_token_id]],
                    [[self.pad_token_id]],
                    pad_token_id=self.pad_token_id,
                )
        return [logprobs for logprobs in out if logprobs is not None]

    def _lockstep_padding(self, passes: int) -> int:
        """How many weightless passes this process adds to its ``passes`` so that every process
        runs as many as the busiest (0 unless ``lockstep``)."""
        if not self.lockstep:
            return 0
        return int(reduce_value(self.accelerator, passes, "max")) - passes

    def _placeholder(self) -> Sample:
        """A one-token sample whose loss, multiplied by 0, pads a micro-batch (``lockstep``)."""
        token = [self.pad_token_id]
        return Sample(
            env_id="", env_index=0, task_id="", turn=0, agent="", adapter=None, group_key="", branch=0,
            prompt="", completion="", prompt_token_ids=token, completion_token_ids=token,
            behaviour_logprobs=[0.0], reward=0.0, role_reward=0.0, global_reward=0.0,
        )  # fmt: skip

    def _temperatures(self, batch: list[Sample]) -> float | list[float]:
        """The temperature that sampled each row: one number when they all share the rollout's."""
        if not self.agent_temperatures:
            return self.temperature
        return [self.agent_temperatures.get(s.agent, self.temperature) for s in batch]

    def _optimizer_step(self, adapter: str) -> float:
        parameters = self.policy.adapter_parameters(adapter)
        if self.accelerator.num_processes > 1 and not self.lockstep:  # FSDP summed them in the backward
            for parameter in parameters:
                if parameter.grad is None:
                    parameter.grad = torch.zeros_like(parameter)
                parameter.grad.copy_(self.accelerator.reduce(parameter.grad, reduction="sum"))
        max_norm = self.training.max_grad_norm
        norm = full_tensor(
            self.accelerator.clip_grad_norm_(parameters, max_norm if max_norm > 0 else float("inf"))
        )
        optimizer = self.optimizers[adapter]
        if not math.isfinite(float(norm)):  # a NaN loss or gradient: the weights must not see it
            optimizer.zero_grad(set_to_none=True)
            raise gradient_error(adapter, float(norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(norm)


def rows_by_prompt(samples: Sequence[Sample]) -> list[list[int]]:
    """The indices of ``samples`` grouped by identical prompt token ids, groups in order of first
    appearance, rows in order within each."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, sample in enumerate(samples):
        groups.setdefault(tuple(sample.prompt_token_ids), []).append(row)
    return list(groups.values())


def reduce_value(accelerator: Any, value: float, reduction: str = "sum") -> float:
    """``value`` summed (or maxed) over all processes; itself in a single process."""
    if accelerator.num_processes == 1:
        return float(value)
    tensor = torch.tensor([float(value)], device=accelerator.device)
    if reduction == "max":
        return float(accelerator.gather(tensor).max())
    return float(accelerator.reduce(tensor, reduction=reduction))


def mean_across_processes(accelerator: Any, metrics: dict[str, float]) -> dict[str, float]:
    """Each metric averaged over the processes that report it."""
    if accelerator.num_processes == 1:
        return metrics
    from accelerate.utils import gather_object

    everyone = gather_object([metrics])
    keys = sorted({k for m in everyone for k in m})
    return {k: float(np.mean([m[k] for m in everyone if k in m])) for k in keys}


def _pad(rows: Sequence[Sequence[float]], width: int, device: torch.device) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, row in enumerate(rows):
        values = torch.as_tensor(list(row)[:width], dtype=torch.float32)
        out[i, : len(values)] = values
    return out.to(device)
