"""The record of measured attention choices (llm_zoo_train.kernels.attention_choices): the margin,
a JSON round trip, replace=False, and one clear error that adopts nothing."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from llm_zoo_train.kernels.attention_choices import AttentionChoices  # noqa: E402

BF16 = ("cpu", torch.bfloat16)
F32 = ("cpu", torch.float32)


def test_the_grouped_products_are_chosen_only_past_the_margin():
    choices = AttentionChoices("update attention")
    assert BF16 not in choices
    assert choices.choose(BF16, 0.0115, 0.010, 1.15) and choices.grouped(BF16)
    assert not choices.choose(F32, 0.0114, 0.010, 1.15) and not choices.grouped(F32)
    assert choices.record() == {
        "cpu/bfloat16": {"kernel": "grouped", "sdpa_s": 0.0115, "grouped_s": 0.010},
        "cpu/float32": {"kernel": "sdpa", "sdpa_s": 0.0114, "grouped_s": 0.010},
    }
    choices.clear()
    assert choices.record() == {} and BF16 not in choices


def test_a_record_survives_json_and_replace_false_keeps_what_was_measured_here():
    measured = AttentionChoices("decode attention")
    measured.choose(BF16, 0.004, 0.001, 1.15)
    record = json.loads(json.dumps(measured.record()))
    taken = AttentionChoices("decode attention")
    taken.choose(F32, 0.001, 0.002, 1.15)
    taken.adopt(
        {**record, "cpu/float32": {"kernel": "grouped", "sdpa_s": 9.0, "grouped_s": 1.0}}, replace=False
    )
    assert taken.grouped(BF16) and not taken.grouped(F32)
    taken.adopt({"cpu/float32": {"kernel": "grouped", "sdpa_s": 9.0, "grouped_s": 1.0}})
    assert taken.grouped(F32)


@pytest.mark.parametrize(
    ("entry", "error", "message"),
    [
        ({"cpu/float33": {"kernel": "sdpa", "sdpa_s": 1, "grouped_s": 1}}, ValueError, "not a torch dtype"),
        (
            {"cpu/float32": {"kernel": "eager", "sdpa_s": 1, "grouped_s": 1}},
            ValueError,
            "unknown update attention 'eager'",
        ),
        ({"cpu/float32": {"kernel": "sdpa"}}, KeyError, "sdpa_s"),
    ],
)
def test_a_malformed_entry_adopts_nothing(entry, error, message):
    choices = AttentionChoices("update attention")
    good = {"cpu/bfloat16": {"kernel": "grouped", "sdpa_s": 2.0, "grouped_s": 1.0}}
    with pytest.raises(error, match=message):
        choices.adopt({**good, **entry})
    assert choices.record() == {}
