import warnings

import pytest
from pettingzoo.test import render_test

import llm_zoo
from llm_zoo.core import TextAECEnv
from llm_zoo.testing import check_env, play_episode
from toy_envs import KeywordEnv

BUILTIN_IDS = ("PlanPath-v0", "Sokoban-v0", "Code-v0", "Math-v0")


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
    with pytest.raises(
        ValueError, match=r"render_mode must be one of \['ansi', 'human'\] or None, got 'rgb_array'"
    ):
        KeywordEnv(render_mode="rgb_array")


def test_human_mode_prints_the_ansi_picture(capsys):
    ansi, human = KeywordEnv(render_mode="ansi"), KeywordEnv(render_mode="human")
    ansi.reset(seed=4)
    human.reset(seed=4)
    assert human.render() is None
    assert capsys.readouterr().out == ansi.render() + "\n"
    with pytest.warns(UserWarning, match="without specifying any render mode"):
        assert KeywordEnv().render() is None  # no render_mode: nothing rendered, a warning


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_pettingzoo_render_test_passes_for_builtin_envs(env_id, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        render_test(lambda render_mode=None: llm_zoo.make(env_id, render_mode=render_mode))
    assert llm_zoo.make(env_id).metadata["render_modes"] == ["ansi", "human"]
    assert capsys.readouterr().out.strip()  # "human" printed the pictures


def test_unsupported_render_mode_names_the_supported_ones():
    with pytest.raises(ValueError, match=r"PlanPathEnv: render_mode must be one of \['ansi', 'human'\]"):
        llm_zoo.make("PlanPath-v0", render_mode="rgb_array")


@pytest.mark.parametrize("method", ["step", "observe", "render", "last"])
def test_using_an_env_before_reset_is_a_one_line_error(method):
    env = KeywordEnv(render_mode="ansi")
    calls = {
        "step": lambda: env.step("apple"),
        "observe": lambda: env.observe("alice"),
        "render": env.render,
        "last": env.last,
    }
    with pytest.raises(
        RuntimeError, match=r"^KeywordEnv\.\w+\(\) before reset\(\): call env\.reset\(\) first$"
    ):
        calls[method]()


def test_step_after_the_episode_is_over_says_so():
    env = KeywordEnv(max_turns=1)
    play_episode(env, lambda agent, prompt: "nothing", seed=0)
    with pytest.raises(RuntimeError, match="the episode is over"):
        env.step("apple")


def _env_class(name: str, **attributes: object) -> type:
    rules = {
        "_new_episode": lambda self, rng, options: None,
        "_prompt": lambda self, agent: "say something",
        "_act": lambda self, agent, action: KeywordEnv._act(self, agent, action),
        "_render_state": lambda self: "state",
        "said": {},
        "keywords": KeywordEnv.keywords,
    }
    return type(name, (TextAECEnv,), {**rules, **attributes})


def test_metadata_defaults_come_from_the_base_class():
    env_class = _env_class("Minimal", roles=("alice", "bob"), metadata={"name": "minimal_v0"})
    assert env_class.metadata == {
        "name": "minimal_v0",
        "render_modes": ["ansi", "human"],
        "is_parallelizable": False,  # agents read same-turn answers: aec_to_parallel would hide them
    }
    assert env_class(render_mode="ansi").render_mode == "ansi"  # once a bare KeyError
    declared = _env_class(
        "AnsiOnly", roles=("alice", "bob"), metadata={"name": "a_v0", "render_modes": ["ansi"]}
    )
    assert declared.metadata["render_modes"] == ["ansi", "human"]


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"metadata": {"name": "x_v0"}}, "must define the class attribute `roles`"),
        ({"roles": ("a", "a"), "metadata": {"name": "x_v0"}}, "repeated agent"),
        ({"roles": ("alice", "bob"), "metadata": {"render_modes": ["ansi"]}}, 'metadata lacks "name"'),
        ({"roles": ("alice", "bob")}, 'metadata lacks "name"'),  # inherited the base's placeholder name
        ({"roles": ("alice", "bob"), "metadata": {"name": "x_v0", "render_modes": "ansi"}}, "must be a list"),
    ],
)
def test_missing_class_attributes_are_named_by_the_constructor_and_check_env(attributes, message):
    env_class = _env_class("Broken", **attributes)
    with pytest.raises(TypeError, match=message):
        env_class()
    with pytest.raises(AssertionError, match=message):
        check_env(env_class)


def test_check_env_runs_render_test_for_factories_that_take_render_mode(monkeypatch):
    from llm_zoo import testing

    seen = []
    monkeypatch.setattr(
        testing, "render_test", lambda maker: seen.append(maker(render_mode="human").render_mode)
    )
    check_env(KeywordEnv, num_cycles=2, fuzz_count=5, sample_actions=["apple", "banana"])
    assert seen == ["human"]


@pytest.mark.parametrize(
    "env_id", ["PlanPath-v0", "Sokoban-v0", "Code-v0", "Math-v0", "MathRelay-v0", "KeyRelay-v0"]
)
def test_state_is_pettingzoos_method_on_every_built_in_env(env_id):
    """Issue 54: PlanPath-v0 and Sokoban-v0 kept their board in an attribute named ``state``, so
    ``env.state()`` raised ``TypeError: 'PlanPathState' object is not callable``."""
    env = llm_zoo.make(env_id)
    env.reset(seed=0)
    assert callable(env.state)
    with pytest.raises(NotImplementedError):
        env.state()
    env.close()
