"""Tree, independent and evaluation rollouts (llm_zoo_train.rollout.tree).

Structural tests use ScriptedEngine (exact, no model) on ScriptedEnv, whose reward is the fraction
of the reply that is the agent's letter ("a" for alice, "b" for bob) and which records every action
it receives. One test runs the whole path with HFEngine and the tiny random model.

The structural tests pin ``team_credit_lookahead=0``: the tree rollout as it was before team credit
(immediate global). tests/test_team_credit.py covers the look-ahead, the default.
"""

from __future__ import annotations

import re
from dataclasses import asdict

import numpy as np
import pytest

from llm_zoo.core import Outcome
from llm_zoo_train.engines.base import Engine, SamplingParams
from llm_zoo_train.rollout.samples import read_jsonl, write_jsonl
from llm_zoo_train.rollout.tree import evaluation_rollout, independent_rollout, tree_rollout
from llm_zoo_train.training.advantages import compute_advantages, group_samples
from toy_envs_trainer import SCRIPTED_ENV_ID, ScriptedEngine, ScriptedEnv, letter_fraction

ADAPTERS = {"alice": "alice_lora", "bob": "bob_lora"}
LETTERS = {"alice": "a", "bob": "b"}
SAMPLING = SamplingParams(max_tokens=8, temperature=1.0, seed=123)


def ladder(prompt: str, adapter: str | None, index: int) -> str:
    """Branch k writes k of the agent's letter then 'x's: distinct texts, rewards increasing in k."""
    letter = "a" if adapter == "alice_lora" else "b"
    return letter * index + "x" * (3 - index)


def rollout(
    engine,
    *,
    seeds=(3, 4, 5),
    k=4,
    max_turns=3,
    rng_seed=0,
    sampling=SAMPLING,
    mode=tree_rollout,
    lookahead=0,
):
    return mode(
        SCRIPTED_ENV_ID,
        {"max_turns": max_turns},
        list(seeds),
        engine,
        ADAPTERS,
        k,
        sampling,
        np.random.default_rng(rng_seed),
        team_credit_lookahead=lookahead,
    )


def problem_of(prompt: str) -> int:
    return int(re.match(r"Problem (\d+)\.", prompt).group(1))


def expected_problem(seed: int) -> int:
    env = ScriptedEnv()
    env.reset(seed=seed)
    return env.problem


def test_scripted_engine_implements_the_engine_protocol():
    assert isinstance(ScriptedEngine(), Engine)


def test_every_group_has_k_samples_from_one_prompt_and_never_mixes_envs():
    seeds = (3, 4, 5)
    samples = rollout(ScriptedEngine(), seeds=seeds, k=4, max_turns=3)
    groups = group_samples(samples)
    assert len(groups) == len(seeds) * 3 * 2  # envs x turns x agents, no early end ("STOP" never said)
    for key, members in groups.items():
        assert len(members) == 4
        assert sorted(s.branch for s in members) == [0, 1, 2, 3]
        assert len({s.prompt for s in members}) == 1
        first = members[0]
        assert key == f"e{first.env_index}/t{first.turn}/{first.agent}"
        assert {(s.env_index, s.task_id, s.turn, s.agent, s.adapter) for s in members} == {
            (first.env_index, first.task_id, first.turn, first.agent, ADAPTERS[first.agent])
        }
        # The prompt is from this env's own problem (groups never mix problems).
        assert problem_of(first.prompt) == expected_problem(seeds[first.env_index])
        assert first.task_id == f"seed-{seeds[first.env_index]}"


def test_siblings_share_one_state_and_each_action_lands_on_its_own_clone():
    samples = rollout(ScriptedEngine(script=ladder), k=4)
    for members in group_samples(samples).values():
        before = {tuple(s.extra["info"]["history_before"]) for s in members}
        assert len(before) == 1, "siblings were stepped on different states"
        for s in members:
            assert s.extra["info"]["action"] == s.completion == ladder("", ADAPTERS[s.agent], s.branch)
            # Each candidate is scored with its own action's reward (not one branch's for all K).
            assert s.role_reward == pytest.approx(letter_fraction(s.completion, LETTERS[s.agent]))
            assert s.reward == pytest.approx(s.role_reward + 1.0 * s.global_reward)
            # Look-ahead 0: the immediate global is the credited one; nothing else was generated.
            assert (s.credited_global, s.credit, s.lookahead_steps, s.lookahead_tokens) == (
                s.global_reward,
                "immediate",
                0,
                0,
            )


def test_greedy_choice_is_the_state_every_agent_continues_from():
    samples = rollout(ScriptedEngine(script=ladder), k=4, max_turns=3)
    for env_index in {s.env_index for s in samples}:
        steps = [m for m in group_samples(samples).values() if m[0].env_index == env_index]
        history: list[str] = []
        for members in steps:
            chosen = [s for s in members if s.chosen]
            assert len(chosen) == 1
            assert chosen[0].reward == max(s.reward for s in members)
            assert members[0].extra["info"]["history_before"] == history
            assert f"History: {'; '.join(history) or '(none)'}" in members[0].prompt
            history.append(f"{chosen[0].agent}={chosen[0].completion}")
        assert [m[0].agent for m in steps] == ["alice", "bob"] * 3


def test_both_agents_groups_have_reward_variance_in_a_two_agent_env():
    samples = rollout(ScriptedEngine(script=ladder), k=4, max_turns=2)
    by_agent = {"alice": 0, "bob": 0}
    for members in group_samples(samples).values():
        assert np.var([s.reward for s in members]) > 0
        by_agent[members[0].agent] += 1
    assert by_agent == {"alice": 6, "bob": 6}
    _, stats = compute_advantages(samples)
    assert stats["zero_variance_groups"] == 0


def test_done_stops_the_episode_for_every_agent_and_other_envs_go_on():
    stop_problem = expected_problem(10)

    def script(prompt, adapter, index):
        # In env 0, alice ends the episode at turn 1 (every branch says STOP).
        if problem_of(prompt) == stop_problem and adapter == "alice_lora" and "turn 1" in prompt:
            return "aSTOP"
        return ladder(prompt, adapter, index)

    engine = ScriptedEngine(script=script)
    samples = rollout(engine, seeds=(10, 11), k=3, max_turns=3)
    keys = {s.group_key for s in samples}
    assert {k for k in keys if k.startswith("e0/")} == {"e0/t0/alice", "e0/t0/bob", "e0/t1/alice"}
    assert len([k for k in keys if k.startswith("e1/")]) == 6
    # One engine call per step, batched over the live envs: 2 envs for 3 steps, then env 1 alone.
    assert [len(call.prompts) for call in engine.calls] == [2, 2, 2, 1, 1, 1]
    assert all(call.n == 3 for call in engine.calls)
    assert [call.adapters[0] for call in engine.calls] == ["alice_lora", "bob_lora"] * 3


def test_ties_are_broken_by_the_seeded_rng():
    def all_tied(prompt, adapter, index):
        return ("a" if adapter == "alice_lora" else "b") * (index + 1)  # fraction 1 for every branch

    def choices(rng_seed):
        samples = rollout(ScriptedEngine(script=all_tied), seeds=(1,), k=4, max_turns=3, rng_seed=rng_seed)
        return [s.branch for s in samples if s.chosen]

    assert choices(7) == choices(7)
    picked = {tuple(choices(seed)) for seed in range(6)}
    assert len(picked) > 1, "ties must be broken by the rng, not always by position"
    assert len({b for run in picked for b in run}) > 1


def test_independent_rollout_gives_k_full_episodes_per_env():
    engine = ScriptedEngine()  # random strings, seeded per call
    seeds, k = (3, 4), 3
    samples = rollout(engine, seeds=seeds, k=k, max_turns=2, mode=independent_rollout)
    assert len(samples) == len(seeds) * k * 2 * 2
    assert all(s.chosen for s in samples)
    assert all(call.n == 1 and len(call.prompts) == len(seeds) * k for call in engine.calls)
    assert len(engine.calls) == 4
    for env_index in range(len(seeds)):
        for branch in range(k):
            episode = [s for s in samples if s.env_index == env_index and s.branch == branch]
            assert [(s.turn, s.agent) for s in episode] == [
                (0, "alice"),
                (0, "bob"),
                (1, "alice"),
                (1, "bob"),
            ]
            # The episode continues from its own actions.
            history = [f"{s.agent}={s.completion}" for s in episode]
            assert [s.extra["info"]["history_before"] for s in episode] == [history[:i] for i in range(4)]
    # One group per (env, agent): that agent's actions in the K episodes of that env.
    groups = group_samples(samples)
    assert sorted(groups) == ["e0/alice", "e0/bob", "e1/alice", "e1/bob"]
    for key, members in groups.items():
        assert len(members) == k * 2 and len({(s.env_index, s.agent) for s in members}) == 1, key
        assert sorted({s.branch for s in members}) == list(range(k))
        first_turn = [s for s in members if s.turn == 0]
        if key.endswith("/alice"):
            assert len({s.prompt for s in first_turn}) == 1  # same seed, same task


def test_independent_rollout_rewards_are_episode_returns_of_the_immediate_rewards_at_lookahead_0():
    samples = rollout(ScriptedEngine(), seeds=(3, 4), k=3, max_turns=3, mode=independent_rollout)
    for s in samples:
        assert s.credit == "episode" and s.credited_global == s.global_reward and s.lookahead_steps == 0
        mine = [t for t in samples if (t.env_index, t.branch, t.agent) == (s.env_index, s.branch, s.agent)]
        env_rewards = [t.extra["info"]["role_reward"] + 1.0 * t.extra["info"]["global_reward"] for t in mine]
        assert s.reward == pytest.approx(sum(env_rewards))
    # The advantage compares the K episode returns: one value per episode, whatever its length.
    compute_advantages(samples)
    for members in group_samples(samples).values():
        returns = {s.branch: s.reward for s in members}
        spread = np.std(list(returns.values()), ddof=1)
        for s in members:
            expected = 0.0 if spread == 0 else (s.reward - np.mean(list(returns.values()))) / (spread + 1e-4)
            assert s.advantage == pytest.approx(expected)


def test_rollouts_are_seedable_and_jsonl_replays_them(tmp_path):
    first = rollout(ScriptedEngine(seed=1), k=3)
    second = rollout(ScriptedEngine(seed=2), k=3)  # engine state differs; the sampling seed rules
    assert [asdict(s) for s in first] == [asdict(s) for s in second]
    other = rollout(ScriptedEngine(), k=3, sampling=SamplingParams(max_tokens=8, seed=124))
    assert [s.completion for s in other] != [s.completion for s in first]

    path = tmp_path / "rollout.jsonl"
    write_jsonl(first, path)
    replayed = list(read_jsonl(path))
    assert [asdict(s) for s in replayed] == [asdict(s) for s in first]
    kept, stats = compute_advantages(replayed)
    kept_again, stats_again = compute_advantages(first)
    assert stats == stats_again and [s.advantage for s in kept] == [s.advantage for s in kept_again]


def test_successive_engine_calls_get_different_seeds():
    engine = ScriptedEngine()
    rollout(engine, seeds=(0,), k=2, max_turns=2)
    seeds = [call.sampling.seed for call in engine.calls]
    assert len(set(seeds)) == len(seeds) == 4


def test_agent_adapters_must_cover_every_agent():
    with pytest.raises(ValueError, match=r"missing \['bob'\]"):
        tree_rollout(
            SCRIPTED_ENV_ID, {}, [0], ScriptedEngine(), {"alice": None}, 2, SAMPLING, np.random.default_rng()
        )
    with pytest.raises(ValueError, match=r"unknown \['carol'\]"):
        tree_rollout(
            SCRIPTED_ENV_ID,
            {},
            [0],
            ScriptedEngine(),
            {**ADAPTERS, "carol": None},
            2,
            SAMPLING,
            np.random.default_rng(),
        )
    with pytest.raises(ValueError, match="num_generations"):
        tree_rollout(
            SCRIPTED_ENV_ID, {}, [0], ScriptedEngine(), ADAPTERS, 0, SAMPLING, np.random.default_rng()
        )


def test_a_broken_engine_is_reported():
    class Short(ScriptedEngine):
        def generate(self, prompts, adapters, n, sampling):
            return super().generate(prompts, adapters, n, sampling)[:-1]

    with pytest.raises(RuntimeError, match="returned"):
        rollout(Short(), seeds=(0, 1), k=2)


def test_non_finite_rewards_are_reported(monkeypatch):
    monkeypatch.setattr(ScriptedEnv, "_act", lambda self, agent, action: Outcome(float("nan"), 0.0))
    with pytest.raises(ValueError, match="non-finite rewards"):
        rollout(ScriptedEngine(), seeds=(0,), k=2)


def test_evaluation_rollout_sums_rewards_per_agent():
    engine = ScriptedEngine(script=lambda prompt, adapter, index: "a" if adapter == "alice_lora" else "b")
    results = evaluation_rollout(
        SCRIPTED_ENV_ID, {"max_turns": 2}, [5, 6], engine, ADAPTERS, SamplingParams(temperature=0)
    )
    assert [r.env_index for r in results] == [0, 1]
    for result in results:
        # Turn 0: alice 1 (bob has not written yet: no global), bob 1 + 1; turn 1: both 1 + 1.
        # Each agent's return also holds alpha x the global of its teammate's steps (PettingZoo's
        # cumulative rewards): alice 3 + 2 (bob's two steps), bob 4 + 1 (alice's second step).
        assert result.rewards == {"alice": 5.0, "bob": 5.0}
        assert result.role_rewards == {"alice": 2.0, "bob": 2.0}
        assert result.global_rewards == {"alice": 1.0, "bob": 2.0}
        assert result.success and result.turns == 2 and result.format_ok_rate == 1.0
    assert all(call.n == 1 and len(call.prompts) == 2 for call in engine.calls)

    failing = ScriptedEngine(script=lambda prompt, adapter, index: "" if adapter == "alice_lora" else "STOP")
    (result,) = evaluation_rollout(SCRIPTED_ENV_ID, {}, [5], failing, ADAPTERS, SamplingParams(temperature=0))
    assert not result.success and result.turns == 1 and result.format_ok_rate == 0.5
    assert result.rewards == {"alice": -0.5, "bob": 0.0}


def test_tree_rollout_end_to_end_with_the_hf_engine(tiny_model_dir):
    torch = pytest.importorskip("torch")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_zoo_train.engines.hf.engine import HFEngine
    from llm_zoo_train.training.loss import completion_logprobs

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
        adapter_name="alice_lora",
    )
    model.add_adapter(
        "bob_lora", LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    engine = HFEngine(model, tokenizer, max_batch_size=16)
    sampling = SamplingParams(max_tokens=6, temperature=1.0, seed=5)

    def run():
        return rollout(engine, seeds=(0, 1), k=3, max_turns=1, sampling=sampling)

    samples = run()
    assert [asdict(s) for s in run()] == [asdict(s) for s in samples]
    groups = group_samples(samples)
    assert sorted(groups) == ["e0/t0/alice", "e0/t0/bob", "e1/t0/alice", "e1/t0/bob"]
    for members in groups.values():
        assert len(members) == 3 and len({s.prompt for s in members}) == 1
        assert len({tuple(s.prompt_token_ids) for s in members}) == 1
        assert sum(s.chosen for s in members) == 1
        for s in members:
            assert 1 <= len(s.completion_token_ids) == len(s.behaviour_logprobs) <= 6
            assert s.completion == tokenizer.decode(s.completion_token_ids, skip_special_tokens=True)
            expected = letter_fraction(s.completion, LETTERS[s.agent]) if s.completion else -0.5
            assert s.role_reward == pytest.approx(expected)

    # The behaviour logprobs are what the loss recomputes for the same adapter.
    alice = [s for s in samples if s.agent == "alice"]
    model.set_adapter("alice_lora")
    with torch.no_grad():
        logprobs, mask, _ = completion_logprobs(
            model,
            [s.prompt_token_ids for s in alice],
            [s.completion_token_ids for s in alice],
            pad_token_id=tokenizer.pad_token_id,
        )
    for row, s in enumerate(alice):
        n = len(s.completion_token_ids)
        assert mask[row].sum() == n
        np.testing.assert_allclose(logprobs[row, :n].numpy(), s.behaviour_logprobs, atol=1e-4)


@pytest.mark.parametrize("mode", [tree_rollout, independent_rollout])
@pytest.mark.parametrize("lookahead", [0, -1])
def test_the_team_reward_reaching_every_agent_changes_no_sample_reward(monkeypatch, mode, lookahead):
    """Issue 48: the env now pays alpha x global to the teammates too (PettingZoo's returns). The
    trainer reads an agent's reward right after its own action and credits the team part through
    team credit, so every sample's reward and advantage is what it was when the env paid the
    actor alone: no double counting."""

    def script(prompt, adapter, index):  # 2 or 3 letters: the team part is paid
        return ladder(prompt, adapter, index % 2 + 2)

    new = rollout(ScriptedEngine(script=script), mode=mode, lookahead=lookahead)
    compute_advantages(new)

    real_step = ScriptedEnv.step

    def actor_only(env, action):  # the env before issue 48: the teammates get 0 for the step
        acting = env.agent_selection
        real_step(env, action)
        for agent in list(env._cumulative_rewards):
            if agent != acting:
                env._cumulative_rewards[agent] -= env.rewards[agent]
                env.rewards[agent] = 0.0

    monkeypatch.setattr(ScriptedEnv, "step", actor_only)
    old = rollout(ScriptedEngine(script=script), mode=mode, lookahead=lookahead)
    compute_advantages(old)
    assert any(s.global_reward != 0 for s in new)  # the team part is there to double count
    assert [(s.group_key, s.reward, s.advantage, s.credited_global) for s in new] == [
        (s.group_key, s.reward, s.advantage, s.credited_global) for s in old
    ]
