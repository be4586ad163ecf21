"""The update's frozen linear layers by oneDNN's packed copies (llm_zoo_train.kernels.frozen_linear):
F.linear's values and input gradients to float32 rounding, only frozen float32 layers, F.linear
under autocast, re-packed when a weight changes, every forward given back, "auto" choosing by
the measured margin once per process, and LoRA gradients through a model to rounding."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

from llm_zoo_train.kernels import frozen_linear  # noqa: E402
from llm_zoo_train.kernels.frozen_linear import FrozenLinearPackings, forget_frozen_measurements  # noqa: E402
from llm_zoo_train.kernels.lora_training import fused_lora_forward  # noqa: E402
from llm_zoo_train.kernels.packed_linear import ONEDNN_MIN_SPEEDUP, onednn_packing_available  # noqa: E402
from llm_zoo_train.training.loss import completion_logprobs  # noqa: E402
from tiny_model import build_tokenizer, tiny_llama_config  # noqa: E402

pytestmark = pytest.mark.skipif(
    not onednn_packing_available(), reason="this torch build has no oneDNN packing"
)


@pytest.fixture(autouse=True)
def measure_anew():
    forget_frozen_measurements()
    yield
    forget_frozen_measurements()


def frozen(inputs: int, outputs: int, *, bias: bool = True) -> torch.nn.Linear:
    torch.manual_seed(0)
    layer = torch.nn.Linear(inputs, outputs, bias=bias)
    layer.requires_grad_(False)
    return layer


@pytest.mark.parametrize("shape", [(5, 96), (3, 7, 96)])
@pytest.mark.parametrize("bias", [True, False])
def test_outputs_and_input_gradients_are_f_linears_to_float32_rounding(shape, bias):
    layer = frozen(96, 160, bias=bias)
    x = torch.randn(*shape, requires_grad=True)
    grad = torch.randn(*shape[:-1], 160)
    expected = F.linear(x, layer.weight, layer.bias)
    (expected_grad,) = torch.autograd.grad(expected, x, grad)
    with FrozenLinearPackings("onednn").applied(layer) as choice:
        assert choice.kernel == "onednn" and "forward" in vars(layer)
        output = layer(x)
    (output_grad,) = torch.autograd.grad(output, x, grad)
    assert "forward" not in vars(layer)
    torch.testing.assert_close(output, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(output_grad, expected_grad, rtol=0, atol=1e-5)


def test_trainable_small_and_other_dtype_layers_are_left_alone():
    trainable = torch.nn.Linear(96, 160)
    small = frozen(96, 8)
    half = frozen(96, 160).to(torch.bfloat16)
    model = torch.nn.ModuleList([trainable, small, half])
    with FrozenLinearPackings("onednn").applied(model) as choice:
        assert choice is None
        assert not any("forward" in vars(m) for m in model)


def test_autocast_runs_f_linear():
    layer = frozen(96, 160)
    with FrozenLinearPackings("onednn").applied(layer), torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(torch.randn(4, 96)).dtype == torch.bfloat16


def test_exact_packs_nothing():
    layer = frozen(96, 160)
    with FrozenLinearPackings("exact").applied(layer) as choice:
        assert choice.kernel is None and "forward" not in vars(layer)


def test_a_weight_changed_in_place_is_packed_again():
    layer = frozen(96, 160)
    packings = FrozenLinearPackings("onednn")
    x = torch.randn(4, 96)
    with packings.applied(layer):
        before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(2.0)
    with packings.applied(layer):
        after = layer(x)
    torch.testing.assert_close(after, F.linear(x, layer.weight, layer.bias), rtol=0, atol=1e-5)
    assert (after - before).abs().max() > 1e-2


def test_an_unknown_kernel_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"'auto', 'exact', 'onednn'.*'fast'"):
        FrozenLinearPackings("fast")


def fake_timings(monkeypatch, f_linear_s: float, onednn_s: float) -> list[str]:
    timed: list[str] = []

    def seconds(products):
        plain = products[0][1].func is F.linear
        timed.append("F.linear" if plain else "onednn")
        return f_linear_s if plain else onednn_s

    monkeypatch.setattr(frozen_linear, "_pass_seconds", seconds)
    return timed


@pytest.mark.parametrize(
    ("onednn_s", "chosen"),
    [(0.010 / ONEDNN_MIN_SPEEDUP - 1e-6, "onednn"), (0.010 / ONEDNN_MIN_SPEEDUP + 1e-4, None), (0.012, None)],
)
def test_auto_takes_onednn_only_when_faster_by_the_margin(monkeypatch, onednn_s, chosen):
    fake_timings(monkeypatch, 0.010, onednn_s)
    layer = frozen(96, 160)
    with FrozenLinearPackings("auto").applied(layer) as choice:
        assert choice.kernel == chosen
        assert ("forward" in vars(layer)) == (chosen is not None)


def test_auto_measures_a_set_of_shapes_once_per_process(monkeypatch):
    timed = fake_timings(monkeypatch, 0.010, 0.005)
    layer = frozen(96, 160)
    first, second = FrozenLinearPackings("auto"), FrozenLinearPackings("auto")
    with first.applied(layer):
        pass
    measured = len(timed)
    with second.applied(layer):
        pass
    assert measured > 0 and len(timed) == measured
    assert first.choices == second.choices


def test_lora_gradients_through_a_model_are_the_exact_ones_to_float32_rounding():
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    base = LlamaForCausalLM(tiny_llama_config(tokenizer, hidden_size=64, intermediate_size=128))
    adapter = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    model = get_peft_model(base, adapter, adapter_name="agent")
    prompts, completions = [[5, 6, 7, 8], [5, 6, 7, 8], [9, 10]], [[11, 12, 13], [14, 15], [16, 17, 18]]

    def logprobs_and_grads(kernel: str):
        model.zero_grad()
        with fused_lora_forward(model), FrozenLinearPackings(kernel).applied(model) as choice:
            logprobs, mask, _ = completion_logprobs(model, prompts, completions, pad_token_id=0)
        (logprobs * mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        return choice, logprobs.detach(), grads

    _, exact_logprobs, exact_grads = logprobs_and_grads("exact")
    choice, logprobs, grads = logprobs_and_grads("onednn")
    assert choice.kernel == "onednn"
    torch.testing.assert_close(logprobs, exact_logprobs, rtol=0, atol=1e-5)
    assert exact_grads.keys() == grads.keys() and len(grads) > 0
    for name, grad in grads.items():
        torch.testing.assert_close(grad, exact_grads[name], rtol=1e-4, atol=1e-6, msg=name)
