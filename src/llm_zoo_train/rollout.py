"""Rollouts: playing envs with an engine and recording every sampled action as a :class:`Sample`.

Three modes, all batched across envs (one engine call per step of every live env):

* :func:`tree_rollout` - AT-GRPO (arXiv 2510.11062). At every step of every env the acting agent
  samples K candidates from one state (one engine call with ``n=K`` for all live envs); each
  candidate is applied to its own copy of the env and scored with that agent's reward on that copy;
  the K candidates form the group ``(env, turn, agent)``; the episode continues from the
  highest-reward copy (ties broken by ``rng``), which is then the state every agent plays on.
* :func:`independent_rollout` - the baseline: K independent episodes per env (same seed, so the
  same task), ``n=1`` per step; samples are grouped per ``(env, turn, agent)`` the same way, so
  the advantage and loss code is shared.
* :func:`evaluation_rollout` - one episode per seed, no branching, returning per-episode results.

The tree rollout is built so that the seed system's bugs (REFERENCE.md) cannot happen: group keys
are made from the env's position only once (``group_key(env_index, turn, agent)``); candidate k is
stepped on clone k, created from the live env before any candidate is stepped, and its reward is
read from clone k right after its own step; the chosen clone *replaces* the live env, so the next
agent's prompt is observed on it.

Seeding: with ``SamplingParams.seed`` set, engine call ``c`` of a rollout samples with a seed
derived from ``(seed, c)``, so one seed gives one rollout, and successive calls do not repeat one
random stream.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

import llm_zoo
from llm_zoo_train.engines.base import Completion, Engine, SamplingParams
from llm_zoo_train.samples import Sample, group_key

__all__ = ["EpisodeResult", "evaluation_rollout", "independent_rollout", "tree_rollout"]

# Rewards this close to the best count as tied for the greedy choice.
_TIE = 1e-12


@dataclass
class EpisodeResult:
    """The outcome of one evaluation episode.

    Attributes:
        env_index: Position of the episode's seed in ``seeds``.
        task_id: The env's task instance id.
        success: The env reported success (sticky) by the end of the episode.
        turns: Number of turns in which at least one agent acted.
        rewards: Sum of each agent's rewards (role + alpha x global) over the episode.
        role_rewards: Sum of each agent's role rewards.
        global_rewards: Sum of the global rewards each agent received after its actions.
        format_ok_rate: Fraction of actions the env could parse.
    """

    env_index: int
    task_id: str
    success: bool
    turns: int
    rewards: dict[str, float] = field(default_factory=dict)
    role_rewards: dict[str, float] = field(default_factory=dict)
    global_rewards: dict[str, float] = field(default_factory=dict)
    format_ok_rate: float = 1.0


# ---------------------------------------------------------------------- shared pieces


def _make_env(
    env_id: str, env_kwargs: Mapping[str, Any], seed: int, agent_adapters: Mapping[str, str | None]
) -> Any:
    env = llm_zoo.make(env_id, **dict(env_kwargs))
    env.reset(seed=int(seed))
    agents = list(env.possible_agents)
    missing = [a for a in agents if a not in agent_adapters]
    unknown = [a for a in agent_adapters if a not in agents]
    if missing or unknown:
        raise ValueError(
            f"agent_adapters must name an adapter (or None) for every agent of {env_id} "
            f"{agents}: missing {missing}, unknown {unknown}"
        )
    return env


def _is_done(env: Any) -> bool:
    return not env.agents or all(env.terminations[a] or env.truncations[a] for a in env.agents)


def _call_sampling(sampling: SamplingParams, call_index: int) -> SamplingParams:
    if sampling.seed is None:
        return sampling
    seed = int(np.random.SeedSequence([int(sampling.seed), call_index]).generate_state(1)[0])
    return replace(sampling, seed=seed)


def _generate(
    engine: Engine, prompts: list[str], adapters: list[str | None], n: int, sampling: SamplingParams
) -> list[list[Completion]]:
    results = engine.generate(prompts, adapters, n, sampling)
    if len(results) != len(prompts) or any(len(group) != n for group in results):
        shape = [len(group) for group in results]
        raise RuntimeError(
            f"{type(engine).__name__}.generate returned {shape} completions for {len(prompts)} prompts x n={n}"
        )
    return results


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _step_and_record(
    env: Any,
    *,
    env_id: str,
    env_index: int,
    agent: str,
    adapter: str | None,
    prompt: str,
    completion: Completion,
    branch: int,
) -> Sample:
    """Step ``env`` (the agent to act must be ``agent``) with the completion; return its sample."""
    task_id, turn = str(env.task_id), int(env.turn)
    env.step(completion.text)
    info = env.infos[agent]
    return Sample(
        env_id=env_id,
        env_index=env_index,
        task_id=task_id,
        turn=turn,
        agent=agent,
        adapter=adapter,
        group_key=group_key(env_index, turn, agent),
        branch=branch,
        prompt=prompt,
        completion=completion.text,
        prompt_token_ids=list(completion.prompt_token_ids),
        completion_token_ids=list(completion.token_ids),
        behaviour_logprobs=list(completion.logprobs),
        reward=float(env.rewards[agent]),
        role_reward=float(info.get("role_reward", 0.0)),
        global_reward=float(info.get("global_reward", 0.0)),
        format_ok=bool(info.get("format_ok", True)),
        success=bool(info.get("success", False)),
        finish_reason=completion.finish_reason,
        extra={"info": {k: v for k, v in info.items() if _jsonable(v)}},
    )


# ---------------------------------------------------------------------- tree (AT-GRPO)


def tree_rollout(
    env_id: str,
    env_kwargs: Mapping[str, Any],
    seeds: Sequence[int],
    engine: Engine,
    agent_adapters: Mapping[str, str | None],
    num_generations: int,
    sampling: SamplingParams,
    rng: np.random.Generator,
) -> list[Sample]:
    """AT-GRPO tree rollouts: one episode per seed, K candidates per (turn, agent), greedy continue.

    Args:
        env_id: Registered env id, built with ``llm_zoo.make(env_id, **env_kwargs)``.
        env_kwargs: Constructor arguments of the env.
        seeds: One env per seed; the env's position in ``seeds`` is its ``env_index``.
        engine: Generates the candidates.
        agent_adapters: The adapter (or ``None``: base model) answering for each agent.
        num_generations: K, candidates per group.
        sampling: Sampling parameters (see the module docstring for seeding).
        rng: Breaks ties between equally rewarded candidates.

    Returns:
        All K candidates of every group, in order of sampling; ``chosen`` marks the branch each
        episode continued from.
    """
    k = int(num_generations)
    if k < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations!r}")
    envs = [_make_env(env_id, env_kwargs, seed, agent_adapters) for seed in seeds]
    live = [i for i, env in enumerate(envs) if not _is_done(env)]
    samples: list[Sample] = []
    call_index = 0
    while live:
        agents = [envs[i].agent_selection for i in live]
        prompts = [envs[i].observe(agent)["prompt"] for i, agent in zip(live, agents, strict=True)]
        adapters = [agent_adapters[agent] for agent in agents]
        groups = _generate(engine, prompts, adapters, k, _call_sampling(sampling, call_index))
        call_index += 1
        still_live = []
        for i, agent, prompt, adapter, completions in zip(
            live, agents, prompts, adapters, groups, strict=True
        ):
            # Every clone is taken before any candidate is stepped: siblings share one state.
            branches = [envs[i].clone() for _ in completions]
            group = [
                _step_and_record(
                    branch_env,
                    env_id=env_id,
                    env_index=i,
                    agent=agent,
                    adapter=adapter,
                    prompt=prompt,
                    completion=completion,
                    branch=b,
                )
                for b, (branch_env, completion) in enumerate(zip(branches, completions, strict=True))
            ]
            rewards = np.array([s.reward for s in group])
            if not np.isfinite(rewards).all():
                raise ValueError(
                    f"{env_id} gave {agent} non-finite rewards {rewards.tolist()} (env {i}, turn {group[0].turn})"
                )
            best = np.flatnonzero(rewards >= rewards.max() - _TIE)
            choice = int(best[0]) if best.size == 1 else int(rng.choice(best))
            group[choice].chosen = True
            samples.extend(group)
            envs[i] = branches[choice]
            if not _is_done(envs[i]):
                still_live.append(i)
        live = still_live
    return samples


# ---------------------------------------------------------------------- independent (baseline)


def independent_rollout(
    env_id: str,
    env_kwargs: Mapping[str, Any],
    seeds: Sequence[int],
    engine: Engine,
    agent_adapters: Mapping[str, str | None],
    num_generations: int,
    sampling: SamplingParams,
    rng: np.random.Generator,
) -> list[Sample]:
    """K independent full episodes per seed (the non-tree baseline), ``n=1`` per step.

    Arguments as :func:`tree_rollout` (``rng`` is unused: nothing is chosen). Episode ``b`` of env
    ``i`` records ``branch=b``; every sample is ``chosen`` (each episode continues from its own
    actions). Groups are ``(env_index, turn, agent)``: up to K samples, fewer at turns some
    episodes did not reach; after the first step their prompts differ (the episodes diverge).
    """
    del rng  # same signature as tree_rollout; independent episodes make no choice
    k = int(num_generations)
    if k < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations!r}")
    episodes: list[tuple[int, int, Any]] = []  # (env_index, branch, env)
    for i, seed in enumerate(seeds):
        env = _make_env(env_id, env_kwargs, seed, agent_adapters)
        episodes.extend((i, b, env if b == 0 else env.clone()) for b in range(k))
    live = [e for e in episodes if not _is_done(e[2])]
    samples: list[Sample] = []
    call_index = 0
    while live:
        agents = [env.agent_selection for _, _, env in live]
        prompts = [env.observe(agent)["prompt"] for (_, _, env), agent in zip(live, agents, strict=True)]
        adapters = [agent_adapters[agent] for agent in agents]
        outputs = _generate(engine, prompts, adapters, 1, _call_sampling(sampling, call_index))
        call_index += 1
        for (i, b, env), agent, prompt, adapter, (completion,) in zip(
            live, agents, prompts, adapters, outputs, strict=False
        ):
            sample = _step_and_record(
                env,
                env_id=env_id,
                env_index=i,
                agent=agent,
                adapter=adapter,
                prompt=prompt,
                completion=completion,
                branch=b,
            )
            sample.chosen = True
            samples.append(sample)
        live = [e for e in live if not _is_done(e[2])]
    order = (
        {agent: position for position, agent in enumerate(episodes[0][2].possible_agents)} if episodes else {}
    )
    samples.sort(key=lambda s: (s.env_index, s.turn, order[s.agent], s.branch))
    return samples


# ---------------------------------------------------------------------- evaluation


def evaluation_rollout(
    env_id: str,
    env_kwargs: Mapping[str, Any],
    seeds: Sequence[int],
    engine: Engine,
    agent_adapters: Mapping[str, str | None],
    sampling: SamplingParams,
) -> list[EpisodeResult]:
    """One episode per seed, one action per step (greedy when ``sampling.temperature == 0``)."""
    envs = [_make_env(env_id, env_kwargs, seed, agent_adapters) for seed in seeds]
    results = [
        EpisodeResult(
            env_index=i,
            task_id=str(env.task_id),
            success=False,
            turns=0,
            rewards={a: 0.0 for a in env.possible_agents},
            role_rewards={a: 0.0 for a in env.possible_agents},
            global_rewards={a: 0.0 for a in env.possible_agents},
        )
        for i, env in enumerate(envs)
    ]
    actions = [0] * len(envs)
    parsed = [0] * len(envs)
    live = [i for i, env in enumerate(envs) if not _is_done(env)]
    call_index = 0
    while live:
        agents = [envs[i].agent_selection for i in live]
        prompts = [envs[i].observe(agent)["prompt"] for i, agent in zip(live, agents, strict=True)]
        adapters = [agent_adapters[agent] for agent in agents]
        outputs = _generate(engine, prompts, adapters, 1, _call_sampling(sampling, call_index))
        call_index += 1
        for i, agent, (completion,) in zip(live, agents, outputs, strict=True):
            env, result = envs[i], results[i]
            result.turns = int(env.turn) + 1
            env.step(completion.text)
            info = env.infos[agent]
            result.rewards[agent] += float(env.rewards[agent])
            result.role_rewards[agent] += float(info.get("role_reward", 0.0))
            result.global_rewards[agent] += float(info.get("global_reward", 0.0))
            result.success = result.success or bool(info.get("success", False))
            actions[i] += 1
            parsed[i] += bool(info.get("format_ok", True))
        live = [i for i in live if not _is_done(envs[i])]
    for i, (env, result) in enumerate(zip(envs, results, strict=True)):
        result.success = result.success or bool(getattr(env, "success", False))
        result.format_ok_rate = parsed[i] / actions[i] if actions[i] else 1.0
    return results
