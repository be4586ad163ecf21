"""The transformers engine: ``model.generate`` on the live (training) model, adapters by name.

:class:`HFEngine` serves completions from the same model object the trainer updates, so it never
needs to reload weights. It is the engine for CPU runs, tests and small GPU runs; the vLLM engine
is faster for anything large.

How one :meth:`HFEngine.generate` call runs:

1. Each prompt gets the tokenizer's chat template (:func:`llm_zoo_train.models.chat.encode_prompt`;
   encodings are cached, since tree rollouts ask the same prompt again rarely but evaluation and
   independent rollouts do).
2. Prompts are grouped by adapter. For each group the adapter is activated (``set_adapter``), or
   all adapters are disabled (``disable_adapter()``) for ``None``. The model's active adapter,
   its ``requires_grad`` flags (``set_adapter`` makes the activated adapter trainable) and its
   train/eval mode are restored afterwards, so generation never changes what the trainer trains.
3. Each prompt is repeated ``n`` times (one row per sample), rows are sorted by length and cut
   into batches of ``max_batch_size`` rows, left-padded, and generated with sampling parameters
   that are exactly ``SamplingParams`` (the model's own generation defaults such as a repetition
   penalty are neutralised, because the recorded logprobs must describe the real sampling).
   The ``n`` rows of one prompt share one prefill: the prompt's KV cache is computed once and
   copied to its rows (``share_prefill``, :mod:`llm_zoo_train.engines.hf.prefill`), as vLLM's
   prefix cache would. Across calls, the keys and
   values of recent prompts are kept per adapter and a prompt that starts with the tokens of one of
   them prefills only the rest, in fixed blocks so the result does not depend on what the cache held
   (``prefix_cache_mb``: off in this class by default, on for the trainer's CPU runs;
   :mod:`llm_zoo_train.engines.hf.prefix_cache` says how
   prompts are matched and when the cache is emptied: after every weight update). A row leaves the batch
   at the step it ends (:mod:`llm_zoo_train.engines.hf.decode`: ``model.generate``'s distribution,
   with one random number per row instead of one per vocabulary entry; ``generate`` would carry
   the row to the end of the batch's longest answer). peft's LoRA layers run a leaner forward with
   the same numbers, and an all-zero (untrained) adapter is skipped
   (:mod:`llm_zoo_train.kernels.lora_inference`).
4. Per-token logprobs are recorded during generation from the raw logits before any warper: ``log_softmax(logits / temperature)`` at the sampled token
   (temperature 1 for greedy). That is the quantity :func:`llm_zoo_train.training.loss.completion_logprobs`
   recomputes, so importance ratios start at 1 (up to float error). ``top_k``/``top_p``
   truncation is applied to sampling but not to the recorded logprobs (as in TRL).
5. Completions are cut after the first end-of-sequence token (kept in ``token_ids``; the
   ``finish_reason`` is ``"stop"``) or at ``max_tokens`` (``"length"``); padding is removed.

While it runs, the call reports every decode step's tokens and the completions as they end
through :func:`llm_zoo_train.engines.base.report_generated`, and before them each decoder layer of
a prompt pass (:mod:`llm_zoo_train.engines.hf.reading`), so a progress display can count them
during a call of minutes (:mod:`llm_zoo_train.reporting.progress`).

Seeding: when ``SamplingParams.seed`` is set, the call samples from a forked torch RNG seeded with
it (the global RNG is left untouched), so one seed and one batch give one result.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList

from llm_zoo_train.engines.base import Completion, SamplingParams, check_generate_args, report_generated
from llm_zoo_train.engines.hf.decode import (
    GenerateLogprobRecorder,
    GenerateStepReporter,
    decode_compacting,
)
from llm_zoo_train.engines.hf.prefill import prefill_from_prefixes, shared_prefill
from llm_zoo_train.engines.hf.prefix_cache import PREFIX_BLOCK, PrefixKVCache
from llm_zoo_train.engines.hf.reading import reading_progress
from llm_zoo_train.kernels.lora_inference import lean_lora_forward
from llm_zoo_train.kernels.packed_linear import PackedLinearWeights
from llm_zoo_train.kernels.rollout_activations import DecodeRecorder, RolloutActivations
from llm_zoo_train.models.chat import encode_prompt

__all__ = ["CPU_PREFIX_CACHE_MB", "HFEngine", "prefix_cache_mb_for"]

_PROMPT_CACHE_SIZE = 4096


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a [train] dependency
        return False
    return isinstance(model, PeftModel)


#: MiB of prefix cache that ``rollout.prefix_cache_mb: null`` (the default) gives a model on a CPU.
CPU_PREFIX_CACHE_MB = 1024.0


def prefix_cache_mb_for(setting: float | None, model: Any) -> float:
    """The prefix cache size for ``model``: ``setting`` when given, else :data:`CPU_PREFIX_CACHE_MB`
    on a CPU and 0 (off) elsewhere. Prompts prefilled one at a time pay on a CPU, which gains little
    from batching them (measured: ``benchmarks/rollout_speed.py``); a GPU would run them as one
    batch in about the time of one, and that trade has not been measured there."""
    if setting is not None:
        return float(setting)
    device = next(model.parameters()).device
    return CPU_PREFIX_CACHE_MB if device.type == "cpu" else 0.0


class HFEngine:
    """An :class:`~llm_zoo_train.engines.base.Engine` on a transformers model (optionally peft).

    Args:
        model: A ``peft.PeftModel`` holding named adapters, or a plain causal LM (then every
            prompt's adapter must be ``None``). Not wrapped by DDP/FSDP: pass the unwrapped model.
        tokenizer: Its tokenizer (chat template, end-of-sequence and padding tokens).
        max_batch_size: Most rows (prompt x sample) generated in one ``model.generate`` call.
        system_prompt: A system message put before every prompt (``None``: none).
        share_prefill: Compute each prompt's KV cache once for its ``n`` samples (and copy it to
            them) instead of once per sample. Same results; faster for long prompts and large n.
        compact_finished_rows: Stop computing a row once it has ended
            (:func:`~llm_zoo_train.engines.hf.decode.decode_compacting`) instead of running
            ``model.generate``, which carries finished rows until the whole batch ends. Same
            distribution; faster when answers end at different lengths.
        draws_as_generate: With ``compact_finished_rows``, sample with ``generate``'s own random
            numbers (the same tokens as ``generate`` for a seed) instead of one number per row
            (:func:`~llm_zoo_train.engines.hf.decode.draw_per_row`: the same distribution, other
            tokens, a fifth less time per sampled bfloat16 decode step on a CPU).
        prefix_cache_mb: Keep the keys and values of recently prefilled prompts, per adapter, up to
            this many MiB, and prefill only what a new prompt adds to the longest stored prefix of
            it (:mod:`~llm_zoo_train.engines.hf.prefix_cache`; emptied whenever a weight changes).
            1024 holds ~23k positions of SmolLM2-135M in float32 (46 KB each), a tree step's
            look-ahead prompts at 4 envs x K=4. With the cache every prompt is prefilled alone, in
            ``prefix_block``-token blocks at fixed positions, and only whole blocks are reused, so
            a prompt's keys and values are the same bits whatever earlier calls left in the cache:
            a replayed or resumed step repeats the original. They differ from the batched prefill
            without the cache by float rounding. Calls whose prompts all fit in one block take the
            batched prefill (nothing to reuse). Off by default here (0); the trainer's default is
            :func:`prefix_cache_mb_for`.
        prefix_block: The block size of that prefill (tokens).
        pack_base_weights: On a CPU, decode with packed copies of the model's linear layers
            (:mod:`~llm_zoo_train.kernels.packed_linear`; float32: MKL's with the same bits, or
            oneDNN's; bfloat16: oneDNN's where probed to the same bits): less time per decode
            step, about the base model's size again in memory. No effect elsewhere.
        decode_kernel: Which packed product: ``"exact"`` (MKL's, the same bits as unpacked, the
            decode only), ``"onednn"`` (oneDNN's, decode and prefill, other float32 rounding) or
            ``"auto"`` (oneDNN's where a pass over the model measures at least 1.15x faster, else
            MKL's with the LoRA layers merged; prefills too where they measure faster as well):
            :class:`~llm_zoo_train.kernels.packed_linear.PackedLinearWeights`.
        merge_adapters: Where oneDNN's copies serve, or MKL's chosen by ``"auto"``, each LoRA
            layer multiplies by a packed copy of its merged weight (one product instead of three;
            :mod:`~llm_zoo_train.kernels.merged_lora`), merged again after each optimizer step.
        activations: Keep every linear layer's output of each decode step in this store, per
            sampled row, for the update to take instead of computing it again
            (:mod:`~llm_zoo_train.kernels.rollout_activations`; with ``compact_finished_rows``,
            sampled calls only: greedy answers are never trained on). ``None``: nothing kept.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 32,
        system_prompt: str | None = None,
        share_prefill: bool = True,
        compact_finished_rows: bool = True,
        draws_as_generate: bool = False,
        prefix_cache_mb: float = 0.0,
        prefix_block: int = PREFIX_BLOCK,
        pack_base_weights: bool = True,
        decode_kernel: str = "auto",
        merge_adapters: bool = True,
        activations: RolloutActivations | None = None,
    ):
        if int(max_batch_size) < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = int(max_batch_size)
        self.system_prompt = system_prompt
        self.share_prefill = bool(share_prefill)
        self.compact_finished_rows = bool(compact_finished_rows)
        self.draws_as_generate = bool(draws_as_generate)
        self.eos_token_ids = self._eos_token_ids()
        if not self.eos_token_ids:
            raise ValueError("neither the tokenizer nor the model's generation config names an eos token")
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else min(self.eos_token_ids)
        self._prompt_cache: OrderedDict[str, list[int]] = OrderedDict()
        if float(prefix_cache_mb) < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0, got {prefix_cache_mb!r}")
        self.prefix_cache: PrefixKVCache | None = (
            PrefixKVCache(int(float(prefix_cache_mb) * 2**20)) if float(prefix_cache_mb) > 0 else None
        )
        if int(prefix_block) < 1:
            raise ValueError(f"prefix_block must be >= 1, got {prefix_block!r}")
        self.prefix_block = int(prefix_block)
        self.packed_weights: PackedLinearWeights | None = (
            PackedLinearWeights(decode_kernel, merge_adapters=merge_adapters) if pack_base_weights else None
        )
        self.activations = activations

    # ------------------------------------------------------------------ Engine interface

    def generate(
        self,
        prompts: Sequence[str],
        adapters: Sequence[str | None],
        n: int,
        sampling: SamplingParams,
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per prompt, ``adapters[i]`` answering ``prompts[i]``."""
        check_generate_args(prompts, adapters, n, sampling)
        self._check_adapters(adapters)
        encoded = [self._encode(prompt) for prompt in prompts]

        by_adapter: dict[str | None, list[int]] = {}
        for index, adapter in enumerate(adapters):
            by_adapter.setdefault(adapter, []).append(index)

        results: list[list[Completion | None]] = [[None] * n for _ in prompts]
        generation_config = self._generation_config(sampling)
        if self.prefix_cache is not None:
            self.prefix_cache.validate(self.model)  # any weight changed since the last call: empty
        with (
            self._preserved_model_state(),
            self._seeded(sampling.seed),
            reading_progress(self.model),
            lean_lora_forward(self.model),
        ):
            for adapter, indices in by_adapter.items():
                # Longest first: rows of similar length share a batch (less padding).
                indices = sorted(indices, key=lambda i: -len(encoded[i]))
                rows = [(i, j) for i in indices for j in range(n)]
                with self._adapter(adapter):
                    for start in range(0, len(rows), self.max_batch_size):
                        chunk = rows[start : start + self.max_batch_size]
                        completions = self._generate_batch(
                            [encoded[i] for i, _ in chunk], sampling, generation_config, adapter
                        )
                        for (i, j), completion in zip(chunk, completions, strict=True):
                            results[i][j] = completion
        return [[c for c in row if c is not None] for row in results]

    def load_adapters(self, paths: Mapping[str, str], version: int) -> None:
        """Serve the adapters saved (PEFT format) at ``paths[name]`` from now on.

        This engine generates with the live model that the trainer updates in place, so training
        never needs this call (new weights are served as soon as the optimizer steps). When called,
        an adapter the model already has gets the saved weights copied into its parameters in place
        (same tensors, so an optimizer holding them stays valid; nothing changes if the path holds
        the live weights); a name the model lacks is added as a new, frozen adapter (e.g. to
        evaluate a checkpoint next to the live adapters). ``version`` is unused: nothing here is
        cached by name.
        """
        del version
        self.clear_prefix_cache()
        if not paths:
            return
        if not _is_peft(self.model):
            raise ValueError(
                f"cannot load adapters {sorted(paths)}: the model is not a peft PeftModel "
                "(wrap it with peft.get_peft_model or PeftModel.from_pretrained first)"
            )
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        device = str(next(self.model.parameters()).device)
        with self._preserved_model_state():
            for name, path in paths.items():
                if name not in self.model.peft_config:
                    self.model.load_adapter(str(path), adapter_name=name, is_trainable=False)
                    continue
                weights = load_peft_weights(str(path), device=device)
                result = set_peft_model_state_dict(self.model, weights, adapter_name=name)
                missing = [key for key in getattr(result, "missing_keys", []) if f".{name}." in key]
                if missing:
                    raise ValueError(
                        f"{path} does not hold every weight of adapter {name!r}: missing {missing[:3]}"
                    )

    def without_prefix_cache(self) -> HFEngine:
        """This engine without a prefix cache: the same model, tokenizer, settings and packed
        weights, each call's prompts prefilled in one batched pass, as with ``prefix_cache_mb=0``.
        The trainer evaluates through it, so that evaluation figures do not depend on the cache
        (a speed setting). ``self`` when there is no cache."""
        if self.prefix_cache is None:
            return self
        view = copy.copy(self)
        view.prefix_cache = None
        view.activations = None  # evaluation's answers are never trained on
        return view

    def clear_prefix_cache(self) -> None:
        """Forget every stored prompt prefix (the engine also does so by itself whenever a weight
        changed in place; call this after writing weights through ``param.data``)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    # ------------------------------------------------------------------ internals

    def _eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        config = getattr(self.model, "generation_config", None)
        configured = getattr(config, "eos_token_id", None)
        if isinstance(configured, int):
            ids.add(configured)
        elif configured is not None:
            ids.update(int(i) for i in configured)
        return ids

    def _encode(self, prompt: str) -> list[int]:
        cached = self._prompt_cache.get(prompt)
        if cached is None:
            cached = encode_prompt(self.tokenizer, prompt, self.system_prompt)
            self._prompt_cache[prompt] = cached
            if len(self._prompt_cache) > _PROMPT_CACHE_SIZE:
                self._prompt_cache.popitem(last=False)
        else:
            self._prompt_cache.move_to_end(prompt)
        return cached

    def _check_adapters(self, adapters: Sequence[str | None]) -> None:
        named = {a for a in adapters if a is not None}
        if not named:
            return
        if not _is_peft(self.model):
            raise ValueError(
                f"adapters {sorted(named)} were requested but the model has no adapters "
                f"({type(self.model).__name__} is not a peft PeftModel): use adapter None"
            )
        unknown = named - set(self.model.peft_config)
        if unknown:
            raise ValueError(
                f"unknown adapter(s) {sorted(unknown)}; the model has {sorted(self.model.peft_config)} (or None for the base model)"
            )

    def _generation_config(self, sampling: SamplingParams) -> GenerationConfig:
        # Every knob that changes the distribution is set explicitly: generate() fills unset (None)
        # fields from the model's own generation_config (e.g. Qwen3 ships top_k=20, top_p=0.95).
        neutral = dict(
            repetition_penalty=1.0,
            encoder_repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
            min_p=None,
            min_length=0,
            min_new_tokens=None,
            num_beams=1,
            num_return_sequences=1,
        )
        if sampling.greedy:
            # Sampling knobs are unused by greedy search (and setting them makes generate() warn).
            strategy: dict[str, Any] = dict(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            strategy = dict(
                do_sample=True,
                temperature=float(sampling.temperature),
                top_p=float(sampling.top_p),
                top_k=int(sampling.top_k) if sampling.top_k and sampling.top_k > 0 else 0,
            )
        return GenerationConfig(
            max_new_tokens=int(sampling.max_tokens),
            eos_token_id=sorted(self.eos_token_ids),
            pad_token_id=self.pad_token_id,
            **neutral,
            **strategy,
        )

    def _decode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Any,
        sampling: SamplingParams,
        generation_config: GenerationConfig,
        width: int,
        first_logits: torch.Tensor | None = None,
        activation_recorder: DecodeRecorder | None = None,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Each row's new tokens and their logprobs, from prompts left-padded to ``width``
        (``first_logits``: the compacting loop's, from a prefill of whole prompts)."""
        if self.compact_finished_rows:
            return decode_compacting(
                self.model,
                input_ids,
                attention_mask,
                cache=cache,
                first_logits=first_logits,
                max_new_tokens=int(sampling.max_tokens),
                eos_token_ids=self.eos_token_ids,
                pad_token_id=self.pad_token_id,
                greedy=sampling.greedy,
                temperature=float(sampling.temperature),
                top_k=int(sampling.top_k) if sampling.top_k and sampling.top_k > 0 else 0,
                top_p=float(sampling.top_p),
                draws_as_generate=self.draws_as_generate,
                before_forward=activation_recorder.before_forward
                if activation_recorder is not None
                else None,
            )
        recorder = GenerateLogprobRecorder(1.0 if sampling.greedy else float(sampling.temperature))
        with torch.no_grad():
            sequences = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                past_key_values=cache,
                generation_config=generation_config,
                logits_processor=LogitsProcessorList([recorder, GenerateStepReporter()]),
            )
        generated = sequences[:, width:]
        return generated.cpu().tolist(), recorder.finish(generated).cpu().tolist()

    def _generate_batch(
        self,
        prompt_ids: list[list[int]],
        sampling: SamplingParams,
        generation_config: GenerationConfig,
        adapter: str | None = None,
    ) -> list[Completion]:
        """Generate one completion per row; rows that repeat a prompt (the n samples) are adjacent."""
        device = next(self.model.parameters()).device
        # Unique prompts of this batch, and which one each row answers.
        unique: list[list[int]] = []
        row_to_unique: list[int] = []
        for ids in prompt_ids:
            if not unique or unique[-1] is not ids:
                unique.append(ids)
            row_to_unique.append(len(unique) - 1)
        width = max(len(ids) for ids in unique)
        input_ids = torch.full((len(unique), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(unique), width), dtype=torch.long)
        for row, ids in enumerate(unique):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        index = torch.tensor(row_to_unique, dtype=torch.long, device=device)

        # Prefill and decode both run on the packed copies: MKL's serve only the decode's row
        # count (the same bits), oneDNN's more where measured faster (kernels.packed_linear).
        packed = (
            self.packed_weights.applied(self.model, len(prompt_ids))
            if self.packed_weights is not None
            else nullcontext()
        )
        recorder = (
            DecodeRecorder(self.model, self.activations, adapter, len(prompt_ids))
            # Greedy answers (evaluation, the team-credit look-ahead's teammate) are never trained on.
            if self.activations is not None and self.compact_finished_rows and not sampling.greedy
            else None
        )
        with packed, recorder if recorder is not None else nullcontext():
            cache = None
            if (
                self.share_prefill
                and self.prefix_cache is not None
                and min(len(ids) for ids in unique) >= 2
                # Only whole blocks are stored: prompts that all fit in one block have nothing to reuse
                # or keep, and their batched prefill is cheaper than one forward pass per prompt.
                and max(len(ids) for ids in unique) > self.prefix_block
            ):
                cache = prefill_from_prefixes(
                    self.model, self.prefix_cache, self.prefix_block, unique, adapter, width - 1, index
                )
                if cache is None:
                    self.prefix_cache = None
            first_logits = None
            if (
                cache is None
                and self.share_prefill
                and len(unique) < len(prompt_ids)
                and min(len(ids) for ids in unique) >= 2
            ):
                if self.compact_finished_rows:
                    # The whole prompt: the compacting loop samples its first token from this pass's
                    # logits, one forward pass over every row less than generate's way below.
                    with recorder.prefill(unique) if recorder is not None else nullcontext():
                        prefilled = shared_prefill(
                            self.model, input_ids, attention_mask, index, with_logits=True
                        )
                else:  # generate must run the last prompt token itself
                    prefilled = shared_prefill(self.model, input_ids[:, :-1], attention_mask[:, :-1], index)
                if prefilled is None:
                    self.share_prefill = False
                else:
                    cache, first_logits = prefilled
            new_tokens, logprobs = self._decode(
                input_ids[index],
                attention_mask[index],
                cache,
                sampling,
                generation_config,
                width,
                first_logits,
                recorder,
            )
        if recorder is not None:
            recorder.keep(prompt_ids, new_tokens)

        completions = []
        for row, ids in enumerate(prompt_ids):
            tokens, finish_reason = new_tokens[row], "length"
            for position, token in enumerate(tokens):
                if token in self.eos_token_ids:
                    tokens, finish_reason = tokens[: position + 1], "stop"
                    break
            if sampling.stop:
                stopped = self._stop_length(tokens, sampling.stop)
                if stopped is not None:
                    tokens, finish_reason = tokens[:stopped], "stop"
            completions.append(
                Completion(
                    text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                    prompt_token_ids=list(ids),
                    token_ids=tokens,
                    logprobs=logprobs[row][: len(tokens)],
                    finish_reason=finish_reason,
                )
            )
        # The compacting loop has reported the rows that ended with an end-of-sequence token.
        unreported = (
            [c for c in completions if c.finish_reason == "length"]
            if self.compact_finished_rows
            else completions
        )
        report_generated(0, len(unreported))
        return completions

    def _stop_length(self, tokens: list[int], stops: tuple[str, ...]) -> int | None:
        """The length of the shortest prefix of ``tokens`` whose text holds one of ``stops`` (a
        prefix that holds one, every longer one does too: found by bisection), or ``None``."""

        def holds(length: int) -> bool:
            text = self.tokenizer.decode(tokens[:length], skip_special_tokens=True)
            return any(stop in text for stop in stops)

        if not holds(len(tokens)):
            return None
        low, high = 1, len(tokens)
        while low < high:
            middle = (low + high) // 2
            if holds(middle):
                high = middle
            else:
                low = middle + 1
        return low

    @contextmanager
    def _adapter(self, adapter: str | None) -> Iterator[None]:
        if adapter is None:
            with self.model.disable_adapter() if _is_peft(self.model) else nullcontext():
                yield
            return
        if self.model.active_adapter != adapter:
            self.model.set_adapter(adapter)
        yield

    @contextmanager
    def _preserved_model_state(self) -> Iterator[None]:
        """Eval mode during generation; afterwards the previous mode, active adapter and
        ``requires_grad`` flags (``set_adapter`` changes them) come back."""
        was_training = self.model.training
        peft = _is_peft(self.model)
        active = self.model.active_adapter if peft else None
        flags = [(p, p.requires_grad) for p in self.model.parameters()] if peft else []
        self.model.eval()
        try:
            yield
        finally:
            if peft and self.model.active_adapter != active:
                if isinstance(active, str):
                    self.model.set_adapter(active)
                else:
                    self.model.base_model.set_adapter(active)
            for parameter, flag in flags:
                if parameter.requires_grad != flag:
                    parameter.requires_grad_(flag)
            self.model.train(was_training)

    @contextmanager
    def _seeded(self, seed: int | None) -> Iterator[None]:
        if seed is None:
            yield
            return
        device = next(self.model.parameters()).device
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(int(seed))
            yield
