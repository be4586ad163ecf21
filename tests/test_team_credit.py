"""Team credit (llm_zoo_train.rollout.team_credit): the look-ahead of teammate actions in tree rollouts, the
episode returns of independent rollouts, and agents that finish before the others.

The toy tests use ScriptedEnv (tests/toy_envs_trainer.py): global = 1 once both agents' latest
replies are at least half their own letter. tests/test_team_credit_envs.py runs every built-in env.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

from llm_zoo_train.config import Config, ConfigError, validate
from llm_zoo_train.engines.base import SamplingParams
from llm_zoo_train.rollout.samples import read_jsonl, write_jsonl
from llm_zoo_train.rollout.team_credit import (
    check_lookahead,
    generated_tokens,
    lookahead_limit,
    team_credit_metrics,
)
from llm_zoo_train.rollout.tree import evaluation_rollout, independent_rollout, tree_rollout
from llm_zoo_train.training.advantages import compute_advantages, group_samples
from toy_envs_credit import EARLY_EXIT_ENV_ID
from toy_envs_trainer import SCRIPTED_ENV_ID, ScriptedEngine

ADAPTERS = {"alice": "alice_lora", "bob": "bob_lora"}
SAMPLING = SamplingParams(max_tokens=8, temperature=1.0, seed=11)


def alice_ladder_bob_fixed(prompt: str, adapter: str | None, index: int) -> str:
    """Alice's branch k writes k a's then x's (fractions 0, 1/3, 2/3, 1); bob always writes 'bbb'."""
    if adapter == "alice_lora":
        return "a" * index + "x" * (3 - index)
    return "bbb"


def run(mode=tree_rollout, *, lookahead=-1, seeds=(3, 4), k=4, max_turns=2, script=alice_ladder_bob_fixed):
    engine = ScriptedEngine(script=script)
    samples = mode(
        SCRIPTED_ENV_ID,
        {"max_turns": max_turns},
        list(seeds),
        engine,
        ADAPTERS,
        k,
        SAMPLING,
        np.random.default_rng(0),
        team_credit_lookahead=lookahead,
    )
    return samples, engine


def test_lookahead_credits_the_team_outcome_after_the_teammates_next_action():
    samples, _ = run(lookahead=-1)
    first = [s for s in samples if s.group_key == "e0/t0/alice"]
    # Bob has not written yet: the immediate global is 0 for every candidate of alice's first turn.
    assert [s.global_reward for s in first] == [0.0] * 4
    # After bob's 'bbb' the team succeeds iff alice's fraction is >= 0.5 (branches 2 and 3).
    assert [s.credited_global for s in first] == [0.0, 0.0, 1.0, 1.0]
    for s in first:
        assert s.credit == "lookahead" and s.lookahead_steps == 1 and s.lookahead_tokens == 4
        assert s.reward == pytest.approx(s.role_reward + 1.0 * s.credited_global)
        (step,) = s.extra["lookahead"]
        assert step["agent"] == "bob" and step["adapter"] == "bob_lora" and step["completion"] == "bbb"
        assert step["global_reward"] == s.credited_global and step["prompt"].startswith("Problem")
    # The look-ahead is a copy: the episode goes on from the chosen candidate's own clone.
    bob_group = [s for s in samples if s.group_key == "e0/t0/bob"]
    chosen = next(s for s in first if s.chosen)
    assert chosen.branch == 3
    assert {tuple(s.extra["info"]["history_before"]) for s in bob_group} == {(f"alice={chosen.completion}",)}


def alice_answers_her_own_question(prompt: str, adapter: str | None, index: int) -> str:
    """Alice's turn-0 branch k writes k a's among 6 x's (never half a's: the team cannot succeed
    yet); on turn 1 she writes 'aaa' only after a turn-0 reply of at least two a's (her own
    earlier move decides her later one); bob always writes 'bbb'."""
    if adapter != "alice_lora":
        return "bbb"
    if "turn 1" in prompt:
        return "aaa" if "alice=aa" in prompt else "xxx"
    return "a" * index + "x" * 6


def test_episode_lookahead_credits_an_action_with_the_agents_own_later_move():
    """-2 plays every later action, the acting agent's own included, to the episode's end: alice's
    first move is credited with the team outcome after her own second move. A round (-1) stops
    before alice acts again."""
    episode, _ = run(lookahead=-2, k=4, max_turns=2, script=alice_answers_her_own_question)
    first = [s for s in episode if s.group_key == "e0/t0/alice"]
    for s in first:
        assert s.lookahead_steps == 3  # bob, alice again, bob: the episode's end
        assert [step["agent"] for step in s.extra["lookahead"]] == ["bob", "alice", "bob"]
        assert s.credited_global == s.extra["lookahead"][-1]["global_reward"]
    # Her turn-1 answer is 'aaa' only after branches 2 and 3 (2 and 3 a's): the team ends solved.
    assert [s.credited_global for s in first] == [0.0, 0.0, 1.0, 1.0]
    round_only, _ = run(lookahead=-1, k=4, max_turns=2, script=alice_answers_her_own_question)
    first = [s for s in round_only if s.group_key == "e0/t0/alice"]
    assert {s.lookahead_steps for s in first} == {1}
    assert [s.credited_global for s in first] == [0.0] * 4  # the round ends before alice's answer


def test_lookahead_calls_are_batched_per_position_and_not_trained_on():
    samples, engine = run(lookahead=-1, seeds=(3, 4, 5), k=4, max_turns=2)
    # Per step: one call n=K for the live envs, then one look-ahead call n=1 for all their branches;
    # bob's last step (turn 1) ends the episode: no teammate left to look ahead.
    shapes = [(len(call.prompts), call.n) for call in engine.calls]
    assert shapes == [(3, 4), (12, 1), (3, 4), (12, 1), (3, 4), (12, 1), (3, 4)]
    assert engine.calls[1].adapters == ["bob_lora"] * 12 and engine.calls[3].adapters == ["alice_lora"] * 12
    # Look-ahead calls draw their own seeds.
    seeds = [call.sampling.seed for call in engine.calls]
    assert len(set(seeds)) == len(seeds)
    # Only the candidates are samples; the look-ahead tokens are counted, not trained on.
    assert len(samples) == 3 * 2 * 2 * 4
    lookahead_rows = sum(len(call.prompts) for call in engine.calls if call.n == 1)
    assert sum(s.lookahead_steps for s in samples) == lookahead_rows
    metrics = team_credit_metrics(samples)
    assert metrics["rollout/lookahead_generations"] == lookahead_rows
    assert metrics["rollout/lookahead_tokens"] == lookahead_rows * 4  # 'bbb' or 'aaa'-like + end token
    assert generated_tokens(samples) == sum(
        len(c.prompts) * c.n * 4 for c in engine.calls
    )  # every scripted answer is 3 characters + end token
    assert 0 < metrics["rollout/lookahead_token_share"] < 1
    assert metrics["alice/credited_global"] > 0


def test_lookahead_0_reproduces_the_immediate_global_rollout():
    immediate, engine = run(lookahead=0, seeds=(3, 4, 5))
    assert all(call.n == 4 for call in engine.calls) and len(engine.calls) == 4
    for s in immediate:
        assert (s.credited_global, s.credit, s.lookahead_steps, s.lookahead_tokens) == (
            s.global_reward,
            "immediate",
            0,
            0,
        )
        info = s.extra["info"]
        assert s.reward == info["role_reward"] + 1.0 * info["global_reward"]  # the env's own reward
        assert "lookahead" not in s.extra
    assert team_credit_metrics(immediate)["rollout/lookahead_tokens"] == 0
    # The candidates of the first step are the same with or without look-ahead (own seed streams).
    looked, _ = run(lookahead=-1, seeds=(3, 4, 5))
    first = [s.completion for s in immediate if s.turn == 0 and s.agent == "alice"]
    assert first == [s.completion for s in looked if s.turn == 0 and s.agent == "alice"]
    # Alice at turn 0: with look-ahead 0 every candidate's global is 0 (bob has not written).
    assert {s.credited_global for s in immediate if s.group_key.endswith("t0/alice")} == {0.0}


def test_alpha_changes_the_advantages_only_through_the_credited_global():
    def advantages(alpha, lookahead):
        engine = ScriptedEngine(script=alice_ladder_bob_fixed)
        samples = tree_rollout(
            SCRIPTED_ENV_ID,
            {"max_turns": 1, "alpha": alpha},
            [3],
            engine,
            ADAPTERS,
            4,
            SAMPLING,
            np.random.default_rng(0),
            team_credit_lookahead=lookahead,
        )
        compute_advantages(samples)
        return [s.advantage for s in samples if s.group_key == "e0/t0/alice"]

    assert advantages(0.0, -1) != pytest.approx(advantages(3.0, -1))
    # Immediate global: 0 for all of alice's turn-0 candidates, so alpha cannot matter.
    assert advantages(0.0, 0) == pytest.approx(advantages(3.0, 0))


def test_saved_rollouts_keep_the_credit(tmp_path):
    samples, _ = run(lookahead=-1)
    path = tmp_path / "step.jsonl"
    write_jsonl(samples, path)
    replayed = list(read_jsonl(path))
    assert [asdict(s) for s in replayed] == [asdict(s) for s in samples]
    assert {s.credit for s in replayed} == {"lookahead"}
    assert any(s.extra.get("lookahead") for s in replayed)


def test_independent_episodes_are_grouped_by_each_agents_episode_return():
    def script(prompt, adapter, index):
        return "aaa" if adapter == "alice_lora" else "bbb"

    samples, engine = run(independent_rollout, lookahead=-1, seeds=(3,), k=3, max_turns=2, script=script)
    assert all(call.n == 1 for call in engine.calls) and len(engine.calls) == 4  # no extra generation
    alice = [s for s in samples if s.agent == "alice" and s.branch == 0]
    # Alice's turn-0 action is credited with the global after bob's reply (1), not the immediate 0.
    assert [s.global_reward for s in alice] == [0.0, 1.0]
    assert [s.credited_global for s in alice] == [1.0, 1.0]
    assert all(s.lookahead_steps == 1 for s in alice)
    # Bob's last action has no teammate action after it: its own global.
    assert [s.lookahead_steps for s in samples if s.agent == "bob" and s.branch == 0] == [1, 0]
    # Episode return of alice: (1 + 1) + (1 + 1), on every one of her samples of that episode.
    assert {s.reward for s in alice} == {4.0}
    assert {s.credit for s in samples} == {"episode"}
    assert sorted(group_samples(samples)) == ["e0/alice", "e0/bob"]


def test_independent_advantages_compare_the_k_episode_returns():
    def script(prompt, adapter, index):
        return "aaa" if adapter == "alice_lora" else "bbb"

    samples, _ = run(independent_rollout, lookahead=0, seeds=(3,), k=3, max_turns=2, script=script)
    # Make the three episodes' returns differ: 0, 1, 2 (two samples each for alice).
    for s in samples:
        s.reward = float(s.branch)
    compute_advantages(samples)
    alice = sorted((s for s in samples if s.agent == "alice"), key=lambda s: s.branch)
    # Returns 0, 1, 2: mean 1, std 1 (per episode, not per sample).
    assert [round(s.advantage, 6) for s in alice] == [round(x / (1 + 1e-4), 6) for x in (-1, -1, 0, 0, 1, 1)]
    alice[0].reward = 5.0  # one sample of episode 0 disagrees with the other: not one return
    with pytest.raises(ValueError, match="branch 0 have rewards"):
        compute_advantages(samples)


def test_lookahead_values_are_checked():
    assert [check_lookahead(v) for v in (-2, -1, 0, 1, 5)] == [-2, -1, 0, 1, 5]
    for bad in (-3, 1.5, "round", True, None):
        with pytest.raises(ValueError, match="team_credit_lookahead must be -2"):
            check_lookahead(bad)
    assert [lookahead_limit(v, 3) for v in (-1, 0, 1, 5)] == [2, 0, 1, 2]
    assert lookahead_limit(-2, 3) == lookahead_limit(-2, 1) == 64  # to the episode's end, bounded
    assert lookahead_limit(-1, 1) == 0  # a single agent has no teammate
    config = Config()
    config.rollout.team_credit_lookahead = -3
    with pytest.raises(ConfigError, match=r"rollout\.team_credit_lookahead must be -2 .* got -3"):
        validate(config)
    with pytest.raises(ValueError, match="team_credit_lookahead"):
        run(lookahead=-7)


# ---------------------------------------------------------------------- agents that finish first


def scout_builder(prompt, adapter, index):
    assert "you are the scout" not in prompt or "turn 0" in prompt, "generated for a dead agent"
    return "map here" if adapter == "scout_lora" else ("build" if index % 2 == 0 else "wait")


SCOUT_ADAPTERS = {"scout": "scout_lora", "builder": "builder_lora"}


@pytest.mark.parametrize("lookahead", [-1, 0])
def test_tree_rollout_steps_none_for_an_agent_that_finished_first(lookahead):
    engine = ScriptedEngine(script=scout_builder)
    samples = tree_rollout(
        EARLY_EXIT_ENV_ID,
        {"max_turns": 3},
        [1, 2],
        engine,
        SCOUT_ADAPTERS,
        2,
        SAMPLING,
        np.random.default_rng(0),
        team_credit_lookahead=lookahead,
    )
    assert sorted({(s.turn, s.agent) for s in samples}) == [
        (0, "builder"),
        (0, "scout"),
        (1, "builder"),
        (2, "builder"),
    ]
    scout_calls = [call for call in engine.calls if "scout_lora" in call.adapters]
    assert len(scout_calls) == 1 and scout_calls[0].n == 2  # only its single turn, never after
    scouts = [s for s in samples if s.agent == "scout"]
    if lookahead == -1:
        # The scout's report is credited with the team outcome after the builder's reply.
        assert all(s.lookahead_steps == 1 and s.credited_global == 1.0 for s in scouts)
        # The builder's look-ahead meets only the dead scout (stepped with None): nothing to play.
        assert all(s.lookahead_steps == 0 for s in samples if s.agent == "builder")
    else:
        assert all(s.credited_global == 0.0 for s in scouts)


def test_independent_and_evaluation_rollouts_step_none_for_an_agent_that_finished_first():
    engine = ScriptedEngine(script=scout_builder)
    samples = independent_rollout(
        EARLY_EXIT_ENV_ID,
        {"max_turns": 3},
        [1],
        engine,
        SCOUT_ADAPTERS,
        2,
        SAMPLING,
        np.random.default_rng(0),
    )
    for branch in (0, 1):
        episode = [s for s in samples if s.branch == branch]
        assert [(s.turn, s.agent) for s in episode] == [
            (0, "scout"),
            (0, "builder"),
            (1, "builder"),
            (2, "builder"),
        ]
    results = evaluation_rollout(
        EARLY_EXIT_ENV_ID, {"max_turns": 3}, [1, 2], engine, SCOUT_ADAPTERS, SamplingParams(temperature=0)
    )
    assert [r.turns for r in results] == [3, 3]
    assert all(r.success for r in results)
    assert all(r.role_rewards["scout"] == 1.0 for r in results)


def test_lookahead_with_the_hf_engine_is_seeded_and_batched(tiny_model_dir):
    torch = pytest.importorskip("torch")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_zoo_train.engines.hf.engine import HFEngine

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), lora, adapter_name="alice_lora"
    )
    model.add_adapter(
        "bob_lora", LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    engine = HFEngine(model, tokenizer, max_batch_size=16)
    sampling = SamplingParams(max_tokens=5, temperature=1.0, seed=9)

    def once():
        return tree_rollout(
            SCRIPTED_ENV_ID, {"max_turns": 1}, [0, 1], engine, ADAPTERS, 3, sampling, np.random.default_rng(0)
        )

    samples = once()
    assert [asdict(s) for s in once()] == [asdict(s) for s in samples]
    alice = [s for s in samples if s.agent == "alice"]
    assert len(alice) == 6 and all(s.credit == "lookahead" and s.lookahead_steps == 1 for s in alice)
    for s in alice:
        (step,) = s.extra["lookahead"]
        assert step["adapter"] == "bob_lora" and step["prompt"].startswith("Problem")
        assert s.lookahead_tokens == len(step["completion_token_ids"]) == len(step["behaviour_logprobs"]) >= 1
        assert step["completion"] == tokenizer.decode(step["completion_token_ids"], skip_special_tokens=True)
        assert s.reward == pytest.approx(s.role_reward + 1.0 * s.credited_global)


def test_the_trainer_logs_lookahead_cost_and_saves_the_credit(tiny_model_dir, tmp_path, one_torch_thread):
    pytest.importorskip("peft")
    from llm_zoo_train.trainer import Trainer
    from train_helpers import toy_config

    config = toy_config(
        tiny_model_dir,
        tmp_path / "run",
        [
            "--training.max_steps", "1", "--eval.num_episodes", "0", "--rollout.save_rollouts", "true",
            "--rollout.envs_per_step", "2", "--rollout.team_credit_lookahead", "-1",
        ],
    )  # fmt: skip
    trainer = Trainer(config)
    trainer.train()
    (record,) = trainer.history
    saved = list(read_jsonl(tmp_path / "run" / "rollouts" / "step_000001.jsonl"))
    assert record["rollout/lookahead_tokens"] == sum(s.lookahead_tokens for s in saved)
    assert record["alice/credited_global"] == pytest.approx(
        np.mean([s.credited_global for s in saved if s.agent == "alice"])
    )
    # One turn: each of alice's 2 x 4 candidates is followed by one bob action; bob's are last.
    assert record["rollout/lookahead_generations"] == 8 and record["rollout/lookahead_tokens"] >= 8
    assert {s.credit for s in saved} == {"lookahead"}
    assert all(len(s.extra["lookahead"]) == 1 for s in saved if s.agent == "alice")


def test_independent_episodes_credit_to_the_episodes_end_with_lookahead_minus_2():
    samples, _ = run(
        mode=independent_rollout, lookahead=-2, k=4, max_turns=2, script=alice_answers_her_own_question
    )
    by_episode: dict = {}
    for s in samples:
        by_episode.setdefault((s.env_index, s.branch), []).append(s)
    for episode in by_episode.values():
        first, last = episode[0], episode[-1]
        assert first.agent == "alice" and first.lookahead_steps == len(episode) - 1
        assert first.credited_global == last.global_reward  # the episode's final team outcome
