"""PettingZoo's family-module convention for llm-zoo envs: ``raw_env``, ``env()``, ``parallel_env()``.

PettingZoo's own environments are made as ``from pettingzoo.classic import chess_v6;
env = chess_v6.env()``. Each built-in llm-zoo env has such a module in :mod:`llm_zoo.envs`:
``plan_path_v0``, ``sokoban_v0``, ``code_v0``, ``math_v0`` and ``math_relay_v0``::

    from llm_zoo.envs import plan_path_v0

    env = plan_path_v0.env(rows=5, cols=5)      # the same env as llm_zoo.make("PlanPath-v0", ...)
    parallel = plan_path_v0.parallel_env()      # the parallel view

Each module holds

* ``raw_env``: the env class;
* ``env(**kwargs)``: :func:`llm_zoo.make` of the env's id (arguments checked: a wrong one is an
  error naming the valid choices);
* ``parallel_env(**kwargs)``: PettingZoo's ``turn_based_aec_to_parallel`` of ``env(**kwargs)``,
  where one agent acts per parallel step. PettingZoo's ``aec_to_parallel`` refuses these envs:
  an agent later in a turn reads what the earlier ones answered in the same turn (see
  "PettingZoo conventions" in :mod:`llm_zoo.core`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pettingzoo.utils.conversions import turn_based_aec_to_parallel

from llm_zoo.registry import make

__all__ = ["family"]


def family(env_id: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``(env, parallel_env)`` for the registered ``env_id`` (module docstring)."""

    def env(**kwargs: Any) -> Any:
        return make(env_id, **kwargs)

    def parallel_env(**kwargs: Any) -> Any:
        return turn_based_aec_to_parallel(env(**kwargs))

    env.__doc__ = f"``llm_zoo.make({env_id!r}, **kwargs)``: the AEC env."
    parallel_env.__doc__ = f"The parallel view of ``env(**kwargs)`` ({env_id}): one agent acts per step."
    return env, parallel_env
