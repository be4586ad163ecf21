"""The lean LoRA forward the engine generates with (llm_zoo_train.kernels.lora_inference): the same
tokens and logprobs as peft's forward, untrained adapters skipped, peft's forward everywhere else."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from peft.tuners.lora.layer import Linear as LoraLinear  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from llm_zoo_train.engines.base import SamplingParams  # noqa: E402
from llm_zoo_train.engines.hf.engine import HFEngine  # noqa: E402
from llm_zoo_train.kernels import lora_forward, lora_inference  # noqa: E402
from llm_zoo_train.kernels.lora_inference import lean_lora_forward, zero_adapters  # noqa: E402

PROMPTS = ["hello", "apple banana cherry, reply with one word", "U D L R"]


def peft_model(tiny_model_dir, dtype):
    """Two adapters on every linear layer: ``trained`` (random lora_B) and ``untrained`` (peft's
    zero lora_B); a bfloat16 base keeps peft's float32 adapter weights, as the trainer's does."""
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype).eval()
    trained = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    model = get_peft_model(base, trained, adapter_name="trained")
    model.add_adapter("untrained", LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    return model


def lora_layers(model):
    return [module for module in model.modules() if isinstance(module, LoraLinear)]


def generate(model, tokenizer, adapter, sampling, lean: bool, monkeypatch):
    """The engine's completions, and how many times peft's own LoRA forward ran."""
    peft_calls = []
    peft_forward = LoraLinear.forward

    def counted(self, *args, **kwargs):
        peft_calls.append(1)
        return peft_forward(self, *args, **kwargs)

    monkeypatch.setattr(LoraLinear, "forward", counted)
    if not lean:  # peft's own forward throughout
        monkeypatch.setattr(lora_forward, "lora_linear_class", lambda: None)
    try:
        completions = HFEngine(model, tokenizer).generate(PROMPTS, [adapter] * len(PROMPTS), 3, sampling)
    finally:
        monkeypatch.undo()
    return completions, len(peft_calls)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("adapter", ["trained", "untrained"])
def test_generation_is_bit_identical_with_and_without_the_lean_forward(
    tiny_model_dir, dtype, adapter, monkeypatch
):
    model = peft_model(tiny_model_dir, getattr(torch, dtype))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for sampling in (
        SamplingParams(max_tokens=10, temperature=0.9, seed=4),
        SamplingParams(max_tokens=10, temperature=0),
    ):
        lean, peft_calls_lean = generate(model, tokenizer, adapter, sampling, True, monkeypatch)
        plain, peft_calls_plain = generate(model, tokenizer, adapter, sampling, False, monkeypatch)
        assert peft_calls_lean == 0 and peft_calls_plain > 0  # each side ran the forward it names
        assert [[(c.token_ids, c.logprobs) for c in row] for row in lean] == [
            [(c.token_ids, c.logprobs) for c in row] for row in plain
        ]


def test_an_untrained_adapter_adds_no_work_and_a_trained_one_changes_the_output(tiny_model_dir):
    model = peft_model(tiny_model_dir, torch.float32)
    layer = lora_layers(model)[0]
    assert zero_adapters(layer) == {"untrained"}
    calls = []
    hooks = [
        layer.lora_A[name].register_forward_hook(lambda *args, n=name: calls.append(n))
        for name in layer.lora_A
    ]
    x = torch.randn(3, 1, layer.in_features)
    try:
        with torch.no_grad(), lean_lora_forward(model):
            model.set_adapter("untrained")
            assert torch.equal(layer(x), layer.base_layer(x))
            model.set_adapter("trained")
            trained = layer(x)
    finally:
        for hook in hooks:
            hook.remove()
    assert calls == ["trained"]  # the untrained adapter's product never ran
    assert not torch.equal(trained, layer.base_layer(x))


def test_peft_forward_is_kept_under_autograd_and_restored_after_the_block(tiny_model_dir):
    model = peft_model(tiny_model_dir, torch.float32)
    model.set_adapter("trained")
    layers = lora_layers(model)
    x = torch.randn(2, 1, layers[0].in_features)
    with lean_lora_forward(model):
        assert all("forward" in vars(layer) for layer in layers)
        out = layers[0](x)  # autograd on: peft's forward, so the update's gradients are peft's
        assert out.requires_grad
        out.sum().backward()
    assert layers[0].lora_B["trained"].weight.grad is not None
    assert not any("forward" in vars(layer) for layer in layers)


def test_a_forward_someone_else_replaced_is_left_alone(tiny_model_dir):
    """accelerate's hooks replace a module's ``forward`` on the instance: the lean forward must
    neither wrap nor remove it."""
    model = peft_model(tiny_model_dir, torch.float32)
    layer = lora_layers(model)[0]
    calls = []

    def hooked(x, *args, **kwargs):
        calls.append(1)
        return LoraLinear.forward(layer, x, *args, **kwargs)

    layer.forward = hooked
    with torch.no_grad(), lean_lora_forward(model):
        layer(torch.randn(1, 1, layer.in_features))
        assert layer.forward is hooked
    assert layer.forward is hooked and calls == [1]


def test_float32_layers_multiply_by_transposed_copies_with_peft_s_bits(tiny_model_dir, monkeypatch):
    """Where the probe agrees, a layer multiplies by contiguous transposed copies of its LoRA
    matrices (the scaled sum inside the second product when the scaling is exact); the tokens and
    logprobs stay peft's (the bit-identity test above covers the same engine calls)."""
    model = peft_model(tiny_model_dir, torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    sampling = SamplingParams(max_tokens=6, temperature=0.9, seed=2)
    real = lora_inference._lora_by_mm
    generate(model, tokenizer, "trained", sampling, True, monkeypatch)  # probes each shape once

    real_probe = lora_inference._mm_matches_peft
    verdicts: list[bool] = []

    passed_shapes: set[tuple[int, int, int]] = set()  # (rows, in, out) whose probe agreed
    probe_now = real_probe

    def probed(*a):
        verdict = probe_now(*a)
        verdicts.append(verdict)
        if verdict:
            passed_shapes.add(a[:3])
        return verdict

    def completions_and_mm_calls(probe=None):
        nonlocal probe_now
        probe_now = probe or real_probe
        calls = []

        def by_mm(*a):
            calls.append((a[-1], (a[0].shape[0], a[0].shape[1], a[1].shape[1])))
            return real(*a)

        monkeypatch.setattr(lora_inference, "_lora_by_mm", by_mm)
        monkeypatch.setattr(lora_inference, "_mm_matches_peft", probed)
        completions = HFEngine(model, tokenizer).generate(PROMPTS, ["trained"] * len(PROMPTS), 3, sampling)
        monkeypatch.undo()
        return [[(c.token_ids, c.logprobs) for c in row] for row in completions], calls

    peft_side, _ = generate(model, tokenizer, "trained", sampling, False, monkeypatch)
    peft_side = [[(c.token_ids, c.logprobs) for c in row] for row in peft_side]
    exact, calls = completions_and_mm_calls()
    assert exact == peft_side
    # The copies serve exactly the shapes this machine's probe passed, however often each recurs
    # (which shapes pass is the CPU's verdict: on an AMD EPYC MKL's products differ in the last
    # bits and none is used; on the Intel Xeon some are).
    assert verdicts
    assert {shape for _, shape in calls} == passed_shapes
    assert all(fused for fused, _ in calls)  # every call that used them fused: scaling 2 is exact

    for layer in lora_layers(model):
        layer.scaling["trained"] = 1.5  # inexact: products by the copies, scaled and added apart
    peft_side, _ = generate(model, tokenizer, "trained", sampling, False, monkeypatch)
    peft_side = [[(c.token_ids, c.logprobs) for c in row] for row in peft_side]
    completions_and_mm_calls()  # probes the new scaling's shapes (the probe runs _lora_by_mm too)
    verdicts.clear()
    passed_shapes.clear()
    inexact, calls = completions_and_mm_calls()
    assert inexact == peft_side
    assert not any(fused for fused, _ in calls)
    assert {shape for _, shape in calls} == passed_shapes
    disagreeing, calls = completions_and_mm_calls(probe=lambda *args: False)
    assert disagreeing == peft_side and calls == []


def test_the_transposed_products_probe_catches_other_bits(monkeypatch):
    real = lora_inference._lora_by_mm
    monkeypatch.setattr(
        lora_inference, "_lora_by_mm", lambda *a: torch.nextafter(real(*a), torch.tensor(math.inf))
    )
    lora_inference._probed.clear()
    dtypes = (torch.float32, torch.float32)
    assert not lora_inference._mm_matches_peft(5, 32, 48, 4, 2.0, True, dtypes, torch.device("cpu"))
    # A product that computes peft's own operations gives its bits: the probe lets it through.
    monkeypatch.setattr(
        lora_inference,
        "_lora_by_mm",
        lambda x, result, transposed, scaling, fused: (
            result
            + F.linear(F.linear(x, transposed[0].t().contiguous()), transposed[1].t().contiguous()) * scaling
        ),
    )
    lora_inference._probed.clear()
    assert lora_inference._mm_matches_peft(5, 32, 48, 4, 2.0, True, dtypes, torch.device("cpu"))
    monkeypatch.undo()
    lora_inference._probed.clear()
