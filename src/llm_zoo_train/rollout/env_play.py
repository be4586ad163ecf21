"""The steps every rollout shares: making envs, stepping dead agents, seeded and checked generation.

Dead agents follow PettingZoo's AEC API: an agent whose ``terminations`` or ``truncations`` entry is
true while others still play must be stepped with ``None`` (never with text) when it is selected;
:func:`step_dead_agents` does that, so no rollout ever generates for a dead agent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from llm_zoo_train.engines.base import Completion, Engine, SamplingParams
from llm_zoo_train.rollout import env_servers

__all__ = ["generate_checked", "is_done", "make_env", "seeded_sampling", "step_dead_agents"]


def make_env(
    env_id: str,
    env_kwargs: Mapping[str, Any],
    seed: int,
    agent_adapters: Mapping[str, str | None],
    options: Mapping[str, Any] | None = None,
) -> Any:
    """``llm_zoo.make(env_id, **env_kwargs)`` (on the env servers, if configured) reset with
    ``seed`` (and ``options``, e.g. ``{"problem_id": ...}``); every agent must have an adapter."""
    env = env_servers.make(env_id, **dict(env_kwargs))
    env.reset(seed=int(seed), options=dict(options) if options else None)
    agents = list(env.possible_agents)
    missing = [a for a in agents if a not in agent_adapters]
    unknown = [a for a in agent_adapters if a not in agents]
    if missing or unknown:
        raise ValueError(
            f"agent_adapters must name an adapter (or None) for every agent of {env_id} "
            f"{agents}: missing {missing}, unknown {unknown}"
        )
    return env


def is_done(env: Any) -> bool:
    """No agent is left to act: every agent is gone, terminated or truncated."""
    return not env.agents or all(env.terminations[a] or env.truncations[a] for a in env.agents)


def step_dead_agents(env: Any) -> int:
    """Step ``None`` for the selected agent while it is dead and others still play; return how many.

    Raises:
        RuntimeError: The env selected an agent it no longer has (an env bug), naming it.
    """
    stepped = 0
    while not is_done(env):
        agent = env.agent_selection
        if agent not in env.agents:
            raise RuntimeError(
                f"{type(env).__name__} selected agent {agent!r}, which is not among its live agents "
                f"{list(env.agents)}: after a dead agent's step(None) the env must select a live agent"
            )
        if not (env.terminations[agent] or env.truncations[agent]):
            break
        env.step(None)
        stepped += 1
    return stepped


def seeded_sampling(sampling: SamplingParams, *stream: int) -> SamplingParams:
    """``sampling`` with a seed derived from ``(sampling.seed, *stream)`` (unchanged when unseeded),
    so every engine call of a rollout draws from its own random stream."""
    if sampling.seed is None:
        return sampling
    seed = int(np.random.SeedSequence([int(sampling.seed), *map(int, stream)]).generate_state(1)[0])
    return replace(sampling, seed=seed)


def generate_checked(
    engine: Engine,
    prompts: list[str],
    adapters: list[str | None],
    n: int,
    sampling: SamplingParams,
    agents: Sequence[str] | None = None,
) -> list[list[Completion]]:
    """``engine.generate``, raising ``RuntimeError`` when it does not return ``n`` per prompt.

    With per-agent sampling (``sampling.per_agent``) ``agents[i]`` is the agent of ``prompts[i]``:
    the prompts are generated in one call per distinct set of parameters (all of them at once when
    their agents sample alike), each call with :meth:`SamplingParams.for_agent`'s parameters and the
    call's seed, and the results come back in the prompts' order."""
    if not sampling.per_agent:
        return _generate_one_call(engine, prompts, adapters, n, sampling)
    if agents is None or len(agents) != len(prompts):
        raise ValueError("per-agent sampling needs the agent of every prompt")
    calls: dict[tuple[float, int, tuple[str, ...]], tuple[SamplingParams, list[int]]] = {}
    for row, agent in enumerate(agents):
        params = sampling.for_agent(agent)
        calls.setdefault((params.temperature, params.max_tokens, params.stop), (params, []))[1].append(row)
    results: list[list[Completion]] = [[] for _ in prompts]
    for params, rows in calls.values():
        outputs = _generate_one_call(
            engine, [prompts[r] for r in rows], [adapters[r] for r in rows], n, params
        )
        for row, output in zip(rows, outputs, strict=True):
            results[row] = output
    return results


def _generate_one_call(
    engine: Engine, prompts: list[str], adapters: list[str | None], n: int, sampling: SamplingParams
) -> list[list[Completion]]:
    results = engine.generate(prompts, adapters, n, sampling)
    if len(results) != len(prompts) or any(len(group) != n for group in results):
        shape = [len(group) for group in results]
        raise RuntimeError(
            f"{type(engine).__name__}.generate returned {shape} completions for {len(prompts)} prompts x n={n}"
        )
    return results
