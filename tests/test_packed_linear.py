"""Packed frozen linear layers while the engine decodes (llm_zoo_train.kernels.packed_linear).
float32: MKL's ("exact"): the same bits as F.linear for every row count, packing only where it
applies, re-packed when the weight changes, and the engine's tokens and logprobs unchanged.
oneDNN's: F.linear's values to float32 rounding. "auto": the faster of the two by a margin,
measured once per row count. bfloat16: oneDNN's copies only where probed to F.linear's bits (the
engine's tokens and logprobs unchanged), "auto" weighing them against F.linear."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

from llm_zoo_train.engines.base import SamplingParams  # noqa: E402
from llm_zoo_train.engines.hf.engine import HFEngine  # noqa: E402
from llm_zoo_train.kernels import packed_linear  # noqa: E402
from llm_zoo_train.kernels.packed_linear import (  # noqa: E402
    ONEDNN_MIN_SPEEDUP,
    PREFILL_ROWS,
    PackedLinearWeights,
    forget_measurements,
    mkl_packing_available,
    onednn_bfloat16_packing_available,
    onednn_packing_available,
)
from tiny_model import build_tokenizer, tiny_llama_config  # noqa: E402

pytestmark = pytest.mark.skipif(not mkl_packing_available(), reason="this torch build has no MKL packing")


@pytest.fixture(autouse=True)
def measure_anew():
    """Each test sees "auto" measure (its timings are often faked)."""
    forget_measurements()
    yield
    forget_measurements()


def frozen_linear(inputs: int, outputs: int, *, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    layer = torch.nn.Linear(inputs, outputs, bias=True)
    layer.requires_grad_(False)
    return layer


def count_packed_calls(monkeypatch, forward: str = "_packed_forward") -> list[int]:
    """Records the row count of every call of ``packed_linear.<forward>`` (MKL's or oneDNN's)."""
    calls: list[int] = []
    original = getattr(packed_linear, forward)

    def counted(module, packed, rows, x, *args, **kwargs):
        calls.append(rows)
        return original(module, packed, rows, x, *args, **kwargs)

    monkeypatch.setattr(packed_linear, forward, counted)
    return calls


def test_every_row_count_gives_the_bits_of_f_linear():
    layer = frozen_linear(576, 1536)
    weights = PackedLinearWeights("exact")
    for rows in (1, 4, 8, 15, 16, 17, 32):
        x = torch.randn(rows, 1, 576)
        with torch.no_grad(), weights.applied(layer, rows):
            packed = layer(x)
            other_rows = layer(torch.randn(rows + 1, 576))  # another row count: F.linear
        assert torch.equal(packed, F.linear(x, layer.weight, layer.bias)), rows
        assert other_rows.shape == (rows + 1, 1536)
        assert "forward" not in vars(layer)  # the layer's own forward again after the block


def test_packing_is_used_for_the_decode_row_counts(monkeypatch):
    """On the project's machines MKL's packed kernel matches the unpacked one from 16 rows; the
    speed-up of the engine depends on it."""
    calls = count_packed_calls(monkeypatch)
    layer = frozen_linear(576, 576)
    with torch.no_grad(), PackedLinearWeights("exact").applied(layer, 16):
        layer(torch.randn(16, 1, 576))
    assert calls == [16]


def test_small_or_float16_layers_are_left_alone():
    small = frozen_linear(8, 576)  # a LoRA-sized side
    half = frozen_linear(128, 128).to(torch.float16)  # bfloat16 is packed (oneDNN's, probed), float16 not
    model = torch.nn.ModuleList([small, half])
    with PackedLinearWeights("exact").applied(model, 16):
        assert all("forward" not in vars(layer) for layer in model)


def test_autograd_runs_f_linear_and_gradients_flow():
    layer = torch.nn.Linear(128, 256)  # a weight that trains
    x = torch.randn(16, 128, requires_grad=True)
    with PackedLinearWeights("exact").applied(layer, 16):
        y = layer(x)
    y.sum().backward()
    assert torch.equal(y.detach(), F.linear(x.detach(), layer.weight, layer.bias))
    assert x.grad is not None and layer.weight.grad is not None


def test_a_weight_changed_in_place_is_packed_again():
    layer = frozen_linear(128, 256)
    weights = PackedLinearWeights("exact")
    x = torch.randn(16, 128)
    with torch.no_grad(), weights.applied(layer, 16):
        before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(2.0)
    with torch.no_grad(), weights.applied(layer, 16):
        after = layer(x)
    assert not torch.equal(before, after)
    assert torch.equal(after, F.linear(x, layer.weight, layer.bias))


def test_only_the_most_recent_row_counts_are_kept():
    layer = frozen_linear(128, 256)
    weights = PackedLinearWeights("exact")
    with torch.no_grad():
        for rows in (16, 32, 48):
            with weights.applied(layer, rows):
                pass
    assert packed_linear.MAX_ROW_COUNTS == 2
    assert weights.row_counts(layer) == [32, 48]


def test_a_shape_whose_probe_differs_is_not_packed_again(monkeypatch):
    packs: list[int] = []

    def differs(module, rows, generator):
        packs.append(rows)
        return None  # as if MKL's packed kernel gave other bits

    monkeypatch.setattr(packed_linear, "_pack", differs)
    weights = PackedLinearWeights("exact")
    first, second = frozen_linear(128, 256, seed=1), frozen_linear(128, 256, seed=2)
    x = torch.randn(16, 128)
    with torch.no_grad():
        for layer in (first, second, first):
            with weights.applied(layer, 16):
                assert "forward" not in vars(layer)
                assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert packs == [16]
    assert weights.row_counts(first) == []


@pytest.fixture(scope="module")
def model_and_tokenizer():
    """A float32 Llama wide enough (64 hidden, 128 intermediate) for its layers to be packed,
    with a random LoRA adapter on every linear layer."""
    tokenizer = build_tokenizer()
    config = tiny_llama_config(tokenizer, hidden_size=64, intermediate_size=128)
    torch.manual_seed(0)
    base = LlamaForCausalLM(config).eval()
    adapter = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    return get_peft_model(base, adapter, adapter_name="agent"), tokenizer


@pytest.mark.parametrize("greedy", [False, True])
def test_engine_tokens_and_logprobs_are_the_same_bits_with_packing(model_and_tokenizer, greedy, monkeypatch):
    model, tokenizer = model_and_tokenizer
    prompts = ["hello", "apple banana cherry, reply with one word", "U D L R", "1 2 3 4"]
    sampling = SamplingParams(max_tokens=12, temperature=0.0 if greedy else 1.0, seed=3)

    def completions(pack: bool):
        engine = HFEngine(model, tokenizer, pack_base_weights=pack, decode_kernel="exact")
        return [
            [(c.token_ids, c.logprobs) for c in row]
            for row in engine.generate(prompts, ["agent"] * len(prompts), 4, sampling)
        ]

    plain = completions(False)
    calls = count_packed_calls(monkeypatch)
    packed = completions(True)
    assert packed == plain
    assert 16 in calls  # 4 prompts x 4 samples decoded on packed weights


needs_onednn = pytest.mark.skipif(
    not onednn_packing_available(), reason="this torch build has no oneDNN packing"
)


def test_an_unknown_kernel_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"'auto', 'exact', 'onednn'.*'fast'"):
        PackedLinearWeights("fast")


@needs_onednn
def test_onednn_gives_f_linears_values_to_float32_rounding(monkeypatch):
    calls = count_packed_calls(monkeypatch, "_onednn_forward")
    layer = frozen_linear(576, 1536)
    weights = PackedLinearWeights("onednn")
    for rows in (1, 4, 16, 17):
        x = torch.randn(rows, 1, 576)
        with torch.no_grad(), weights.applied(layer, rows):
            packed = layer(x)
            fewer = layer(x[: max(rows // 2, 1)])  # rows that finished left the batch
            more_x = torch.randn(rows + 1, 576)
            more = layer(more_x)  # more rows (a prefill): "onednn" serves them too
        torch.testing.assert_close(packed, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fewer, packed[: max(rows // 2, 1)], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(more, F.linear(more_x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        assert "forward" not in vars(layer)
    assert calls == [1, 1, 1, 4, 4, 4, 16, 16, 16, 17, 17, 17]  # each call, F.linear's fallback included
    assert weights.row_counts(layer) == [16, 17]


def timed_passes(monkeypatch, seconds: dict[str, float]) -> list[str]:
    """Makes every timed pass over the layers take ``seconds[key]``: ``mkl`` and ``onednn`` at the
    decode's rows, ``prefill_mkl`` (F.linear) and ``prefill_onednn`` at PREFILL_ROWS (the decode's
    figures where absent); returns the keys timed."""
    timed: list[str] = []

    def pass_seconds(calls):
        call = calls[0]
        kernel = "onednn" if call.func is packed_linear._onednn_forward else "mkl"
        prefill = len(call.args) == 5 or (call.func is F.linear and call.args[0].shape[0] == PREFILL_ROWS)
        key = f"prefill_{kernel}" if prefill else kernel
        timed.append(key)
        return seconds.get(key, seconds[kernel])

    monkeypatch.setattr(packed_linear, "_pass_seconds", pass_seconds)
    return timed


@needs_onednn
@pytest.mark.parametrize(
    ("onednn_s", "chosen"),
    [(0.010 / ONEDNN_MIN_SPEEDUP, "onednn"), (0.0095, "mkl"), (0.012, "mkl")],
)
def test_auto_takes_onednn_only_when_a_pass_is_faster_by_the_margin(monkeypatch, onednn_s, chosen):
    timed = timed_passes(monkeypatch, {"mkl": 0.010, "onednn": onednn_s})
    model = torch.nn.Sequential(frozen_linear(128, 256), frozen_linear(256, 128, seed=1))
    weights = PackedLinearWeights("auto")
    x = torch.randn(16, 128)
    for _ in range(2):  # measured once per row count and set of shapes
        with torch.no_grad(), weights.applied(model, 16):
            out = model(x)
    passes = packed_linear.TIMED_PASSES + 1
    assert timed.count("mkl") == timed.count("onednn") == passes
    # the prefill is timed (one untimed and two timed passes each) only once oneDNN won the decode
    assert timed.count("prefill_mkl") == timed.count("prefill_onednn") == (3 if chosen == "onednn" else 0)
    [choice] = weights.choices.values()
    assert (choice.rows, choice.kernel, choice.exact_s, choice.onednn_s) == (16, chosen, 0.010, onednn_s)
    assert choice.any_rows == (chosen == "onednn")
    with torch.no_grad():
        plain = model(x)
    if chosen == "mkl":
        assert torch.equal(out, plain)
    else:
        torch.testing.assert_close(out, plain, rtol=1e-5, atol=1e-5)
    for layer in model:
        assert weights._by_layer[layer][16].kernel == chosen
    with torch.no_grad(), weights.applied(model, 4):  # a new row count is measured anew
        pass
    assert len(weights.choices) == 2


@needs_onednn
@pytest.mark.parametrize("prefill_onednn_s", [0.010 / ONEDNN_MIN_SPEEDUP, 0.009])
def test_onednn_serves_prefills_only_where_they_measured_faster(monkeypatch, prefill_onednn_s):
    timed_passes(
        monkeypatch, {"mkl": 0.010, "onednn": 0.005, "prefill_mkl": 0.010, "prefill_onednn": prefill_onednn_s}
    )
    calls = count_packed_calls(monkeypatch, "_onednn_forward")
    layer = frozen_linear(128, 256)
    weights = PackedLinearWeights("auto")
    prefill = torch.randn(3, 20, 128)  # 60 rows: more than the decode's 16
    with torch.no_grad(), weights.applied(layer, 16):
        calls.clear()  # the measurement's own calls
        out = layer(prefill)
    [choice] = weights.choices.values()
    assert choice.any_rows == (prefill_onednn_s < 0.009)
    assert calls == [16]
    if choice.any_rows:
        torch.testing.assert_close(out, F.linear(prefill, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(out, F.linear(prefill, layer.weight, layer.bias))


@needs_onednn
@pytest.mark.parametrize("greedy", [False, True])
def test_engine_with_onednn_products_gives_the_logprobs_to_float32_rounding(model_and_tokenizer, greedy):
    model, tokenizer = model_and_tokenizer
    prompts = ["hello", "apple banana cherry, reply with one word", "U D L R", "1 2 3 4"]
    sampling = SamplingParams(max_tokens=12, temperature=0.0 if greedy else 1.0, seed=3)

    def completions(kernel: str):
        engine = HFEngine(model, tokenizer, decode_kernel=kernel)
        return [c for row in engine.generate(prompts, ["agent"] * len(prompts), 4, sampling) for c in row]

    exact, onednn = completions("exact"), completions("onednn")
    # tokens can differ only where two are within float32 rounding of each other; this seed's do not
    assert [c.token_ids for c in onednn] == [c.token_ids for c in exact]
    for ours, reference in zip(onednn, exact, strict=True):
        torch.testing.assert_close(
            torch.tensor(ours.logprobs), torch.tensor(reference.logprobs), rtol=0, atol=1e-4
        )


@needs_onednn
def test_auto_measures_a_shape_once_per_process(monkeypatch):
    timed = timed_passes(monkeypatch, {"mkl": 0.010, "onednn": 0.005})
    layer = frozen_linear(128, 256)
    first, second = PackedLinearWeights("auto"), PackedLinearWeights("auto")
    with torch.no_grad(), first.applied(layer, 16):
        pass
    measured = len(timed)
    with torch.no_grad(), second.applied(layer, 16):
        pass
    assert measured > 0 and len(timed) == measured
    assert list(first.choices.values()) == list(second.choices.values())


needs_bfloat16_packing = pytest.mark.skipif(
    not onednn_bfloat16_packing_available(), reason="oneDNN does not pack bfloat16 on this CPU (AVX2 only)"
)


@pytest.mark.parametrize("kernel", ["auto", "exact", "onednn"])
def test_bfloat16_layers_run_f_linear_where_onednn_cannot_pack_them(monkeypatch, kernel):
    monkeypatch.setattr(packed_linear, "onednn_bfloat16_packing_available", lambda: False)
    calls = count_packed_calls(monkeypatch, "_onednn_forward")
    model = torch.nn.Sequential(frozen_linear(128, 256), frozen_linear(256, 128, seed=1)).to(torch.bfloat16)
    x = torch.randn(16, 128).to(torch.bfloat16)
    weights = PackedLinearWeights(kernel)
    with torch.no_grad(), weights.applied(model, 16):
        packed = model(x)
    with torch.no_grad():
        assert torch.equal(packed, model(x))
    assert calls == [] and [c.kernel for c in weights.choices.values()] == [None]


@needs_bfloat16_packing
def test_bfloat16_layers_take_onednn_copies_only_where_probed_to_f_linears_bits(monkeypatch):
    model = torch.nn.Sequential(frozen_linear(128, 256), frozen_linear(256, 128, seed=1)).to(torch.bfloat16)
    x = torch.randn(16, 128).to(torch.bfloat16)
    with torch.no_grad():
        plain = [model(x[:rows]) for rows in (16, 5, 1)]
    calls = count_packed_calls(monkeypatch, "_onednn_forward")
    weights = PackedLinearWeights("exact")
    with torch.no_grad(), weights.applied(model, 16):
        packed = [model(x[:rows]) for rows in (16, 5, 1)]
    [choice] = weights.choices.values()
    assert (choice.dtype, choice.kernel) == ("bfloat16", "onednn")
    assert len(calls) == 6  # both layers, every row count: a decode keeps fewer rows as they finish
    for got, want in zip(packed, plain, strict=True):
        assert torch.equal(got, want)

    # A shape whose probe differs keeps F.linear, and is not packed (nor probed) again.
    monkeypatch.setattr(torch, "equal", lambda a, b: False)
    other = PackedLinearWeights("exact")
    with torch.no_grad(), other.applied(model, 4):
        model(x[:4])
    assert other.row_counts(model[0]) == [] and len(calls) == 6


@needs_bfloat16_packing
@pytest.mark.parametrize(("onednn_s", "chosen"), [(0.0095, "onednn"), (0.0105, None)])
def test_auto_in_bfloat16_takes_the_faster_of_onednn_and_f_linear(monkeypatch, onednn_s, chosen):
    """No margin in bfloat16 (both give the same bits), unlike float32's."""
    timed = timed_passes(monkeypatch, {"mkl": 0.010, "onednn": onednn_s})
    model = torch.nn.Sequential(frozen_linear(128, 256), frozen_linear(256, 128, seed=1)).to(torch.bfloat16)
    weights = PackedLinearWeights("auto")
    with torch.no_grad(), weights.applied(model, 16):
        model(torch.randn(16, 128).to(torch.bfloat16))
    [choice] = weights.choices.values()
    assert (choice.dtype, choice.kernel, choice.exact_s, choice.onednn_s) == (
        "bfloat16",
        chosen,
        0.010,
        onednn_s,
    )
    assert timed.count("onednn") == packed_linear.TIMED_PASSES + 1
    [entry] = packed_linear.measurements()  # the record a checkpoint keeps names the dtype
    assert entry["dtype"] == "bfloat16"
    forget_measurements()
    packed_linear.adopt_measurements([entry])
    again = PackedLinearWeights("auto")
    with torch.no_grad(), again.applied(model, 16):
        model(torch.randn(16, 128).to(torch.bfloat16))
    assert list(again.choices.values()) == [choice]
    assert timed.count("onednn") == packed_linear.TIMED_PASSES + 1  # adopted, not measured again


@needs_bfloat16_packing
@pytest.mark.parametrize("kernel", ["auto", "exact"])
def test_engine_in_bfloat16_gives_the_same_bits_with_onednn_copies(model_and_tokenizer, kernel, monkeypatch):
    model, tokenizer = model_and_tokenizer
    model = copy.deepcopy(model).to(torch.bfloat16)  # the fixture's model stays float32
    prompts = ["hello", "apple banana cherry, reply with one word", "U D L R", "1 2 3 4"]
    sampling = SamplingParams(max_tokens=12, temperature=1.0, seed=3)

    def completions(pack: bool):
        engine = HFEngine(model, tokenizer, pack_base_weights=pack, decode_kernel=kernel)
        return [
            [(c.token_ids, c.logprobs) for c in row]
            for row in engine.generate(prompts, ["agent"] * len(prompts), 4, sampling)
        ]

    plain = completions(False)
    calls = count_packed_calls(monkeypatch, "_onednn_forward")
    monkeypatch.setattr(packed_linear, "ONEDNN_MIN_SPEEDUP", 0.0)  # "auto" takes them whatever the times
    assert completions(True) == plain
    assert 16 in calls  # 4 prompts x 4 samples decoded on oneDNN's copies
