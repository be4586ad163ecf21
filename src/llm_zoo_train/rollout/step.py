"""The rollout of one training step, the same wherever it runs (the trainer or a generation process).

:func:`play_step` draws a step's task seeds, sampling seed and tie-break generator from ``(run
seed, step, process)`` (:mod:`llm_zoo_train.runs.seeding`) and plays the tasks with the engine, so a
step's samples depend only on the seed, the step, the process and the adapter weights the engine
serves. The trainer calls it for synchronous rollouts, the generation process of
:mod:`llm_zoo_train.rollout.asynchronous` for rollouts generated ahead; both record rollouts with
:func:`save_step_rollout`. A step's tasks can also be played in parts (``envs``: the trainer plays
some of an asynchronous step's tasks itself); each part has sampling and tie-break seeds of its own
and keeps its tasks' ``env_index``, and :func:`merge_parts` joins the parts into the step's rollout.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llm_zoo_train.config import Config, train_env_kwargs
from llm_zoo_train.config.agent_sampling import rollout_overrides
from llm_zoo_train.engines.base import Completion, SamplingParams
from llm_zoo_train.rollout.samples import Sample, write_jsonl
from llm_zoo_train.rollout.tree import independent_rollout, tree_rollout
from llm_zoo_train.runs.seeding import Stream, derive_seed

__all__ = ["ROLLOUTS", "StepRollout", "TimedEngine", "merge_parts", "play_step", "save_step_rollout"]

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
    envs: range | None = None,
) -> StepRollout:
    """Play training step ``step``'s tasks of process ``rank`` with ``engine``.

    Args:
        config: The run's configuration (env, rollout settings, seed).
        agent_adapters: The adapter (or ``None``: base model) answering for each agent.
        engine: Serves the adapters of version ``policy_version``.
        step: The training step (1-based).
        rank: The process index (data-parallel runs roll out different tasks per process).
        policy_version: Recorded in every sample and in the result.
        envs: Which of the step's ``rollout.envs_per_step`` tasks to play (``None``: all). A part
            draws its sampling and tie-break seeds from its first task's index, so two parts of
            a step never share random numbers; its samples keep the tasks' indices in the step.
    """
    rollout, seed = config.rollout, config.training.seed
    start = time.perf_counter()
    task_rng = np.random.default_rng(derive_seed(seed, step, rank, Stream.TASKS))
    seeds = task_rng.integers(0, 2**30, size=rollout.envs_per_step).tolist()
    everything = range(rollout.envs_per_step)
    envs = everything if envs is None else envs
    if envs.step != 1 or not envs or envs.start < 0 or envs.stop > len(everything):
        raise ValueError(f"envs must be a non-empty slice of range({len(everything)}), got {envs}")
    part = () if envs == everything else (envs.start,)  # the whole step keeps its seeds
    sampling = SamplingParams(
        max_tokens=rollout.max_completion_length,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        seed=derive_seed(seed, step, rank, Stream.SAMPLING, *part),
        per_agent=rollout_overrides(config),
    )
    timed = TimedEngine(engine)
    samples = ROLLOUTS[rollout.mode](
        config.env.id,
        train_env_kwargs(config),
        seeds[envs.start : envs.stop],
        timed,
        agent_adapters,
        rollout.num_generations,
        sampling,
        np.random.default_rng(derive_seed(seed, step, rank, Stream.TIES, *part)),
        team_credit_lookahead=rollout.team_credit_lookahead,
        team_credit_samples=rollout.team_credit_samples,
        team_credit_teammate=rollout.team_credit_teammate,
        first_env_index=envs.start,
    )
    for sample in samples:
        sample.policy_version = policy_version
    return StepRollout(step, samples, policy_version, timed.seconds, time.perf_counter() - start)


def merge_parts(parts: Sequence[StepRollout]) -> StepRollout:
    """One step's rollout from the parts of its tasks that :func:`play_step` played separately
    (same step and version): samples in task order, seconds added up (generation work, not wall)."""
    if not parts or len({(p.step, p.policy_version) for p in parts}) != 1:
        raise ValueError("merge_parts needs at least one part, all of one step and adapter version")
    ordered = sorted(parts, key=lambda p: min((s.env_index for s in p.samples), default=0))
    return StepRollout(
        step=parts[0].step,
        samples=[sample for part in ordered for sample in part.samples],
        policy_version=parts[0].policy_version,
        generation_seconds=sum(p.generation_seconds for p in parts),
        seconds=sum(p.seconds for p in parts),
    )


def save_step_rollout(
    output_dir: str | Path, produced: StepRollout, rank: int, num_processes: int, recorder: Any
) -> None:
    """Write ``produced``'s samples to ``output_dir/rollouts/step_NNNNNN.jsonl`` and the engine
    calls ``recorder`` (a :class:`~llm_zoo_train.rollout.replay.GenerationRecorder`) kept to
    ``step_NNNNNN.generations.jsonl`` (``-rankR`` before the suffix in multi-process runs)."""
    directory = Path(output_dir) / "rollouts"
    directory.mkdir(parents=True, exist_ok=True)
    suffix = f"-rank{rank}" if num_processes > 1 else ""
    write_jsonl(produced.samples, directory / f"step_{produced.step:06d}{suffix}.jsonl")
    recorder.write(directory / f"step_{produced.step:06d}{suffix}.generations.jsonl")
