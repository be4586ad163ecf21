"""The update's LoRA products with the rank as the rows (llm_zoo_train.kernels.lora_rank_rows): the
gradients are right, a model's logprobs and gradients match peft's to float32 rounding, which
``training.update_kernel`` takes it, and ``"auto"`` measures once per set of shapes."""

from __future__ import annotations

import copy
import logging

import pytest

torch = pytest.importorskip("torch")
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from llm_zoo_train.kernels import lora_rank_rows  # noqa: E402
from llm_zoo_train.kernels.lora_rank_rows import (  # noqa: E402
    RankRowsLoRA,
    adopt_rank_rows_measurements,
    forget_rank_rows_measurements,
    rank_rows_chosen,
    rank_rows_measurements,
)
from llm_zoo_train.kernels.lora_training import fused_lora_forward  # noqa: E402
from llm_zoo_train.training.loss import completion_logprobs  # noqa: E402

PROMPTS = [[1, 50, 60], [1, 50, 60], [1, 80], [1, 80, 81, 82]]
COMPLETIONS = [[10, 11, 12], [13, 14], [15, 16, 17, 18], [19]]
SHAPES = {(64, 64, 4): 10, (64, 128, 4): 4}


@pytest.fixture(autouse=True)
def measure_anew():
    forget_rank_rows_measurements()
    yield
    forget_rank_rows_measurements()


def doubles(*shape: int, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=GENERATOR).requires_grad_(grad)


GENERATOR = torch.Generator().manual_seed(0)


@pytest.mark.parametrize("x_needs_grad", [True, False])
def test_the_gradients_are_those_of_the_formula(x_needs_grad):
    result, x = doubles(2, 5, 6), doubles(2, 5, 7, grad=x_needs_grad)
    lora_a, lora_b = doubles(3, 7), doubles(6, 3)
    assert torch.autograd.gradcheck(RankRowsLoRA.apply, (result, x, lora_a, lora_b, 1.5))
    output = RankRowsLoRA.apply(result, x, lora_a, lora_b, 2.0)
    torch.testing.assert_close(output, result + 2.0 * (x @ lora_a.T) @ lora_b.T, rtol=1e-12, atol=1e-12)


def peft_model(tiny_model_dir, alpha: float):
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=alpha, target_modules="all-linear", init_lora_weights=False)
    return get_peft_model(base, config).train()


def logprobs_and_gradients(model, kernel: str | None, monkeypatch):
    """Token logprobs and the adapter's gradients of one weighted loss under ``kernel`` (``None``:
    peft's own forward), and how many LoRA layer calls took the rank as the rows."""
    calls = []
    real_apply = RankRowsLoRA.apply
    monkeypatch.setattr(RankRowsLoRA, "apply", lambda *a: calls.append(1) or real_apply(*a))
    model.zero_grad()
    try:
        with fused_lora_forward(model, kernel) if kernel else torch.enable_grad():
            logprobs, _, _ = completion_logprobs(model, PROMPTS, COMPLETIONS, pad_token_id=0, temperature=0.7)
        weights = torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(1))
        (logprobs * weights).sum().backward()
    finally:
        monkeypatch.undo()
    grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    return logprobs.detach(), grads, len(calls)


def relative_error(values, reference) -> float:
    """The error's norm over the reference's, all tensors together."""
    error = sum(float((v.double() - r).norm() ** 2) for v, r in zip(values, reference, strict=True))
    return (error / sum(float(r.norm() ** 2) for r in reference)) ** 0.5


@pytest.mark.parametrize("alpha", [8.0, 6.0], ids=["scaling-2", "scaling-1.5"])
def test_a_model_s_logprobs_and_gradients_are_as_accurate_as_peft_s(tiny_model_dir, alpha, monkeypatch):
    model = peft_model(tiny_model_dir, alpha)
    layers = sum(type(m).__name__ == "Linear" and hasattr(m, "lora_A") for m in model.modules())
    peft = logprobs_and_gradients(model, None, monkeypatch)
    rank_rows = logprobs_and_gradients(model, "onednn", monkeypatch)
    exact = logprobs_and_gradients(copy.deepcopy(model).double(), None, monkeypatch)  # float64: the truth
    assert rank_rows[2] == 2 * layers  # every layer, in the prompt pass and the completion pass
    # As close to float64 as peft's float32, and both within float32's reach.
    for part in (lambda run: [run[0]], lambda run: run[1]):  # the logprobs, then the gradients
        ours, theirs = relative_error(part(rank_rows), part(exact)), relative_error(part(peft), part(exact))
        assert ours < 1e-5 and theirs < 1e-5 and ours < 3 * theirs + 1e-7
    assert any(bool(g.abs().sum() > 0) for g in rank_rows[1])
    assert logprobs_and_gradients(model, "exact", monkeypatch)[2] == 0  # peft's bits: never taken
    assert all("forward" not in vars(m) for m in model.modules())  # peft's forward is back


def test_a_bfloat16_model_with_bfloat16_adapters_keeps_peft_s_products(tiny_model_dir, monkeypatch):
    model = peft_model(tiny_model_dir, 8.0).to(torch.bfloat16)
    assert logprobs_and_gradients(model, "onednn", monkeypatch)[2] == 0


@pytest.mark.parametrize("alpha", [8.0, 6.0], ids=["scaling-2", "scaling-1.5"])
def test_a_bfloat16_model_s_float32_adapters_take_the_rank_as_the_rows_as_accurately(
    tiny_model_dir, alpha, monkeypatch
):
    """peft keeps a bfloat16 model's adapters in float32 and casts the input up: the rank-as-rows
    products do the same casts, as accurately."""
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    config = LoraConfig(r=4, lora_alpha=alpha, target_modules="all-linear", init_lora_weights=False)
    model = get_peft_model(base, config).train()
    adapters = [p for name, p in model.named_parameters() if "lora_" in name]
    assert adapters and all(p.dtype == torch.float32 for p in adapters)
    layers = sum(type(m).__name__ == "Linear" and hasattr(m, "lora_A") for m in model.modules())
    peft = logprobs_and_gradients(model, None, monkeypatch)
    rank_rows = logprobs_and_gradients(model, "onednn", monkeypatch)
    exact = logprobs_and_gradients(copy.deepcopy(model).double(), None, monkeypatch)
    assert rank_rows[2] == 2 * layers
    for part in (lambda run: [run[0]], lambda run: run[1]):
        ours, theirs = relative_error(part(rank_rows), part(exact)), relative_error(part(peft), part(exact))
        assert ours < 0.05 and ours < 1.1 * theirs + 1e-5
    assert [g.dtype for g in rank_rows[1]] == [torch.float32] * len(adapters)
    assert logprobs_and_gradients(model, "exact", monkeypatch)[2] == 0


@pytest.fixture
def timings(monkeypatch):
    """Fake pass timings (the rank as the rows ``speedup`` times faster); the passes timed."""
    timed: list[str] = []
    speedup = [2.0]

    def pass_seconds(calls):
        name = calls[0][1].func.__name__
        timed.append(name)
        return 0.010 if name == "_peft_pass" else 0.010 / speedup[0]

    monkeypatch.setattr(lora_rank_rows, "_pass_seconds", pass_seconds)
    return timed, speedup


def test_auto_measures_once_per_set_of_shapes_and_takes_the_faster(timings, caplog):
    timed, speedup = timings
    with caplog.at_level(logging.INFO, logger="llm_zoo_train.kernels.lora_rank_rows"):
        assert rank_rows_chosen("auto", SHAPES)
    assert "update LoRA products (14 layers" in caplog.text and "using the rank as the rows" in caplog.text
    passes = len(timed)
    assert passes == 2 * (lora_rank_rows.TIMED_PASSES + 1)
    assert rank_rows_chosen("auto", dict(reversed(SHAPES.items())))  # the same set: not measured again
    assert len(timed) == passes

    speedup[0] = 1.1  # below the margin: peft's
    assert not rank_rows_chosen("auto", {(64, 64, 8): 3})
    assert not rank_rows_chosen("exact", SHAPES) and rank_rows_chosen("onednn", SHAPES)
    assert not rank_rows_chosen("auto", {})
    assert len(timed) == 2 * passes  # exact, onednn and no layers measure nothing


def test_the_measurements_survive_json_and_are_adopted_without_measuring(timings):
    import json

    timed, _ = timings
    rank_rows_chosen("auto", SHAPES)
    record = json.loads(json.dumps(rank_rows_measurements()))
    assert record[0]["layers"] == [[64, 64, 4], [64, 128, 4]] and record[0]["rank_rows"] is True
    forget_rank_rows_measurements()
    record[0]["rank_rows"] = False  # another process chose otherwise: this one follows
    adopt_rank_rows_measurements(record)
    measured = len(timed)
    assert not rank_rows_chosen("auto", SHAPES)
    assert len(timed) == measured
    adopt_rank_rows_measurements([{**record[0], "rank_rows": True}], replace=False)
    assert not rank_rows_chosen("auto", SHAPES)  # its own kept
    with pytest.raises(ValueError, match="rank_rows must be true or false"):
        adopt_rank_rows_measurements([{**record[0], "rank_rows": "yes"}])
    assert rank_rows_measurements() == record


def test_an_unknown_kernel_names_the_choices():
    with pytest.raises(ValueError, match="kernel must be one of 'auto', 'exact', 'onednn', got 'fast'"):
        rank_rows_chosen("fast", SHAPES)
