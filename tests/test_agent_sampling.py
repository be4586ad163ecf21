"""Per-agent sampling (``agents.sampling``): the config, the split engine calls, the loss's per-row
temperature, and a real training step on the tiny model where the two agents sample differently."""

from __future__ import annotations

import pytest

from llm_zoo_train.config import ConfigError, validate
from llm_zoo_train.config.agent_sampling import eval_overrides, rollout_overrides
from llm_zoo_train.engines.base import SamplingParams
from llm_zoo_train.rollout.env_play import generate_checked
from toy_envs_trainer import ScriptedEngine
from train_helpers import toy_config

SAMPLING = "{alice: {temperature: 0.5, max_completion_length: 3, eval_temperature: 0.0}, bob: {eval_max_completion_length: 5, stop: ['.']}}"


def test_overrides_take_only_the_fields_set(tmp_path):
    config = toy_config("unused-model", tmp_path / "run", ["--agents.sampling", SAMPLING])
    assert rollout_overrides(config) == {
        "alice": {"temperature": 0.5, "max_tokens": 3},
        "bob": {"stop": (".",)},
    }
    assert eval_overrides(config) == {"alice": {"temperature": 0.0}, "bob": {"max_tokens": 5, "stop": (".",)}}


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ("{carol: {temperature: 0.5}}", r"\['carol'\] are not agents of test/Scripted-v0; its agents: \['alice', 'bob'\]"),
        ("{alice: {temprature: 0.5}}", "temprature"),
        ("{alice: {temperature: -1}}", r"agents.sampling.alice.temperature must be a finite number >= 0"),
        ("{alice: {eval_temperature: .nan}}", r"agents.sampling.alice.eval_temperature: expected a finite number"),
        ("{alice: {max_completion_length: 0}}", r"agents.sampling.alice.max_completion_length must be at least 1"),
        ("{alice: 0.5}", r"agents.sampling: expected dict\[str, dict\[str, any\]\]"),
        ("{alice: {stop: ['']}}", r"agents.sampling.alice.stop must be a list of non-empty texts"),
    ],
)  # fmt: skip
def test_bad_per_agent_sampling_is_a_config_error_naming_the_key(tmp_path, sampling, message):
    with pytest.raises(ConfigError, match=message):
        validate(toy_config("unused-model", tmp_path / "run", ["--agents.sampling", sampling]))


def test_a_call_is_split_by_the_agents_sampling_and_answers_keep_the_prompts_order():
    engine = ScriptedEngine(script=lambda prompt, adapter, index: f"{prompt}:{index}")
    sampling = SamplingParams(max_tokens=8, temperature=1.0, seed=3,
                              per_agent={"alice": {"temperature": 0.5, "max_tokens": 2}, "carol": {},
                                         "dave": {"stop": ("!",)}})  # fmt: skip
    agents = ["alice", "bob", "alice", "carol", "bob", "dave"]
    prompts = [f"p{i}" for i in range(6)]
    results = generate_checked(engine, prompts, [None] * 6, 2, sampling, agents)
    assert [[c.text for c in group] for group in results] == [[f"p{i}:0", f"p{i}:1"] for i in range(6)]
    calls = [(call.prompts, call.sampling.temperature, call.sampling.max_tokens, call.sampling.stop)
             for call in engine.calls]  # fmt: skip
    assert calls == [(["p0", "p2"], 0.5, 2, ()), (["p1", "p3", "p4"], 1.0, 8, ()), (["p5"], 1.0, 8, ("!",))]
    assert all(not call.sampling.per_agent and call.sampling.seed == 3 for call in engine.calls)
    with pytest.raises(ValueError, match="needs the agent of every prompt"):
        generate_checked(engine, prompts, [None] * 6, 1, sampling)


def test_without_per_agent_sampling_a_call_is_one_engine_call():
    engine = ScriptedEngine(script=lambda prompt, adapter, index: "x")
    generate_checked(engine, ["a", "b"], [None, None], 1, SamplingParams(), ["alice", "bob"])
    assert len(engine.calls) == 1


def test_greedy_play_drops_the_per_agent_temperatures_only():
    sampling = SamplingParams(
        per_agent={"alice": {"temperature": 0.5, "max_tokens": 2}, "bob": {"temperature": 2.0}}
    )
    greedy = sampling.without_agent_temperatures()
    assert greedy.per_agent == {"alice": {"max_tokens": 2}}
    assert greedy.for_agent("alice").max_tokens == 2 and greedy.for_agent("bob") == SamplingParams()


def test_the_loss_divides_each_row_by_its_own_temperature(tiny_model_dir):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from llm_zoo_train.training.loss import completion_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompts = [[5, 6, 7], [5, 6, 7], [9, 10]]
    completions = [[11, 12, 13], [14, 15], [16, 17, 18]]
    temperatures = [0.5, 1.0, 0.0]  # greedy rows score at temperature 1
    with torch.no_grad():
        mixed, _, _ = completion_logprobs(
            model, prompts, completions, pad_token_id=0, temperature=temperatures
        )
        for row, t in enumerate(temperatures):
            alone, _, _ = completion_logprobs(
                model, [prompts[row]], [completions[row]], pad_token_id=0, temperature=t
            )
            width = len(completions[row])
            torch.testing.assert_close(mixed[row, :width], alone[0], atol=1e-5, rtol=1e-5)
        same, _, _ = completion_logprobs(model, prompts, completions, pad_token_id=0, temperature=[0.5] * 3)
        scalar, _, _ = completion_logprobs(model, prompts, completions, pad_token_id=0, temperature=0.5)
    assert torch.equal(same, scalar)  # one temperature for all rows: the scalar path, same bits
    with pytest.raises(ValueError, match="2 temperatures for 3 sequences"):
        completion_logprobs(model, prompts, completions, pad_token_id=0, temperature=[0.5, 1.0])


def test_a_training_step_samples_each_agent_with_its_own_settings(tiny_model_dir, tmp_path):
    """One shared adapter, alice at T=0.3 with 3 tokens, bob at the rollout's T=1.5 with 8: every
    sample keeps its agent's limit, and the loss recomputes the behaviour logprobs of both (a loss at
    one temperature for both rows would differ from them by far more than float noise)."""
    pytest.importorskip("torch")
    from llm_zoo_train.rollout.samples import read_jsonl
    from llm_zoo_train.trainer import Trainer

    run = tmp_path / "run"
    config = toy_config(
        tiny_model_dir, run,
        ["--eval.num_episodes", "0", "--agents.adapters", "shared", "--rollout.temperature", "1.5",
         "--rollout.save_rollouts", "true", "--agents.sampling", "{alice: {temperature: 0.3, max_completion_length: 3}}"],
    )  # fmt: skip
    trainer = Trainer(config)
    try:
        metrics = trainer.train_step(1)
    finally:
        trainer.close()
    samples = list(read_jsonl(run / "rollouts" / "step_000001.jsonl"))
    longest = {
        agent: max(len(s.completion_token_ids) for s in samples if s.agent == agent)
        for agent in ("alice", "bob")
    }
    assert longest["alice"] <= 3 < longest["bob"] <= 8
    assert metrics["update/shared/samples"] > 0
    assert metrics["update/shared/logp_mismatch"] < 1e-3
