"""Replaying recorded rollouts: a step re-run from ``rollout.save_rollouts`` files ends with
bit-identical adapters, and a recording that does not fit the run is refused clearly."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import toy_envs_trainer  # noqa: E402, F401  (registers test/Scripted-v0)
from llm_zoo_train.engines.base import SamplingParams  # noqa: E402
from llm_zoo_train.rollout.replay import ReplayEngine, ReplayMismatchError  # noqa: E402
from llm_zoo_train.rollout.samples import read_jsonl  # noqa: E402
from llm_zoo_train.trainer import Trainer  # noqa: E402
from train_helpers import history_without_timing, toy_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


#: A replay computes every update pass (a recording holds tokens, not the decode's activations), so
#: only a run that computed them too is repeated bit for bit; with the rollout's activations reused
#: (training.rollout_activations_mb, on by default on a CPU) a replay agrees to float rounding.
COMPUTED_UPDATES = ["--training.rollout_activations_mb", "0"]


def _weights(trainer):
    return {name: trainer.policy.adapter_state_dict(name) for name in trainer.plan.adapters}


@pytest.mark.parametrize("mode", ["tree", "independent"])
def test_replayed_steps_give_bit_identical_adapters(tiny_model_dir, tmp_path, mode):
    common = [
        "--training.max_steps",
        "2",
        "--rollout.mode",
        mode,
        "--eval.num_episodes",
        "2" if mode == "tree" else "0",
        *COMPUTED_UPDATES,
    ]
    recorded = Trainer(
        toy_config(tiny_model_dir, tmp_path / "recorded", [*common, "--rollout.save_rollouts", "true"])
    )
    start = _weights(recorded)
    recorded.train()

    replay_path = tmp_path / "recorded" / "rollouts"
    replayed = Trainer(
        toy_config(
            tiny_model_dir,
            tmp_path / "replayed",
            [*common, "--rollout.engine", "replay", "--rollout.replay_path", str(replay_path)],
        )
    )
    assert isinstance(replayed.engine, ReplayEngine)
    replayed.train()

    a, b = _weights(recorded), _weights(replayed)
    for name in a:
        assert a[name].keys() == b[name].keys()
        assert all(torch.equal(a[name][k], b[name][k]) for k in a[name]), name
        assert not all(torch.equal(start[name][k], a[name][k]) for k in a[name])  # it did train
    # Same rewards, choices, advantages and update metrics (evaluation ran on the live model).
    assert history_without_timing(replayed.history) == history_without_timing(recorded.history)


NO_LOOKAHEAD = [
    "--training.max_steps",
    "1",
    "--eval.num_episodes",
    "0",
    "--rollout.team_credit_lookahead",
    "0",
    *COMPUTED_UPDATES,
]


def _record_one_step(tiny_model_dir, tmp_path, extra=()):
    config = toy_config(
        tiny_model_dir,
        tmp_path / "run",
        ["--training.max_steps", "1", "--eval.num_episodes", "0", "--rollout.save_rollouts", "true", *extra],
    )
    Trainer(config).train()
    return tmp_path / "run" / "rollouts"


def test_every_engine_call_is_recorded_and_served_back_in_order(tiny_model_dir, tmp_path):
    rollouts = _record_one_step(tiny_model_dir, tmp_path)
    assert sorted(p.name for p in rollouts.iterdir()) == [
        "step_000001.generations.jsonl",
        "step_000001.jsonl",
    ]
    calls = [
        json.loads(line) for line in (rollouts / "step_000001.generations.jsonl").read_text().splitlines()
    ]
    samples = list(read_jsonl(rollouts / "step_000001.jsonl"))
    # Tree rollout, one turn: alice's and bob's K=4 candidates, then each candidate's team-credit
    # look-ahead (bob after each alice candidate); the look-ahead actions are in no sample.
    assert sum(len(g) for call in calls for g in call["completions"]) > len(samples)

    engine = ReplayEngine(rollouts)
    assert engine.load_step(1).name == "step_000001.generations.jsonl"
    first = calls[0]
    served = engine.generate(first["prompts"], first["adapters"], first["n"], SamplingParams())
    assert [[c.token_ids for c in g] for g in served] == [
        [c["token_ids"] for c in g] for g in first["completions"]
    ]
    with pytest.raises(ReplayMismatchError, match=r"step 1 left \d+ recorded completion"):
        engine.check_all_served()
    second = calls[1]
    with pytest.raises(ReplayMismatchError, match="asks for other generations than recorded"):
        engine.generate(
            ["not recorded", *second["prompts"][1:]], second["adapters"], second["n"], SamplingParams()
        )
    with pytest.raises(
        ReplayMismatchError, match=r"no recording of step 7 \(step_000007.jsonl\).*recorded: step_000001"
    ):
        engine.load_step(7)


def test_a_samples_only_recording_is_served_by_prompt(tiny_model_dir, tmp_path):
    """Without the call log (an older recording), completions are served per (prompt, adapter) in
    sampling order: exact when every generation became a sample (no team-credit look-ahead)."""
    rollouts = _record_one_step(tiny_model_dir, tmp_path, NO_LOOKAHEAD[4:])
    (rollouts / "step_000001.generations.jsonl").unlink()
    samples = list(read_jsonl(rollouts / "step_000001.jsonl"))
    group = samples[:4]  # the K=4 candidates of the first group
    assert len({(s.prompt, s.adapter) for s in group}) == 1
    engine = ReplayEngine(rollouts)
    assert engine.load_step(1).name == "step_000001.jsonl"
    (served,) = engine.generate([group[0].prompt], [group[0].adapter], 4, SamplingParams())
    assert [c.token_ids for c in served] == [s.completion_token_ids for s in group]
    assert [c.logprobs for c in served] == [s.behaviour_logprobs for s in group]
    with pytest.raises(ReplayMismatchError, match="for the prompt 'not recorded'"):
        engine.generate(["not recorded"], [group[0].adapter], 1, SamplingParams())

    replayed = Trainer(
        toy_config(
            tiny_model_dir,
            tmp_path / "replayed",
            [*NO_LOOKAHEAD, "--rollout.engine", "replay", "--rollout.replay_path", str(rollouts)],
        )
    )
    replayed.train()
    recorded = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert history_without_timing(replayed.history) == history_without_timing(recorded)


def test_replay_of_a_different_run_is_refused(tiny_model_dir, tmp_path):
    rollouts = _record_one_step(tiny_model_dir, tmp_path)
    base = ["--training.max_steps", "1", "--eval.num_episodes", "0"]
    replay = ["--rollout.engine", "replay", "--rollout.replay_path", str(rollouts)]
    other_seed = Trainer(
        toy_config(tiny_model_dir, tmp_path / "seed", [*base, *replay, "--training.seed", "5"])
    )
    with pytest.raises(ReplayMismatchError, match="asks for other generations than recorded"):
        other_seed.train_step(1)


def test_replay_needs_an_existing_recording(tiny_model_dir, tmp_path):
    from llm_zoo_train.config import ConfigError, validate

    config = toy_config(tiny_model_dir, tmp_path / "run", ["--rollout.engine", "replay"])
    with pytest.raises(ConfigError, match=r"rollout\.engine 'replay' needs rollout\.replay_path"):
        validate(config)
