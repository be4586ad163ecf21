"""Team credit: which global (team) reward a sampled action is credited with.

An env reports, after every action, the team's global reward *at that moment*. For many teams that
moment is too early: a PlanPath tool agent's program only simulates its moves on a copy, so the
grid is solved (global 1) only after the plan agent plays them; a Code unit tester's tests only pay
off when the coder fixes its program on the next turn. Crediting the immediate global never
rewards an agent for what its action makes its teammates achieve.

So a candidate action of agent X is credited with the global reward *after the teammates' next
actions on its own branch*: the **look-ahead**. In a tree rollout, after the K candidates are
applied (each on its own clone), every branch is cloned once more and played on by the other
agents, in turn order, one sampled action each, with the current adapters, until X would act
again, the episode ends, or ``lookahead`` teammate actions were played. The global reward reported
after the last of them is the candidate's ``credited_global``, and its reward becomes::

    reward = role_reward + alpha * credited_global

(``alpha`` is the env's). Dead agents met on the way are stepped with ``None``, never generated
for. The look-ahead actions are a value estimate only: they are not trained on, their branch
copies are thrown away (the episode goes on from the candidate's own clone), and every look-ahead
position is one engine call, ``n=1``, for all branches of all envs that reach it. Their tokens are
counted in ``Sample.lookahead_tokens``.

``lookahead`` (``rollout.team_credit_lookahead``): ``-1`` (:data:`LOOKAHEAD_ROUND`, default) a full
round of teammates; ``-2`` (:data:`LOOKAHEAD_EPISODE`) every later action to the episode's end, the
acting agent's own included (at most :data:`EPISODE_LOOKAHEAD_CAP`): where an action pays off only
through the agent's own later move (KeyRelay's asker asks, the holder answers, the asker answers
the team), a round stops before that move and credits the question with nothing; ``0`` the
immediate global (no look-ahead, the behaviour before); ``n > 0`` at most ``n`` teammate actions
(never more than a round).

How the look-ahead's teammates answer (tree mode; config choices, defaults as above):

* ``samples`` (``rollout.team_credit_samples``, default 1): each branch's look-ahead is played
  ``samples`` times, from independent copies, and ``credited_global`` is the **mean** of their
  globals: an estimate of the team outcome the candidate leads to rather than one draw of it. One
  sample credits a failed program whenever the teammate's single guess happens to be right; the
  mean of ``m`` samples credits it with the teammate's guess *rate*, below what a right program
  earns as long as the teammate copies right results more often than it guesses. Cost: ``samples``
  times the look-ahead's generation (one engine call per position for all replicates).
* ``teammate`` (``rollout.team_credit_teammate``): ``"greedy"`` the teammates answer greedily
  (temperature 0), the team outcome under the teammates' most likely play: deterministic, no
  extra cost, but blind to what the teammates might do otherwise; ``"sampled"`` they sample at
  the rollout's temperature. ``"greedy"`` with ``samples > 1`` is refused (every replicate would
  be the same). The config's default, ``"auto"``, is greedy with one sample and sampled with
  several: on Math-v0 the one-sample sampled teammate credited failed programs whenever its guess
  happened to be right, and the team learned less with it than with a greedy teammate
  (docs/training/team-credit.md).

A counterfactual baseline (the candidate's team outcome minus the mean over its K siblings) is not
an option: the group-relative advantage already subtracts the group mean of the whole reward, so
subtracting the siblings' mean of its global part changes no advantage. What it would add, a
better estimate of each sibling's own team outcome, is what ``samples`` provides.

Independent episodes (the GRPO baseline) need no extra generation: their own next actions are the
look-ahead. :func:`credit_episode` credits each action with the same rule on the episode's own
trajectory and gives every action of agent A the episode return of A::

    return_A = sum over A's actions of (role_reward + alpha * credited_global)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llm_zoo_train.config.checks import (
    EPISODE_LOOKAHEAD_CAP,
    LOOKAHEAD_EPISODE,
    LOOKAHEAD_ROUND,
    TEAMMATES,
    check_lookahead,
    check_team_credit,
)
from llm_zoo_train.engines.base import Engine, SamplingParams
from llm_zoo_train.rollout.env_play import generate_checked, is_done, seeded_sampling, step_dead_agents
from llm_zoo_train.rollout.samples import Sample

__all__ = [
    "CREDIT_EPISODE",
    "CREDIT_IMMEDIATE",
    "CREDIT_LOOKAHEAD",
    "LOOKAHEAD_EPISODE",
    "LOOKAHEAD_ROUND",
    "TEAMMATES",
    "Lookahead",
    "apply_credit",
    "credit_disagreements",
    "credit_episode",
    "generated_tokens",
    "lookahead_limit",
    "run_lookahead",
    "team_credit_metrics",
]

#: ``Sample.credit``: the immediate global (look-ahead 0).
CREDIT_IMMEDIATE = "immediate"
#: ``Sample.credit``: the global after the tree rollout's look-ahead of teammate actions.
CREDIT_LOOKAHEAD = "lookahead"
#: ``Sample.credit``: independent episodes; ``reward`` is the agent's episode return.
CREDIT_EPISODE = "episode"
# Separates the look-ahead calls' sampling seeds from the candidates' (stream (call_index,)).
_LOOKAHEAD_STREAM = 1


def lookahead_limit(lookahead: int, num_agents: int) -> int:
    """Most actions looked at: a round of teammates (``num_agents - 1``), ``lookahead`` if fewer, or
    :data:`EPISODE_LOOKAHEAD_CAP` to the episode's end."""
    if lookahead == LOOKAHEAD_EPISODE:
        return EPISODE_LOOKAHEAD_CAP
    round_length = max(num_agents - 1, 0)
    return round_length if lookahead == LOOKAHEAD_ROUND else min(int(lookahead), round_length)


@dataclass
class Lookahead:
    """The look-ahead of one branch.

    Attributes:
        credited_global: The global reward after the last teammate action (the immediate global
            when none was played); with several samples, the mean over them.
        samples: Look-ahead replicates averaged (1 when none was played).
        steps: Teammate actions played (all replicates together).
        tokens: Tokens generated for them.
        trace: One record per teammate action: ``agent``, ``adapter``, ``prompt``, ``completion``,
            ``prompt_token_ids``, ``completion_token_ids``, ``behaviour_logprobs``,
            ``finish_reason`` (all a replay needs, as in :class:`~llm_zoo_train.rollout.samples.Sample`),
            the env's ``role_reward``, ``global_reward`` and ``format_ok`` after it, and the
            ``replicate`` it belongs to.
    """

    credited_global: float
    samples: int = 1
    steps: int = 0
    tokens: int = 0
    trace: list[dict[str, Any]] = field(default_factory=list)


def run_lookahead(
    branches: Sequence[tuple[Any, str, float]],
    engine: Engine,
    agent_adapters: Mapping[str, str | None],
    sampling: SamplingParams,
    call_index: int,
    lookahead: int,
    *,
    samples: int = 1,
    teammate: str = "auto",
) -> list[Lookahead]:
    """Play the teammates' next actions on a copy of every branch (see the module docstring).

    Args:
        branches: ``(env, agent, immediate_global)`` per branch: the env right after ``agent``'s
            candidate was stepped on it (it is cloned, never changed), and that step's global.
        engine: Generates the teammates' actions (``n=1``).
        agent_adapters: The adapter answering for each agent.
        sampling: Sampling parameters of the rollout; look-ahead position ``p`` after candidate call
            ``call_index`` samples with the seed stream ``(call_index, 1, p)``.
        call_index: Index of the engine call that sampled the candidates.
        lookahead: ``-1``, ``0`` or ``n > 0`` (see :func:`check_lookahead`).
        samples: Look-ahead replicates per branch, averaged (see the module docstring).
        teammate: ``"sampled"``, ``"greedy"``, or ``"auto"`` (greedy with one sample, sampled with
            several; see the module docstring).

    Returns:
        One :class:`Lookahead` per branch, in order.
    """
    lookahead = check_lookahead(lookahead)
    samples, teammate = check_team_credit(samples, teammate)
    if teammate == "greedy":
        sampling = dataclasses.replace(
            sampling, temperature=0.0, top_p=1.0, top_k=0
        ).without_agent_temperatures()
    results = [Lookahead(credited_global=float(immediate)) for _, _, immediate in branches]
    finals: list[list[float]] = [[] for _ in branches]
    # (branch position, replicate, copy, acting agent, limit, steps played, last global)
    active: list[list[Any]] = []
    for position, (env, agent, immediate) in enumerate(branches):
        limit = lookahead_limit(lookahead, len(env.possible_agents))
        if limit > 0 and not is_done(env):
            active.extend(
                [position, r, env.clone(), agent, limit, 0, float(immediate)] for r in range(samples)
            )
    played = list(active)
    step = 0
    while active:
        ready = []
        for entry in active:
            _, _, env, agent, limit, steps, _ = entry
            step_dead_agents(env)
            own_turn = env.agent_selection == agent and lookahead != LOOKAHEAD_EPISODE
            if is_done(env) or own_turn or steps >= limit:
                continue
            ready.append(entry)
        if not ready:
            break
        teammates = [entry[2].agent_selection for entry in ready]
        prompts = [entry[2].observe(a)["prompt"] for entry, a in zip(ready, teammates, strict=True)]
        adapters = [agent_adapters[a] for a in teammates]
        call_sampling = seeded_sampling(sampling, call_index, _LOOKAHEAD_STREAM, step)
        outputs = generate_checked(engine, prompts, adapters, 1, call_sampling, teammates)
        for entry, mate, prompt, adapter, (completion,) in zip(
            ready, teammates, prompts, adapters, outputs, strict=True
        ):
            position, replicate, env = entry[0], entry[1], entry[2]
            env.step(completion.text)
            info = env.infos[mate]
            entry[5] += 1
            entry[6] = float(info.get("global_reward", 0.0))
            result = results[position]
            result.steps += 1
            result.tokens += len(completion.token_ids)
            result.trace.append(
                {
                    "agent": mate,
                    "adapter": adapter,
                    "prompt": prompt,
                    "completion": completion.text,
                    "prompt_token_ids": list(completion.prompt_token_ids),
                    "completion_token_ids": list(completion.token_ids),
                    "behaviour_logprobs": list(completion.logprobs),
                    "finish_reason": completion.finish_reason,
                    "role_reward": float(info.get("role_reward", 0.0)),
                    "global_reward": entry[6],
                    "format_ok": bool(info.get("format_ok", True)),
                    "replicate": replicate,
                }
            )
        active = ready
        step += 1
    for entry in played:
        finals[entry[0]].append(entry[6])
    for result, values in zip(results, finals, strict=True):
        if values:
            result.credited_global = float(np.mean(values))
            result.samples = len(values)
    return results


def apply_credit(sample: Sample, outcome: Lookahead | None, alpha: float) -> None:
    """Credit ``sample`` (whose ``reward`` is still the env's) with a look-ahead's global.

    ``outcome`` ``None`` credits the immediate global (look-ahead 0). The env's reward is
    ``role + alpha * global``; the credited one replaces ``global`` by ``credited_global``.
    """
    if outcome is None:
        sample.credited_global = sample.global_reward
        sample.credit = CREDIT_IMMEDIATE
        return
    sample.credited_global = outcome.credited_global
    sample.credit = CREDIT_LOOKAHEAD
    sample.lookahead_steps = outcome.steps
    sample.lookahead_tokens = outcome.tokens
    sample.reward = sample.reward + alpha * (outcome.credited_global - sample.global_reward)
    if outcome.trace:
        sample.extra["lookahead"] = outcome.trace


def credit_episode(episode: Sequence[Sample], alpha: float, lookahead: int, num_agents: int) -> None:
    """Credit one independent episode's samples (in order of play) and set episode returns.

    Each action is credited with the global after the episode's own next teammate actions (the
    rule of :func:`run_lookahead`, no generation); then every sample of agent A gets
    ``reward = return_A`` and ``credit = "episode"`` (see the module docstring).
    """
    limit = lookahead_limit(check_lookahead(lookahead), num_agents)
    for index, sample in enumerate(episode):
        credited, steps = sample.global_reward, 0
        for later in episode[index + 1 :]:
            own_turn = later.agent == sample.agent and lookahead != LOOKAHEAD_EPISODE
            if own_turn or steps >= limit:
                break
            credited, steps = later.global_reward, steps + 1
        sample.credited_global, sample.lookahead_steps = credited, steps
    returns: dict[str, float] = {}
    for sample in episode:
        own = sample.reward + alpha * (sample.credited_global - sample.global_reward)
        returns[sample.agent] = returns.get(sample.agent, 0.0) + own
    for sample in episode:
        sample.reward = returns[sample.agent]
        sample.credit = CREDIT_EPISODE


def generated_tokens(samples: Sequence[Sample]) -> int:
    """Every token a rollout generated: the samples' completions and their look-aheads."""
    return sum(len(s.completion_token_ids) + s.lookahead_tokens for s in samples)


def team_credit_metrics(samples: Sequence[Sample]) -> dict[str, float]:
    """``rollout/lookahead_generations`` / ``rollout/lookahead_tokens`` (generated for look-aheads,
    not trained on), ``rollout/lookahead_token_share`` (of all generated tokens) and
    ``{agent}/credited_global`` (mean credited global part)."""
    lookahead_tokens = sum(s.lookahead_tokens for s in samples)
    total = generated_tokens(samples)
    metrics = {
        "rollout/lookahead_generations": float(
            sum(s.lookahead_steps for s in samples if s.credit == CREDIT_LOOKAHEAD)
        ),
        "rollout/lookahead_tokens": float(lookahead_tokens),
        "rollout/lookahead_token_share": lookahead_tokens / total if total else 0.0,
    }
    for agent in sorted({s.agent for s in samples}):
        credited = [s.credited_global for s in samples if s.agent == agent and s.credited_global is not None]
        metrics[f"{agent}/credited_global"] = float(np.mean(credited)) if credited else 0.0
    return metrics


def credit_disagreements(groups: Sequence[Sequence[tuple[float, float]]]) -> dict[str, int]:
    """How often credited globals disagree with what the candidates themselves caused.

    Args:
        groups: Per group of sibling candidates, ``(own, credited)`` per candidate: ``own`` is 1
            when the candidate itself was right (for Math-v0's tool agent: its program's printed
            answer is correct), else 0; ``credited`` its credited global (a mean in ``[0, 1]``
            with several look-ahead samples).

    Returns:
        ``candidates``; ``credited_failed`` (own 0, credited >= 0.5) and ``withheld_correct``
        (own 1, credited < 0.5), summed in ``disagreements``; over sibling pairs with one right
        and one wrong candidate: ``pairs``, ``pairs_misordered`` (the wrong one credited more) and
        ``pairs_tied`` (credited equally: no signal); ``groups`` and ``groups_flipped``: groups
        where some candidate's credited global lies on the other side of the group mean than its
        own correctness (its advantage's global part has the wrong sign); ``groups_spurious``:
        groups whose candidates were all equally right (or wrong) yet were credited differently
        (a signal none of them caused).
    """
    counts = dict.fromkeys(
        ("candidates", "credited_failed", "withheld_correct", "disagreements", "pairs", "pairs_misordered",
         "pairs_tied", "groups", "groups_flipped", "groups_spurious"), 0,
    )  # fmt: skip
    for group in groups:
        counts["groups"] += 1
        own_mean = float(np.mean([own for own, _ in group])) if group else 0.0
        credit_mean = float(np.mean([credited for _, credited in group])) if group else 0.0
        flipped = False
        for own, credited in group:
            counts["candidates"] += 1
            counts["credited_failed"] += int(own < 0.5 <= credited)
            counts["withheld_correct"] += int(credited < 0.5 <= own)
            flipped |= (own - own_mean) * (credited - credit_mean) < 0
        counts["groups_flipped"] += int(flipped)
        counts["groups_spurious"] += int(
            len({own for own, _ in group}) == 1 and len({credited for _, credited in group}) > 1
        )
        for own_i, credited_i in group:
            for own_j, credited_j in group:
                if own_i >= 0.5 > own_j:
                    counts["pairs"] += 1
                    counts["pairs_misordered"] += int(credited_i < credited_j)
                    counts["pairs_tied"] += int(credited_i == credited_j)
    counts["disagreements"] = counts["credited_failed"] + counts["withheld_correct"]
    return counts
