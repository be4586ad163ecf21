"""The sdpa variant that reads grouped key/value heads in place while generating
(llm_zoo_train.kernels.attention): the engine samples the same tokens and logprobs, bit for bit, as
with transformers' sdpa, and the update's forward and backward are transformers' sdpa unchanged.

The tiny model groups its heads (4 query heads, 2 key/value heads) and its prompts have different
lengths, so every batch is left-padded and carries a mask: the case the variant changes.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from llm_zoo_train.engines.base import SamplingParams  # noqa: E402
from llm_zoo_train.engines.hf.engine import HFEngine  # noqa: E402
from llm_zoo_train.kernels import attention  # noqa: E402
from llm_zoo_train.kernels.attention import (  # noqa: E402
    GROUPED_MIN_SPEEDUP,
    SDPA_SHARED_KV,
    decode_attention_choices,
    forget_decode_attention_choices,
    grouped_decode_attention,
    register,
)

PROMPTS = ["hello", "apple banana cherry, reply with one word", "say the word", "U D L R"]


@pytest.fixture(autouse=True)
def decode_by_sdpa(monkeypatch):
    """The bit-for-bit comparisons below are of torch's sdpa kernel (the measured choice of the
    decode's attention is tested on its own at the end)."""
    monkeypatch.setattr(attention, "DECODE_ATTENTION", "sdpa")
    forget_decode_attention_choices()
    yield
    forget_decode_attention_choices()


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert base.config.num_key_value_heads < base.config.num_attention_heads  # grouped heads
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    return get_peft_model(base, config, adapter_name="one"), tokenizer


@pytest.fixture
def sdpa_calls(monkeypatch):
    """Every call of torch's sdpa kernel: (a mask was given, enable_gqa, key heads)."""
    calls: list[tuple[bool, bool, int]] = []
    kernel = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, **kwargs):
        calls.append((attn_mask is not None, bool(kwargs.get("enable_gqa", False)), key.shape[1]))
        return kernel(query, key, value, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


def generated(model, tokenizer, implementation, sampling):
    model.get_base_model().set_attn_implementation(implementation)
    try:
        engine = HFEngine(model, tokenizer)
        rows = engine.generate(PROMPTS, ["one"] * len(PROMPTS), 3, sampling)
    finally:
        model.get_base_model().set_attn_implementation("sdpa")
    return [[(c.token_ids, c.logprobs, c.finish_reason) for c in row] for row in rows]


@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "sampled"])
def test_the_engine_samples_the_same_bits_as_with_transformers_sdpa(
    model_and_tokenizer, sdpa_calls, temperature
):
    model, tokenizer = model_and_tokenizer
    sampling = SamplingParams(max_tokens=10, temperature=temperature, seed=7)
    plain = generated(model, tokenizer, "sdpa", sampling)
    plain_calls = list(sdpa_calls)
    sdpa_calls.clear()
    in_place = generated(model, tokenizer, register(), sampling)
    assert in_place == plain
    heads = model.config.num_key_value_heads
    # transformers' sdpa copied the key/value heads (never enable_gqa with a mask); ours read them in place
    assert plain_calls and not any(masked and gqa for masked, gqa, _ in plain_calls)
    assert all(masked for masked, _, _ in sdpa_calls)
    assert sdpa_calls and all(gqa and key_heads == heads for _, gqa, key_heads in sdpa_calls)


def loss_and_grads(model, implementation, batch):
    model.get_base_model().set_attn_implementation(implementation)
    try:
        model.zero_grad(set_to_none=True)
        loss = model(**batch).logits.float().log_softmax(-1).mean()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    finally:
        model.get_base_model().set_attn_implementation("sdpa")
    return loss.detach(), grads


def test_the_update_runs_transformers_sdpa_unchanged(model_and_tokenizer, sdpa_calls):
    """With autograd on (the update), the variant is transformers' sdpa: the same loss and LoRA
    gradients, bit for bit, and the kernel is called as transformers calls it."""
    model, tokenizer = model_and_tokenizer
    tokenizer.padding_side = "left"
    batch = dict(tokenizer(PROMPTS, return_tensors="pt", padding=True))
    assert (batch["attention_mask"] == 0).any()
    plain = loss_and_grads(model, "sdpa", batch)
    plain_calls = list(sdpa_calls)
    sdpa_calls.clear()
    ours = loss_and_grads(model, register(), batch)
    assert torch.equal(plain[0], ours[0])
    assert plain[1].keys() == ours[1].keys() and len(plain[1]) > 0
    assert all(torch.equal(plain[1][name], ours[1][name]) for name in plain[1])
    assert sdpa_calls == plain_calls


def test_register_is_idempotent_and_names_the_implementation(model_and_tokenizer):
    model, _ = model_and_tokenizer
    assert register() == register() == SDPA_SHARED_KV
    model.get_base_model().set_attn_implementation(SDPA_SHARED_KV)
    assert model.config._attn_implementation == SDPA_SHARED_KV
    model.get_base_model().set_attn_implementation("sdpa")


def grouped_inputs(dtype=torch.float32):
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(5, 1, 9, 16, generator=generator).transpose(1, 2).to(dtype)  # as the model's view
    key, value = (torch.randn(5, 3, 12, 16, generator=generator).to(dtype) for _ in range(2))
    keep = torch.ones(5, 1, 1, 12, dtype=torch.bool)
    keep[1, ..., :4] = False
    keep[3, ..., :9] = False
    return query, key, value, keep


@pytest.mark.parametrize("mask", ["none", "bool", "additive"])
def test_grouped_decode_attention_is_sdpas_over_copied_heads_to_float32_rounding(mask):
    query, key, value, keep = grouped_inputs()
    given = {
        "none": None,
        "bool": keep,
        "additive": torch.zeros(keep.shape).masked_fill(~keep, float("-inf")),
    }[mask]
    reference = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(3, 1), value.repeat_interleave(3, 1), attn_mask=given, scale=0.25
    )
    torch.testing.assert_close(
        grouped_decode_attention(query, key, value, given, 0.25), reference, rtol=0, atol=1e-6
    )


@pytest.mark.parametrize(
    ("grouped_s", "chosen"),
    [(0.010 / GROUPED_MIN_SPEEDUP - 1e-6, "grouped"), (0.010 / GROUPED_MIN_SPEEDUP + 1e-4, "sdpa")],
)
def test_auto_takes_the_grouped_products_only_when_faster_by_the_margin_once_per_dtype(
    monkeypatch, grouped_s, chosen
):
    query, key, value, keep = grouped_inputs()
    times = {"sdpa": 0.010, "grouped": grouped_s}
    calls: list[str] = []

    def timed(name):
        def run(*args):
            calls.append(name)
            return torch.zeros(1)

        return run

    readings = iter(range(1000))  # perf_counter alternates: a start, then that call's end

    def perf_counter():
        reading = float(next(readings))
        return reading if reading % 2 == 0 else reading - 1 + times[calls[-1]]

    monkeypatch.setattr(attention, "_sdpa_in_place", timed("sdpa"))
    monkeypatch.setattr(attention, "grouped_decode_attention", timed("grouped"))
    monkeypatch.setattr(attention.time, "perf_counter", perf_counter)
    assert attention._grouped_faster(query, key, value, keep, 0.25) == (chosen == "grouped")
    measured = len(calls)
    assert attention._grouped_faster(query, key, value, keep, 0.25) == (chosen == "grouped")
    assert len(calls) == measured == 8  # measured once: 4 calls of each
    assert decode_attention_choices()["cpu/float32"]["kernel"] == chosen


def test_the_engine_decodes_with_the_grouped_products_to_float32_rounding(model_and_tokenizer, monkeypatch):
    model, tokenizer = model_and_tokenizer
    sampling = SamplingParams(max_tokens=10, temperature=0.9, seed=5)
    by_sdpa = generated(model, tokenizer, register(), sampling)
    monkeypatch.setattr(attention, "DECODE_ATTENTION", "grouped")
    grouped = generated(model, tokenizer, register(), sampling)
    # tokens can differ only where two are within float32 rounding of each other; this seed's do not
    assert [[c[0] for c in row] for row in grouped] == [[c[0] for c in row] for row in by_sdpa]
    for row, reference in zip(grouped, by_sdpa, strict=True):
        for ours, theirs in zip(row, reference, strict=True):
            torch.testing.assert_close(torch.tensor(ours[1]), torch.tensor(theirs[1]), rtol=0, atol=1e-4)


def test_model_decode_attention_sets_the_process_choice(tiny_model_dir):
    from llm_zoo_train.config import ModelConfig
    from llm_zoo_train.models.policy import load_base_model

    for choice in ("grouped", "sdpa", "auto"):
        load_base_model(ModelConfig(name_or_path=str(tiny_model_dir), decode_attention=choice))
        assert choice == attention.DECODE_ATTENTION
    with pytest.raises(ValueError, match="must be one of 'auto', 'sdpa', 'grouped', got 'fast'"):
        attention.set_decode_attention("fast")
    assert attention.DECODE_ATTENTION == "auto"


def test_an_unknown_decode_attention_is_a_config_error_naming_the_choices(tiny_model_dir, tmp_path):
    from llm_zoo_train.config import ConfigError, validate
    from train_helpers import toy_config

    with pytest.raises(ConfigError, match="decode_attention") as err:
        validate(toy_config(tiny_model_dir, tmp_path / "run", ["--model.decode_attention", "fast"]))
    assert "grouped" in str(err.value) and "sdpa" in str(err.value)
