"""Rollouts: playing envs with an engine and recording every sampled action as a :class:`Sample`.

Three modes, all batched across envs (one engine call per step of every live env):

* :func:`tree_rollout` - AT-GRPO (arXiv 2510.11062). At every step of every env the acting agent
  samples K candidates from one state (one engine call with ``n=K`` for all live envs); each
  candidate is applied to its own copy of the env and scored on that copy with the agent's role
  reward plus ``alpha`` times the team outcome it leads to: the global reward after the
  teammates' next actions on that branch (the *look-ahead*, :mod:`llm_zoo_train.rollout.team_credit`; one
  engine call per look-ahead position); the K candidates form the group ``(env, turn, agent)``;
  the episode continues from the highest-reward copy (ties broken by ``rng``), which is then the
  state every agent plays on. With ``team_credit_lookahead=0`` the global part is the immediate
  one and the rollout is the one before team credit existed.
* :func:`independent_rollout` - the baseline (the paper's GRPO): K independent episodes per env
  (same seed, so the same task), ``n=1`` per step; every action of agent A in episode k gets A's
  return in episode k as its reward, and the group is ``(env, agent)``: the K returns are compared.
* :func:`evaluation_rollout` - one episode per seed, no branching, returning per-episode results.

The tree rollout is built so that the seed system's bugs (REFERENCE.md) cannot happen: group keys
are made from the env's position only once (``group_key(env_index, turn, agent)``); candidate k is
stepped on clone k, created from the live env before any candidate is stepped, and its reward is
read from clone k right after its own step (its look-ahead plays on a further copy of clone k);
the chosen clone *replaces* the live env, so the next agent's prompt is observed on it.

Agents that finish before the others (PettingZoo AEC): every mode steps ``None`` for a selected
dead agent and never generates for it (:func:`llm_zoo_train.rollout.env_play.step_dead_agents`).

Seeding: with ``SamplingParams.seed`` set, engine call ``c`` of a rollout samples with a seed
derived from ``(seed, c)`` (its look-ahead position ``p`` from ``(seed, c, 1, p)``), so one seed
gives one rollout, and successive calls do not repeat one random stream.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llm_zoo_train.config.checks import LOOKAHEAD_ROUND, check_lookahead, check_team_credit
from llm_zoo_train.engines.base import Completion, Engine, SamplingParams
from llm_zoo_train.rollout.env_play import (
    generate_checked,
    is_done,
    make_env,
    seeded_sampling,
    step_dead_agents,
)
from llm_zoo_train.rollout.env_servers import map_envs
from llm_zoo_train.rollout.samples import Sample, episode_group_key, group_key
from llm_zoo_train.rollout.team_credit import Lookahead, apply_credit, credit_episode, run_lookahead

__all__ = [
    "EpisodeResult",
    "NonFiniteRewardError",
    "evaluation_rollout",
    "independent_rollout",
    "tree_rollout",
]

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
        rewards: Each agent's return as a PettingZoo user sums it: the rewards it received on every
            step, its own (role + alpha x global) and its teammates' (alpha x global).
        role_rewards: Sum of each agent's role rewards.
        global_rewards: Sum of the global rewards each agent received after its actions.
        format_ok_rate: Fraction of actions the env could parse.
        answer: The episode's final answer as the env read it: the ``answer`` info of the last action
            that reported one (as text; ``None`` when no action did, or the env reports none).
            :mod:`llm_zoo_train.evaluation.majority` votes on it.
    """

    env_index: int
    task_id: str
    success: bool
    turns: int
    rewards: dict[str, float] = field(default_factory=dict)
    role_rewards: dict[str, float] = field(default_factory=dict)
    global_rewards: dict[str, float] = field(default_factory=dict)
    format_ok_rate: float = 1.0
    answer: str | None = None


# ---------------------------------------------------------------------- shared pieces


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
        credited_global=float(info.get("global_reward", 0.0)),
        format_ok=bool(info.get("format_ok", True)),
        success=bool(info.get("success", False)),
        finish_reason=completion.finish_reason,
        extra={"info": {k: v for k, v in info.items() if _jsonable(v)}},
    )


def _still_live(envs: Sequence[Any]) -> list[bool]:
    """Step ``None`` for dead agents selected in each env; which envs still have an agent to act."""
    for env in envs:
        step_dead_agents(env)
    return [not is_done(env) for env in envs]


class NonFiniteRewardError(FloatingPointError, ValueError):
    """An env gave a NaN or infinite reward; ``str(error)`` names the env, agent, env index and turn."""


def _check_finite(env_id: str, agent: str, env_index: int, group: Sequence[Sample]) -> np.ndarray:
    rewards = np.array([s.reward for s in group])
    if not np.isfinite(rewards).all():
        raise NonFiniteRewardError(
            f"{env_id} gave {agent} non-finite rewards {rewards.tolist()} (env {env_index}, turn {group[0].turn})"
        )
    return rewards


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
    *,
    team_credit_lookahead: int = LOOKAHEAD_ROUND,
    first_env_index: int = 0,
    team_credit_samples: int = 1,
    team_credit_teammate: str = "auto",
) -> list[Sample]:
    """AT-GRPO tree rollouts: one episode per seed, K candidates per (turn, agent), greedy continue.

    Args:
        env_id: Registered env id, built with ``llm_zoo.make(env_id, **env_kwargs)``.
        env_kwargs: Constructor arguments of the env.
        seeds: One env per seed; the env's position in ``seeds`` plus ``first_env_index`` is its
            ``env_index``.
        engine: Generates the candidates and the look-ahead actions.
        agent_adapters: The adapter (or ``None``: base model) answering for each agent.
        num_generations: K, candidates per group.
        sampling: Sampling parameters (see the module docstring for seeding).
        rng: Breaks ties between equally rewarded candidates.
        team_credit_lookahead: Teammate actions played after each candidate to credit the team
            outcome: ``-1`` a full round (default), ``0`` the immediate global, ``n > 0`` at most
            ``n`` (:mod:`llm_zoo_train.rollout.team_credit`).
        first_env_index: The ``env_index`` of the first seed's env (a step's tasks played in
            parts, by different processes, keep distinct groups).
        team_credit_samples: Look-ahead replicates per candidate, their globals averaged.
        team_credit_teammate: ``"sampled"`` or ``"greedy"`` look-ahead teammates; ``"auto"``
            (default): greedy with one sample, sampled with several
            (:mod:`llm_zoo_train.rollout.team_credit`).

    Returns:
        All K candidates of every group, in order of sampling; ``chosen`` marks the branch each
        episode continued from, which is the candidate with the highest ``reward`` (role + alpha x
        credited global: the same reward the advantage uses).
    """
    k = int(num_generations)
    if k < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations!r}")
    lookahead = check_lookahead(team_credit_lookahead)
    credit_samples, teammate = check_team_credit(team_credit_samples, team_credit_teammate)
    envs = [make_env(env_id, env_kwargs, seed, agent_adapters) for seed in seeds]
    live = [i for i, alive in enumerate(_still_live(envs)) if alive]
    samples: list[Sample] = []
    call_index = 0
    while live:
        agents = [envs[i].agent_selection for i in live]
        prompts = [envs[i].observe(agent)["prompt"] for i, agent in zip(live, agents, strict=True)]
        adapters = [agent_adapters[agent] for agent in agents]
        groups = generate_checked(engine, prompts, adapters, k, seeded_sampling(sampling, call_index), agents)

        def branch_out(
            item: tuple[int, str, str, str | None, list[Completion]],
        ) -> tuple[int, list[Any], list[Sample]]:
            i, agent, prompt, adapter, completions = item
            # Every clone is taken before any candidate is stepped: siblings share one state.
            branches = [envs[i].clone() for _ in completions]
            group = [
                _step_and_record(
                    branch_env,
                    env_id=env_id,
                    env_index=first_env_index + i,
                    agent=agent,
                    adapter=adapter,
                    prompt=prompt,
                    completion=completion,
                    branch=b,
                )
                for b, (branch_env, completion) in enumerate(zip(branches, completions, strict=True))
            ]
            _check_finite(env_id, agent, first_env_index + i, group)
            return i, branches, group

        # Each env's branches are its own: envs on servers step concurrently, in-process in order.
        stepped = map_envs(branch_out, list(zip(live, agents, prompts, adapters, groups, strict=True)))
        branch_states = [
            (env, s.agent, s.global_reward)
            for _, branches, group in stepped
            for env, s in zip(branches, group, strict=True)
        ]
        credits: list[Lookahead | None] = (
            run_lookahead(
                branch_states,
                engine,
                agent_adapters,
                sampling,
                call_index,
                lookahead,
                samples=credit_samples,
                teammate=teammate,
            )
            if lookahead != 0
            else [None] * len(branch_states)
        )
        call_index += 1
        position = 0
        for i, branches, group in stepped:
            for sample in group:
                apply_credit(sample, credits[position], float(envs[i].alpha))
                position += 1
            rewards = _check_finite(env_id, group[0].agent, first_env_index + i, group)
            best = np.flatnonzero(rewards >= rewards.max() - _TIE)
            choice = int(best[0]) if best.size == 1 else int(rng.choice(best))
            group[choice].chosen = True
            samples.extend(group)
            envs[i] = branches[choice]
        live = [i for i, alive in zip(live, _still_live([envs[i] for i in live]), strict=True) if alive]
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
    *,
    team_credit_lookahead: int = LOOKAHEAD_ROUND,
    first_env_index: int = 0,
    team_credit_samples: int = 1,
    team_credit_teammate: str = "auto",
) -> list[Sample]:
    """K independent full episodes per seed (the paper's GRPO baseline), ``n=1`` per step.

    Arguments as :func:`tree_rollout` (``rng`` is unused: nothing is chosen). Episode ``b`` of env
    ``i`` records ``branch=b``; every sample is ``chosen`` (each episode continues from its own
    actions). Each action is credited with the global after the episode's own next teammate
    actions (``team_credit_lookahead`` of them, no extra generation); every sample of agent A in
    episode ``b`` gets A's episode return (the sum of ``role + alpha x credited global`` over A's
    actions in that episode) as ``reward``, and the group ``e{i}/{A}``
    (:func:`~llm_zoo_train.rollout.samples.episode_group_key`): the advantage compares A's K returns.
    ``team_credit_samples`` / ``team_credit_teammate`` must keep their defaults: the look-ahead
    is the episode's own next actions, nothing is generated for it.
    """
    del rng  # same signature as tree_rollout; independent episodes make no choice
    samples_per_branch, _ = check_team_credit(team_credit_samples, team_credit_teammate)
    if samples_per_branch != 1 or team_credit_teammate == "greedy":
        raise ValueError(
            "team_credit_samples / team_credit_teammate apply to tree rollouts only: independent episodes "
            "read the look-ahead from their own next actions"
        )
    k = int(num_generations)
    if k < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations!r}")
    lookahead = check_lookahead(team_credit_lookahead)
    episodes: list[tuple[int, int, Any]] = []  # (env_index, branch, env)
    for i, seed in enumerate(seeds):
        env = make_env(env_id, env_kwargs, seed, agent_adapters)
        episodes.extend((i, b, env if b == 0 else env.clone()) for b in range(k))
    played: dict[tuple[int, int], list[Sample]] = {(i, b): [] for i, b, _ in episodes}
    live = [e for e, alive in zip(episodes, _still_live([e[2] for e in episodes]), strict=True) if alive]
    call_index = 0
    while live:
        agents = [env.agent_selection for _, _, env in live]
        prompts = [env.observe(agent)["prompt"] for (_, _, env), agent in zip(live, agents, strict=True)]
        adapters = [agent_adapters[agent] for agent in agents]
        outputs = generate_checked(
            engine, prompts, adapters, 1, seeded_sampling(sampling, call_index), agents
        )
        call_index += 1

        def act(item: tuple[tuple[int, int, Any], str, str, str | None, list[Completion]]) -> None:
            (i, b, env), agent, prompt, adapter, (completion,) = item
            sample = _step_and_record(
                env,
                env_id=env_id,
                env_index=first_env_index + i,
                agent=agent,
                adapter=adapter,
                prompt=prompt,
                completion=completion,
                branch=b,
            )
            _check_finite(env_id, agent, first_env_index + i, [sample])
            sample.chosen = True
            sample.group_key = episode_group_key(first_env_index + i, agent)
            played[(i, b)].append(sample)  # one list per episode: no two calls share one

        map_envs(act, list(zip(live, agents, prompts, adapters, outputs, strict=True)))
        live = [e for e, alive in zip(live, _still_live([e[2] for e in live]), strict=True) if alive]
    samples: list[Sample] = []
    for i, b, env in episodes:
        credit_episode(played[(i, b)], float(env.alpha), lookahead, len(env.possible_agents))
        samples.extend(played[(i, b)])
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
    problem_ids: Sequence[str] | None = None,
) -> list[EpisodeResult]:
    """One episode per seed, one action per step (greedy when ``sampling.temperature == 0``);
    with ``problem_ids`` (one per seed) episode ``i`` plays problem ``problem_ids[i]``."""
    if problem_ids is not None and len(problem_ids) != len(seeds):
        raise ValueError(f"one problem id per seed: {len(problem_ids)} ids for {len(seeds)} seeds")
    chosen = [None] * len(seeds) if problem_ids is None else [{"problem_id": p} for p in problem_ids]
    envs = [
        make_env(env_id, env_kwargs, seed, agent_adapters, options)
        for seed, options in zip(seeds, chosen, strict=True)
    ]
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
    live = [i for i, alive in enumerate(_still_live(envs)) if alive]
    call_index = 0
    while live:
        agents = [envs[i].agent_selection for i in live]
        prompts = [envs[i].observe(agent)["prompt"] for i, agent in zip(live, agents, strict=True)]
        adapters = [agent_adapters[agent] for agent in agents]
        outputs = generate_checked(
            engine, prompts, adapters, 1, seeded_sampling(sampling, call_index), agents
        )
        call_index += 1

        def act(item: tuple[int, str, list[Completion]]) -> None:
            i, agent, (completion,) = item
            env, result = envs[i], results[i]  # one episode's own: no two calls share them
            result.turns = int(env.turn) + 1
            env.step(completion.text)
            info = env.infos[agent]
            for name, reward in env.rewards.items():  # the team's part reaches every agent
                result.rewards[name] = result.rewards.get(name, 0.0) + float(reward)
            result.role_rewards[agent] += float(info.get("role_reward", 0.0))
            result.global_rewards[agent] += float(info.get("global_reward", 0.0))
            result.success = result.success or bool(info.get("success", False))
            if info.get("answer") is not None:
                result.answer = str(info["answer"])
            actions[i] += 1
            parsed[i] += bool(info.get("format_ok", True))

        map_envs(act, list(zip(live, agents, outputs, strict=True)))
        live = [i for i, alive in zip(live, _still_live([envs[i] for i in live]), strict=True) if alive]
    for i, (env, result) in enumerate(zip(envs, results, strict=True)):
        result.success = result.success or bool(getattr(env, "success", False))
        result.format_ok_rate = parsed[i] / actions[i] if actions[i] else 1.0
    return results
