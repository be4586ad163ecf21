"""Passes that need only the last positions' logits gather those positions (a contiguous block)
instead of slicing them (llm_zoo_train.engines.hf.decode.last_logits_only).

``F.linear`` on a non-contiguous slice of the hidden states multiplies by an expanded copy of the
vocabulary matrix, one per row: seconds per call in bfloat16 on a CPU for a 49k vocabulary. The
engine's prompt passes (bfloat16) and the update's logprobs (every dtype) must never do that, and in
bfloat16 the engine must sample the same bits as with the slice.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from llm_zoo_train.engines.base import SamplingParams  # noqa: E402
from llm_zoo_train.engines.hf import decode as hf_decode  # noqa: E402
from llm_zoo_train.engines.hf import prefill as hf_prefill  # noqa: E402
from llm_zoo_train.engines.hf.engine import HFEngine  # noqa: E402
from llm_zoo_train.training.loss import completion_logprobs  # noqa: E402

PROMPTS = ["hello", "apple banana cherry, reply with one word", "say the word", "U D L R"]


def lora_model(tiny_model_dir, dtype):
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype)
    with torch.no_grad():
        base.lm_head.weight.mul_(20.0)  # decisive logits: tokens that depend on every bit
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    return get_peft_model(base.eval(), config, adapter_name="one")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def projections():
    """Every input of the vocabulary projection with more than one row: (rows, contiguous)."""
    seen: list[tuple[int, bool]] = []
    handles = []

    def watch(model):
        def hook(module, args):
            x = args[0]
            if x.shape[0] > 1:
                seen.append((x.shape[0], x.is_contiguous()))

        handles.append(model.get_base_model().lm_head.register_forward_pre_hook(hook))
        return seen

    yield watch
    for handle in handles:
        handle.remove()


def sampled(engine, n, temperature):
    sampling = SamplingParams(max_tokens=8, temperature=temperature, seed=5)
    rows = engine.generate(PROMPTS, ["one"] * len(PROMPTS), n, sampling)
    return [[(c.token_ids, c.logprobs, c.finish_reason) for c in row] for row in rows]


@pytest.mark.parametrize("n", [1, 3], ids=["prompt_pass_in_the_loop", "shared_prefill"])
@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "sampled"])
def test_bfloat16_generation_gathers_and_samples_the_same_bits_as_with_the_slice(
    tiny_model_dir, tokenizer, projections, monkeypatch, n, temperature
):
    model = lora_model(tiny_model_dir, torch.bfloat16)
    seen = projections(model)
    gathered = sampled(HFEngine(model, tokenizer), n, temperature)
    assert seen and all(contiguous for _, contiguous in seen), seen
    seen.clear()
    # The slice, as before: every caller asks for {"logits_to_keep": 1}.
    monkeypatch.setattr(hf_decode, "last_logits_only", lambda model, *_: {"logits_to_keep": 1})
    monkeypatch.setattr(hf_prefill, "last_logits_only", lambda model, *_: {"logits_to_keep": 1})
    sliced = sampled(HFEngine(model, tokenizer), n, temperature)
    assert any(not contiguous for _, contiguous in seen)  # the slice is the case being avoided
    assert gathered == sliced


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared_prompts", "distinct_prompts"])
def test_the_update_projects_only_contiguous_positions(tiny_model_dir, projections, dtype, shared):
    model = lora_model(tiny_model_dir, dtype)
    seen = projections(model)
    prompts = [[5, 9, 3], [5, 9, 3], [7, 2, 8, 4]] if shared else [[5, 9, 3], [6, 1], [7, 2, 8, 4]]
    completions = [[4, 4, 6], [1], [2, 3]]
    logprobs, mask, _ = completion_logprobs(model, prompts, completions, pad_token_id=0)
    (logprobs * mask).sum().backward()
    assert seen and all(contiguous for _, contiguous in seen), seen
    assert logprobs.shape == (3, 3) and torch.isfinite(logprobs).all()
