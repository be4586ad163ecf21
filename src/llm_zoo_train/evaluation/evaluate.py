"""Evaluation: the success rate of the current adapters on an env's evaluation tasks.

One episode per task seed, no branching (:func:`llm_zoo_train.rollout.tree.evaluation_rollout`),
at the env kind's evaluation temperature by default (:mod:`llm_zoo_train.evaluation.defaults`). The success rate comes with a 95% Wilson score interval, which stays inside
[0, 1] and is honest for the small episode counts a CPU run affords (the normal approximation
claims zero uncertainty at 0% or 100%).

The trainer calls :func:`evaluate` during a run; the command ``llm-zoo-train eval`` (also
``python -m llm_zoo_train.evaluation.cli``, implemented in :mod:`llm_zoo_train.evaluation.cli`) evaluates a
saved run, the base model, a role swap or a served model after it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from llm_zoo_train.engines.base import Engine, SamplingParams
from llm_zoo_train.rollout.tree import EpisodeResult, evaluation_rollout

__all__ = ["EvalResult", "episode_to_dict", "evaluate", "summarize", "wilson_interval"]


def wilson_interval(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% for the default ``z``)."""
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class EvalResult:
    """Evaluation summary.

    Attributes:
        num_episodes: Episodes played.
        successes: Episodes the env reported as solved.
        success_rate: ``successes / num_episodes``.
        ci_low: Lower end of the 95% Wilson interval of the success rate.
        ci_high: Upper end.
        mean_turns: Mean number of turns per episode.
        mean_rewards: Per agent, the mean over episodes of its return (its role rewards plus alpha
            x the global rewards of every agent's actions, as a PettingZoo user sums them).
        format_ok_rate: Mean over episodes of the fraction of actions the env could parse.
        mean_role_rewards: Per agent, the mean over episodes of its summed role reward.
        mean_global_rewards: Per agent, the mean over episodes of the summed global reward it
            received after its own actions.
        distinct_tasks: Distinct task ids among the episodes (fewer than ``num_episodes`` when
            tasks were drawn with replacement: repeated tasks count several times).
    """

    num_episodes: int
    successes: int
    success_rate: float
    ci_low: float
    ci_high: float
    mean_turns: float
    mean_rewards: dict[str, float] = field(default_factory=dict)
    format_ok_rate: float = 1.0
    mean_role_rewards: dict[str, float] = field(default_factory=dict)
    mean_global_rewards: dict[str, float] = field(default_factory=dict)
    distinct_tasks: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON-ready values."""
        return asdict(self)

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """Flat metrics for logging."""
        values: dict[str, float] = {
            f"{prefix}success_rate": self.success_rate,
            f"{prefix}success_ci_low": self.ci_low,
            f"{prefix}success_ci_high": self.ci_high,
            f"{prefix}num_episodes": float(self.num_episodes),
            f"{prefix}distinct_tasks": float(self.distinct_tasks),
            f"{prefix}mean_turns": self.mean_turns,
            f"{prefix}format_ok_rate": self.format_ok_rate,
        }
        values.update({f"{prefix}{agent}/reward": value for agent, value in self.mean_rewards.items()})
        return values

    def describe(self) -> str:
        """E.g. ``37.5% (95% CI 22.9-54.7%, 12/32 episodes)``; ``..., 12/32 episodes, 27 distinct
        tasks)`` when some task was played more than once."""
        repeated = (
            f", {self.distinct_tasks} distinct tasks" if 0 < self.distinct_tasks < self.num_episodes else ""
        )
        return (
            f"{100 * self.success_rate:.1f}% (95% CI {100 * self.ci_low:.1f}-{100 * self.ci_high:.1f}%, "
            f"{self.successes}/{self.num_episodes} episodes{repeated})"
        )


def summarize(episodes: Sequence[EpisodeResult]) -> EvalResult:
    """Aggregate episode results into an :class:`EvalResult`."""
    n = len(episodes)
    successes = sum(bool(e.success) for e in episodes)
    low, high = wilson_interval(successes, n)
    agents = sorted({a for e in episodes for a in e.rewards})

    def mean(values: Sequence[Mapping[str, float]], agent: str) -> float:
        return sum(v.get(agent, 0.0) for v in values) / n

    return EvalResult(
        num_episodes=n,
        successes=successes,
        success_rate=successes / n if n else 0.0,
        ci_low=low,
        ci_high=high,
        mean_turns=sum(e.turns for e in episodes) / n if n else 0.0,
        mean_rewards={a: mean([e.rewards for e in episodes], a) for a in agents} if n else {},
        format_ok_rate=sum(e.format_ok_rate for e in episodes) / n if n else 1.0,
        mean_role_rewards={a: mean([e.role_rewards for e in episodes], a) for a in agents} if n else {},
        mean_global_rewards={a: mean([e.global_rewards for e in episodes], a) for a in agents} if n else {},
        distinct_tasks=len({e.task_id for e in episodes}),
    )


def episode_to_dict(episode: EpisodeResult) -> dict[str, Any]:
    """One episode's result as plain JSON-ready values."""
    return asdict(episode)


def evaluate(
    engine: Engine,
    env_id: str,
    env_kwargs: Mapping[str, Any],
    seeds: Sequence[int],
    agent_adapters: Mapping[str, str | None],
    sampling: SamplingParams,
    problem_ids: Sequence[str] | None = None,
) -> tuple[EvalResult, list[EpisodeResult]]:
    """Play one episode per seed (on ``problem_ids[i]`` when given, see
    :mod:`llm_zoo_train.evaluation.tasks`) and summarize; returns the summary and the episodes."""
    episodes = evaluation_rollout(env_id, env_kwargs, seeds, engine, agent_adapters, sampling, problem_ids)
    return summarize(episodes), episodes
