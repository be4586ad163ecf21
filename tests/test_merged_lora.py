"""LoRA layers served by a packed copy of their merged weight (llm_zoo_train.kernels.merged_lora,
used by PackedLinearWeights where oneDNN's copies serve, or MKL's chosen by "auto"): the unmerged
layer's values to float32 rounding, merged again when a weight changes, only for plain inference
calls (an MKL copy only at its row count), at most MAX_MERGED_ADAPTERS copies kept, every forward
given back after the block; "exact" merges nothing, nor does an "auto" record made before MKL's
copies merged."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402

from llm_zoo_train.engines.base import SamplingParams  # noqa: E402
from llm_zoo_train.engines.hf.engine import HFEngine  # noqa: E402
from llm_zoo_train.kernels import packed_linear  # noqa: E402
from llm_zoo_train.kernels.lora_forward import lora_linear_class, replaced_lora_forwards  # noqa: E402
from llm_zoo_train.kernels.merged_lora import (  # noqa: E402
    MAX_MERGED_ADAPTERS,
    MergedAdapterPackings,
    mergeable_adapter,
)
from llm_zoo_train.kernels.packed_linear import (  # noqa: E402
    PackedLinearWeights,
    adopt_measurements,
    forget_measurements,
    mkl_packing_available,
    onednn_packing_available,
)

pytestmark = pytest.mark.skipif(
    not onednn_packing_available(), reason="this torch build has no oneDNN packing"
)


needs_mkl = pytest.mark.skipif(not mkl_packing_available(), reason="this torch build has no MKL packing")


def mkl_measures_as_fast(monkeypatch) -> None:
    """Every pass "auto" times takes as long with oneDNN's copies as with MKL's: MKL's are chosen."""
    monkeypatch.setattr(packed_linear, "_pass_seconds", lambda calls: 0.010)


@pytest.fixture(autouse=True)
def measure_anew():
    forget_measurements()
    yield
    forget_measurements()


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(96, 160)
        self.down = torch.nn.Linear(160, 96, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def lora_model(*adapters: str, zero: bool = False):
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["up", "down"], init_lora_weights=zero)
    model = get_peft_model(TwoLayers(), config, adapter_name=adapters[0])
    for name in adapters[1:]:
        model.add_adapter(name, config)
    if not zero:
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_" in name:
                    parameter.copy_(torch.randn_like(parameter) * 0.1)
    return model.eval()


def lora_layers(model) -> list:
    return [m for m in model.modules() if type(m) is lora_linear_class()]


def unmerged(layer, x: torch.Tensor, adapter: str) -> torch.Tensor:
    lora_a, lora_b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
    return F.linear(x, layer.base_layer.weight, layer.base_layer.bias) + F.linear(
        F.linear(x, lora_a), lora_b
    ) * float(layer.scaling[adapter])


def outputs_with_and_without(weights: PackedLinearWeights, model, rows: int = 8):
    """``model``'s output on random rows with ``weights`` applied, and without."""
    x = torch.randn(rows, 96)
    with torch.no_grad():
        expected = model(x)
        with weights.applied(model, rows):
            return model(x), expected


def test_merged_layers_give_the_unmerged_values_and_every_forward_comes_back():
    model = lora_model("agent")
    weights = PackedLinearWeights("onednn")
    x = torch.randn(8, 96)
    with torch.no_grad():
        expected = model(x)
        with weights.applied(model, 8):
            layers = lora_layers(model)
            assert all("forward" in vars(layer) for layer in layers)
            merged_out = model(x)
            for layer in layers:
                inputs = torch.randn(8, layer.in_features)
                torch.testing.assert_close(layer(inputs), unmerged(layer, inputs, "agent"), rtol=0, atol=1e-5)
    torch.testing.assert_close(merged_out, expected, rtol=0, atol=1e-5)
    assert not any("forward" in vars(m) for m in model.modules())
    assert all(weights.merged.adapters(layer) == ["agent"] for layer in lora_layers(model))


def test_an_adapter_changed_in_place_is_merged_again():
    model = lora_model("agent")
    weights = PackedLinearWeights("onednn")
    layer = lora_layers(model)[0]
    x = torch.randn(4, 96)
    with torch.no_grad():
        with weights.applied(model, 4):
            before = layer(x)
        layer.lora_B["agent"].weight.add_(1.0)  # as an optimizer step does: the version counter moves
        with weights.applied(model, 4):
            after = layer(x)
    torch.testing.assert_close(after, unmerged(layer, x, "agent"), rtol=0, atol=1e-5)
    assert (after - before).abs().max() > 1e-2


def test_an_untrained_adapter_multiplies_by_the_base_weight_alone():
    model = lora_model("agent", zero=True)
    weights = PackedLinearWeights("onednn")
    layer = lora_layers(model)[0]
    x = torch.randn(4, 96)
    base = torch.ops.mkldnn._reorder_linear_weight(layer.base_layer.weight.detach(), 4)
    with torch.no_grad(), weights.applied(model, 4):
        assert torch.equal(
            layer(x), torch.ops.mkldnn._linear_pointwise(x, base, layer.base_layer.bias, "none", [], "")
        )


def test_autograd_and_other_adapters_run_the_previous_forward():
    model = lora_model("agent", "other")
    weights = PackedLinearWeights("onednn")
    layer = lora_layers(model)[0]
    x = torch.randn(4, 96)
    with weights.applied(model, 4):
        output = layer(x)  # autograd on: peft's forward, gradients reach the adapter
        output.sum().backward()
        assert layer.lora_B["agent"].weight.grad is not None
        with torch.no_grad():
            layer.set_adapter("other")
            assert torch.equal(layer(x), type(layer).forward(layer, x))
            layer.set_adapter("agent")


def test_at_most_the_most_recent_adapters_are_kept():
    names = [f"agent{i}" for i in range(MAX_MERGED_ADAPTERS + 1)]
    model = lora_model(*names)
    weights = PackedLinearWeights("onednn")
    layer = lora_layers(model)[0]
    with torch.no_grad():
        for name in names:
            model.set_adapter(name)
            with weights.applied(model, 4):
                x = torch.randn(4, 96)
                torch.testing.assert_close(layer(x), unmerged(layer, x, name), rtol=0, atol=1e-5)
    assert weights.merged.adapters(layer) == names[-MAX_MERGED_ADAPTERS:]


def test_a_forward_replaced_by_our_lora_block_is_merged_and_given_back_while_others_are_left_alone():
    model = lora_model("agent")
    weights = PackedLinearWeights("onednn")
    first, second = lora_layers(model)
    foreign = first.forward  # a bound method set on the instance: someone else's (accelerate's hooks)
    first.forward = foreign
    with replaced_lora_forwards(model, lambda layer: layer.forward):
        ours = vars(second)["forward"]
        assert mergeable_adapter(first) is None and mergeable_adapter(second) == "agent"
        with torch.no_grad(), weights.applied(model, 4):
            assert vars(first)["forward"] is foreign and vars(second)["forward"] is not ours
        assert vars(second)["forward"] is ours
    assert vars(first)["forward"] is foreign and "forward" not in vars(second)


def test_exact_products_and_merging_off_merge_nothing():
    model = lora_model("agent")
    for weights in (PackedLinearWeights("exact"), PackedLinearWeights("onednn", merge_adapters=False)):
        with torch.no_grad(), weights.applied(model, 16):
            assert not any("forward" in vars(layer) for layer in lora_layers(model))
        assert all(weights.merged.adapters(layer) == [] for layer in lora_layers(model))


@needs_mkl
def test_an_mkl_copy_serves_its_row_count_and_other_counts_run_the_previous_forward():
    model = lora_model("agent")
    merged = MergedAdapterPackings()
    layer = lora_layers(model)[0]
    x, fewer = torch.randn(8, 96), torch.randn(3, 96)
    with torch.no_grad():
        previous = layer(fewer)
        with merged.applied(model, 8, lambda inputs: True, kernel="mkl") as served:
            assert layer in served
            out, out_fewer = layer(x), layer(fewer)  # "accepts" takes both: the row count decides
    torch.testing.assert_close(out, unmerged(layer, x, "agent"), rtol=0, atol=1e-5)
    assert torch.equal(out_fewer, previous)  # MKL would have multiplied them by the base weight alone
    assert merged.adapters(layer) == ["agent"]
    with pytest.raises(ValueError, match="'onednn' or 'mkl'"), merged.applied(model, 8, bool, kernel="fast"):
        pass


@needs_mkl
@pytest.mark.parametrize("kernel", ["auto", "exact"])
def test_auto_merges_adapters_into_mkl_copies_where_it_chooses_them_and_exact_keeps_them_apart(
    monkeypatch, kernel
):
    mkl_measures_as_fast(monkeypatch)
    model = lora_model("agent")
    weights = PackedLinearWeights(kernel)
    out, expected = outputs_with_and_without(weights, model)
    [choice] = weights.choices.values()
    assert (choice.kernel, choice.mkl_merged) == ("mkl", kernel == "auto")
    kept = [weights.merged.adapters(layer) for layer in lora_layers(model)]
    if kernel == "auto":
        assert kept == [["agent"]] * 2
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    else:
        assert kept == [[]] * 2
        assert torch.equal(out, expected)  # MKL's copies only where probed to F.linear's bits


@needs_mkl
def test_an_auto_record_made_before_mkl_copies_merged_keeps_the_adapters_apart():
    model = lora_model("agent")
    adopt_measurements([{"layers": [[160, 96, True], [96, 160, False]], "rows": 8, "kernel": "mkl"}])
    weights = PackedLinearWeights("auto")
    out, expected = outputs_with_and_without(weights, model)
    [choice] = weights.choices.values()
    assert (choice.kernel, choice.mkl_merged, choice.exact_s) == ("mkl", False, None)  # adopted, not timed
    assert all(weights.merged.adapters(layer) == [] for layer in lora_layers(model))
    assert torch.equal(out, expected)


@pytest.mark.parametrize("kernel", ["onednn", pytest.param("auto", marks=needs_mkl)])
@pytest.mark.parametrize("greedy", [False, True])
def test_engine_with_merged_adapters_gives_the_unmerged_logprobs_to_float32_rounding(
    greedy, kernel, monkeypatch
):
    from transformers import LlamaForCausalLM

    from tiny_model import build_tokenizer, tiny_llama_config

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    base = LlamaForCausalLM(tiny_llama_config(tokenizer, hidden_size=64, intermediate_size=128)).eval()
    adapter = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    model = get_peft_model(base, adapter, adapter_name="agent")
    prompts = ["hello", "apple banana cherry, reply with one word", "U D L R", "1 2 3 4"]
    sampling = SamplingParams(max_tokens=12, temperature=0.0 if greedy else 1.0, seed=3)

    mkl_measures_as_fast(monkeypatch)  # "auto": MKL's copies, merged

    def completions(merge: bool):
        engine = HFEngine(model, tokenizer, decode_kernel=kernel)
        engine.packed_weights.merge_adapters = merge
        rows = engine.generate(prompts, ["agent"] * len(prompts), 4, sampling)
        return engine, [c for row in rows for c in row]

    _, separate = completions(False)
    engine, merged = completions(True)
    assert all(engine.packed_weights.merged.adapters(layer) == ["agent"] for layer in lora_layers(model))
    # tokens can differ only where two are within float32 rounding of each other; this seed's do not
    assert [c.token_ids for c in merged] == [c.token_ids for c in separate]
    for ours, reference in zip(merged, separate, strict=True):
        torch.testing.assert_close(
            torch.tensor(ours.logprobs), torch.tensor(reference.logprobs), rtol=0, atol=1e-4
        )
