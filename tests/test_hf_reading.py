"""Live progress of the transformers engine's prompt pass (llm_zoo_train.engines.hf.reading).

Forward hooks on the decoder layers report each layer of a prompt pass, before the call's first
token; they change no sampled token or logprob (compared bit for bit, greedy and seeded sampling,
with each of the engine's loops) and are gone when the call returns, error or not.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from llm_zoo_train.engines.base import SamplingParams, generation_progress  # noqa: E402
from llm_zoo_train.engines.hf.engine import HFEngine  # noqa: E402
from llm_zoo_train.engines.hf.reading import decoder_layers  # noqa: E402

PROMPTS = ["hello", "apple banana cherry, reply with one word", "say the word", "U D L R", "a b"]
SAMPLINGS = {
    "greedy": SamplingParams(max_tokens=10, temperature=0.0),
    "sampled": SamplingParams(max_tokens=10, temperature=0.9, top_k=20, top_p=0.95, seed=3),
}


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    return get_peft_model(base, config, adapter_name="one"), tokenizer


def hook_count(model) -> int:
    return sum(len(layer._forward_hooks) for layer in decoder_layers(model))


def test_the_decoder_layers_are_found(model_and_tokenizer):
    model, _ = model_and_tokenizer
    layers = decoder_layers(model)
    assert len(layers) == model.config.num_hidden_layers >= 2
    assert all(type(layer).__name__ == "LlamaDecoderLayer" for layer in layers)


def _reads_then_tokens(engine: HFEngine) -> tuple[list[tuple], list[tuple]]:
    """The progress events of one sampled call: those before its first token, and the rest."""
    events: list[tuple] = []
    with generation_progress(
        lambda tokens, done: events.append(("tokens", tokens)),
        reading=lambda *report: events.append(("reading", *report)),
    ):
        engine.generate(PROMPTS, ["one"] * len(PROMPTS), 2, SAMPLINGS["sampled"])
    first_token = next(i for i, event in enumerate(events) if event[0] == "tokens")
    return events[:first_token], events[first_token:]


@pytest.mark.parametrize(
    ("share_prefill", "compact"), [(True, True), (False, True), (True, False), (False, False)]
)
def test_each_layer_of_the_prompt_pass_is_reported_before_the_first_token(
    model_and_tokenizer, share_prefill, compact
):
    model, tokenizer = model_and_tokenizer
    layers = model.config.num_hidden_layers
    engine = HFEngine(
        model,
        tokenizer,
        max_batch_size=64,
        share_prefill=share_prefill,
        compact_finished_rows=compact,
        prefix_cache_mb=0,  # the batched prompt pass; the prefix cache's own is tested below
    )
    reading, after = _reads_then_tokens(engine)
    width = max(len(engine._encode(p)) for p in PROMPTS)
    # With a shared prefill the unique prompts are read once: whole for the compacting loop (it
    # samples the first token from that pass), all but their last token for generate (its first
    # decode step runs it); otherwise every row (prompt x sample) is read whole.
    if share_prefill:
        rows, positions = len(PROMPTS), width if compact else width - 1
    else:
        rows, positions = 2 * len(PROMPTS), width
    assert reading == [("reading", rows, positions, done, layers) for done in range(1, layers + 1)]
    assert all(event[0] == "tokens" for event in after)  # decode steps are not reads
    assert hook_count(model) == 0


def test_with_the_prefix_cache_each_prompt_read_alone_is_reported(model_and_tokenizer):
    """The prefix cache prefills prompt by prompt (only what follows a stored prefix): each of
    those passes reports its layers, one row at a time, before the first token."""
    model, tokenizer = model_and_tokenizer
    layers = model.config.num_hidden_layers
    # A block as long as the longest prompt's prefill: every prompt is read in one pass.
    block = max(len(HFEngine(model, tokenizer)._encode(p)) for p in PROMPTS) - 1
    engine = HFEngine(model, tokenizer, max_batch_size=64, prefix_cache_mb=64, prefix_block=block)
    assert engine.prefix_cache is not None
    reading, _ = _reads_then_tokens(engine)
    assert reading and all(event[1] == 1 for event in reading)  # one prompt per pass
    assert [event[3] for event in reading] == list(range(1, layers + 1)) * (len(reading) // layers)
    assert len(reading) // layers == len(PROMPTS)
    assert hook_count(model) == 0


@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
@pytest.mark.parametrize(("share_prefill", "compact"), [(True, True), (False, False)])
def test_watching_the_prompt_pass_changes_no_token_or_logprob(
    model_and_tokenizer, sampling, share_prefill, compact
):
    model, tokenizer = model_and_tokenizer
    engine = HFEngine(
        model,
        tokenizer,
        max_batch_size=4,
        share_prefill=share_prefill,
        compact_finished_rows=compact,
        prefix_cache_mb=0,  # the second call must read its prompts again
    )
    params = SAMPLINGS[sampling]
    plain = engine.generate(PROMPTS, ["one"] * len(PROMPTS), 3, params)
    reports: list[tuple[int, ...]] = []
    with generation_progress(lambda tokens, done: None, reading=lambda *report: reports.append(report)):
        watched = engine.generate(PROMPTS, ["one"] * len(PROMPTS), 3, params)
    assert reports  # the hooks were there
    for row_a, row_b in zip(plain, watched, strict=True):
        for a, b in zip(row_a, row_b, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == b.logprobs  # bit for bit
            assert a.finish_reason == b.finish_reason


def test_hooks_live_only_during_a_watched_call(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    engine = HFEngine(model, tokenizer, prefix_cache_mb=0)
    layers = model.config.num_hidden_layers
    during: list[int] = []
    # Only token progress asked for: nothing is installed.
    with generation_progress(lambda tokens, done: during.append(hook_count(model))):
        engine.generate(PROMPTS, ["one"] * len(PROMPTS), 1, SAMPLINGS["greedy"])
    assert set(during) == {0}
    during.clear()
    for _ in range(2):  # a second call installs its own hooks, not one more set
        with generation_progress(
            lambda tokens, done: during.append(hook_count(model)), reading=lambda *r: None
        ):
            engine.generate(PROMPTS, ["one"] * len(PROMPTS), 1, SAMPLINGS["greedy"])
        assert set(during) == {layers}
        assert hook_count(model) == 0
    # A call that fails part-way (here the display's own callback) removes them too.

    def broken(*report):
        raise RuntimeError("display failed")

    with (
        pytest.raises(RuntimeError, match="display failed"),
        generation_progress(lambda t, d: None, reading=broken),
    ):
        engine.generate(PROMPTS, ["one"] * len(PROMPTS), 1, SAMPLINGS["greedy"])
    assert hook_count(model) == 0
    assert engine.generate(["hello"], ["one"], 1, SAMPLINGS["greedy"])  # the model still works


def test_without_named_layer_classes_the_longest_module_list_is_taken():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])

    net = Net()
    assert decoder_layers(net) == list(net.blocks)
    assert decoder_layers(torch.nn.Linear(2, 2)) == []
