"""The rollout of one training step, the same wherever it runs (the trainer or a generation process).

:func:`play_step` draws a step's task seeds, sampling seed and tie-break generator from ``(run
seed, step, process)`` (:mod:`llm_zoo_train.seeding`) and plays the tasks with the engine, so a
step's samples depend only on the seed, the step, the process and the adapter weights the engine
serves. The trainer calls it for synchronous rollouts, the generation process of
:mod:`llm_zoo_train.async_rollout` for rollouts generated ahead; both record rollouts with
:func:`save_step_rollout`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llm_zoo_train.config import Config, train_env_kwargs
from llm_zoo_train.engines.base import Completion, SamplingParams
from llm_zoo_train.rollout import independent_rollout, tree_rollout
from llm_zoo_train.samples import Sample, write_jsonl
from llm_zoo_train.seeding import Stream, derive_seed

__all__ = ["ROLLOUTS", "StepRollout", "TimedEngine", "play_step", "save_step_rollout"]

#: The rollout function of each ``rollout.mode``.
ROLLOUTS = {"tree": tree_rollout, "independent": independent_rollout}


class TimedEngine:
    """Wraps an engine and adds up the seconds spent generating (the rest of a rollout is env time).

    Args:
        engine: The engine that generates.
    """

    def __init__(self, engine: Any):
        self.engine = engine
        self.seconds = 0.0

    def generate(
        self, prompts: Sequence[str], adapters: Sequence[str | None], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        """``engine.generate``, timed."""
        start = time.perf_counter()
        try:
            return self.engine.generate(prompts, adapters, n, sampling)
        finally:
            self.seconds += time.perf_counter() - start

    def load_adapters(self, paths: Mapping[str, str], version: int) -> None:
        """``engine.load_adapters``."""
        self.engine.load_adapters(paths, version)


@dataclass
class StepRollout:
    """The samples of one training step and how they were produced.

    Attributes:
        step: The training step (1-based) the rollout is for.
        samples: Its samples, each with ``policy_version`` set.
        policy_version: The adapter version that generated them: the number of updates the
            adapters had received (0: the initial adapters).
        generation_seconds: Seconds spent in the engine's ``generate``.
        seconds: Seconds of the whole rollout (generation and env time).
    """

    step: int
    samples: list[Sample]
    policy_version: int
    generation_seconds: float
    seconds: float


def play_step(
    config: Config,
    agent_adapters: Mapping[str, str | None],
    engine: Any,
    step: int,
    rank: int,
    policy_version: int,
) -> StepRollout:
    """Play training step ``step``'s tasks of process ``rank`` with ``engine``.

    Args:
        config: The run's configuration (env, rollout settings, seed).
        agent_adapters: The adapter (or ``None``: base model) answering for each agent.
        engine: Serves the adapters of version ``policy_version``.
        step: The training step (1-based).
        rank: The process index (data-parallel runs roll out different tasks per process).
        policy_version: Recorded in every sample and in the result.
    """
    rollout, seed = config.rollout, config.training.seed
    start = time.perf_counter()
    task_rng = np.random.default_rng(derive_seed(seed, step, rank, Stream.TASKS))
    seeds = task_rng.integers(0, 2**30, size=rollout.envs_per_step).tolist()
    sampling = SamplingParams(
        max_tokens=rollout.max_completion_length,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        seed=derive_seed(seed, step, rank, Stream.SAMPLING),
    )
    timed = TimedEngine(engine)
    samples = ROLLOUTS[rollout.mode](
        config.env.id,
        train_env_kwargs(config),
        seeds,
        timed,
        agent_adapters,
        rollout.num_generations,
        sampling,
        np.random.default_rng(derive_seed(seed, step, rank, Stream.TIES)),
        team_credit_lookahead=rollout.team_credit_lookahead,
    )
    for sample in samples:
        sample.policy_version = policy_version
    return StepRollout(step, samples, policy_version, timed.seconds, time.perf_counter() - start)


def save_step_rollout(
    output_dir: str | Path, produced: StepRollout, rank: int, num_processes: int, recorder: Any
) -> None:
    """Write ``produced``'s samples to ``output_dir/rollouts/step_NNNNNN.jsonl`` and the engine
    calls ``recorder`` (a :class:`~llm_zoo_train.engines.replay.GenerationRecorder`) kept to
    ``step_NNNNNN.generations.jsonl`` (``-rankR`` before the suffix in multi-process runs)."""
    directory = Path(output_dir) / "rollouts"
    directory.mkdir(parents=True, exist_ok=True)
    suffix = f"-rank{rank}" if num_processes > 1 else ""
    write_jsonl(produced.samples, directory / f"step_{produced.step:06d}{suffix}.jsonl")
    recorder.write(directory / f"step_{produced.step:06d}{suffix}.generations.jsonl")
