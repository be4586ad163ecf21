"""The update's completion and prompt passes from the rollout's recorded outputs
(llm_zoo_train.kernels.rollout_activations): the same log-probabilities and LoRA gradients as the
computed passes, to float rounding, for LoRA layers and frozen ones, with the frozen layers' packed
input gradients too; records only for the weights, prompts and tokens they were made with; bounded
memory.

The engine decodes with its own kernels (and, on a model this small, finished rows leave the batch
as they end), so the recorded outputs are the decode's; the comparison is with the update's own
forward over the same tokens.
"""

from __future__ import annotations

from functools import partial

import pytest

torch = pytest.importorskip("torch")
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

from llm_zoo_train.engines.base import SamplingParams  # noqa: E402
from llm_zoo_train.engines.hf.engine import HFEngine  # noqa: E402
from llm_zoo_train.kernels import packed_linear, rollout_activations  # noqa: E402
from llm_zoo_train.kernels.frozen_linear import FrozenLinearPackings  # noqa: E402
from llm_zoo_train.kernels.packed_linear import (  # noqa: E402
    forget_measurements,
    mkl_packing_available,
    onednn_packing_available,
)
from llm_zoo_train.kernels.rollout_activations import (  # noqa: E402
    adapter_fingerprint,
    attach,
    attached,
    recorded_layers,
    replayable,
    replayed_completion_pass,
    replayed_prompt_pass,
)
from llm_zoo_train.training.loss import completion_logprobs  # noqa: E402

PROMPTS = ["hello", "apple banana cherry, reply with one word", "say the word"]


def lora_model(targets, *, hidden: int = 32, dtype=torch.float32):
    from tiny_model import build_tokenizer, tiny_llama_config

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    base = LlamaForCausalLM(tiny_llama_config(tokenizer, hidden_size=hidden, intermediate_size=2 * hidden))
    base = base.to(dtype).eval()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
    return get_peft_model(base, config, adapter_name="one"), tokenizer


def sampled(model, tokenizer, *, max_bytes: int = 1 << 30, ending: int = 0, decode_kernel: str = "auto"):
    """Three samples of each prompt, recorded; ``ending``: that many more token ids end a row (rows
    then end at different steps and leave the decode's batch)."""
    store = attach(model, max_bytes)
    store.clear()
    engine = HFEngine(model, tokenizer, activations=store, decode_kernel=decode_kernel)
    engine.eos_token_ids = engine.eos_token_ids | set(range(3, 3 + ending))
    rows = engine.generate(
        PROMPTS, ["one"] * len(PROMPTS), 3, SamplingParams(max_tokens=8, temperature=1.0, seed=3)
    )
    return store, [c for row in rows for c in row]


def logprobs_and_grads(model, completions, completion_pass=None, prompt_pass=None):
    model.zero_grad(set_to_none=True)
    logprobs, mask, _ = completion_logprobs(
        model,
        [c.prompt_token_ids for c in completions],
        [c.token_ids for c in completions],
        pad_token_id=0,
        temperature=0.7,
        completion_pass=completion_pass,
        prompt_pass=prompt_pass,
    )
    weights = torch.linspace(-1.0, 1.0, logprobs.numel()).view_as(logprobs)
    (logprobs * weights * mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logprobs.detach(), grads


def assert_close_to_float32_rounding(replayed, computed, name):
    """Within 1e-5 of the gradient's largest entry: the decode's products round differently."""
    torch.testing.assert_close(
        replayed, computed, rtol=1e-4, atol=1e-5 * float(computed.abs().max()), msg=name
    )


def replayed_pass(model, store, completions, rank_rows=False):
    fingerprint = adapter_fingerprint(model, "one")
    rows = [store.find("one", c.prompt_token_ids, c.token_ids, fingerprint) for c in completions]
    assert all(row is not None for row in rows)
    return partial(replayed_completion_pass, model, "one", rows, rank_rows=rank_rows)


def replayed_prompts(model, store, completions, rank_rows=False):
    fingerprint = adapter_fingerprint(model, "one")
    records = {
        tuple(c.prompt_token_ids): store.find_prompt("one", c.prompt_token_ids, fingerprint)
        for c in completions
    }
    assert all(record is not None for record in records.values())
    return partial(replayed_prompt_pass, model, "one", records, rank_rows=rank_rows)


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]], ids=["every-layer", "some-layers"])
def test_the_recorded_layers_are_every_lora_layer_and_each_linear_outside_one_in_module_order(targets):
    from llm_zoo_train.kernels.lora_forward import lora_linear_class

    model, _ = lora_model(targets)
    lora = lora_linear_class()
    inside = {
        id(inner) for m in model.modules() if isinstance(m, lora) for inner in m.modules() if inner is not m
    }

    def by_modules():  # the same list from a walk of every module
        return [
            m
            for m in model.modules()
            if isinstance(m, lora) or (type(m) is torch.nn.Linear and id(m) not in inside)
        ]

    expected = by_modules()
    layers = recorded_layers(model)
    assert [id(m) for m in layers] == [id(m) for m in expected]
    assert any(type(m) is torch.nn.Linear for m in layers) and any(isinstance(m, lora) for m in layers)
    # A module reachable from two parents is listed once, where modules() first meets it.
    model.base_model.model.model.layers[0].shared_head = model.base_model.model.lm_head
    twice = by_modules()
    assert [id(m) for m in recorded_layers(model)] == [id(m) for m in twice] != [id(m) for m in expected]


@pytest.fixture
def replays(monkeypatch):
    """How many layer outputs the replay gave (LoRA, frozen)."""
    counts = {"lora": 0, "frozen": 0}
    for name, key in (("ReplayedLoRA", "lora"), ("ReplayedFrozen", "frozen")):
        function = getattr(rollout_activations, name)
        original = function.apply

        def spy(*args, _original=original, _key=key):
            counts[_key] += 1
            return _original(*args)

        monkeypatch.setattr(function, "apply", spy)
    return counts


@pytest.mark.parametrize("with_prompts", [False, True], ids=["completions", "prompts-too"])
@pytest.mark.parametrize(
    ("targets", "ending"),
    [("all-linear", 0), (["q_proj", "v_proj"], 0), ("all-linear", 40)],
    ids=["every-layer-lora", "some-layers-frozen", "rows-ending-apart"],
)
def test_the_replayed_passes_give_the_computed_logprobs_and_gradients(targets, ending, with_prompts, replays):
    model, tokenizer = lora_model(targets)
    store, completions = sampled(model, tokenizer, ending=ending)
    if ending:
        assert len({len(c.token_ids) for c in completions}) > 2, "rows should end at different steps"
    completions[1].token_ids = completions[1].token_ids[:3]  # a stop string cut this one short
    assert len(store) == len(completions)
    model.train()  # as the updater runs it (no dropout here)
    assert replayable(model, "one")
    computed, computed_grads = logprobs_and_grads(model, completions)
    replayed, replayed_grads = logprobs_and_grads(
        model,
        completions,
        replayed_pass(model, store, completions),
        replayed_prompts(model, store, completions) if with_prompts else None,
    )
    layers = recorded_layers(model)
    lora_layers = sum(1 for m in layers if hasattr(m, "lora_A"))
    passes = 2 if with_prompts else 1
    assert replays == {"lora": passes * lora_layers, "frozen": passes * (len(layers) - lora_layers)}
    torch.testing.assert_close(replayed, computed, rtol=1e-5, atol=1e-5)
    assert replayed_grads.keys() == computed_grads.keys() and computed_grads
    for name, grad in computed_grads.items():
        assert_close_to_float32_rounding(replayed_grads[name], grad, name)


def test_a_prompt_pass_missing_a_prompts_record_is_computed(replays):
    model, tokenizer = lora_model("all-linear")
    store, completions = sampled(model, tokenizer)
    model.train()
    computed, _ = logprobs_and_grads(model, completions)
    prompts = replayed_prompts(model, store, completions)
    records = dict(prompts.args[2])
    records.pop(tuple(completions[0].prompt_token_ids))
    replayed, _ = logprobs_and_grads(
        model,
        completions,
        replayed_pass(model, store, completions),
        partial(replayed_prompt_pass, model, "one", records),
    )
    layers = recorded_layers(model)
    lora_layers = sum(1 for m in layers if hasattr(m, "lora_A"))
    assert replays == {"lora": lora_layers, "frozen": len(layers) - lora_layers}  # the completions' only
    torch.testing.assert_close(replayed, computed, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not onednn_packing_available(), reason="this torch build has no oneDNN packing")
@pytest.mark.parametrize("decode_kernel", ["onednn", "mkl-merged", "exact"])
def test_the_replayed_pass_takes_the_frozen_layers_packed_input_gradients(
    replays, decode_kernel, monkeypatch, request
):
    """The decode's own kernels (hidden 64: its layers are packed) record what the update takes:
    oneDNN's copies with merged adapters, MKL's with merged adapters ("auto" where MKL's measure as
    fast), MKL's exact ones with the adapters apart."""
    if decode_kernel == "mkl-merged":
        if not mkl_packing_available():
            pytest.skip("this torch build has no MKL packing")
        monkeypatch.setattr(packed_linear, "_pass_seconds", lambda calls: 0.010)
        forget_measurements()  # "auto" measures (faked) here, and its choice stays here
        request.addfinalizer(forget_measurements)
    model, tokenizer = lora_model("all-linear", hidden=64)
    store, completions = sampled(
        model, tokenizer, decode_kernel="auto" if decode_kernel == "mkl-merged" else decode_kernel
    )
    model.train()
    packings = FrozenLinearPackings("onednn")
    with packings.applied(model):
        computed, computed_grads = logprobs_and_grads(model, completions)
        replayed, replayed_grads = logprobs_and_grads(
            model,
            completions,
            replayed_pass(model, store, completions),
            replayed_prompts(model, store, completions),
        )
    assert replays["lora"] > 0
    torch.testing.assert_close(replayed, computed, rtol=1e-5, atol=1e-5)
    for name, grad in computed_grads.items():
        assert_close_to_float32_rounding(replayed_grads[name], grad, name)
    if decode_kernel == "mkl-merged":
        assert [(c["kernel"], c["mkl_merged"]) for c in packed_linear.measurements()] == [("mkl", True)]


def test_the_replayed_backward_with_the_rank_as_the_rows_gives_the_computed_gradients(monkeypatch):
    """training.update_kernel's rank-as-rows choice: the replayed layers' LoRA products in the
    backward take it too (other float32 rounding, the same sums)."""
    model, tokenizer = lora_model("all-linear")
    store, completions = sampled(model, tokenizer)
    model.train()
    products = []
    monkeypatch.setattr(torch, "mm", lambda a, b, _mm=torch.mm: products.append(a.shape) or _mm(a, b))
    computed, computed_grads = logprobs_and_grads(model, completions)
    assert not products  # peft's forward and autograd's backward run F.linear and matmul, not mm
    replayed, replayed_grads = logprobs_and_grads(
        model,
        completions,
        replayed_pass(model, store, completions, rank_rows=True),
        replayed_prompts(model, store, completions, rank_rows=True),
    )
    rank = 4
    assert products and any(shape[0] == rank for shape in products)  # the rank as the rows
    torch.testing.assert_close(replayed, computed, rtol=1e-5, atol=1e-5)
    for name, grad in computed_grads.items():
        assert_close_to_float32_rounding(replayed_grads[name], grad, name)


def test_a_bfloat16_model_with_float32_adapters_replays_to_bfloat16_rounding(replays):
    model, tokenizer = lora_model("all-linear", dtype=torch.bfloat16)
    assert next(p for n, p in model.named_parameters() if "lora_A" in n).dtype == torch.float32
    store, completions = sampled(model, tokenizer)
    model.train()
    computed, computed_grads = logprobs_and_grads(model, completions)
    replayed, replayed_grads = logprobs_and_grads(
        model,
        completions,
        replayed_pass(model, store, completions),
        replayed_prompts(model, store, completions),
    )
    assert replays["lora"] > 0
    torch.testing.assert_close(replayed, computed, rtol=0.05, atol=0.05)
    for name, grad in computed_grads.items():
        scale = float(grad.abs().max()) + 1e-6
        assert float((replayed_grads[name] - grad).abs().max()) <= 0.05 * scale, name


def test_records_serve_only_the_weights_and_tokens_they_were_made_with():
    model, tokenizer = lora_model("all-linear")
    store, completions = sampled(model, tokenizer)
    first = completions[0]
    fingerprint = adapter_fingerprint(model, "one")
    assert store.find("one", first.prompt_token_ids, first.token_ids, fingerprint) is not None
    assert store.find("two", first.prompt_token_ids, first.token_ids, fingerprint) is None
    assert store.find("one", first.prompt_token_ids, [*first.token_ids, 5], fingerprint) is None
    assert store.find("one", first.prompt_token_ids, [first.token_ids[0] + 1], fingerprint) is None
    weight = next(p for n, p in model.named_parameters() if "lora_B" in n)
    with torch.no_grad():
        weight.add_(0.01)  # an optimizer step
    changed = adapter_fingerprint(model, "one")
    assert changed != fingerprint
    assert store.find("one", first.prompt_token_ids, first.token_ids, changed) is None
    assert store.find_prompt("one", first.prompt_token_ids, fingerprint) is not None
    assert store.find_prompt("one", first.prompt_token_ids, changed) is None
    assert store.find_prompt("one", [*first.prompt_token_ids, 5], fingerprint) is None
    assert store.find_prompt("two", first.prompt_token_ids, fingerprint) is None
    store.drop("one")
    assert len(store) == 0 and store.nbytes == 0


def test_a_call_whose_records_would_not_fit_keeps_none():
    model, tokenizer = lora_model("all-linear")
    store, completions = sampled(model, tokenizer, max_bytes=4096)
    assert completions and len(store) == 0 and store.nbytes == 0


def test_records_hold_the_decodes_outputs_and_are_dropped_for_newer_weights():
    model, tokenizer = lora_model("all-linear")
    store, _ = sampled(model, tokenizer)
    held = store.nbytes
    assert held > 0 and attached(model) is store
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "lora_A" in n).mul_(1.5)
    engine = HFEngine(model, tokenizer, activations=store)
    engine.generate(PROMPTS[:1], ["one"], 2, SamplingParams(max_tokens=4, temperature=1.0, seed=1))
    assert len(store) == 2 and 0 < store.nbytes < held  # the older weights' rows are gone


def test_dropout_or_autocast_is_not_replayed():
    model, _ = lora_model("all-linear")
    model.train()
    assert replayable(model, "one")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not replayable(model, "one")
    from tiny_model import build_tokenizer, tiny_llama_config

    base = LlamaForCausalLM(tiny_llama_config(build_tokenizer()))
    dropping = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.1), "one")
    assert not dropping.train().training or not replayable(dropping, "one")


def test_evaluation_through_the_engine_keeps_nothing(tmp_path):
    model, tokenizer = lora_model("all-linear")
    store = attach(model, 1 << 30)
    engine = HFEngine(model, tokenizer, activations=store, prefix_cache_mb=64)
    assert engine.activations is store
    assert engine.without_prefix_cache().activations is None


@pytest.mark.usefixtures("one_torch_thread")
def test_a_trainer_step_replays_its_rollout_to_the_computed_gradient(tiny_model_dir, tmp_path, monkeypatch):
    import toy_envs_trainer  # noqa: F401  (registers test/Scripted-v0)
    from llm_zoo_train.trainer import Trainer
    from train_helpers import toy_config

    grads, replayed, prompts = {}, {}, {}
    for megabytes in ("2048", "0"):
        overrides = ["--eval.num_episodes", "0", "--agents.frozen", "[bob]"]
        config = toy_config(
            tiny_model_dir,
            tmp_path / f"run{megabytes}",
            [*overrides, "--training.rollout_activations_mb", megabytes],
        )
        trainer = Trainer(config)
        store = attached(trainer.policy.model)
        assert (store is None) == (megabytes == "0")

        def step(adapter, trainer=trainer, store=store, megabytes=megabytes):
            grads[megabytes] = [p.grad.detach().clone() for p in trainer.policy.adapter_parameters(adapter)]
            replayed[megabytes] = store.replayed_rows if store is not None else 0
            prompts[megabytes] = store.replayed_prompts if store is not None else 0
            return 0.0

        monkeypatch.setattr(trainer.updater, "_optimizer_step", step)
        trainer.train_step(1)
        if store is not None:
            assert len(store) == 0 and store.nbytes == 0  # the step's records served it and are gone
            assert store.missed_rows == store.missed_prompts == 0
    assert replayed["2048"] > 0 and replayed["0"] == 0
    assert prompts["2048"] > 0 and prompts["0"] == 0
    assert any(g.abs().sum() > 0 for g in grads["0"])
    for replayed_grad, computed in zip(grads["2048"], grads["0"], strict=True):
        torch.testing.assert_close(replayed_grad, computed, rtol=1e-4, atol=1e-7)


def test_by_default_only_a_float32_model_on_a_cpu_keeps_its_rollout():
    from llm_zoo_train.training.model_pools import CPU_ROLLOUT_ACTIVATIONS_MB, rollout_activations_mb_for

    float32, _ = lora_model("all-linear")
    bfloat16, _ = lora_model("all-linear", dtype=torch.bfloat16)  # its adapters stay float32
    assert rollout_activations_mb_for(None, float32) == CPU_ROLLOUT_ACTIVATIONS_MB > 0
    assert rollout_activations_mb_for(None, bfloat16) == 0.0
    assert rollout_activations_mb_for(64, bfloat16) == 64.0 and rollout_activations_mb_for(0, float32) == 0.0


def test_greedy_answers_are_not_recorded():
    model, tokenizer = lora_model("all-linear")
    store = attach(model, 1 << 30)
    store.clear()
    engine = HFEngine(model, tokenizer, activations=store)
    engine.generate(PROMPTS, ["one"] * len(PROMPTS), 1, SamplingParams(max_tokens=4, temperature=0.0))
    assert len(store) == 0
