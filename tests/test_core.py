import pytest

from llm_zoo.testing import check_env, play_episode
from toy_envs import KeywordEnv


def test_check_env_accepts_the_toy_env():
    check_env(KeywordEnv, sample_actions=["apple", "banana", "", "hello"])


def test_reward_mixes_role_and_global_with_alpha():
    env = KeywordEnv(alpha=0.5, max_turns=2)
    trace = play_episode(env, lambda agent, prompt: KeywordEnv.keywords[agent], seed=3)
    (a, _, _, r_a, info_a), (b, _, _, r_b, info_b) = trace
    assert (a, b) == ("alice", "bob")
    assert r_a == pytest.approx(1.0) and info_a["global_reward"] == 0.0
    assert r_b == pytest.approx(1.0 + 0.5 * 1.0)
    assert info_b["role_reward"] == 1.0 and info_b["global_reward"] == 1.0 and info_b["success"]
    assert env.agents == []


def test_max_turns_truncates_every_agent():
    env = KeywordEnv(max_turns=3)
    trace = play_episode(env, lambda agent, prompt: "nothing", seed=0)
    assert [t[0] for t in trace] == ["alice", "bob"] * 3
    assert [t[4]["turn"] for t in trace] == [0, 0, 1, 1, 2, 2]


def test_malformed_action_gets_feedback_in_next_prompt():
    env = KeywordEnv()
    env.reset(seed=0)
    env.step("")
    assert env.infos["alice"]["format_ok"] is False
    env.step("banana")
    assert env.observe("alice")["prompt"].startswith("Your reply was empty.")


def test_same_seed_same_episode_and_rng_is_per_env():
    import numpy as np

    np.random.seed(0)
    first = KeywordEnv()
    first.reset(seed=7)
    np.random.seed(1)
    second = KeywordEnv()
    second.reset(seed=7)
    assert first.observe("alice") == second.observe("alice")


def test_clone_is_independent():
    env = KeywordEnv()
    env.reset(seed=1)
    twin = env.clone()
    twin.step("apple")
    assert env.agent_selection == "alice" and twin.agent_selection == "bob"
    assert env.said["alice"] is False


def test_constructor_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_turns"):
        KeywordEnv(max_turns=0)
    with pytest.raises(ValueError, match="render_mode"):
        KeywordEnv(render_mode="human")
