"""The transformers engine's compacting sampling loop (llm_zoo_train.engines.hf.decode) against
``model.generate``: the same tokens and logprobs with ``generate``'s random numbers, while finished
rows leave the batch; and its default draw (one number per row) against the probabilities.

The tiny model's end-of-sequence set is widened to a sixth of its vocabulary so that rows of one
batch end at many different steps (that is where the loops differ); its float32 weights make the
comparison exact up to matmul rounding.
"""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from llm_zoo_train.engines.base import SamplingParams  # noqa: E402
from llm_zoo_train.engines.hf import decode as hf_decode  # noqa: E402
from llm_zoo_train.engines.hf.engine import HFEngine  # noqa: E402

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
        engine = HFEngine(
            model,
            tokenizer,
            share_prefill=share_prefill,
            compact_finished_rows=compact,
            draws_as_generate=True,
        )
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


def forward_rows(model, monkeypatch) -> list[int]:
    """The rows of every forward pass of ``model`` from now on (filled as it runs)."""
    batch_sizes: list[int] = []
    original = type(model).forward

    def counting_forward(self, *args, **kwargs):
        batch_sizes.append(kwargs["input_ids"].shape[0])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", counting_forward)
    return batch_sizes


def test_a_shared_prefill_gives_the_first_token_without_another_pass(model_and_tokenizer, monkeypatch):
    """The compacting loop samples each row's first token from the prefill's logits: the prompts
    are read once, whole, and every later pass runs a sampled token."""
    model, tokenizer = model_and_tokenizer
    engine = HFEngine(model, tokenizer, prefix_cache_mb=0)
    batch_sizes = forward_rows(model, monkeypatch)
    out = engine.generate(PROMPTS, ["one"] * len(PROMPTS), 3, SamplingParams(max_tokens=6, seed=7))
    longest = max(len(c.token_ids) for row in out for c in row)
    assert batch_sizes[0] == len(PROMPTS)
    assert len(batch_sizes) == longest  # the prefill, then one pass per token after the first


def test_finished_rows_leave_the_forward_passes(model_and_tokenizer, monkeypatch):
    """The work shrinks: the rows fed to the model fall as rows end (generate keeps all of them).
    Without the float32 CPU floor, every finished row leaves at once."""
    model, tokenizer = model_and_tokenizer
    batch_sizes = forward_rows(model, monkeypatch)
    tokens, _ = decode(
        model, tokenizer, SamplingParams(max_tokens=12, seed=7), 4, preallocate_kv=True, floor=0
    )
    assert batch_sizes[0] == 4 * len(PROMPTS)
    assert batch_sizes == sorted(batch_sizes, reverse=True) and batch_sizes[-1] < batch_sizes[0]
    assert sum(batch_sizes) == sum(len(row) for row in tokens)  # one row-step per token, none for ended rows


def test_float32_on_a_cpu_keeps_sixteen_rows_while_ten_or_more_generate(model_and_tokenizer, monkeypatch):
    """The default floor (float32 model, CPU): finished rows stay in as placeholders while 10-15
    rows generate, so the forward passes never take 10-15 rows; the tokens and logprobs are those
    of the loop without placeholders."""
    model, tokenizer = model_and_tokenizer
    sampling = SamplingParams(max_tokens=12, temperature=1.0, seed=7)
    plain = decode(model, tokenizer, sampling, 4, preallocate_kv=True, floor=0)
    batch_sizes = forward_rows(model, monkeypatch)
    floored = decode(model, tokenizer, sampling, 4, preallocate_kv=True)
    generating = [sum(len(row) > step for row in floored[0]) for step in range(len(batch_sizes))]
    assert not any(hf_decode.CPU_FLOAT32_FLOOR_FROM <= rows < 16 for rows in batch_sizes)
    assert any(10 <= live < 16 for live in generating)  # the floor was needed in this run
    for rows, live in zip(batch_sizes, generating, strict=True):
        assert rows == (16 if 10 <= live < 16 else live)
    assert floored[0] == plain[0]
    for a, b in zip(floored[1], plain[1], strict=True):
        assert max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0) < LOGPROB_TOLERANCE


def test_rows_to_keep_adds_placeholders_only_within_the_floors_range():
    keep = hf_decode.rows_to_keep
    generating = torch.tensor([1, 4, 6, 7, 8, 9, 10, 11, 12, 13, 19])  # 11 of 20 computed rows
    assert keep(generating, 20, 16, 10).tolist() == [*range(15), 19]  # placeholders 0, 2, 3, 5, 14
    assert keep(generating, 20, 0, 10).tolist() == generating.tolist()  # no floor
    assert keep(generating[:9], 20, 16, 10).tolist() == generating[:9].tolist()  # fewer than 10 generate
    assert len(keep(torch.arange(11), 12, 16, 10)) == 12  # never more rows than are computed
    assert keep(torch.arange(17), 20, 16, 10).tolist() == list(range(17))  # 16 or more generate: all that do


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


def decode(model, tokenizer, sampling, n, *, preallocate_kv, on_step=None, floor=None):
    """decode_compacting on PROMPTS (left-padded, n rows each); ``on_step(cache)`` before each pass."""
    encoded = [tokenizer(p)["input_ids"] for p in PROMPTS for _ in range(n)]
    width = max(len(ids) for ids in encoded)
    input_ids = torch.zeros((len(encoded), width), dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(encoded):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        mask[row, width - len(ids) :] = 1
    hook = None
    if on_step is not None:
        hook = model.get_base_model().model.register_forward_pre_hook(
            lambda module, args, kwargs: on_step(kwargs["past_key_values"]), with_kwargs=True
        )
    torch.manual_seed(sampling.seed or 0)
    try:
        return hf_decode.decode_compacting(
            model, input_ids, mask, cache=None, max_new_tokens=sampling.max_tokens,
            eos_token_ids=set(model.generation_config.eos_token_id), pad_token_id=0,
            greedy=sampling.greedy, temperature=sampling.temperature, preallocate_kv=preallocate_kv,
            floor_rows=floor,
        )  # fmt: skip
    finally:
        if hook is not None:
            hook.remove()


@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "sampled"])
def test_preallocated_kv_gives_bit_identical_tokens_and_logprobs(model_and_tokenizer, temperature):
    model, tokenizer = model_and_tokenizer
    sampling = SamplingParams(max_tokens=12, temperature=temperature, seed=5)
    in_place = decode(model, tokenizer, sampling, 3, preallocate_kv=True)
    copied = decode(model, tokenizer, sampling, 3, preallocate_kv=False)
    assert in_place == copied  # exact: the same numbers, only stored differently
    assert len({len(tokens) for tokens in in_place[0]}) > 2  # rows left the batch at several steps


def test_decode_steps_write_the_kv_cache_in_place(model_and_tokenizer):
    """The cache is not re-allocated (re-copied) at every decode step: its storage stays put
    between the steps where rows leave the batch."""
    model, tokenizer = model_and_tokenizer
    storages: list[tuple[int, int]] = []  # (rows, storage address of layer 0's keys)

    def on_step(cache):
        if cache.get_seq_length() > 0:
            keys = cache.layers[0].keys
            storages.append((keys.shape[0], keys.untyped_storage().data_ptr()))

    decode(model, tokenizer, SamplingParams(max_tokens=12, seed=5), 3, preallocate_kv=True, on_step=on_step)
    steady = [b for a, b in itertools.pairwise(storages) if a[0] == b[0]]  # no row left
    moved = [b for a, b in itertools.pairwise(storages) if a[0] == b[0] and a[1] != b[1]]
    assert len(steady) >= 3 and not moved


def test_draw_per_row_follows_the_probabilities_and_never_draws_a_zero():
    """Frequencies over many draws match each row's probabilities (within 5 standard errors), on a
    vocabulary that is not a whole number of blocks; tokens of probability zero never come."""
    generator = torch.Generator().manual_seed(0)
    vocabulary, draws = 300, 40_000
    probs = torch.softmax(torch.randn(2, vocabulary, generator=generator) * 2, dim=-1)
    probs[0, ::3] = 0.0  # a third of the first row's tokens are masked (as top-k or top-p do)
    probs[0] /= probs[0].sum()
    torch.manual_seed(1)
    chosen = hf_decode.draw_per_row(probs.repeat_interleave(draws, dim=0), block=64).view(2, draws)
    for row in range(2):
        frequencies = torch.bincount(chosen[row], minlength=vocabulary).double() / draws
        expected = probs[row].double()
        standard_error = (expected * (1 - expected) / draws).sqrt()
        assert bool(((frequencies - expected).abs() <= 5 * standard_error + 1e-12).all())
    assert not bool(torch.isin(chosen[0], torch.arange(0, vocabulary, 3)).any())


def test_draw_per_row_at_the_rows_total_takes_the_last_token_with_mass(monkeypatch):
    """A number that rounding puts at the row's total (the end of every cumulative sum) draws the
    last token that has probability, not the zero-probability tokens after it nor past the end."""
    probs = torch.tensor([[0.2, 0.0, 0.5, 0.3, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    monkeypatch.setattr(torch, "rand", lambda shape, **kwargs: torch.ones(shape, **kwargs))
    assert hf_decode.draw_per_row(probs, block=2).tolist() == [3, 6]
    monkeypatch.setattr(torch, "rand", lambda shape, **kwargs: torch.zeros(shape, **kwargs))
    assert hf_decode.draw_per_row(probs, block=2).tolist() == [0, 6]


def test_the_default_draw_samples_generates_distribution_reproducibly(model_and_tokenizer):
    """Per-row draws: the same tokens for the same seed, other tokens than generate's random
    numbers give, greedy unchanged, and each sampled token's logprob is the one the model gives
    it (checked by the first-token frequencies of many samples against their probabilities)."""
    model, tokenizer = model_and_tokenizer
    sampling = SamplingParams(max_tokens=6, temperature=0.9, seed=11)
    per_row = HFEngine(model, tokenizer)
    as_generate = HFEngine(model, tokenizer, draws_as_generate=True)
    first = per_row.generate(PROMPTS, ["one"] * len(PROMPTS), 4, sampling)
    assert assert_same(first, per_row.generate(PROMPTS, ["one"] * len(PROMPTS), 4, sampling))
    other = as_generate.generate(PROMPTS, ["one"] * len(PROMPTS), 4, sampling)
    assert [c.token_ids for row in first for c in row] != [c.token_ids for row in other for c in row]
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    assert_same(
        per_row.generate(PROMPTS, ["one"] * len(PROMPTS), 1, greedy),
        as_generate.generate(PROMPTS, ["one"] * len(PROMPTS), 1, greedy),
    )

    draws = 2_000
    one_token = SamplingParams(max_tokens=1, temperature=0.9, seed=3)
    samples = HFEngine(model, tokenizer, max_batch_size=500).generate(["hello"], ["one"], draws, one_token)[0]
    counts: dict[int, int] = {}
    probability: dict[int, float] = {}
    for completion in samples:
        token = completion.token_ids[0]
        counts[token] = counts.get(token, 0) + 1
        probability[token] = float(torch.tensor(completion.logprobs[0]).exp())
    for token, count in counts.items():
        p = probability[token]
        assert abs(count / draws - p) <= 5 * (p * (1 - p) / draws) ** 0.5 + 1e-9
    assert sum(probability.values()) > 0.5  # the drawn tokens hold most of the mass: a real check
