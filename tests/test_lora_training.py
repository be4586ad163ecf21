"""The fused LoRA forward of the update (llm_zoo_train.kernels.lora_training): the same logprobs and
gradients as peft's forward, fused only where the scaling is exact and the probe agrees, peft's
forward everywhere else."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
from peft import LoraConfig, get_peft_model  # noqa: E402
from peft.tuners.lora.layer import Linear as LoraLinear  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from llm_zoo_train.kernels import lora_training  # noqa: E402
from llm_zoo_train.kernels.lora_training import exact_scaling, fused_lora_forward, fused_matches_peft  # noqa: E402
from llm_zoo_train.training.loss import completion_logprobs  # noqa: E402

PROMPTS = [[1, 50, 60], [1, 50, 60], [1, 80], [1, 80, 81, 82]]
COMPLETIONS = [[10, 11, 12], [13, 14], [15, 16, 17, 18], [19]]


def peft_model(tiny_model_dir, r: int, alpha: float, **lora):
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules="all-linear", init_lora_weights=False, **lora)
    return get_peft_model(base, config).train()


def logprobs_and_gradients(model, fused: bool, monkeypatch):
    """Token logprobs, entropies and the adapter's gradients of one weighted loss, and how many
    LoRA layer calls took the fused product."""
    fused_calls = []
    real_addmm = torch.addmm
    monkeypatch.setattr(torch, "addmm", lambda *a, **k: fused_calls.append(1) or real_addmm(*a, **k))
    model.zero_grad()
    try:
        with fused_lora_forward(model) if fused else torch.enable_grad():
            logprobs, _, entropy = completion_logprobs(
                model, PROMPTS, COMPLETIONS, pad_token_id=0, temperature=0.7, with_entropy=True
            )
        weights = torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(1))
        (logprobs * weights).sum().backward()
    finally:
        monkeypatch.undo()
    grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    return logprobs.detach(), entropy, grads, len(fused_calls)


def assert_same_bits(a, b):
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert len(a[2]) == len(b[2]) > 0
    assert all(torch.equal(x, y) for x, y in zip(a[2], b[2], strict=True))
    assert any(bool(g.abs().sum() > 0) for g in a[2])


def test_exact_scalings_are_powers_of_two_of_at_least_one():
    assert all(exact_scaling(s) for s in (1.0, 2.0, 4.0, 1024.0))
    assert not any(exact_scaling(s) for s in (0.5, 0.25, 1.5, 3.0, 0.0, -2.0, math.inf, math.nan))


def test_the_fused_update_forward_gives_peft_s_logprobs_and_gradients(tiny_model_dir, monkeypatch):
    model = peft_model(tiny_model_dir, r=4, alpha=8)  # scaling 2: exact
    layers = [m for m in model.modules() if isinstance(m, LoraLinear)]
    plain = logprobs_and_gradients(model, False, monkeypatch)
    logprobs_and_gradients(model, True, monkeypatch)  # probes each shape once (probes call addmm)
    fused = logprobs_and_gradients(model, True, monkeypatch)
    assert_same_bits(fused, plain)
    assert plain[3] == 0
    # Every layer call of both passes (prompts, then completions) is fused where the probe agrees;
    # MKL's products (this project's machines) agree at every shape.
    if torch.backends.mkl.is_available():
        assert fused[3] == 2 * len(layers)
    assert all("forward" not in vars(layer) for layer in layers)  # peft's forward is back


def test_inexact_scalings_and_disagreeing_probes_keep_peft_s_operations(tiny_model_dir, monkeypatch):
    inexact = peft_model(tiny_model_dir, r=4, alpha=6)  # scaling 1.5
    plain = logprobs_and_gradients(inexact, False, monkeypatch)
    fused = logprobs_and_gradients(inexact, True, monkeypatch)
    assert fused[3] == 0
    assert_same_bits(fused, plain)

    exact = peft_model(tiny_model_dir, r=4, alpha=8)
    monkeypatch.setattr(lora_training, "fused_matches_peft", lambda *args: False)
    plain = logprobs_and_gradients(exact, False, monkeypatch)
    monkeypatch.setattr(lora_training, "fused_matches_peft", lambda *args: False)
    fused = logprobs_and_gradients(exact, True, monkeypatch)
    assert fused[3] == 0
    assert_same_bits(fused, plain)


def test_peft_s_forward_runs_without_autograd_and_for_dropout(tiny_model_dir, monkeypatch):
    model = peft_model(tiny_model_dir, r=4, alpha=8)
    peft_calls = []
    peft_forward = LoraLinear.forward
    monkeypatch.setattr(
        LoraLinear, "forward", lambda self, *a, **k: peft_calls.append(1) or peft_forward(self, *a, **k)
    )
    with fused_lora_forward(model), torch.no_grad():
        model(input_ids=torch.tensor([PROMPTS[0]]))
    assert len(peft_calls) == sum(isinstance(m, LoraLinear) for m in model.modules())
    monkeypatch.undo()

    with_dropout = peft_model(tiny_model_dir, r=4, alpha=8, lora_dropout=0.1)
    assert logprobs_and_gradients(with_dropout, True, monkeypatch)[3] == 0


@pytest.mark.parametrize("rows", [1, 7, 248])
def test_the_probe_compares_outputs_and_gradients(rows, monkeypatch):
    assert fused_matches_peft(rows, 48, 4, 1.5, torch.float32, torch.device("cpu")) in (True, False)
    # A fused product that is off by one unit in the last place is caught.
    real_addmm = torch.addmm
    monkeypatch.setattr(
        torch, "addmm", lambda *a, **k: torch.nextafter(real_addmm(*a, **k), torch.tensor(math.inf))
    )
    lora_training._probed.clear()
    assert not fused_matches_peft(rows, 48, 4, 2.0, torch.float32, torch.device("cpu"))
    monkeypatch.undo()
    lora_training._probed.clear()
    if torch.backends.mkl.is_available():
        assert fused_matches_peft(rows, 48, 4, 2.0, torch.float32, torch.device("cpu"))
