"""The record of one sampled action: what the rollout produces and the update consumes."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["Sample", "episode_group_key", "group_key", "read_jsonl", "write_jsonl"]


@dataclass
class Sample:
    """One candidate action of one agent at one turn of one env, with everything to train on it.

    Attributes:
        env_id: Registered env id, e.g. ``"PlanPath-v0"``.
        env_index: Index of the env (episode) within the rollout batch.
        task_id: The env's task instance id (problem id or generated-task seed).
        turn: Turn number within the episode (0-based).
        agent: The acting agent (role).
        adapter: The adapter that generated the action (``None``: base model).
        group_key: The group the advantage compares this sample within. Tree rollouts:
            ``(env_index, turn, agent)`` as ``"e{env_index}/t{turn}/{agent}"`` (:func:`group_key`);
            the K candidates sampled from one state share it, and nothing else does. Independent
            rollouts: ``(env_index, agent)`` as ``"e{env_index}/{agent}"``
            (:func:`episode_group_key`): every action of that agent in the K episodes of that env.
        branch: Index of this candidate among the K of its group (independent rollouts: of its
            episode; samples of one group and branch are one draw and share one reward).
        prompt: The env's prompt text (before the chat template).
        completion: The decoded action text.
        prompt_token_ids: Templated prompt token ids.
        completion_token_ids: Generated token ids.
        behaviour_logprobs: Per-token log-probabilities under the sampling policy.
        reward: The reward the advantage uses. Tree rollouts: ``role_reward + alpha x
            credited_global``. Independent rollouts: the agent's episode return, the sum over its
            actions in the episode of ``role_reward + alpha x credited_global``
            (:mod:`llm_zoo_train.rollout.team_credit`).
        role_reward: The env's role reward for this action.
        global_reward: The env's immediate global (team) reward right after this action, before
            ``alpha``.
        format_ok: The env could parse the action.
        success: The env reported success right after this action.
        chosen: This candidate's branch is the one the episode continued from.
        finish_reason: ``"stop"`` or ``"length"``.
        advantage: Filled in by :mod:`llm_zoo_train.training.advantages`.
        extra: JSON-safe extras: ``info`` (the env's infos after the action) and, for a
            look-ahead, ``lookahead``: one record per teammate action played on a copy of this
            branch (its prompt, adapter, completion, token ids, logprobs and the env's rewards;
            :class:`llm_zoo_train.rollout.team_credit.Lookahead`), never trained on.
        credited_global: The global part credited in ``reward`` (before ``alpha``): the global
            after the look-ahead of teammate actions, or ``global_reward`` without one
            (``None``: a record written before team credit existed).
        credit: How ``credited_global`` was obtained: ``"immediate"`` (look-ahead 0),
            ``"lookahead"`` (tree rollout, teammates played on a copy of this branch) or
            ``"episode"`` (independent rollout, the episode's own next actions; ``reward`` is the
            episode return).
        lookahead_steps: Teammate actions after this one whose outcome was credited.
        lookahead_tokens: Tokens generated for this sample's look-ahead (not trained on).
        policy_version: The adapter version that generated the action: the number of updates the
            adapters had received (0: the initial adapters; ``None``: not recorded). Equal to the
            trained adapters' version in synchronous runs, older with ``rollout.async_steps``.
    """

    env_id: str
    env_index: int
    task_id: str
    turn: int
    agent: str
    adapter: str | None
    group_key: str
    branch: int
    prompt: str
    completion: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    behaviour_logprobs: list[float]
    reward: float
    role_reward: float
    global_reward: float
    format_ok: bool = True
    success: bool = False
    chosen: bool = False
    finish_reason: str = "stop"
    advantage: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    credited_global: float | None = None
    credit: str = "immediate"
    lookahead_steps: int = 0
    lookahead_tokens: int = 0
    policy_version: int | None = None


def group_key(env_index: int, turn: int, agent: str) -> str:
    """The group of the K candidates sampled for ``agent`` at ``turn`` of env ``env_index``."""
    return f"e{env_index}/t{turn}/{agent}"


def episode_group_key(env_index: int, agent: str) -> str:
    """The group of every action of ``agent`` in the K independent episodes of env ``env_index``."""
    return f"e{env_index}/{agent}"


def write_jsonl(samples: Iterable[Sample], path: str | Path) -> None:
    """Write samples one JSON object per line (append-safe, readable by :func:`read_jsonl`)."""
    with open(path, "w", encoding="utf-8") as handle:
        for sample in samples:
            handle.write(json.dumps(asdict(sample), ensure_ascii=False) + "\n")


def read_jsonl(path: str | Path) -> Iterator[Sample]:
    """Read samples written by :func:`write_jsonl`; a malformed line raises naming its number."""
    names = {f.name for f in fields(Sample)}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                unknown = set(record) - names
                if unknown:
                    raise ValueError(f"unknown fields {sorted(unknown)}")
                yield Sample(**record)
            except (ValueError, TypeError) as err:
                raise ValueError(f"{path}:{number}: not a valid sample record: {err}") from None
