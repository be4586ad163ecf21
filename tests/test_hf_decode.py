"""The transformers engine's compacting sampling loop (llm_zoo_train.engines.hf_decode) against
``model.generate``: the same tokens and logprobs, while finished rows leave the batch.

The tiny model's end-of-sequence set is widened to a sixth of its vocabulary so that rows of one
batch end at many different steps (that is where the loops differ); its float32 weights make the
comparison exact up to matmul rounding.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from llm_zoo_train.engines import hf_decode  # noqa: E402
from llm_zoo_train.engines.base import SamplingParams  # noqa: E402
from llm_zoo_train.engines.hf import HFEngine  # noqa: E402

PROMPTS = ["hello", "apple banana cherry, reply with one word", "say the word", "U D L R", "a b"]
LOGPROB_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    vocab = base.config.vocab_size
    base.generation_config.eos_token_id = [tokenizer.eos_token_id, *range(0, vocab, 6)]
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    return get_peft_model(base, config, adapter_name="one"), tokenizer


def both_loops(model, tokenizer, n, sampling, *, share_prefill=True):
    results = []
    for compact in (False, True):
        engine = HFEngine(model, tokenizer, share_prefill=share_prefill, compact_finished_rows=compact)
        results.append(engine.generate(PROMPTS, ["one"] * len(PROMPTS), n, sampling))
    return results


def assert_same(generated, compacted):
    lengths = set()
    for row_a, row_b in zip(generated, compacted, strict=True):
        for a, b in zip(row_a, row_b, strict=True):
            assert a.token_ids == b.token_ids
            assert a.finish_reason == b.finish_reason
            assert a.prompt_token_ids == b.prompt_token_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < LOGPROB_TOLERANCE
            lengths.add(len(a.token_ids))
    return lengths


@pytest.mark.parametrize("share_prefill", [True, False])
def test_sampled_rows_match_generate_while_rows_end_at_different_steps(model_and_tokenizer, share_prefill):
    model, tokenizer = model_and_tokenizer
    sampling = SamplingParams(max_tokens=12, temperature=0.9, seed=7)
    generated, compacted = both_loops(model, tokenizer, 4, sampling, share_prefill=share_prefill)
    lengths = assert_same(generated, compacted)
    assert len(lengths) >= 4, f"rows should end at many steps to exercise compaction, got {lengths}"
    assert 12 in lengths or any(c.finish_reason == "length" for row in generated for c in row)


def test_greedy_and_truncated_sampling_match_generate(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    assert_same(*both_loops(model, tokenizer, 1, SamplingParams(max_tokens=10, temperature=0.0)))
    truncated = SamplingParams(max_tokens=10, temperature=1.3, top_k=20, top_p=0.8, seed=3)
    assert_same(*both_loops(model, tokenizer, 3, truncated))


def test_finished_rows_leave_the_forward_passes(model_and_tokenizer, monkeypatch):
    """The work shrinks: the rows fed to the model fall as rows end (generate keeps all of them)."""
    model, tokenizer = model_and_tokenizer
    batch_sizes: list[int] = []
    original = type(model).forward

    def counting_forward(self, *args, **kwargs):
        batch_sizes.append(kwargs["input_ids"].shape[0])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", counting_forward)
    engine = HFEngine(model, tokenizer, share_prefill=False, compact_finished_rows=True)
    results = engine.generate(PROMPTS, ["one"] * len(PROMPTS), 4, SamplingParams(max_tokens=12, seed=7))
    tokens = sum(len(c.token_ids) for row in results for c in row)
    assert batch_sizes[0] == 4 * len(PROMPTS)
    assert batch_sizes == sorted(batch_sizes, reverse=True) and batch_sizes[-1] < batch_sizes[0]
    assert sum(batch_sizes) == tokens  # one row-step per generated token, nothing for ended rows


def test_the_sampling_warpers_follow_generate(model_and_tokenizer):
    assert hf_decode.sampling_warpers(1.0, 0, 1.0) == []
    kinds = [type(w).__name__ for w in hf_decode.sampling_warpers(0.5, 5, 0.9)]
    assert kinds == ["TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"]


@pytest.mark.parametrize("compact", [True, False])
def test_both_loops_report_tokens_while_they_generate_and_sample_the_same(model_and_tokenizer, compact):
    """Live progress (llm_zoo_train.engines.base.generation_progress) sees every decode step's
    tokens during the call, and watching changes no sampled token."""
    from llm_zoo_train.engines.base import generation_progress

    model, tokenizer = model_and_tokenizer
    sampling = SamplingParams(max_tokens=12, temperature=0.9, seed=7)
    engine = HFEngine(model, tokenizer, max_batch_size=8, compact_finished_rows=compact)
    unwatched = engine.generate(PROMPTS, ["one"] * len(PROMPTS), 4, sampling)
    reports: list[tuple[int, int]] = []
    with generation_progress(lambda tokens, done: reports.append((tokens, done))):
        watched = engine.generate(PROMPTS, ["one"] * len(PROMPTS), 4, sampling)
    assert assert_same(unwatched, watched)
    generated = sum(len(c.token_ids) for row in watched for c in row)
    reported = sum(tokens for tokens, _ in reports)
    assert sum(done for _, done in reports) == 4 * len(PROMPTS)  # every completion, once
    assert len(reports) > 3  # during the call, one report per decode step
    if compact:
        assert reported == generated  # finished rows leave the batch and are no longer counted
        assert any(done for _, done in reports[:-1])  # completions counted as rows end, not per batch
    else:
        assert reported >= generated  # model.generate carries finished rows to the batch's end
