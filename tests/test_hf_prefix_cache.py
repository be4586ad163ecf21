"""The transformers engine's per-adapter KV prefix cache (llm_zoo_train.engines.hf.prefix_cache).

Same tiny model as tests/test_hf_engine.py (output layer scaled up, so greedy choices have clear
margins): with the cache, an engine samples the tokens it samples without it, prefills fewer
positions, and never serves keys and values computed with weights that have since changed.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from llm_zoo_train.engines.base import SamplingParams  # noqa: E402
from llm_zoo_train.engines.hf.engine import CPU_PREFIX_CACHE_MB, HFEngine, prefix_cache_mb_for  # noqa: E402
from llm_zoo_train.engines.hf.prefix_cache import PrefixKVCache, common_prefix_length  # noqa: E402

TASK = "Move the agent to the goal on this grid: S . . # . G, then reply with one move"
# Look-ahead-like traffic: branch prompts that share the task text, asked once each (n=1), then
# one of them again with n candidates, and a longer prompt that extends one of them.
BRANCHES = [TASK + " (you moved up)", TASK + " (you moved left)", TASK + " (you waited)"]
GREEDY = SamplingParams(max_tokens=6, temperature=0.0)
SAMPLED = SamplingParams(max_tokens=6, temperature=0.9, seed=3)
FP32_TOLERANCE = 1e-4
#: Prefill block of the cached engines here: the tiny model's prompts are shorter than the default 128.
BLOCK = 4


def lora_config():
    return LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False
    )


def peft_model(model_dir):
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        base.lm_head.weight.mul_(20.0)
    torch.manual_seed(0)
    model = get_peft_model(base.eval(), lora_config(), adapter_name="one")
    model.add_adapter("two", lora_config())
    model.set_adapter("one")
    return model


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return peft_model(tiny_model_dir)


def calls(engine, sampling):
    """A step's worth of calls; every completion's tokens and logprobs."""
    out = []
    for adapter in ("one", "two", None):
        out += engine.generate(BRANCHES, [adapter] * 3, 1, sampling)
    out += engine.generate(BRANCHES[1:2], ["one"], 3, sampling)
    out += engine.generate([BRANCHES[0] + " and then you waited", BRANCHES[2]], ["one", "two"], 2, sampling)
    return [(c.token_ids, c.logprobs) for row in out for c in row]


def assert_same(a, b):
    assert [t for t, _ in a] == [t for t, _ in b]
    for (_, x), (_, y) in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, atol=FP32_TOLERANCE)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_prefix_cache_gives_the_same_tokens_and_logprobs(model, tokenizer, sampling):
    cached = HFEngine(model, tokenizer, max_batch_size=4, prefix_cache_mb=64, prefix_block=BLOCK)
    plain = HFEngine(model, tokenizer, max_batch_size=4, prefix_cache_mb=0)
    assert cached.prefix_cache is not None and plain.prefix_cache is None
    assert_same(calls(cached, sampling), calls(plain, sampling))
    store = cached.prefix_cache
    assert store.hit_tokens > store.prefilled_tokens > 0  # most prompt positions were reused


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_what_the_cache_held_before_changes_no_bit(model, tokenizer, sampling):
    """A replayed or resumed step meets another cache than the original did: the same calls must
    give the same tokens and logprobs, bit for bit, whatever earlier prompts left in it."""
    fresh = HFEngine(model, tokenizer, max_batch_size=4, prefix_cache_mb=64, prefix_block=BLOCK)
    warmed = HFEngine(model, tokenizer, max_batch_size=4, prefix_cache_mb=64, prefix_block=BLOCK)
    # Prompts sharing prefixes of many lengths with the step's, some longer than its prompts.
    others = [TASK[:n] for n in range(20, len(TASK), 9)] + [b + " and then you moved down" for b in BRANCHES]
    for adapter in ("one", "two"):
        warmed.generate(others, [adapter] * len(others), 1, GREEDY)
    hits_before = warmed.prefix_cache.hit_tokens
    assert calls(warmed, sampling) == calls(fresh, sampling)
    assert warmed.prefix_cache.hit_tokens - hits_before > fresh.prefix_cache.hit_tokens  # it did reuse more


def forward_positions(model, engine, prompts, adapters, n):
    """Positions run through the model by one generate call (prefill and decode together)."""
    seen = []
    hook = model.get_base_model().model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].numel()), with_kwargs=True
    )
    try:
        engine.generate(prompts, adapters, n, GREEDY)
    finally:
        hook.remove()
    return sum(seen)


def test_a_prompt_asked_again_is_not_prefilled_again(model, tokenizer):
    engine = HFEngine(model, tokenizer, prefix_cache_mb=64, prefix_block=BLOCK)
    first = forward_positions(model, engine, BRANCHES, ["one"] * 3, 1)
    again = forward_positions(model, engine, BRANCHES[:1], ["one"], 4)  # the look-ahead's prompt, n=K
    longest = max(len(engine._encode(p)) for p in BRANCHES)
    # The branches share the task text: it is prefilled once, not three times.
    assert first < 2 * longest
    # Without the cache the second call prefills its whole prompt again; with it, only the last
    # prompt token and the decode steps run (4 rows x at most 6 tokens).
    assert again <= 4 * GREEDY.max_tokens
    # Another adapter's keys and values are never used.
    other = forward_positions(model, engine, BRANCHES[:1], ["two"], 1)
    assert other > longest - 2


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_prompts_within_one_block_take_the_batched_prefill(model, tokenizer, sampling):
    """Only whole blocks are kept: a call whose prompts all fit in one block has nothing to reuse
    or store, and gets the batched prefill, the very bits of an engine without the cache."""
    cached = HFEngine(model, tokenizer, max_batch_size=4, prefix_cache_mb=64, prefix_block=1000)
    plain = HFEngine(model, tokenizer, max_batch_size=4, prefix_cache_mb=0)
    assert calls(cached, sampling) == calls(plain, sampling)
    store = cached.prefix_cache
    assert len(store) == 0 and store.prefilled_tokens == 0 and store.hit_tokens == 0
    # One block or more to prefill: the blocked path, which stores what it prefilled.
    blocked = HFEngine(model, tokenizer, max_batch_size=4, prefix_cache_mb=64, prefix_block=BLOCK)
    blocked.generate(BRANCHES, ["one"] * 3, 1, sampling)
    assert len(blocked.prefix_cache) > 0 and blocked.prefix_cache.prefilled_tokens > 0


def test_the_view_without_the_cache_prefills_as_an_engine_without_one(model, tokenizer):
    """``without_prefix_cache`` (the trainer's evaluation engine): the same model, settings and
    packed weights, no cache, the bits of an engine built with ``prefix_cache_mb=0``; the engine it
    came from keeps its cache."""
    cached = HFEngine(model, tokenizer, max_batch_size=4, prefix_cache_mb=64, prefix_block=BLOCK)
    view = cached.without_prefix_cache()
    assert view is not cached and view.prefix_cache is None and cached.prefix_cache is not None
    assert view.model is cached.model and view.packed_weights is cached.packed_weights
    assert view.max_batch_size == cached.max_batch_size and view.prefix_block == cached.prefix_block
    plain = HFEngine(model, tokenizer, max_batch_size=4, prefix_cache_mb=0)
    assert calls(view, SAMPLED) == calls(plain, SAMPLED)
    assert len(cached.prefix_cache) == 0  # the view never wrote into its origin's cache
    assert plain.without_prefix_cache() is plain


def test_a_router_gives_each_engine_its_view_without_the_cache(model, tokenizer):
    """Several base models: the router's view routes the same adapters to each engine's uncached
    view; an engine that is not an ``HFEngine`` is kept as it is."""
    from llm_zoo_train.training.model_pools import ModelRouter

    class Other:  # any other Engine, e.g. a server client
        def generate(self, prompts, adapters, n, sampling):
            return [[] for _ in prompts]

    cached = HFEngine(model, tokenizer, prefix_cache_mb=64, prefix_block=BLOCK)
    other = Other()
    router = ModelRouter({"a": cached, "b": other}, {"one": "a", "two": "b"})
    view = router.without_prefix_cache()
    assert view.adapter_models == router.adapter_models and view.engines["b"] is other
    assert view.engines["a"].prefix_cache is None and view.engines["a"].model is model
    assert router.engines["a"] is cached and cached.prefix_cache is not None


def test_the_default_cache_size_follows_the_device(model):
    """``rollout.prefix_cache_mb: null``: on a CPU model, :data:`CPU_PREFIX_CACHE_MB`; elsewhere off
    (a meta-device model stands in for a GPU one here); a number given is kept, 0 included."""
    assert prefix_cache_mb_for(None, model) == CPU_PREFIX_CACHE_MB > 0
    assert prefix_cache_mb_for(0, model) == 0.0 and prefix_cache_mb_for(8, model) == 8.0
    off_cpu = torch.nn.Linear(2, 2, device="meta")
    assert prefix_cache_mb_for(None, off_cpu) == 0.0 and prefix_cache_mb_for(16, off_cpu) == 16.0


def test_a_weight_update_empties_the_cache(tiny_model_dir, tokenizer):
    model = peft_model(tiny_model_dir)
    cached = HFEngine(model, tokenizer, prefix_cache_mb=64, prefix_block=BLOCK)
    before = calls(cached, GREEDY)
    assert len(cached.prefix_cache) > 0
    # One optimizer step on adapter "one", in place, as the trainer's update does.
    params = [p for name, p in model.named_parameters() if ".one." in name]
    optimizer = torch.optim.AdamW(params, lr=0.05)
    loss = sum((p.float() ** 2).sum() for p in params)
    loss.backward()
    optimizer.step()
    after = calls(cached, GREEDY)
    fresh = calls(HFEngine(model, tokenizer, prefix_cache_mb=0), GREEDY)
    assert_same(after, fresh)  # a stale prefix would carry the old adapter's keys and values
    changed = [x for (_, x), (_, y) in zip(before, after, strict=True) if not np.allclose(x, y, atol=1e-3)]
    assert changed  # the update did change adapter one's answers, so the check above had teeth
    # load_adapters and clear_prefix_cache empty it too.
    cached.clear_prefix_cache()
    assert len(cached.prefix_cache) == 0 and cached.prefix_cache.nbytes == 0


def test_store_is_bounded_and_keeps_the_longest_prompt():
    def layers(length):
        return [(torch.zeros(1, 2, length, 4), torch.zeros(1, 2, length, 4))] * 3

    per_token = 2 * 3 * 2 * 4 * 4  # keys and values, 3 layers, 2 heads, dim 4, float32
    store = PrefixKVCache(max_bytes=25 * per_token)
    store.store("a", [1, 2, 3], layers(3))
    store.store("a", [1, 2, 3, 4, 5], layers(5))  # extends [1, 2, 3]: that entry is dropped
    store.store("a", [1, 2], layers(2))  # already held by the longer entry
    assert len(store) == 1 and store.nbytes == 5 * per_token
    assert store.longest_prefix("a", [1, 2, 3, 9])[0] == 3
    assert store.longest_prefix("b", [1, 2, 3]) == (0, None)
    for start in range(10, 60, 10):
        store.store("a", list(range(start, start + 8)), layers(8))
    assert store.nbytes <= 25 * per_token and len(store) == 3  # least recently used evicted
    assert store.longest_prefix("a", [1, 2, 3])[0] == 0
    assert common_prefix_length([1, 2, 3, 4], [1, 2, 5]) == 2 and common_prefix_length([], [1]) == 0


def test_the_trainer_turns_the_cache_on_from_its_config(tiny_model_dir, tmp_path):
    """``rollout.prefix_cache_mb`` reaches the trainer's engine (on a CPU 1024 MiB by default; 0
    turns it off); the evaluation engine never has one; a training step with it reuses prefixes
    and trains; a negative size is refused by name."""
    import toy_envs_trainer  # noqa: F401  (registers the toy envs)
    from llm_zoo_train.config import ConfigError, validate
    from llm_zoo_train.trainer import Trainer
    from train_helpers import toy_config

    default = Trainer(toy_config(tiny_model_dir, tmp_path / "default"))
    assert default.engine.prefix_cache.max_bytes == CPU_PREFIX_CACHE_MB * 2**20
    assert default.eval_engine.prefix_cache is None and default.eval_engine.model is default.engine.model
    off = Trainer(toy_config(tiny_model_dir, tmp_path / "off", ["--rollout.prefix_cache_mb", "0"]))
    assert off.engine.prefix_cache is None
    trainer = Trainer(toy_config(tiny_model_dir, tmp_path / "on", ["--rollout.prefix_cache_mb", "8"]))
    cache = trainer.engine.prefix_cache
    assert cache is not None and cache.max_bytes == 8 * 2**20
    trainer.engine.prefix_block = BLOCK  # the toy envs' prompts are shorter than the default block
    trainer.train()
    assert cache.hit_tokens > 0 and cache.prefilled_tokens > 0 and trainer.history[-1]["step"] >= 1
    with pytest.raises(ConfigError, match=r"rollout\.prefix_cache_mb"):
        validate(toy_config(tiny_model_dir, tmp_path / "bad", ["--rollout.prefix_cache_mb", "-1"]))
