"""The update's attention as grouped batched products (llm_zoo_train.kernels.update_attention): the
values and gradients of transformers' sdpa over copied heads to rounding, finite where a query sees
no key, chosen by measurement only outside float32 (or when asked), and used by a model's update."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from llm_zoo_train.kernels import update_attention  # noqa: E402
from llm_zoo_train.kernels.attention import register  # noqa: E402
from llm_zoo_train.kernels.update_attention import (  # noqa: E402
    adopt_update_attention_choices,
    forget_update_attention_choices,
    grouped_update_attention,
    set_update_attention,
    update_attention_choices,
    update_uses_grouped,
)


@pytest.fixture(autouse=True)
def measure_anew(monkeypatch):
    monkeypatch.setattr(update_attention, "UPDATE_ATTENTION", "auto")
    forget_update_attention_choices()
    yield
    forget_update_attention_choices()


def left_padded_causal_mask(pads: list[int], queries: int, keys: int) -> torch.Tensor:
    """``[B, 1, Q, K]`` boolean keep-mask: the last ``queries`` of ``keys`` positions, causal, each
    row's first ``pads[row]`` positions padding (a query there sees no key)."""
    position = torch.arange(keys)
    query_position = torch.arange(keys - queries, keys)
    causal = position[None, :] <= query_position[:, None]
    rows = [causal & (position >= pad)[None, :] for pad in pads]
    return torch.stack(rows)[:, None]


def inputs(dtype=torch.float32, batch=3, heads=6, kv_heads=2, queries=5, keys=9, dim=8):
    generator = torch.Generator().manual_seed(0)
    query, key, value = (
        torch.randn(batch, h, n, dim, generator=generator).to(dtype).requires_grad_(True)
        for h, n in ((heads, queries), (kv_heads, keys), (kv_heads, keys))
    )
    mask = left_padded_causal_mask([0, 2, 6], queries, keys)  # row 2: its first query sees nothing
    return query, key, value, mask


def sdpa_over_copied_heads(query, key, value, mask, scaling):
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2)


def test_values_and_gradients_are_sdpas_to_float32_rounding():
    query, key, value, mask = inputs()
    seen = mask.any(-1).squeeze(1)  # [B, Q]: queries that see at least one key
    weights = (
        torch.randn(query.shape[0], query.shape[2], query.shape[1], query.shape[3]) * seen[..., None, None]
    )

    ours = grouped_update_attention(query, key, value, mask, 0.35)
    (ours * weights).sum().backward()
    grads = [t.grad.clone() for t in (query, key, value)]
    for t in (query, key, value):
        t.grad = None
    reference = sdpa_over_copied_heads(query, key, value, mask, 0.35)
    (reference * weights).sum().backward()

    assert ours.shape == reference.shape and ours.is_contiguous()
    torch.testing.assert_close(ours[seen], reference[seen], rtol=0, atol=1e-6)
    for got, expected in zip(grads, (query.grad, key.grad, value.grad), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_a_query_that_sees_no_key_stays_finite_and_gets_no_gradient_when_masked_out():
    query, key, value, mask = inputs()
    out = grouped_update_attention(query, key, value, mask, 0.35)
    seen = mask.any(-1).squeeze(1)
    assert not bool(seen.all())
    (out * seen[..., None, None]).sum().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(t.grad).all() for t in (query, key, value))
    assert bool((query.grad.transpose(1, 2)[~seen] == 0).all())


def test_an_additive_mask_gives_the_boolean_masks_values():
    query, key, value, mask = inputs()
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    seen = mask.any(-1).squeeze(1)
    torch.testing.assert_close(
        grouped_update_attention(query, key, value, additive, 0.35)[seen],
        grouped_update_attention(query, key, value, mask, 0.35)[seen],
        rtol=0,
        atol=0,
    )


def uses_grouped(query, key, value, mask, **kwargs):
    module = type("Attention", (), {"num_key_value_groups": query.shape[1] // key.shape[1]})()
    with torch.enable_grad():
        return update_uses_grouped(module, query, key, value, mask, 0.0, 0.35, kwargs)


def test_auto_keeps_sdpa_in_float32_without_measuring(monkeypatch):
    monkeypatch.setattr(update_attention, "_seconds_per_pass", lambda call, tensors: pytest.fail("measured"))
    assert not uses_grouped(*inputs())
    assert update_attention_choices() == {}


@pytest.mark.parametrize(
    ("sdpa_s", "grouped_s", "chosen"), [(0.008, 0.002, "grouped"), (0.0021, 0.002, "sdpa")]
)
def test_auto_measures_bfloat16_once_and_takes_grouped_only_when_clearly_faster(
    monkeypatch, sdpa_s, grouped_s, chosen
):
    seconds = iter([sdpa_s, grouped_s])
    timed: list[int] = []

    def fake(call, tensors):
        timed.append(1)
        return next(seconds)

    monkeypatch.setattr(update_attention, "_seconds_per_pass", fake)
    tensors = inputs(torch.bfloat16)
    assert uses_grouped(*tensors) is (chosen == "grouped")
    assert uses_grouped(*tensors) is (chosen == "grouped")  # measured once per dtype
    assert len(timed) == 2
    assert update_attention_choices() == {
        "cpu/bfloat16": {"kernel": chosen, "sdpa_s": sdpa_s, "grouped_s": grouped_s}
    }


def test_auto_measures_real_timings_in_bfloat16():
    uses_grouped(*inputs(torch.bfloat16))
    [choice] = update_attention_choices().values()
    assert choice["sdpa_s"] > 0 and choice["grouped_s"] > 0
    assert choice["kernel"] == ("grouped" if choice["sdpa_s"] >= 1.15 * choice["grouped_s"] else "sdpa")


def test_an_adopted_choice_is_used_without_measuring(monkeypatch):
    monkeypatch.setattr(update_attention, "_seconds_per_pass", lambda call, tensors: pytest.fail("measured"))
    adopt_update_attention_choices({"cpu/bfloat16": {"kernel": "grouped", "sdpa_s": 2.0, "grouped_s": 1.0}})
    assert uses_grouped(*inputs(torch.bfloat16))


def test_the_setting_pins_the_choice_and_only_plain_masked_attention_is_taken(monkeypatch):
    query, key, value, mask = inputs()
    set_update_attention("grouped")
    assert uses_grouped(query, key, value, mask)
    assert not uses_grouped(query, key, value, None)  # no mask: sdpa's causal flag
    assert not uses_grouped(query, key, value, mask, output_attentions=True)
    assert not uses_grouped(query, key, value, mask, sinks=torch.zeros(6))
    assert not uses_grouped(query, key, value, mask[:, :, :, :-1])  # not over the keys
    with torch.no_grad():
        module = type("Attention", (), {"num_key_value_groups": 3})()
        assert not update_uses_grouped(module, query, key, value, mask, 0.0, 0.35, {})  # generating
    set_update_attention("sdpa")
    assert not uses_grouped(query, key, value, mask)
    with pytest.raises(ValueError, match="must be one of 'auto', 'sdpa', 'grouped', got 'eager'"):
        set_update_attention("eager")


def loss_gradients(model, ids, mask):
    model.zero_grad()
    logits = model(input_ids=ids, attention_mask=mask).logits.float()
    logits[mask.bool()].logsumexp(-1).sum().backward()
    return [p.grad.float().clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_models_update_takes_the_grouped_products_when_chosen(tiny_model_dir, monkeypatch, dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype)
    model.set_attn_implementation(register())
    ids = torch.randint(3, 100, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :5] = 0
    calls: list[int] = []
    grouped = update_attention.grouped_update_attention

    def counted(*args):
        calls.append(1)
        return grouped(*args)

    monkeypatch.setattr("llm_zoo_train.kernels.attention.grouped_update_attention", counted)
    set_update_attention("sdpa")
    by_sdpa = loss_gradients(model, ids, mask)
    assert calls == []
    set_update_attention("grouped")
    by_grouped = loss_gradients(model, ids, mask)
    assert len(calls) == model.config.num_hidden_layers
    tolerance = 1e-5 if dtype == torch.float32 else 0.05
    assert len(by_grouped) == len(by_sdpa) > 0
    for ours, theirs in zip(by_grouped, by_sdpa, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=tolerance, atol=tolerance)


def test_model_update_attention_sets_the_process_choice_and_a_bad_one_is_a_config_error(
    tiny_model_dir, tmp_path
):
    from llm_zoo_train.config import ConfigError, ModelConfig, validate
    from llm_zoo_train.models.policy import load_base_model
    from train_helpers import toy_config

    for choice in ("grouped", "sdpa", "auto"):
        load_base_model(ModelConfig(name_or_path=str(tiny_model_dir), update_attention=choice))
        assert choice == update_attention.UPDATE_ATTENTION
    with pytest.raises(ConfigError, match="update_attention") as err:
        validate(toy_config(tiny_model_dir, tmp_path / "run", ["--model.update_attention", "eager"]))
    assert "grouped" in str(err.value) and "sdpa" in str(err.value)
