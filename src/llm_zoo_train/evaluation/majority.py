"""Majority@K: one policy's commonest answer out of K sampled episodes per task.

The control that gives a single agent a team's sample budget. A team of two agents makes more model
calls per task than one agent does; part of a team's gain may be nothing but those extra samples,
and voting over samples buys that part without a teammate (majority voting explains most of
multi-agent debate's gain: arXiv 2508.17536). So a team is compared with the best single agent at
*equal samples*: majority@K, K the team's model calls per episode over the single agent's.

How it is scored:

* The policy plays every task ``k`` times at the sampling's temperature (above 0: greedy
  repetitions would all give one answer), each repetition with its own random stream.
* An episode's answer is :attr:`~llm_zoo_train.rollout.tree.EpisodeResult.answer`: the ``answer``
  info of its last action that reported one, the env's own reading of the final answer (Math-v0,
  KeyRelay-v0). Episodes without one do not vote.
* Per task, the answer given most often wins; a tie goes to the answer reached first, in repetition
  order. The task counts as solved when the episode that gave the winning answer succeeded: the
  env's own check, never a comparison of texts here. Answers that differ only in writing (``0.5``
  and ``1/2``) vote apart, which can only lower majority@K, never raise it.
* A task where no episode gave an answer fails.

:func:`evaluate_majority` returns the usual :class:`~llm_zoo_train.evaluation.evaluate.EvalResult`
over the per-task winners, so paired tests compare it with any other policy task by task.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from llm_zoo_train.engines.base import Engine, SamplingParams
from llm_zoo_train.evaluation.evaluate import EvalResult, summarize
from llm_zoo_train.rollout.tree import EpisodeResult, evaluation_rollout

__all__ = ["evaluate_majority", "majority_vote"]


def majority_vote(episodes: Sequence[EpisodeResult]) -> EpisodeResult:
    """The episode standing for one task's K repetitions: the first that gave the commonest answer,
    or, when none answered, the first repetition marked unsolved."""
    if not episodes:
        raise ValueError("majority_vote needs at least one episode")
    counts = Counter(e.answer for e in episodes if e.answer is not None)
    if not counts:
        return replace(episodes[0], success=False)
    top = max(counts.values())
    # Counter keeps first-seen order, so the first answer with the top count is the earliest one.
    winner = next(answer for answer, count in counts.items() if count == top)
    return next(e for e in episodes if e.answer == winner)


def evaluate_majority(
    engine: Engine,
    env_id: str,
    env_kwargs: Mapping[str, Any],
    seeds: Sequence[int],
    agent_adapters: Mapping[str, str | None],
    sampling: SamplingParams,
    k: int,
    problem_ids: Sequence[str] | None = None,
) -> tuple[EvalResult, list[EpisodeResult], list[list[EpisodeResult]]]:
    """Majority@``k`` on one task per seed (``problem_ids[i]`` when given).

    Returns the summary over the per-task winners, the winners (one per seed, in order) and every
    repetition's episodes (``repetitions[r][i]``: repetition ``r`` of task ``i``).

    Raises:
        ValueError: ``k`` below 1, or ``k > 1`` with greedy sampling.
    """
    if k < 1:
        raise ValueError(f"majority@K needs K >= 1, got {k}")
    if k > 1 and sampling.greedy:
        raise ValueError(
            "majority@K with K > 1 needs a temperature above 0: greedy repetitions give one answer"
        )
    repetitions = []
    for repetition in range(k):
        # Each repetition its own stream; repetition 0 keeps the caller's seed, as a plain evaluation.
        seed = None if sampling.seed is None else sampling.seed + repetition * 1_000_003
        repetitions.append(
            evaluation_rollout(
                env_id, env_kwargs, seeds, engine, agent_adapters, replace(sampling, seed=seed), problem_ids
            )
        )
    winners = [majority_vote([r[i] for r in repetitions]) for i in range(len(seeds))]
    return summarize(winners), winners, repetitions
