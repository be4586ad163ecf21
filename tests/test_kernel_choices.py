"""The "auto" kernel choices as one record (llm_zoo_train.kernels.choices): it survives JSON,
an adopted record is used without measuring, ``replace=False`` keeps this process's own, a
malformed part is one clear error that adopts nothing of it, and a resumed run takes the record
its checkpoint saved."""

from __future__ import annotations

import json
import logging

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import toy_envs_trainer  # noqa: E402, F401
from llm_zoo_train.kernels import frozen_linear, lora_rank_rows, packed_linear  # noqa: E402
from llm_zoo_train.kernels.attention import forget_decode_attention_choices  # noqa: E402
from llm_zoo_train.kernels.choices import (  # noqa: E402
    KernelChoicesError,
    adopt_kernel_choices,
    describe_kernel_choices,
    measured_kernel_choices,
)
from llm_zoo_train.kernels.frozen_linear import FrozenLinearPackings, forget_frozen_measurements  # noqa: E402
from llm_zoo_train.kernels.lora_rank_rows import forget_rank_rows_measurements, rank_rows_chosen  # noqa: E402
from llm_zoo_train.kernels.packed_linear import (  # noqa: E402
    PackedLinearWeights,
    forget_measurements,
    onednn_packing_available,
)
from llm_zoo_train.kernels.update_attention import forget_update_attention_choices  # noqa: E402
from llm_zoo_train.runs.checkpoint import read_trainer_state  # noqa: E402
from llm_zoo_train.trainer import Trainer  # noqa: E402
from train_helpers import toy_config  # noqa: E402

needs_onednn = pytest.mark.skipif(
    not onednn_packing_available(), reason="this torch build has no oneDNN packing"
)


def forget_all() -> None:
    forget_measurements()
    forget_frozen_measurements()
    forget_rank_rows_measurements()
    forget_decode_attention_choices()
    forget_update_attention_choices()


@pytest.fixture(autouse=True)
def measure_anew():
    forget_all()
    yield
    forget_all()


def frozen(inputs: int, outputs: int) -> torch.nn.Linear:
    torch.manual_seed(0)
    layer = torch.nn.Linear(inputs, outputs)
    layer.requires_grad_(False)
    return layer


@pytest.fixture
def timings(monkeypatch):
    """Fake timings for both products (oneDNN's twice as fast); the names of the passes timed."""
    timed: list[str] = []

    def decode_pass(calls):
        onednn = calls[0].func is packed_linear._onednn_forward
        timed.append("decode onednn" if onednn else "decode mkl")
        return 0.005 if onednn else 0.010

    def update_pass(products):
        plain = products[0][1].func is F.linear
        timed.append("update F.linear" if plain else "update onednn")
        return 0.010 if plain else 0.005

    def lora_pass(calls):
        peft = calls[0][1].func.__name__ == "_peft_pass"
        timed.append("update LoRA peft" if peft else "update LoRA rank rows")
        return 0.010 if peft else 0.005

    monkeypatch.setattr(packed_linear, "_pass_seconds", decode_pass)
    monkeypatch.setattr(frozen_linear, "_pass_seconds", update_pass)
    monkeypatch.setattr(lora_rank_rows, "_pass_seconds", lora_pass)
    return timed


LORA_SHAPES = {(96, 160, 8): 2}


def choose(layer: torch.nn.Linear) -> tuple[object, object, bool]:
    """The decode and the update choices fresh objects make for ``layer``, and the update's LoRA
    products' for two rank-8 adapters on it."""
    decode, update = PackedLinearWeights("auto"), FrozenLinearPackings("auto")
    with torch.no_grad(), decode.applied(layer, 16):
        pass
    with update.applied(layer):
        pass
    [decode_choice] = decode.choices.values()
    [update_choice] = update.choices.values()
    return decode_choice, update_choice, rank_rows_chosen("auto", LORA_SHAPES)


ATTENTION = {"cpu/float32": {"kernel": "grouped", "sdpa_s": 0.002, "grouped_s": 0.001}}
UPDATE_ATTENTION = {"cpu/bfloat16": {"kernel": "grouped", "sdpa_s": 0.008, "grouped_s": 0.002}}


@needs_onednn
def test_an_adopted_record_is_chosen_again_without_measuring(timings):
    layer = frozen(96, 160)
    measured = choose(layer)
    assert measured[0].kernel == "onednn" and measured[1].kernel == "onednn" and measured[2]
    adopt_kernel_choices({"decode_attention": ATTENTION, "update_attention": UPDATE_ATTENTION})
    record = json.loads(json.dumps(measured_kernel_choices()))  # what a checkpoint keeps
    assert record["decode_attention"] == ATTENTION
    assert record["update_attention"] == UPDATE_ATTENTION
    parts = ("decode_products", "update_products", "update_lora_products")
    assert [len(record[part]) for part in parts] == [1, 1, 1]
    timed_before = len(timings)

    forget_all()
    adopt_kernel_choices(record)
    assert choose(layer) == measured
    assert len(timings) == timed_before  # nothing measured again
    assert json.loads(json.dumps(measured_kernel_choices())) == record


@needs_onednn
def test_replace_false_keeps_this_processes_own_choices(timings):
    layer = frozen(96, 160)
    choose(layer)
    own = measured_kernel_choices()
    other = json.loads(json.dumps(own))
    other["decode_products"][0].update(kernel="mkl", onednn_s=0.02, any_rows=False)
    other["update_products"][0].update(kernel=None, onednn_s=0.02)
    other["update_lora_products"][0].update(rank_rows=False, rank_rows_s=0.02)
    other["decode_attention"] = ATTENTION
    adopt_kernel_choices(other, replace=False)
    taken = measured_kernel_choices()
    assert taken["decode_products"] == own["decode_products"]
    assert taken["update_products"] == own["update_products"]
    assert taken["update_lora_products"] == own["update_lora_products"]
    assert taken["decode_attention"] == ATTENTION  # not measured here: taken
    adopt_kernel_choices(other)
    assert measured_kernel_choices() == {**other, "decode_attention": ATTENTION}


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ([], "must be a mapping"),
        ({"decode_speed": {}}, "unknown kernel choices ['decode_speed']; known:"),
        ({"decode_attention": {"cpu/float33": ATTENTION["cpu/float32"]}}, "not a torch dtype"),
        ({"decode_attention": {"cpu/float32": {"kernel": "fast", "sdpa_s": 1, "grouped_s": 1}}}, "'fast'"),
        ({"decode_attention": {"cpu/float32": {"kernel": "sdpa"}}}, "KeyError"),
        ({"update_attention": {"cpu/bfloat16": {"kernel": "eager", "sdpa_s": 1, "grouped_s": 1}}}, "'eager'"),
        ({"update_products": [{"layers": [[160, 96]], "kernel": "onednn", "speed": 2}]}, "speed"),
        ({"decode_products": [{"layers": [[160, 96, True]], "rows": 16, "kernel": "blas"}]}, "'blas'"),
        ({"update_lora_products": [{"layers": [[96, 160, 8]], "rank_rows": 1}]}, "true or false"),
        ({"update_lora_products": [{"layers": [[96, 160]], "rank_rows": True}]}, "ValueError"),
    ],
)
def test_a_malformed_record_is_one_error_naming_the_problem(record, message):
    good = {"cpu/bfloat16": {"kernel": "grouped", "sdpa_s": 2.0, "grouped_s": 1.0}}
    if isinstance(record, dict) and "decode_attention" in record:
        record = {"decode_attention": {**good, **record["decode_attention"]}}
    with pytest.raises(KernelChoicesError) as err:
        adopt_kernel_choices(record)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert measured_kernel_choices() == {
        "decode_products": [],
        "update_products": [],
        "update_lora_products": [],
        "decode_attention": {},
        "update_attention": {},
    }


def test_a_resumed_run_takes_the_kernels_its_checkpoint_recorded(
    tiny_model_dir, tmp_path, caplog, one_torch_thread
):
    overrides = ["--training.max_steps", "2", "--training.save_steps", "1", "--eval.num_episodes", "0"]
    config = toy_config(tiny_model_dir, tmp_path / "run", overrides)
    Trainer(config).train(stop_after_step=1)
    [recorded] = [
        r["trainer"] for r in read_trainer_state(tmp_path / "run" / "checkpoint-1")["kernel_choices"]
    ]
    # The toy model's decode steps measured their attention (its layers are too small to pack).
    assert recorded == json.loads(json.dumps(measured_kernel_choices()))
    assert set(recorded["decode_attention"]) == {"cpu/float32"}

    forget_all()  # a new process: nothing measured
    with caplog.at_level(logging.INFO, logger="llm_zoo_train.kernels.choices"):
        resumed = Trainer(config, resume_from=tmp_path / "run")
    assert resumed.step == 1
    assert measured_kernel_choices() == recorded
    assert "kernel choices taken, not measured: " in caplog.text
    assert "decode attention cpu/float32: " in caplog.text
    resumed.train()
    # Its decode steps chose by the record: the timings are the first run's, not new ones.
    assert measured_kernel_choices()["decode_attention"] == recorded["decode_attention"]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (
            lambda records: records[0].update(
                trainer={"decode_attention": {"cpu/float32": {"kernel": "fast"}}}
            ),
            "unknown decode attention 'fast'",
        ),
        (lambda records: records.clear(), "expected a list of one record per process"),
        (lambda records: records[0].update(rollout_process=[1]), "rollout_process: not a record"),
    ],
    ids=["bad-kernel", "empty", "bad-rollout-record"],
)
def test_a_checkpoint_whose_record_is_damaged_resumes_with_a_warning(
    damage, reason, tiny_model_dir, tmp_path, capsys, one_torch_thread
):
    from llm_zoo_train.runs.manifest import write_manifest

    overrides = ["--training.max_steps", "2", "--training.save_steps", "1", "--eval.num_episodes", "0"]
    config = toy_config(tiny_model_dir, tmp_path / "run", overrides)
    Trainer(config).train(stop_after_step=1)
    checkpoint = tmp_path / "run" / "checkpoint-1"
    state = read_trainer_state(checkpoint)
    damage(state["kernel_choices"])
    (checkpoint / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
    write_manifest(checkpoint)  # the record is wrong, not the file: it verifies

    forget_all()
    resumed = Trainer(config, resume_from=tmp_path / "run")
    assert resumed.step == 1
    err = capsys.readouterr().err
    assert "checkpoint-1: the kernel choices it recorded cannot be read" in err
    assert reason in err and "may not be bit-identical" in err
    assert measured_kernel_choices()["decode_attention"] == {}
    resumed.train()  # and the run goes on
    assert resumed.step == 2


def test_a_record_is_described_in_one_line():
    record = {
        "decode_products": [{"layers": [[160, 96, True]], "rows": 16, "kernel": "onednn"}],
        "update_products": [{"layers": [[160, 96]], "kernel": None}],
        "update_lora_products": [{"layers": [[96, 160, 8]], "rank_rows": True}],
        "decode_attention": ATTENTION,
        "update_attention": UPDATE_ATTENTION,
    }
    assert describe_kernel_choices(record) == (
        "decode products at 16 rows: onednn; update products: F.linear; update LoRA products: the rank"
        " as the rows; decode attention cpu/float32: grouped; update attention cpu/bfloat16: grouped"
    )
    assert describe_kernel_choices({}) == "none"
