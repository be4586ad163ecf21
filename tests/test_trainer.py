"""The training loop on the tiny model and the scripted toy env: it learns, it updates only what it
should, and its gradient accumulation is exact."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import toy_envs_trainer  # noqa: E402, F401  (registers test/Scripted-v0)
from llm_zoo_train.trainer import Trainer  # noqa: E402
from train_helpers import toy_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _run(tiny_model_dir, tmp_path, overrides, steps):
    config = toy_config(
        tiny_model_dir,
        tmp_path / "run",
        ["--training.max_steps", str(steps), "--eval.num_episodes", "0", *overrides],
    )
    trainer = Trainer(config)
    start = {name: trainer.policy.adapter_state_dict(name) for name in trainer.plan.adapters}
    trainer.train()
    return trainer, start


def _improvement(history, key, window=3):
    values = [r[key] for r in history if key in r]
    return float(np.mean(values[-window:]) - np.mean(values[:window]))


def _same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


LEARNING_STEPS = 24


def test_per_agent_adapters_learn_their_own_letter(tiny_model_dir, tmp_path):
    trainer, start = _run(tiny_model_dir, tmp_path, [], LEARNING_STEPS)
    history = trainer.history
    assert trainer.plan.agent_adapters == {"alice": "alice", "bob": "bob"}
    # Random tiny model: ~0.01 of the characters are the agent's letter. Both must climb a lot.
    assert _improvement(history, "alice/role_reward") > 0.3, [r["alice/role_reward"] for r in history]
    assert _improvement(history, "bob/role_reward") > 0.3, [r["bob/role_reward"] for r in history]
    for name in ("alice", "bob"):
        assert not _same_weights(start[name], trainer.policy.adapter_state_dict(name))
    last = history[-1]
    for key in (
        "alice/reward",
        "alice/global_reward",
        "alice/success",
        "alice/advantage_mean",
        "alice/zero_variance_groups",
        "alice/groups",
        "alice/completion_length",
        "bob/reward",
        "train/success_rate",
        "train/zero_variance_groups",
        "update/alice/clip_fraction",
        "update/alice/entropy",
        "update/bob/loss",
        "update/bob/grad_norm",
        "update/alice/learning_rate",
        "time/generation",
        "time/env",
        "time/update",
        "time/step",
    ):
        # A learned agent's groups can all tie (dropped: no update keys that step), so look at every step.
        assert any(key in record for record in history), key
    assert last["alice/groups"] == 8 and last["bob/groups"] == 8  # one turn, 8 envs


def test_shared_adapter_learns(tiny_model_dir, tmp_path):
    trainer, _ = _run(
        tiny_model_dir,
        tmp_path,
        ["--agents.adapters", "shared", "--env.kwargs.letters", "aa"],
        LEARNING_STEPS,
    )
    assert trainer.plan.adapters == ["shared"]
    assert set(trainer.optimizers) == {"shared"}
    history = trainer.history
    assert _improvement(history, "alice/role_reward") > 0.3
    assert _improvement(history, "bob/role_reward") > 0.3


def test_frozen_agent_adapter_stays_bit_identical(tiny_model_dir, tmp_path):
    trainer, start = _run(tiny_model_dir, tmp_path, ["--agents.frozen", "[bob]"], LEARNING_STEPS)
    assert trainer.plan.trainable == ["alice"]
    assert set(trainer.optimizers) == {"alice"}
    assert _same_weights(start["bob"], trainer.policy.adapter_state_dict("bob"))
    assert not _same_weights(start["alice"], trainer.policy.adapter_state_dict("alice"))
    assert _improvement(trainer.history, "alice/role_reward") > 0.3
    assert abs(_improvement(trainer.history, "bob/role_reward")) < 0.1  # bob's policy did not change
    assert not any(key.startswith("update/bob/") for key in trainer.history[-1])
    # The saved final adapter of the frozen agent is the untouched one too.
    from peft.utils import load_peft_weights

    saved = load_peft_weights(str(tmp_path / "run" / "adapters" / "bob"), device="cpu")
    assert saved.keys() == start["bob"].keys()
    assert all(torch.equal(saved[k], start["bob"][k]) for k in saved)


def test_frozen_agent_on_the_base_model(tiny_model_dir, tmp_path):
    trainer, _ = _run(
        tiny_model_dir,
        tmp_path,
        ["--agents.adapters", "{alice: alice, bob: null}", "--agents.frozen", "[bob]"],
        2,
    )
    assert trainer.plan.adapters == ["alice"] and trainer.plan.agent_adapters["bob"] is None
    assert trainer.history[-1]["bob/samples"] == 32  # bob acted (base model) but was not trained


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_micro_batches_accumulate_to_the_full_batch_gradient(
    tiny_model_dir, tmp_path, loss_type, monkeypatch
):
    """Splitting an optimizer step into micro-batches must not change its gradient (``bnpo`` is
    excluded: by definition, as in TRL, it normalises each micro-batch by its own token count)."""
    grads = {}

    def capture(size):
        config = toy_config(
            tiny_model_dir,
            tmp_path / f"run{size}",
            [
                "--eval.num_episodes",
                "0",
                "--algorithm.loss_type",
                loss_type,
                "--training.per_device_train_batch_size",
                str(size),
                "--agents.frozen",
                "[bob]",
            ],
        )
        trainer = Trainer(config)

        def record(adapter):
            grads[size] = [p.grad.detach().clone() for p in trainer.policy.adapter_parameters(adapter)]
            return 0.0

        monkeypatch.setattr(trainer.updater, "_optimizer_step", record)
        trainer.train_step(1)

    capture(64)  # alice's 32 samples in one micro-batch
    capture(5)  # 7 micro-batches of different sizes, accumulated
    assert len(grads[64]) == len(grads[5])
    for full, accumulated in zip(grads[64], grads[5], strict=True):
        torch.testing.assert_close(accumulated, full, rtol=1e-4, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in grads[64])


def test_several_optimizer_steps_iterations_kl_and_importance_sampling(tiny_model_dir, tmp_path):
    config = toy_config(
        tiny_model_dir,
        tmp_path / "run",
        [
            "--eval.num_episodes",
            "0",
            "--training.per_device_train_batch_size",
            "8",
            "--training.gradient_accumulation_steps",
            "2",
            "--algorithm.num_iterations",
            "2",
            "--algorithm.beta",
            "0.1",
            "--algorithm.importance_sampling",
            "true",
            "--rollout.mode",
            "independent",
        ],
    )
    trainer = Trainer(config)
    metrics = trainer.train_step(1)
    # 32 samples per adapter / 8 per micro-batch = 4 micro-batches, 2 per optimizer step, 2 iterations.
    assert metrics["update/alice/optimizer_steps"] == 4
    assert metrics["update/alice/kl"] > 0  # the adapter moved away from the base after the first step
    assert metrics["update/alice/ratio_max"] > 1.0 or metrics["update/alice/ratio_min"] < 1.0
    assert 0 < metrics["update/alice/is_weight_mean"] <= 2.0
    assert metrics["update/alice/logp_mismatch"] < 1e-3  # the hf engine records the trainer's logprobs


def test_importance_sampling_on_one_optimizer_step_needs_no_extra_forward_pass(
    tiny_model_dir, tmp_path, monkeypatch
):
    """One optimizer step on one pass: the old logprobs are each micro-batch's own (detached), so
    the update runs one forward pass per micro-batch, and the correction still weights it: behaviour
    logprobs raised by ln 2 halve every token's weight, hence the gradient."""
    import math

    grads, forwards = {}, {}

    def capture(importance_sampling, shift):
        name = f"{importance_sampling}-{shift}"
        overrides = ["--eval.num_episodes", "0", "--training.per_device_train_batch_size", "8"]
        overrides += ["--agents.frozen", "[bob]", "--algorithm.importance_sampling", importance_sampling]
        trainer = Trainer(toy_config(tiny_model_dir, tmp_path / name, overrides))
        rollout = trainer._rollout

        def shifted(step, envs=None):
            produced = rollout(step, envs)
            for sample in produced.samples:
                sample.behaviour_logprobs = [lp + shift for lp in sample.behaviour_logprobs]
            return produced

        def record(adapter):
            grads[name] = [p.grad.detach().clone() for p in trainer.policy.adapter_parameters(adapter)]
            return 0.0

        calls = []
        update = trainer.updater.update

        def counted_update(*args, **kwargs):
            calls.clear()  # count the update's forward passes only, not the rollout's
            return update(*args, **kwargs)

        handle = trainer.policy.model.register_forward_pre_hook(lambda module, args: calls.append(1))
        monkeypatch.setattr(trainer, "_rollout", shifted)
        monkeypatch.setattr(trainer.updater, "_optimizer_step", record)
        monkeypatch.setattr(trainer.updater, "update", counted_update)
        metrics = trainer.train_step(1)
        handle.remove()
        forwards[name] = len(calls)
        return metrics

    metrics = capture("true", 0.0)
    capture("false", 0.0)
    capture("true", math.log(2.0))
    assert metrics["update/alice/optimizer_steps"] == 1
    assert forwards["true-0.0"] == forwards["false-0.0"] > 0  # no pass beyond the micro-batches' own
    for plain, weighted, halved in zip(
        grads["false-0.0"], grads["true-0.0"], grads[f"true-{math.log(2.0)}"], strict=True
    ):
        # The hf engine records the trainer's own logprobs (to ~1e-5): weights exp(~0) = 1.
        torch.testing.assert_close(weighted, plain, rtol=1e-3, atol=1e-7)
        torch.testing.assert_close(halved, plain / 2, rtol=1e-3, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in grads["false-0.0"])


def test_metrics_go_to_tensorboard_and_jsonl(tiny_model_dir, tmp_path):
    pytest.importorskip("tensorboard")
    import json

    config = toy_config(
        tiny_model_dir,
        tmp_path / "run",
        [
            "--training.max_steps",
            "1",
            "--eval.num_episodes",
            "2",
            "--logging.log_with",
            "[tensorboard]",
            "--logging.plot",
            "true",
        ],
    )
    Trainer(config).train()
    events = list((tmp_path / "run").rglob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1]
    assert "eval/success_rate" in records[0] and "alice/reward" in records[1]
    assert (tmp_path / "run" / "learning_curve.png").stat().st_size > 10_000


def test_an_engine_with_its_own_weights_gets_every_new_version(tiny_model_dir, tmp_path, monkeypatch):
    """The vLLM-style contract: saved PEFT adapters, loaded under strictly increasing versions."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from toy_envs_trainer import ScriptedEngine

    engine = ScriptedEngine(alphabet="ab", max_chars=4)
    monkeypatch.setattr(Trainer, "_make_engine", lambda self: engine)
    config = toy_config(
        tiny_model_dir,
        tmp_path / "run",
        ["--training.max_steps", "2", "--eval.num_episodes", "2", "--agents.frozen", "[bob]"],
    )
    trainer = Trainer(config)
    trainer.train()
    assert [(sorted(paths), version) for paths, version in engine.loaded] == [
        (["alice", "bob"], 0),  # everything once at the start
        (["alice"], 1),  # then only the trained adapter, under a new version
        (["alice"], 2),
    ]
    served = tmp_path / "run" / "engine_adapters" / "rank0"
    assert sorted(p.name for p in served.iterdir()) == ["v0", "v2"]  # v1 is no longer served; bob is v0
    plain = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), served / "v2" / "alice"
    )
    saved = {k: v for k, v in plain.state_dict().items() if "lora_" in k}
    live = trainer.policy.adapter_state_dict("alice")
    assert len(saved) == len(live) and all(
        torch.equal(saved[k.replace(".weight", ".default.weight")], v) for k, v in live.items()
    )
    assert any(call.adapters[0] == "alice" for call in engine.calls)
