"""The engine interface: how the trainer gets completions from a model.

An engine turns *raw env prompts* into sampled completions with their token ids and the
per-token log-probabilities of the sampling (behaviour) policy. The chat template is applied
inside the engine (envs produce plain text). Each prompt names the adapter (agent policy) that
answers it; ``None`` means the bare base model.

Implementations: :mod:`llm_zoo_train.engines.hf.engine` (transformers) and
:mod:`llm_zoo_train.engines.vllm.engine` (one vLLM engine, one LoRA per adapter).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "Completion",
    "Engine",
    "SamplingParams",
    "check_generate_args",
    "generation_progress",
    "reading_watched",
    "report_generated",
    "report_reading",
]

#: Where an engine reports what it has generated so far within one ``generate`` call (a context
#: variable, so it reaches the engine through any wrapper and stays with the calling thread).
_progress: ContextVar[Callable[[int, int], None] | None] = ContextVar(
    "llm_zoo_generation_progress", default=None
)


#: Where an engine reports its progress through a prompt pass (prefill), see :func:`report_reading`.
_reading: ContextVar[Callable[[int, int, int, int], None] | None] = ContextVar(
    "llm_zoo_reading_progress", default=None
)


@contextmanager
def generation_progress(
    callback: Callable[[int, int], None], reading: Callable[[int, int, int, int], None] | None = None
) -> Iterator[None]:
    """Within the block, engines call ``callback(new_tokens, finished_completions)`` while they
    generate (the transformers engine at every decode step, the vLLM engines as requests finish),
    so a caller can show life during a ``generate`` call of minutes. Engines that can also call
    ``reading(rows, positions, layers_done, layers)`` while they read prompts before the first
    token (:func:`report_reading`). Reporting changes nothing that is generated."""
    token = _progress.set(callback)
    reading_token = _reading.set(reading)
    try:
        yield
    finally:
        _reading.reset(reading_token)
        _progress.reset(token)


def report_generated(tokens: int, completions: int = 0) -> None:
    """Called by engines: ``tokens`` more tokens were generated and ``completions`` more
    completions finished since their last report (nothing happens outside :func:`generation_progress`)."""
    callback = _progress.get()
    if callback is not None:
        callback(int(tokens), int(completions))


def reading_watched() -> bool:
    """Whether a caller listens to :func:`report_reading` (an engine sets up nothing otherwise)."""
    return _reading.get() is not None


def report_reading(rows: int, positions: int, layers_done: int, layers: int) -> None:
    """Called by engines during a prompt pass (prefill): a forward pass over ``rows`` prompts of
    ``positions`` tokens each (padding included) has run ``layers_done`` of the model's ``layers``
    decoder layers (nothing happens outside :func:`generation_progress` with ``reading``)."""
    callback = _reading.get()
    if callback is not None:
        callback(int(rows), int(positions), int(layers_done), int(layers))


@dataclass(frozen=True)
class SamplingParams:
    """How to sample.

    Attributes:
        max_tokens: Most new tokens per completion (the config's ``max_completion_length``).
        temperature: Softmax temperature; ``0`` means greedy.
        top_p: Nucleus sampling mass (1.0 = off).
        top_k: Keep the k most likely tokens (0 or -1 = off).
        seed: Seed for this call's sampling, for reproducible rollouts (``None``: engine state).
        stop: Texts that end a completion: it ends with the first token that completes one of them
            (the text is kept, as vLLM's ``include_stop_str_in_output``; ``finish_reason`` "stop").
        per_agent: Per agent, ``temperature`` and/or ``max_tokens`` replacing the fields above for
            that agent's prompts (the config's ``agents.sampling``). The rollout splits a call by
            agent (:func:`llm_zoo_train.rollout.env_play.generate_checked`) and gives each engine
            call :meth:`for_agent`'s parameters, so an engine never sees a non-empty map. ``stop``
            may be overridden too.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    per_agent: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def for_agent(self, agent: str) -> SamplingParams:
        """The parameters of ``agent``'s prompts: these with its overrides applied, and no map."""
        overrides = self.per_agent.get(agent, {})
        return replace(self, per_agent={}, **overrides)

    def without_agent_temperatures(self) -> SamplingParams:
        """These parameters with the per-agent temperatures dropped (greedy play must stay greedy)."""
        per_agent = {
            agent: {k: v for k, v in o.items() if k != "temperature"} for agent, o in self.per_agent.items()
        }
        return replace(self, per_agent={agent: o for agent, o in per_agent.items() if o})


@dataclass
class Completion:
    """One sampled answer to one prompt.

    Attributes:
        text: The decoded completion (special tokens removed).
        prompt_token_ids: Token ids of the templated prompt the model saw.
        token_ids: Generated token ids, including the end-of-sequence token when one was produced.
        logprobs: Log-probability of each generated token under the sampling policy
            (temperature applied as configured: the behaviour policy), ``len(logprobs) ==
            len(token_ids)``.
        finish_reason: ``"stop"`` (end of sequence) or ``"length"`` (hit ``max_tokens``).
    """

    text: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


@runtime_checkable
class Engine(Protocol):
    """What the rollout needs from a generation backend."""

    def generate(
        self,
        prompts: Sequence[str],
        adapters: Sequence[str | None],
        n: int,
        sampling: SamplingParams,
    ) -> list[list[Completion]]:
        """Sample ``n`` completions for each prompt; ``adapters[i]`` answers ``prompts[i]``.

        Returns one list of ``n`` completions per prompt, in prompt order. The ``n`` completions
        of one prompt share one prefill where the backend allows it.
        """
        ...

    def load_adapters(self, paths: Mapping[str, str], version: int) -> None:
        """Serve the adapter weights saved (PEFT format) at ``paths[adapter_name]`` from now on.

        ``version`` increases with every update, so backends that cache by name can give each
        (adapter, version) a fresh name.
        """
        ...


def check_generate_args(
    prompts: Sequence[str], adapters: Sequence[str | None], n: int, sampling: SamplingParams
) -> None:
    """The checks every :meth:`Engine.generate` makes first: one adapter per prompt, ``n >= 1``,
    ``max_tokens >= 1``; raises ``ValueError`` naming the bad value."""
    if len(prompts) != len(adapters):
        raise ValueError(
            f"got {len(prompts)} prompts but {len(adapters)} adapters: give one adapter per prompt"
        )
    if int(n) < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    if int(sampling.max_tokens) < 1:
        raise ValueError(f"sampling.max_tokens must be >= 1, got {sampling.max_tokens!r}")
