"""Defaults chosen against the paper (AT-GRPO, arXiv 2510.11062): evaluation temperature per env
kind, the advantage epsilon, and zero-variance groups that do not dilute the ``dapo`` loss."""

from __future__ import annotations

import pytest

from llm_zoo_train.config import AlgorithmConfig, EvalConfig
from llm_zoo_train.evaluation.defaults import eval_temperature
from llm_zoo_train.rollout.samples import Sample
from llm_zoo_train.training.advantages import compute_advantages


@pytest.mark.parametrize(
    ("env_id", "temperature"),
    [("PlanPath-v0", 0.0), ("Sokoban-v0", 0.0), ("Math-v0", 0.6), ("Code-v0", 0.6)],
)
def test_evaluation_is_greedy_for_planning_and_t06_for_math_and_code(env_id, temperature):
    assert EvalConfig().temperature is None  # None: the env's recommended value
    assert eval_temperature(env_id, EvalConfig().temperature) == temperature
    assert eval_temperature(env_id, 0.3) == 0.3  # a configured value wins


def test_an_env_can_state_its_own_evaluation_temperature(monkeypatch):
    import toy_envs_trainer

    assert eval_temperature("test/Scripted-v0") == 0.0  # unknown kind: greedy
    monkeypatch.setitem(toy_envs_trainer.ScriptedEnv.metadata, "eval_temperature", 0.8)
    assert eval_temperature("test/Scripted-v0") == 0.8


def test_the_trainer_evaluates_at_the_envs_temperature(
    tiny_model_dir, tmp_path, monkeypatch, one_torch_thread
):
    pytest.importorskip("peft")
    import toy_envs_trainer
    from llm_zoo_train import trainer as trainer_module
    from train_helpers import toy_config

    monkeypatch.setitem(toy_envs_trainer.ScriptedEnv.metadata, "eval_temperature", 0.6)
    seen = []
    real = trainer_module.evaluate

    def spy(engine, env_id, env_kwargs, seeds, adapters, sampling, *args, **kwargs):
        seen.append(sampling)
        return real(engine, env_id, env_kwargs, seeds, adapters, sampling, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "evaluate", spy)
    config = toy_config(
        tiny_model_dir, tmp_path / "run", ["--eval.temperature", "null", "--eval.num_episodes", "2"]
    )
    trainer_module.Trainer(config).evaluate()
    assert seen[-1].temperature == 0.6 and seen[-1].top_p == 1.0


def _sample(group, reward, branch, tokens=3):
    return Sample(
        env_id="x",
        env_index=0,
        task_id="t",
        turn=0,
        agent="a",
        adapter="a",
        group_key=group,
        branch=branch,
        prompt="p",
        completion="c",
        prompt_token_ids=[1],
        completion_token_ids=[2] * tokens,
        behaviour_logprobs=[-1.0] * tokens,
        reward=reward,
        role_reward=reward,
        global_reward=0.0,
    )


def test_the_advantage_epsilon_does_not_shrink_small_spreads():
    """Plan-Path's per-move costs differ by 0.01: with the paper's 1e-6 a two-sample group still
    gets advantages of +-1/sqrt(2); the old 1e-4 shrank them by 1.4%."""
    assert AlgorithmConfig().advantage_epsilon == 1e-6
    samples = [_sample("g", -0.01, 0), _sample("g", -0.02, 1)]
    compute_advantages(samples, epsilon=AlgorithmConfig().advantage_epsilon)
    assert samples[0].advantage == pytest.approx(2**-0.5, rel=2e-4)
    assert samples[1].advantage == pytest.approx(-(2**-0.5), rel=2e-4)


def test_zero_variance_groups_are_dropped_by_default():
    assert AlgorithmConfig().zero_variance_groups == "drop"
    samples = [_sample("g", 0.0, 0), _sample("g", 1.0, 1), _sample("flat", 0.5, 0), _sample("flat", 0.5, 1)]
    kept, stats = compute_advantages(samples, zero_variance_groups=AlgorithmConfig().zero_variance_groups)
    assert [s.group_key for s in kept] == ["g", "g"] and stats["zero_variance_groups"] == 1


QUICK_ALICE_ONLY = [
    "--eval.num_episodes",
    "0",
    "--agents.frozen",
    "[bob]",
    "--training.per_device_train_batch_size",
    "64",
]


QUICK_ALICE_ONLY = [
    "--eval.num_episodes",
    "0",
    "--agents.frozen",
    "[bob]",
    "--training.per_device_train_batch_size",
    "64",
]


def test_under_dapo_the_default_update_is_not_diluted_by_zero_variance_groups(
    tiny_model_dir, tmp_path, monkeypatch, one_torch_thread
):
    """Kept zero-variance samples add nothing to the gradient but their tokens to the dapo
    denominator: the kept update is the informative one scaled down by their token share."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    import toy_envs_trainer  # noqa: F401
    from llm_zoo_train.trainer import Trainer
    from train_helpers import toy_config

    results = {}

    def capture(name, overrides):
        config = toy_config(
            tiny_model_dir,
            tmp_path / name,
            [*QUICK_ALICE_ONLY, *overrides],
        )
        trainer = Trainer(config)
        update = trainer.updater.update

        def record_samples(adapter, samples, *args, **kwargs):
            results[name] = {"samples": list(samples)}
            return update(adapter, samples, *args, **kwargs)

        def record_gradient(adapter):
            results[name]["grads"] = [
                p.grad.detach().clone() for p in trainer.policy.adapter_parameters(adapter)
            ]
            return 0.0

        monkeypatch.setattr(trainer.updater, "update", record_samples)
        monkeypatch.setattr(trainer.updater, "_optimizer_step", record_gradient)
        trainer.train_step(1)

    capture("default", [])
    capture("keep", ["--algorithm.zero_variance_groups", "keep"])
    kept_all = results["keep"]["samples"]
    informative = results["default"]["samples"]
    assert 0 < len(informative) < len(kept_all)  # the step had zero-variance groups to drop
    share = sum(len(s.completion_token_ids) for s in informative) / sum(
        len(s.completion_token_ids) for s in kept_all
    )
    for default, keep in zip(results["default"]["grads"], results["keep"]["grads"], strict=True):
        torch.testing.assert_close(keep, default * share, rtol=1e-4, atol=1e-8)
    assert any(g.abs().sum() > 0 for g in results["default"]["grads"])
