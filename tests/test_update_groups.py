"""The update's micro-batches keep a prompt's group together (``training.micro_batches: groups``)
and give the gradient of today's sample-by-sample shuffle (``samples``).

The runs use the tiny random Llama model and the scripted toy env (8 envs x K=4 per step, each env
with its own prompt): alice's 32 samples form 8 groups of 4 rows sharing a prompt.
"""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import llm_zoo_train.training.update as update_module  # noqa: E402
import toy_envs_trainer  # noqa: E402, F401  (registers test/Scripted-v0)
from llm_zoo_train.trainer import Trainer  # noqa: E402
from train_helpers import toy_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _trainer(tiny_model_dir, tmp_path, name, overrides):
    base = [
        "--eval.num_episodes",
        "0",
        "--agents.frozen",
        "[bob]",
        "--algorithm.zero_variance_groups",
        "keep",
    ]
    return Trainer(toy_config(tiny_model_dir, tmp_path / name, [*base, *overrides]))


_STEPS_OF_8 = ["--training.per_device_train_batch_size", "4", "--training.gradient_accumulation_steps", "2"]


def _order(order):
    return ["--training.micro_batches", order]


def _one_step(trainer, monkeypatch):
    """Run step 1; return each optimizer step's gradient of alice's adapter and the prompts of
    every micro-batch's forward pass (the gradients are taken, not applied)."""
    steps: list[torch.Tensor] = []
    batches: list[list[tuple[int, ...]]] = []
    real = update_module.completion_logprobs

    def record_batch(model, prompts, *args, **kwargs):
        batches.append([tuple(p) for p in prompts])
        return real(model, prompts, *args, **kwargs)

    def record_step(adapter):
        parameters = trainer.policy.adapter_parameters(adapter)
        steps.append(torch.cat([p.grad.detach().flatten().clone() for p in parameters]))
        for parameter in parameters:
            parameter.grad = None
        return 0.0

    monkeypatch.setattr(update_module, "completion_logprobs", record_batch)
    monkeypatch.setattr(trainer.updater, "_optimizer_step", record_step)
    trainer.train_step(1)
    return steps, batches


@pytest.mark.parametrize(("micro", "expected"), [(4, [1] * 8), (8, [2] * 4), (6, None)])
def test_micro_batches_are_built_from_whole_groups(tiny_model_dir, tmp_path, monkeypatch, micro, expected):
    """K=4: micro-batches of 4 hold one prompt each, of 8 two; with 6, a group at a boundary spans
    two consecutive micro-batches and no micro-batch holds more than ceil(6/4) + 1 prompts (the
    sample-by-sample shuffle puts 3.4 of 4 and 5.8 of 8 distinct prompts in one)."""
    trainer = _trainer(
        tiny_model_dir, tmp_path, f"m{micro}", ["--training.per_device_train_batch_size", str(micro)]
    )
    _, batches = _one_step(trainer, monkeypatch)
    assert [len(b) for b in batches] == [micro] * (32 // micro) + ([32 % micro] if 32 % micro else [])
    distinct = [len(set(b)) for b in batches]
    if micro == 6:  # which groups meet at a boundary depends on the draw; the bound does not
        assert max(distinct) <= 3 and sum(distinct) <= 8 + len(batches) - 1, distinct
    else:
        assert distinct == expected
    # Every sample trained exactly once: 8 prompts, 4 rows each.
    assert sorted(Counter(p for b in batches for p in b).values()) == [4] * 8


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_grouped_micro_batches_give_the_sample_shuffle_gradient(
    tiny_model_dir, tmp_path, monkeypatch, loss_type
):
    """One optimizer step: the grouped update's gradient is today's (micro-batches of 8, so both
    orders split the 32 samples into 4 different micro-batches)."""
    grads, batches = {}, {}
    for order in ("samples", "groups"):
        trainer = _trainer(
            tiny_model_dir,
            tmp_path,
            f"{order}-{loss_type}",
            [
                "--training.per_device_train_batch_size",
                "8",
                "--algorithm.loss_type",
                loss_type,
                *_order(order),
            ],
        )
        (grads[order],), batches[order] = _one_step(trainer, monkeypatch)
    assert max(len(set(b)) for b in batches["samples"]) > 2  # the old order mixes groups
    assert [len(set(b)) for b in batches["groups"]] == [2, 2, 2, 2]
    assert grads["groups"].abs().max() > 1e-3
    # fp32 sums of the same per-token terms in another order (and the prompt's KV computed once
    # instead of per row): rounding only, measured at most 4e-7 of the largest component.
    scale = float(grads["samples"].abs().max())
    torch.testing.assert_close(grads["groups"], grads["samples"], rtol=1e-5, atol=2e-6 * scale)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
def test_several_optimizer_steps_change_only_which_samples_share_a_step(
    tiny_model_dir, tmp_path, monkeypatch, loss_type
):
    """Four optimizer steps of 8 samples: each order puts different samples into each step (so the
    step gradients differ), but over the pass every sample counts once with the same weight (grpo
    and dr_grpo weigh each sequence 1 / 8 in every step), so the steps' gradients, taken at the
    same weights, sum to the same vector."""
    grads = {}
    for order in ("samples", "groups"):
        trainer = _trainer(
            tiny_model_dir,
            tmp_path,
            f"{order}-{loss_type}",
            [*_STEPS_OF_8, "--algorithm.loss_type", loss_type, *_order(order)],
        )
        grads[order], _ = _one_step(trainer, monkeypatch)
    assert len(grads["samples"]) == len(grads["groups"]) == 4
    assert not torch.allclose(grads["samples"][0], grads["groups"][0], atol=1e-4)
    total_samples, total_groups = sum(grads["samples"]), sum(grads["groups"])
    scale = float(total_samples.abs().max())
    torch.testing.assert_close(total_groups, total_samples, rtol=1e-5, atol=2e-6 * scale)


def test_micro_batches_choice_is_validated(tiny_model_dir, tmp_path):
    from llm_zoo_train.config import ConfigError

    with pytest.raises(ConfigError, match=r"groups.*samples"):
        toy_config(tiny_model_dir, tmp_path / "bad", ["--training.micro_batches", "prompts"])
