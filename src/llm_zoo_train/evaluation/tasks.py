"""Which tasks an evaluation plays: one per seed, or a fixed set of distinct held-out problems.

By default (``eval.distinct_problems: false``) evaluation episode ``i`` resets the env with seed
``eval.seed + i`` and the env draws its task from that seed, so a finite problem set is sampled
*with replacement*: 64 episodes on Math-v0's 100 level-1 test problems were 45 distinct ones, the
repeated ones counted several times. With ``eval.distinct_problems: true`` the env's problem list
(:func:`task_ids`: Math-v0's ``problem_set.distinct_ids()``, deduplicated by content; Code-v0's
problem ids) is evaluated once per problem: all of it when ``eval.num_episodes`` is at least its
size, else ``num_episodes`` problems drawn *without replacement* with a seed derived from
``eval.seed`` (the same problems every time). Episode ``i`` still resets with seed
``eval.seed + i`` and picks its problem with ``options={"problem_id": ...}``.

Every evaluation reports how many distinct tasks it played (``EvalResult.distinct_tasks``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

import llm_zoo
from llm_zoo_train.runs.seeding import Stream, derive_seed

__all__ = ["EvalTasks", "eval_tasks", "task_ids"]


@dataclass
class EvalTasks:
    """The episodes of one evaluation.

    Attributes:
        seeds: One reset seed per episode.
        problem_ids: The problem of each episode (``None``: the env draws it from the seed).
        available: Distinct problems in the env's list (``None`` when no list is used).
    """

    seeds: list[int]
    problem_ids: list[str] | None = None
    available: int | None = None


def task_ids(env_id: str, env_kwargs: Mapping[str, Any]) -> list[str] | None:
    """The env's finite problem list without content duplicates, or ``None`` when it draws tasks
    from an unlimited space (generated training problems, grids): the env's ``task_ids()``
    (:meth:`llm_zoo.core.TextAECEnv.task_ids`; an env without one has no finite list)."""
    env = llm_zoo.make(env_id, **dict(env_kwargs))
    try:
        accessor = getattr(env, "task_ids", None)
        ids = accessor() if callable(accessor) else None
        return None if ids is None else [str(i) for i in ids]
    finally:
        env.close()


def eval_tasks(
    env_id: str,
    env_kwargs: Mapping[str, Any],
    num_episodes: int,
    seed: int,
    *,
    distinct: bool,
    required: bool = True,
) -> EvalTasks:
    """The evaluation's episodes (see the module docstring).

    Args:
        env_id: The env evaluated.
        env_kwargs: Its evaluation arguments.
        num_episodes: Episodes (seeded), or most distinct problems (``distinct``).
        seed: ``eval.seed``.
        distinct: Evaluate distinct problems from the env's list.
        required: With ``distinct``, an env without a finite list raises ``ValueError``; when
            false it falls back to seeded episodes (``llm-zoo-train eval`` on an unlimited train split).
    """
    seeded = EvalTasks([seed + i for i in range(num_episodes)])
    if not distinct or num_episodes <= 0:
        return seeded
    ids = task_ids(env_id, env_kwargs)
    if ids is None:
        if not required:
            return seeded
        raise ValueError(
            f"eval.distinct_problems needs an env with a finite problem list (Math-v0 on its test split "
            f"or a file, Code-v0); {env_id} with {dict(env_kwargs)} draws each task from the seed: set "
            "eval.env_kwargs to a finite split, or eval.distinct_problems to false"
        )
    chosen = ids
    if num_episodes < len(ids):
        rng = np.random.default_rng(derive_seed(seed, Stream.EVAL))
        picked = sorted(int(i) for i in rng.choice(len(ids), size=num_episodes, replace=False))
        chosen = [ids[i] for i in picked]
    return EvalTasks([seed + i for i in range(len(chosen))], chosen, len(ids))
