"""The transformers engine (llm_zoo_train.engines.hf.engine) and the chat template step (chat.py).

The tiny random model's output layer is scaled up so its next-token distributions are peaked:
greedy choices then have clear margins, and comparisons of greedy outputs across batch shapes are
not at the mercy of float noise. Two LoRA adapters with random (non-zero) weights make the model
answer differently per adapter.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from llm_zoo_train.engines.base import Engine, SamplingParams  # noqa: E402
from llm_zoo_train.engines.hf import engine as hf_engine  # noqa: E402
from llm_zoo_train.engines.hf.engine import HFEngine  # noqa: E402
from llm_zoo_train.models.chat import NoChatTemplateWarning, encode_prompt  # noqa: E402
from llm_zoo_train.training.loss import completion_logprobs  # noqa: E402

PROMPTS = ["hello", "apple banana cherry, reply with one word", "say the word", "U D L R"]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
FP32_TOLERANCE = 1e-4


def load_base(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # peaked distributions (see the module docstring)
    return model.eval()


def lora_config():
    return LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def plain_model(tiny_model_dir):
    return load_base(tiny_model_dir)


@pytest.fixture(scope="module")
def peft_model(tiny_model_dir):
    torch.manual_seed(0)
    model = get_peft_model(load_base(tiny_model_dir), lora_config(), adapter_name="one")
    model.add_adapter("two", lora_config())
    model.set_adapter("one")
    return model


@pytest.fixture(scope="module")
def engine(peft_model, tokenizer):
    return HFEngine(peft_model, tokenizer)


def plain_greedy(model, tokenizer, prompt, max_tokens=8):
    """Greedy tokens from model.generate on one unpadded prompt, cut after the first eos."""
    ids = torch.tensor([encode_prompt(tokenizer, prompt)])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    tokens = out[0, ids.shape[1] :].tolist()
    if tokenizer.eos_token_id in tokens:
        tokens = tokens[: tokens.index(tokenizer.eos_token_id) + 1]
    return tokens


def token_ids(results):
    return [[c.token_ids for c in row] for row in results]


def test_hf_engine_implements_the_engine_protocol(engine):
    assert isinstance(engine, Engine)


def test_completions_have_one_logprob_per_token_and_n_per_prompt(engine, tokenizer):
    sampling = SamplingParams(max_tokens=5, temperature=1.0, seed=0)
    results = engine.generate(PROMPTS[:3], ["one", "two", None], 4, sampling)
    assert [len(row) for row in results] == [4, 4, 4]
    for prompt, row in zip(PROMPTS[:3], results, strict=True):
        for completion in row:
            assert completion.prompt_token_ids == encode_prompt(tokenizer, prompt)
            assert 1 <= len(completion.token_ids) == len(completion.logprobs) <= 5
            assert all(lp <= 0 for lp in completion.logprobs)
            assert completion.text == tokenizer.decode(completion.token_ids, skip_special_tokens=True)
            stopped = completion.token_ids[-1] == tokenizer.eos_token_id
            assert completion.finish_reason == ("stop" if stopped else "length")
            assert tokenizer.pad_token_id not in completion.token_ids
        # n samples per prompt are separate draws, not one sample repeated.
        assert len({tuple(c.token_ids) for c in row}) > 1


def test_greedy_is_deterministic_and_equals_plain_generate(engine, peft_model, plain_model, tokenizer):
    first = engine.generate(PROMPTS, [None] * 4, 1, GREEDY)
    assert token_ids(engine.generate(PROMPTS, [None] * 4, 1, GREEDY)) == token_ids(first)
    assert token_ids(first) == [[plain_greedy(plain_model, tokenizer, p)] for p in PROMPTS]

    with_one = engine.generate(PROMPTS, ["one"] * 4, 1, GREEDY)
    peft_model.set_adapter("one")
    assert token_ids(with_one) == [[plain_greedy(peft_model, tokenizer, p)] for p in PROMPTS]
    # Greedy logprobs are taken at temperature 1.
    for row in first:
        assert all(lp <= 0 for lp in row[0].logprobs)


def test_mixed_adapters_in_one_call_are_each_answered_by_their_own(engine, plain_model, tokenizer):
    adapters = ["one", "two", None, "two", "one"]
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[1]]
    mixed = token_ids(engine.generate(prompts, adapters, 1, GREEDY))
    alone = [
        token_ids(engine.generate([p], [a], 1, GREEDY))[0] for p, a in zip(prompts, adapters, strict=True)
    ]
    assert mixed == alone
    one, two, base = mixed[0][0], mixed[1][0], mixed[2][0]
    assert len({tuple(one), tuple(two), tuple(base)}) == 3, "the adapters must answer differently"
    # None is the bare base model.
    assert base == plain_greedy(plain_model, tokenizer, PROMPTS[0])


def test_none_adapter_equals_the_model_with_adapters_disabled(engine, peft_model, plain_model, tokenizer):
    sampling = SamplingParams(max_tokens=6, temperature=1.0, seed=11)
    via_engine = engine.generate(PROMPTS, [None] * 4, 2, sampling)
    plain_engine = HFEngine(plain_model, tokenizer).generate(PROMPTS, [None] * 4, 2, sampling)
    assert token_ids(via_engine) == token_ids(plain_engine)
    for a, b in zip(via_engine, plain_engine, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=FP32_TOLERANCE)
    with peft_model.disable_adapter():
        assert [plain_greedy(peft_model, tokenizer, p) for p in PROMPTS] == [
            row[0].token_ids for row in engine.generate(PROMPTS, [None] * 4, 1, GREEDY)
        ]


def test_stops_after_the_first_eos_and_strips_padding(tiny_model_dir, tokenizer):
    model = load_base(tiny_model_dir)
    free = token_ids(HFEngine(model, tokenizer).generate(PROMPTS, [None] * 4, 1, GREEDY))
    stop = free[0][0][2]  # make the third greedy token of prompt 0 an end token
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, stop]
    stopped = HFEngine(model, tokenizer).generate(PROMPTS, [None] * 4, 1, GREEDY)
    assert len(stopped[0][0].token_ids) <= 3
    for before, row in zip(free, stopped, strict=True):
        tokens, completion = before[0], row[0]
        if stop in tokens:
            expected = tokens[: tokens.index(stop) + 1]
            assert (completion.token_ids, completion.finish_reason) == (expected, "stop")
        else:
            assert (completion.token_ids, completion.finish_reason) == (tokens, "length")
        assert len(completion.logprobs) == len(completion.token_ids)

    # The tokenizer's own eos: made the greedy first token, it ends the completion at once, and
    # as a special token it is not part of the text.
    model = load_base(tiny_model_dir)
    first = free[0][0][0]
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id] = model.lm_head.weight[first] * 1.5
    (completion,) = HFEngine(model, tokenizer).generate(PROMPTS[:1], [None], 1, GREEDY)[0]
    assert completion.token_ids == [tokenizer.eos_token_id]
    assert completion.finish_reason == "stop" and completion.text == ""


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_recorded_logprobs_equal_the_loss_recomputation(engine, peft_model, tokenizer, temperature):
    sampling = SamplingParams(max_tokens=8, temperature=temperature, seed=3)
    adapters = ["one", "two", None, "one"]
    results = engine.generate(PROMPTS, adapters, 3, sampling)  # prompts of different lengths: padding
    for adapter in ("one", "two", None):
        rows = [c for row, a in zip(results, adapters, strict=True) if a == adapter for c in row]
        if adapter is None:
            context = peft_model.disable_adapter()
        else:
            peft_model.set_adapter(adapter)
            context = torch.no_grad()
        with context, torch.no_grad():
            logprobs, mask, _ = completion_logprobs(
                peft_model,
                [c.prompt_token_ids for c in rows],
                [c.token_ids for c in rows],
                pad_token_id=tokenizer.pad_token_id,
                temperature=temperature,
            )
        for i, completion in enumerate(rows):
            n = len(completion.token_ids)
            assert mask[i, :n].sum() == n and mask[i, n:].sum() == 0
            np.testing.assert_allclose(logprobs[i, :n].numpy(), completion.logprobs, atol=FP32_TOLERANCE)


def test_seeded_sampling_is_reproducible_and_leaves_the_global_rng_alone(engine):
    sampling = SamplingParams(max_tokens=6, temperature=1.0, seed=42)
    state = torch.get_rng_state()
    first = token_ids(engine.generate(PROMPTS, ["one", "two", None, "one"], 2, sampling))
    assert torch.equal(state, torch.get_rng_state())
    assert token_ids(engine.generate(PROMPTS, ["one", "two", None, "one"], 2, sampling)) == first
    other = SamplingParams(max_tokens=6, temperature=1.0, seed=43)
    assert token_ids(engine.generate(PROMPTS, ["one", "two", None, "one"], 2, other)) != first


def test_top_k_one_and_tiny_top_p_sample_the_greedy_answer(engine):
    greedy = token_ids(engine.generate(PROMPTS, [None] * 4, 1, GREEDY))
    top_k = SamplingParams(max_tokens=8, temperature=1.0, top_k=1, seed=0)
    top_p = SamplingParams(max_tokens=8, temperature=1.0, top_p=1e-6, seed=0)
    assert token_ids(engine.generate(PROMPTS, [None] * 4, 1, top_k)) == greedy
    assert token_ids(engine.generate(PROMPTS, [None] * 4, 1, top_p)) == greedy


def test_batch_size_and_padding_do_not_change_greedy_answers(peft_model, tokenizer, engine):
    one_by_one = HFEngine(peft_model, tokenizer, max_batch_size=1)
    assert token_ids(one_by_one.generate(PROMPTS, ["two"] * 4, 2, GREEDY)) == token_ids(
        engine.generate(PROMPTS, ["two"] * 4, 2, GREEDY)
    )


def test_generation_restores_mode_active_adapter_and_trainable_flags(engine, peft_model):
    peft_model.set_adapter("two")
    peft_model.train()
    # A trainer may freeze the active adapter (a frozen agent): set_adapter would unfreeze it.
    for name, parameter in peft_model.named_parameters():
        if ".two." in name:
            parameter.requires_grad_(False)
    flags = {name: p.requires_grad for name, p in peft_model.named_parameters()}
    engine.generate(PROMPTS, ["one", None, "two", "one"], 1, SamplingParams(max_tokens=3, seed=0))
    assert peft_model.training
    assert peft_model.active_adapter == "two"
    assert {name: p.requires_grad for name, p in peft_model.named_parameters()} == flags
    peft_model.eval()
    engine.generate(PROMPTS[:1], ["one"], 1, SamplingParams(max_tokens=3, seed=0))
    assert not peft_model.training
    peft_model.set_adapter("one")


def test_bad_requests_are_clear_errors(engine, plain_model, tokenizer):
    with pytest.raises(ValueError, match="unknown adapter"):
        engine.generate(PROMPTS[:1], ["three"], 1, GREEDY)
    with pytest.raises(ValueError, match="no adapters"):
        HFEngine(plain_model, tokenizer).generate(PROMPTS[:1], ["one"], 1, GREEDY)
    with pytest.raises(ValueError, match="one adapter per prompt"):
        engine.generate(PROMPTS[:2], ["one"], 1, GREEDY)
    with pytest.raises(ValueError, match="n must be"):
        engine.generate(PROMPTS[:1], ["one"], 0, GREEDY)
    with pytest.raises(ValueError, match="max_batch_size"):
        HFEngine(plain_model, tokenizer, max_batch_size=0)


def test_load_adapters_overwrites_in_place_or_adds_a_frozen_adapter(tiny_model_dir, tokenizer, tmp_path):
    torch.manual_seed(1)
    model = get_peft_model(load_base(tiny_model_dir), lora_config(), adapter_name="one")
    model.add_adapter("two", lora_config())
    model.save_pretrained(tmp_path, selected_adapters=["one", "two"])
    engine = HFEngine(model, tokenizer)
    # one on prompts 0 and 1, then two on prompts 0 and 1
    before = token_ids(engine.generate(PROMPTS[:2] * 2, ["one", "one", "two", "two"], 1, GREEDY))
    assert before[0] != before[2]
    parameter = next(p for n, p in model.named_parameters() if ".one." in n)
    model.train()

    engine.load_adapters({"one": str(tmp_path / "two")}, version=1)  # "one" now holds two's weights
    assert token_ids(engine.generate(PROMPTS[:2], ["one", "one"], 1, GREEDY)) == before[2:]
    assert parameter is next(p for n, p in model.named_parameters() if ".one." in n)  # same tensor
    engine.load_adapters({"one": str(tmp_path / "one")}, version=2)
    assert token_ids(engine.generate(PROMPTS[:2], ["one", "one"], 1, GREEDY)) == before[:2]

    engine.load_adapters({"three": str(tmp_path / "two")}, version=3)
    assert token_ids(engine.generate(PROMPTS[:2], ["three", "three"], 1, GREEDY)) == before[2:]
    assert model.training and model.active_adapter == "one"
    assert not any(p.requires_grad for n, p in model.named_parameters() if ".three." in n)
    with pytest.raises(ValueError, match="not a peft"):
        HFEngine(load_base(tiny_model_dir), tokenizer).load_adapters(
            {"one": str(tmp_path / "one")}, version=1
        )


# ---------------------------------------------------------------------- chat template


def test_encode_prompt_applies_the_chat_template(tokenizer):
    ids = encode_prompt(tokenizer, "hi")
    assert tokenizer.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with_system = tokenizer.decode(encode_prompt(tokenizer, "hi", system_prompt="Be brief."))
    assert with_system.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi")


def test_engine_system_prompt_reaches_the_model(peft_model, tokenizer):
    (completion,) = HFEngine(peft_model, tokenizer, system_prompt="Be brief.").generate(
        ["hi"], [None], 1, GREEDY
    )[0]
    assert completion.prompt_token_ids == encode_prompt(tokenizer, "hi", "Be brief.")


def test_encode_prompt_without_template_warns_once_and_tokenizes_plainly(tiny_model_dir):
    bare = AutoTokenizer.from_pretrained(tiny_model_dir)
    bare.chat_template = None
    with pytest.warns(NoChatTemplateWarning, match="no chat template"):
        ids = encode_prompt(bare, "hello")
    assert ids == bare("hello")["input_ids"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        encode_prompt(bare, "again")


def test_shared_prefill_gives_the_same_samples(peft_model, tokenizer, monkeypatch):
    # n=3: a batch splits a prompt's rows (the prefix cache, which replaces this prefill, off).
    shared = HFEngine(peft_model, tokenizer, max_batch_size=5, prefix_cache_mb=0)
    separate = HFEngine(peft_model, tokenizer, max_batch_size=5, share_prefill=False, prefix_cache_mb=0)
    prefills = []
    original = hf_engine.shared_prefill
    monkeypatch.setattr(
        hf_engine,
        "shared_prefill",
        lambda model, ids, mask, index, **kw: (
            prefills.append(index.tolist()) or original(model, ids, mask, index, **kw)
        ),
    )
    for sampling in (GREEDY, SamplingParams(max_tokens=8, temperature=0.8, seed=9)):
        a = shared.generate(PROMPTS, ["one", "two", None, "one"], 3, sampling)
        b = separate.generate(PROMPTS, ["one", "two", None, "one"], 3, sampling)
        assert token_ids(a) == token_ids(b)
        for row_a, row_b in zip(a, b, strict=True):
            for x, y in zip(row_a, row_b, strict=True):
                np.testing.assert_allclose(x.logprobs, y.logprobs, atol=FP32_TOLERANCE)
    assert shared.share_prefill
    # Rows 0-2 answer prompt 0 (one prefill), rows 3-4 prompt 3; the next batch starts mid-prompt.
    assert prefills[0] == [0, 0, 0, 1, 1] and len(prefills) == 2 * 3  # 3 batches per call


def test_a_stop_text_ends_a_completion_at_the_token_that_completes_it(engine, tokenizer):
    """The same seeded draw with and without ``stop``: with it, the completion is the shortest prefix
    whose text holds the stop text (kept), its logprobs those of the prefix, finish_reason "stop"."""
    sampling = SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    ((full,),) = engine.generate(PROMPTS[:1], ["one"], 1, sampling)
    text = full.text
    assert len(full.token_ids) >= 6, full
    middle = tokenizer.decode(full.token_ids[:4], skip_special_tokens=True)[-2:]  # ends inside token 4
    assert middle and middle in text
    ((cut,),) = engine.generate(
        PROMPTS[:1], ["one"], 1, dataclasses.replace(sampling, stop=("zzz-never", middle))
    )
    length = next(n for n in range(1, len(full.token_ids) + 1)
                  if middle in tokenizer.decode(full.token_ids[:n], skip_special_tokens=True))  # fmt: skip
    assert cut.token_ids == full.token_ids[:length] and cut.logprobs == full.logprobs[:length]
    assert cut.finish_reason == "stop" and middle in cut.text
    assert middle not in tokenizer.decode(cut.token_ids[:-1], skip_special_tokens=True)
    ((same,),) = engine.generate(PROMPTS[:1], ["one"], 1, dataclasses.replace(sampling, stop=("zzz-never",)))
    assert same.token_ids == full.token_ids and same.finish_reason == full.finish_reason
