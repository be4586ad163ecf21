"""The vLLM engine: one colocated ``vllm.LLM`` serving the base model and one LoRA adapter per agent.

:class:`VLLMEngine` generates with vLLM's offline engine (``vllm.LLM``) in the trainer's own
process. The base model is loaded once; every adapter (agent policy) is a LoRA served with a
``LoRARequest``, so one batch mixes agents and the base model freely, and an update moves only the
adapter weights (a few MB), never the full model.

How one :meth:`VLLMEngine.generate` call runs:

1. Each prompt gets the tokenizer's chat template with :func:`llm_zoo_train.models.chat.encode_prompt`
   (the same function the transformers engine and the loss use) and goes to vLLM as a
   ``TokensPrompt``, so ``prompt_token_ids`` are exactly the ids the trainer scores.
2. Every prompt carries the ``LoRARequest`` of its adapter (``None``: the base model). All prompts
   go in one ``LLM.generate`` call; vLLM schedules them together.
3. ``n`` candidates per prompt are one request with ``SamplingParams(n=n)``: vLLM prefills the
   prompt once and the ``n`` samples share its KV-cache blocks (the tree rollout's K branches).
4. ``logprobs=0`` returns the log-probability of each sampled token. The engine is built with
   ``logprobs_mode="processed_logprobs"``: the log-softmax of the logits *after* temperature
   scaling (and top-k/top-p truncation when those are on), i.e. the behaviour policy that actually
   sampled. vLLM's default (``raw_logprobs``) would give the temperature-1 distribution instead.
   With ``top_k``/``top_p`` off this is ``log_softmax(logits / temperature)``, exactly what the
   transformers engine records and :func:`llm_zoo_train.training.loss.completion_logprobs` recomputes;
   greedy decoding records the temperature-1 logprob of the argmax, as the transformers engine
   does. With ``top_k``/``top_p`` on, vLLM records the truncated, renormalised distribution while
   the transformers engine records the untruncated one; the difference shows up in the logged
   train/inference mismatch and is what truncated importance sampling corrects.
5. ``SamplingParams.seed`` seeds every request: prompt ``i`` gets its own seed derived from
   ``(seed, i)`` (vLLM gives the ``n`` samples of one request ``seed + j``), so identical prompts in
   one call still get different samples, and one seed with one batch gives one result.

Adapter versions. vLLM caches adapters (and the prefix cache keys blocks) by adapter *name* and
integer id. Reloading new weights under an old name would serve stale weights or stale cached
prefixes, so :meth:`VLLMEngine.load_adapters` registers each changed adapter under a new name
``<adapter>-v<version>`` with a new integer id, and removes the previous version from the engine.

Base-model prompts on CPU. vLLM's CPU LoRA kernels (``vllm/lora/ops/torch_ops``) index the
stacked adapter weights with the "no LoRA" marker ``-1``, which selects the *last* adapter slot:
in a batch that mixes base-model prompts with LoRA prompts, the base-model prompts get an adapter's
weights (wrong text, no error; vLLM pull request 48421 fixes it upstream). On the CPU platform this
engine therefore serves ``None`` prompts with an all-zero LoRA adapter (same modules as the first
adapter, one extra slot): its delta is exactly 0, so the output is the base model's. GPU kernels
skip ``-1`` correctly and get plain ``None`` requests.

Seeded sampling on CPU needs whole prefills. vLLM 0.32 splits a prompt that does not fit the
step's token budget over several steps (chunked prefill) and then rewinds the request's random
generator by the tokens it drew and discarded; a CPU ``torch.Generator`` has no offset to rewind,
so the engine core dies (``RuntimeError: CPU Generator does not use offset``) as soon as a seeded
request is split, which happens whenever a batch's prompts exceed ``max_num_batched_tokens``. On
the CPU platform this engine therefore turns chunked prefill off (vLLM then raises the token
budget to at least ``max_model_len``, so every prompt is prefilled in one step).
:class:`~llm_zoo_train.engines.vllm.server_launch.LocalVLLMServer` does the same for servers.

Sleep mode (GPU only). With ``enable_sleep_mode=True`` the trainer can call :meth:`sleep` before
its update (vLLM offloads the weights to CPU memory and frees the KV cache, giving the GPU memory
to training) and :meth:`wake_up` before the next rollout. On CPU these calls are no-ops: vLLM's
CPU backend has no sleep mode, and its KV cache is sized by ``gpu_memory_utilization`` (a share of
the machine's memory) or ``kv_cache_memory_bytes``.

vLLM starts worker processes: scripts that build this engine need an
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import itertools
import logging
import shutil
import tempfile
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_zoo_train.engines.base import Completion, SamplingParams, check_generate_args
from llm_zoo_train.engines.vllm.requests import (
    VLLM_LORA_RANKS,
    FinishedRequests,
    adapter_rank,
    check_served_adapters,
    request_sampling_fields,
    supported_lora_rank,
    write_zero_adapter,
)
from llm_zoo_train.models.chat import encode_prompt

__all__ = ["VLLMEngine", "engine_from_config"]

logger = logging.getLogger(__name__)

_PROMPT_CACHE_SIZE = 4096


@dataclass(frozen=True)
class _ServedAdapter:
    """One adapter version registered in the vLLM engine."""

    adapter: str
    version: int
    path: str
    request: Any  # vllm.lora.request.LoRARequest


class VLLMEngine:
    """An :class:`~llm_zoo_train.engines.base.Engine` on a colocated ``vllm.LLM`` with one LoRA per adapter.

    Args:
        model: Directory (or hub id) of the base model, loadable by vLLM. The trainer passes the
            same directory the policy was loaded from.
        adapters: Adapter name -> directory of its saved PEFT adapter, served as version 0.
            Empty: only the base model (``None``) answers, unless ``max_lora_rank`` is given.
        tokenizer: The tokenizer for the chat template (default: vLLM's tokenizer of ``model``).
            Pass the trainer's tokenizer so both sides template prompts identically.
        system_prompt: A system message put before every prompt (``None``: none).
        max_lora_rank: Rank budget of the LoRA slots. Default: the largest rank of ``adapters``.
            Rounded up to a value vLLM accepts (1, 8, 16, 32, 64, 128, 256, 320, 512).
        max_loras: Adapters resident at once in the model (default: the number of adapters).
        max_cpu_loras: Adapters kept in vLLM's host cache (default ``max_loras + 1``, at least
            ``max_loras``).
        dtype: Weight/activation dtype of vLLM (``"auto"``: the model's; use ``"float32"`` on CPU
            to match a float32 trainer exactly).
        max_model_len: Longest prompt + completion in tokens (default: the model's context).
        gpu_memory_utilization: Share of accelerator memory vLLM may take (weights + KV cache).
            The default 0.3 leaves the rest to training on the same device (TRL's colocate
            default). On CPU it is the share of the machine's memory for the KV cache.
        kv_cache_memory_bytes: KV-cache size in bytes; overrides ``gpu_memory_utilization``.
        enforce_eager: Skip CUDA graphs / torch.compile (faster start, slower decode).
        enable_sleep_mode: Allow :meth:`sleep`/:meth:`wake_up` (CUDA/ROCm/XPU only).
        enable_prefix_caching: Reuse KV blocks of shared prompt prefixes (per adapter version).
        seed: vLLM's engine seed (sampling of requests without ``SamplingParams.seed``).
        llm_kwargs: Further ``vllm.LLM`` arguments (e.g. ``tensor_parallel_size``).
    """

    def __init__(
        self,
        model: str | Path,
        adapters: Mapping[str, str | Path] | None = None,
        *,
        tokenizer: Any = None,
        system_prompt: str | None = None,
        max_lora_rank: int | None = None,
        max_loras: int | None = None,
        max_cpu_loras: int | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.3,
        kv_cache_memory_bytes: int | None = None,
        enforce_eager: bool = False,
        enable_sleep_mode: bool = False,
        enable_prefix_caching: bool = True,
        seed: int = 0,
        llm_kwargs: Mapping[str, Any] | None = None,
    ):
        try:
            import vllm
            from vllm.platforms import current_platform
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError(
                'the vllm engine needs vLLM: `pip install "llm-zoo[vllm]"` (GPU), or see docs/vllm.md '
                "for the CPU package; or use engine 'hf'"
            ) from err

        adapters = {str(name): str(path) for name, path in (adapters or {}).items()}
        ranks = {name: adapter_rank(path) for name, path in adapters.items()}
        if enable_sleep_mode and not current_platform.is_sleep_mode_available():
            raise ValueError(
                f"enable_sleep_mode needs a CUDA, ROCm or XPU device; vLLM runs on {current_platform.device_type!r} "
                "here. Leave sleep mode off (it only frees accelerator memory)."
            )

        wanted_rank = max_lora_rank if max_lora_rank is not None else max(ranks.values(), default=None)
        self.enable_lora = wanted_rank is not None
        self.max_lora_rank = supported_lora_rank(wanted_rank) if wanted_rank is not None else None
        if self.max_lora_rank is not None and self.max_lora_rank != wanted_rank:
            logger.info(
                "vLLM accepts max_lora_rank only in %s: rounded the adapters' rank %d up to %d",
                VLLM_LORA_RANKS,
                wanted_rank,
                self.max_lora_rank,
            )
        too_big = {
            name: r for name, r in ranks.items() if self.max_lora_rank is not None and r > self.max_lora_rank
        }
        if too_big:
            raise ValueError(f"adapters {too_big} have a larger rank than max_lora_rank={max_lora_rank}")

        kwargs: dict[str, Any] = dict(
            model=str(model),
            dtype=dtype,
            seed=int(seed),
            gpu_memory_utilization=float(gpu_memory_utilization),
            enforce_eager=bool(enforce_eager),
            enable_prefix_caching=bool(enable_prefix_caching),
            enable_sleep_mode=bool(enable_sleep_mode),
            logprobs_mode="processed_logprobs",
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = int(max_model_len)
        if kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
        if current_platform.is_cpu():  # seeded requests must never be split (module docstring)
            kwargs["enable_chunked_prefill"] = False
        # vLLM's CPU LoRA ops apply the last adapter slot to base-model tokens (module docstring).
        self._zero_adapter_for_base = self.enable_lora and current_platform.is_cpu()
        if self.enable_lora:
            self.max_loras = int(max_loras) if max_loras is not None else max(1, len(adapters))
            slots = self.max_loras + int(self._zero_adapter_for_base)
            # One spare host slot: an update loads the new version before removing the old one.
            self.max_cpu_loras = max(slots, int(max_cpu_loras or slots + 1))
            kwargs.update(
                enable_lora=True,
                max_loras=slots,
                max_lora_rank=self.max_lora_rank,
                max_cpu_loras=self.max_cpu_loras,
            )
        kwargs.update(llm_kwargs or {})

        self.model = str(model)
        self.system_prompt = system_prompt
        self.sleep_mode = bool(enable_sleep_mode)
        self._asleep = False
        self._llm: Any = vllm.LLM(**kwargs)
        self.tokenizer = tokenizer if tokenizer is not None else self._llm.get_tokenizer()
        self.max_model_len = int(self._llm.llm_engine.model_config.max_model_len)
        self._served: dict[str, _ServedAdapter] = {}
        self._lora_ids = itertools.count(1)
        self._base_request: Any = None  # the zero adapter serving None prompts on CPU
        self._scratch = tempfile.mkdtemp(prefix="llm_zoo_vllm_")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._scratch, True)
        self._prompt_cache: OrderedDict[str, list[int]] = OrderedDict()
        if adapters:
            self.load_adapters(adapters, version=0)

    # ------------------------------------------------------------------ Engine interface

    def generate(
        self,
        prompts: Sequence[str],
        adapters: Sequence[str | None],
        n: int,
        sampling: SamplingParams,
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per prompt, ``adapters[i]`` answering ``prompts[i]``, in one vLLM call."""
        from vllm.inputs import TokensPrompt

        check_generate_args(prompts, adapters, n, sampling)
        check_served_adapters(adapters, self._served)
        if self._asleep:
            self.wake_up()
        if not prompts:
            return []

        encoded = [self.encode(prompt) for prompt in prompts]
        for ids in encoded:
            if len(ids) >= self.max_model_len:
                raise ValueError(
                    f"a templated prompt has {len(ids)} tokens, at least max_model_len={self.max_model_len}: "
                    "shorten the env's prompt or raise max_model_len"
                )
        requests = [self._served[a].request if a is not None else self._base_request for a in adapters]
        outputs = self._llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids in encoded],
            [self._sampling_params(sampling, int(n), index) for index in range(len(prompts))],
            lora_request=requests,
            use_tqdm=FinishedRequests,  # draws nothing; counts finished requests for the progress display
        )
        return [self._completions(output, ids) for output, ids in zip(outputs, encoded, strict=True)]

    def load_adapters(self, paths: Mapping[str, str | Path], version: int) -> None:
        """Serve the adapters saved at ``paths`` (adapter name -> PEFT dir) as ``<adapter>-v<version>``.

        Each adapter gets a name and an integer id never used before, and its previous version is
        removed from the engine. Adapters not in ``paths`` keep serving their current version.
        """
        from vllm.lora.request import LoRARequest

        if not self.enable_lora:
            raise ValueError(
                "this engine was built without LoRA (no adapters and no max_lora_rank): pass the adapters "
                "(or max_lora_rank) when building it"
            )
        version = int(version)
        for adapter, path in paths.items():
            path = str(path)
            rank = adapter_rank(path)
            if self.max_lora_rank is not None and rank > self.max_lora_rank:
                raise ValueError(
                    f"adapter {adapter!r} at {path} has rank {rank}, above this engine's max_lora_rank "
                    f"{self.max_lora_rank}: build the engine with max_lora_rank >= {rank}"
                )
            current = self._served.get(adapter)
            if current is not None and version <= current.version:
                raise ValueError(
                    f"adapter {adapter!r} is already served as version {current.version}; load new weights under "
                    f"a higher version (vLLM caches adapters by name, reusing one would serve stale weights)"
                )
            request = LoRARequest(f"{adapter}-v{version}", next(self._lora_ids), path)
            # Load the new version before dropping the old one: a failed load leaves the old serving.
            if not self._llm.llm_engine.add_lora(request):
                raise RuntimeError(f"vLLM could not load adapter {adapter!r} from {path}")
            if current is not None:
                self._llm.llm_engine.remove_lora(current.request.lora_int_id)
            self._served[adapter] = _ServedAdapter(adapter, version, path, request)
            logger.debug("vLLM serves adapter %s from %s", request.lora_name, path)
            if self._zero_adapter_for_base and self._base_request is None:
                zero_dir = write_zero_adapter(path, Path(self._scratch) / "base-zero")
                base_request = LoRARequest("llm-zoo-base-zero", next(self._lora_ids), str(zero_dir))
                if not self._llm.llm_engine.add_lora(base_request):
                    raise RuntimeError(
                        "vLLM could not load the zero adapter that serves the base model on CPU"
                    )
                self._base_request = base_request

    # ------------------------------------------------------------------ lifecycle

    @property
    def llm(self) -> Any:
        """The underlying ``vllm.LLM`` (for benchmarks and advanced use; do not load LoRAs through it)."""
        return self._llm

    def lora_request(self, adapter: str | None) -> Any:
        """The ``LoRARequest`` that serves ``adapter`` now (``None``: the base model's, which is
        ``None`` except on CPU, where it is the zero adapter)."""
        if adapter is None:
            return self._base_request
        if adapter not in self._served:
            raise ValueError(f"unknown adapter {adapter!r}; this engine serves {sorted(self._served)}")
        return self._served[adapter].request

    @property
    def served_adapters(self) -> dict[str, str]:
        """Adapter -> the versioned vLLM name now serving it (e.g. ``{"tool": "tool-v3"}``)."""
        return {adapter: served.request.lora_name for adapter, served in self._served.items()}

    def loaded_lora_ids(self) -> set[int]:
        """Integer ids of the LoRAs vLLM holds now (old versions are gone from here)."""
        return set(self._llm.llm_engine.list_loras())

    def sleep(self, level: int = 1) -> None:
        """Free accelerator memory for training: level 1 offloads the weights to CPU memory and drops
        the KV cache. A no-op unless the engine was built with ``enable_sleep_mode=True``."""
        if self.sleep_mode and not self._asleep:
            self._llm.sleep(level=level)
            self._asleep = True

    def wake_up(self) -> None:
        """Undo :meth:`sleep` (``generate`` also wakes the engine). A no-op when awake."""
        if self._asleep:
            self._llm.wake_up()
            self._asleep = False

    def close(self) -> None:
        """Stop vLLM's engine processes and free their memory; the engine is unusable afterwards."""
        llm = getattr(self, "_llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            self._llm = None
        self._cleanup()

    # ------------------------------------------------------------------ internals

    def encode(self, prompt: str) -> list[int]:
        """The templated token ids of ``prompt`` that vLLM is given (cached)."""
        cached = self._prompt_cache.get(prompt)
        if cached is None:
            cached = encode_prompt(self.tokenizer, prompt, self.system_prompt)
            self._prompt_cache[prompt] = cached
            if len(self._prompt_cache) > _PROMPT_CACHE_SIZE:
                self._prompt_cache.popitem(last=False)
        else:
            self._prompt_cache.move_to_end(prompt)
        return cached

    def _sampling_params(self, sampling: SamplingParams, n: int, index: int) -> Any:
        import vllm

        # Text is decoded here like the transformers engine does (vLLM's incremental detokenizer
        # holds back a trailing incomplete UTF-8 sequence, so the two texts could differ).
        return vllm.SamplingParams(**request_sampling_fields(sampling, n, index), detokenize=False)

    def _completions(self, output: Any, prompt_ids: list[int]) -> list[Completion]:
        completions = []
        for sample in sorted(output.outputs, key=lambda s: s.index):
            tokens = list(sample.token_ids)
            if sample.logprobs is None or len(sample.logprobs) != len(tokens):
                raise RuntimeError(
                    f"vLLM returned {0 if sample.logprobs is None else len(sample.logprobs)} logprobs for "
                    f"{len(tokens)} tokens"
                )
            logprobs = [
                float(step[token].logprob) for step, token in zip(sample.logprobs, tokens, strict=True)
            ]
            if sample.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM ended a request with finish_reason {sample.finish_reason!r}")
            completions.append(
                Completion(
                    text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                    prompt_token_ids=list(prompt_ids),
                    token_ids=tokens,
                    logprobs=logprobs,
                    finish_reason=sample.finish_reason,
                )
            )
        return completions


# Options read from the config's optional ``vllm`` section (defaults: the VLLMEngine arguments).
_CONFIG_OPTIONS = (
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "max_model_len",
    "dtype",
    "enforce_eager",
    "enable_sleep_mode",
    "enable_prefix_caching",
)


def _policy_lora_rank(policy: Any) -> int:
    """The largest LoRA rank among the policy's adapters (``r`` and any ``rank_pattern``)."""
    ranks = []
    for peft_config in policy.model.peft_config.values():
        ranks.append(int(peft_config.r))
        ranks.extend(int(r) for r in (getattr(peft_config, "rank_pattern", None) or {}).values())
    return max(ranks)


def engine_from_config(config: Any, policy: Any) -> VLLMEngine:
    """The trainer's vLLM engine for ``config`` (a :class:`llm_zoo_train.config.Config`) and ``policy``.

    The engine starts without adapters (LoRA slots for all of the policy's adapters, rank budget
    from their largest rank); the trainer loads the saved adapters as version 0 right after, and
    as a new version after each update. Engine options come from the config's ``vllm`` section
    when it has one; ``dtype`` defaults to ``model.dtype`` (float32 matches a float32 trainer
    exactly; bfloat16 is the usual choice on GPU, with the mismatch logged and optionally corrected
    by importance sampling).
    """
    from llm_zoo_train.engines.vllm.placement import engine_gpus, visible_devices
    from llm_zoo_train.models.policy import resolve_model_path

    try:
        import torch.distributed as dist

        world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    except (ImportError, RuntimeError):  # pragma: no cover - torch without distributed
        world_size = 1
    section = getattr(config, "vllm", None)
    options: dict[str, Any] = {"dtype": config.model.dtype}
    for name in _CONFIG_OPTIONS:
        value = getattr(section, name, None) if section is not None else None
        if value is not None:
            options[name] = value
    llm_kwargs: dict[str, Any] = {"trust_remote_code": True} if config.model.trust_remote_code else {}
    tensor_parallel_size = int(getattr(section, "tensor_parallel_size", 1) or 1)
    if tensor_parallel_size > 1:
        llm_kwargs["tensor_parallel_size"] = tensor_parallel_size
    # Each process's engine on its own GPU (or tensor-parallel group): engines/vllm/placement.py.
    with visible_devices(engine_gpus(world_size, tensor_parallel_size)):
        return VLLMEngine(
            resolve_model_path(config.model.name_or_path, config.model.cache_dir),
            tokenizer=policy.tokenizer,
            system_prompt=config.model.system_prompt,
            max_lora_rank=_policy_lora_rank(policy),
            max_loras=len(policy.adapter_names),
            seed=int(config.training.seed),
            llm_kwargs=llm_kwargs,
            **options,
        )
