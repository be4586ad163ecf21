"""Group-relative advantages (llm_zoo_train.training.advantages) against hand-computed values."""

from __future__ import annotations

import math

import pytest

from llm_zoo_train.rollout.samples import Sample, group_key
from llm_zoo_train.training.advantages import compute_advantages, group_samples

# (env_index, turn, agent, reward) of three groups: A has rewards 3, 1; B is flat (2, 2, 2);
# C has 0, 0.5, 1. A and C are both alice at turn 0, in different envs: they must not mix.
ROWS = [
    (0, 0, "alice", 3.0),
    (1, 0, "alice", 0.0),
    (0, 0, "alice", 1.0),
    (0, 1, "bob", 2.0),
    (0, 1, "bob", 2.0),
    (1, 0, "alice", 0.5),
    (0, 1, "bob", 2.0),
    (1, 0, "alice", 1.0),
]
GROUP_A, GROUP_B, GROUP_C = [0, 2], [3, 4, 6], [1, 5, 7]
# Unbiased (ddof=1) standard deviations, by hand:
STD_A = math.sqrt((1.0**2 + 1.0**2) / 1)  # mean 2
STD_C = math.sqrt((0.5**2 + 0.0**2 + 0.5**2) / 2)  # mean 0.5 -> 0.5
# All eight rewards: mean 11.5 / 8 = 1.4375; squared deviations sum to 6.71875.
STD_BATCH = math.sqrt(6.71875 / 7)


def make_samples(rows=ROWS):
    return [
        Sample(
            env_id="test/Scripted-v0",
            env_index=e,
            task_id=f"seed-{e}",
            turn=t,
            agent=a,
            adapter=None,
            group_key=group_key(e, t, a),
            branch=i,
            prompt="p",
            completion="c",
            prompt_token_ids=[1],
            completion_token_ids=[2],
            behaviour_logprobs=[-0.1],
            reward=r,
            role_reward=r,
            global_reward=0.0,
        )
        for i, (e, t, a, r) in enumerate(rows)
    ]


def advantages_of(samples, indices):
    return [samples[i].advantage for i in indices]


def test_group_scaling_by_hand():
    samples = make_samples()
    kept, stats = compute_advantages(samples, scale_rewards="group", epsilon=0.0)
    assert kept == samples
    assert advantages_of(samples, GROUP_A) == pytest.approx([1.0 / STD_A, -1.0 / STD_A])
    assert advantages_of(samples, GROUP_A) == pytest.approx([0.70710678, -0.70710678])
    assert advantages_of(samples, GROUP_C) == pytest.approx([-1.0, 0.0, 1.0])
    assert advantages_of(samples, GROUP_B) == [0.0, 0.0, 0.0]
    assert stats["num_groups"] == 3 and stats["zero_variance_groups"] == 1
    assert stats["dropped"] == 0 and stats["num_samples"] == 8
    assert stats["zero_variance_fraction"] == pytest.approx(1 / 3)
    assert stats["reward_mean"] == pytest.approx(1.4375)
    assert stats["reward_std"] == pytest.approx(math.sqrt(6.71875 / 8))


def test_epsilon_is_added_to_the_std():
    samples = make_samples()
    compute_advantages(samples, scale_rewards="group", epsilon=0.5)
    assert advantages_of(samples, GROUP_C) == pytest.approx([-0.5 / 1.0, 0.0, 0.5 / 1.0])
    compute_advantages(samples)  # default epsilon 1e-4
    assert samples[7].advantage == pytest.approx(0.5 / (0.5 + 1e-4))


def test_batch_scaling_by_hand():
    samples = make_samples()
    compute_advantages(samples, scale_rewards="batch", epsilon=0.0)
    assert advantages_of(samples, GROUP_A) == pytest.approx([1.0 / STD_BATCH, -1.0 / STD_BATCH])
    assert advantages_of(samples, GROUP_C) == pytest.approx([-0.5 / STD_BATCH, 0.0, 0.5 / STD_BATCH])
    assert advantages_of(samples, GROUP_B) == [0.0, 0.0, 0.0]


def test_no_scaling_only_centres():
    samples = make_samples()
    _, stats = compute_advantages(samples, scale_rewards="none")
    assert advantages_of(samples, GROUP_A) == pytest.approx([1.0, -1.0])
    assert advantages_of(samples, GROUP_C) == pytest.approx([-0.5, 0.0, 0.5])
    assert stats["advantage_mean"] == pytest.approx(0.0)
    assert stats["advantage_abs_mean"] == pytest.approx((1 + 1 + 0.5 + 0.5) / 8)


def test_zero_variance_groups_can_be_dropped_and_are_counted():
    samples = make_samples()
    kept, stats = compute_advantages(samples, zero_variance_groups="drop", epsilon=0.0)
    assert [s.branch for s in kept] == [0, 1, 2, 5, 7]  # input order, group B gone
    assert stats["dropped"] == 3 and stats["zero_variance_groups"] == 1 and stats["num_samples"] == 5
    assert advantages_of(samples, GROUP_C) == pytest.approx([-1.0, 0.0, 1.0])


def test_a_group_of_one_and_float_noise_count_as_zero_variance():
    samples = make_samples([(0, 0, "alice", 1.0), (1, 0, "alice", 0.1 + 0.2), (1, 0, "alice", 0.3)])
    kept, stats = compute_advantages(samples, zero_variance_groups="drop")
    assert kept == [] and stats["zero_variance_groups"] == 2 and stats["dropped"] == 3
    assert stats["advantage_mean"] == 0.0


def test_groups_are_keyed_by_env_turn_and_agent():
    groups = group_samples(make_samples())
    assert list(groups) == ["e0/t0/alice", "e1/t0/alice", "e0/t1/bob"]
    assert [len(g) for g in groups.values()] == [2, 3, 3]


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match=r"scale_rewards.*group, batch, none"):
        compute_advantages(make_samples(), scale_rewards="std")
    with pytest.raises(ValueError, match=r"zero_variance_groups.*keep, drop"):
        compute_advantages(make_samples(), zero_variance_groups="filter")
    with pytest.raises(ValueError, match="epsilon"):
        compute_advantages(make_samples(), epsilon=-1.0)


def test_empty_batch():
    kept, stats = compute_advantages([])
    assert kept == [] and stats["num_groups"] == 0 and stats["reward_mean"] == 0.0
