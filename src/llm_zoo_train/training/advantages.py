"""Group-relative advantages (GRPO / AT-GRPO).

Samples are grouped by :attr:`~llm_zoo_train.rollout.samples.Sample.group_key`: in tree rollouts the
``(env, turn, agent)`` of the state they were sampled from, so an agent's candidates are only ever
compared with the other candidates for the same agent, turn and problem; in independent rollouts
``(env, agent)``, every action of that agent in the K episodes of that problem.

A group's statistics are taken over its *branches*: samples of one group that share
:attr:`~llm_zoo_train.rollout.samples.Sample.branch` are one draw (an independent episode, whose every
action carries the episode return) and must share its reward; in a tree group every sample is its
own branch. Within a group ``g`` with branch rewards ``R_g``::

    advantage_i = (r_i - mean(R_g)) / (std + epsilon)

where ``std`` depends on ``scale_rewards`` (names as in TRL's ``GRPOConfig``):

* ``"group"``: the standard deviation of ``R_g`` (GRPO);
* ``"batch"``: the standard deviation of the branch rewards of all groups passed in (more robust
  to tiny groups);
* ``"none"``: no division at all (Dr. GRPO: ``advantage_i = r_i - mean_g``).

Standard deviations are the unbiased estimate (``ddof = 1``, like ``torch.std``, which TRL and the
seed system use); a group of one sample has no spread.

A group whose rewards are all equal (a *zero-variance* group) carries no learning signal: with
``zero_variance_groups="keep"`` its samples get advantage exactly 0 (they still count in the
loss's token normaliser), with ``"drop"`` they are removed from the batch. Either way they are
counted in the returned statistics.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llm_zoo_train.rollout.samples import Sample

__all__ = ["SCALE_REWARDS", "ZERO_VARIANCE_GROUPS", "compute_advantages", "group_samples"]

#: Valid ``scale_rewards`` values.
SCALE_REWARDS = ("group", "batch", "none")
#: Valid ``zero_variance_groups`` values.
ZERO_VARIANCE_GROUPS = ("keep", "drop")
# Rewards closer than this count as equal (float noise from reward sums must not make a group
# look informative).
_EQUAL_REWARDS = 1e-9


def group_samples(samples: Sequence[Sample]) -> dict[str, list[Sample]]:
    """Samples by group key, groups in order of first appearance, samples in input order."""
    groups: dict[str, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(sample.group_key, []).append(sample)
    return groups


def _std(values: np.ndarray) -> float:
    return float(np.std(values, ddof=1)) if values.size > 1 else 0.0


def _branch_rewards(key: str, members: Sequence[Sample]) -> np.ndarray:
    """One reward per branch of the group; raises ``ValueError`` if a branch's samples disagree."""
    by_branch: dict[int, float] = {}
    for sample in members:
        seen = by_branch.setdefault(sample.branch, sample.reward)
        if abs(seen - sample.reward) > _EQUAL_REWARDS:
            raise ValueError(
                f"group {key!r}: samples of branch {sample.branch} have rewards {seen!r} and "
                f"{sample.reward!r}; samples sharing a group and a branch are one episode and must "
                "carry its one return"
            )
    return np.array(list(by_branch.values()), dtype=np.float64)


def compute_advantages(
    samples: list[Sample],
    *,
    scale_rewards: str = "group",
    zero_variance_groups: str = "keep",
    epsilon: float = 1e-4,
) -> tuple[list[Sample], dict[str, float]]:
    """Set ``sample.advantage`` on every sample (in place) and return the samples to train on.

    Args:
        samples: Samples of one or more groups (any order).
        scale_rewards: ``"group"``, ``"batch"`` or ``"none"`` (see the module docstring).
        zero_variance_groups: ``"keep"`` (advantage 0) or ``"drop"`` (removed).
        epsilon: Added to the standard deviation before dividing.

    Returns:
        ``(kept, stats)``: the kept samples in input order, and ``num_groups``,
        ``zero_variance_groups``, ``zero_variance_fraction`` (of groups), ``dropped`` (samples
        removed), ``num_samples`` (kept), ``reward_mean`` / ``reward_std`` (all samples, ddof 0),
        ``advantage_mean`` / ``advantage_std`` / ``advantage_abs_mean`` (kept samples, ddof 0).
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}; valid: {', '.join(SCALE_REWARDS)}")
    if zero_variance_groups not in ZERO_VARIANCE_GROUPS:
        raise ValueError(
            f"unknown zero_variance_groups {zero_variance_groups!r}; valid: {', '.join(ZERO_VARIANCE_GROUPS)}"
        )
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")

    rewards = np.array([s.reward for s in samples], dtype=np.float64)
    groups = group_samples(samples)
    branch_rewards = {key: _branch_rewards(key, members) for key, members in groups.items()}
    batch_std = _std(np.concatenate(list(branch_rewards.values()))) if groups else 0.0
    flat: set[str] = set()
    for key, members in groups.items():
        group_rewards = branch_rewards[key]
        if np.ptp(group_rewards) <= _EQUAL_REWARDS:
            flat.add(key)
            for sample in members:
                sample.advantage = 0.0
            continue
        centred = np.array([s.reward for s in members], dtype=np.float64) - group_rewards.mean()
        if scale_rewards == "group":
            centred = centred / (_std(group_rewards) + epsilon)
        elif scale_rewards == "batch":
            centred = centred / (batch_std + epsilon)
        for sample, advantage in zip(members, centred, strict=True):
            sample.advantage = float(advantage)

    if zero_variance_groups == "drop":
        kept = [s for s in samples if s.group_key not in flat]
    else:
        kept = list(samples)

    advantages = np.array([s.advantage for s in kept], dtype=np.float64)
    stats = {
        "num_groups": float(len(groups)),
        "zero_variance_groups": float(len(flat)),
        "zero_variance_fraction": len(flat) / len(groups) if groups else 0.0,
        "dropped": float(len(samples) - len(kept)),
        "num_samples": float(len(kept)),
        "reward_mean": float(rewards.mean()) if rewards.size else 0.0,
        "reward_std": float(rewards.std()) if rewards.size else 0.0,
        "advantage_mean": float(advantages.mean()) if advantages.size else 0.0,
        "advantage_std": float(advantages.std()) if advantages.size else 0.0,
        "advantage_abs_mean": float(np.abs(advantages).mean()) if advantages.size else 0.0,
    }
    return kept, stats
