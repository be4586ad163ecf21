"""Where colocated vLLM engines run in multi-process runs (engines/vllm/placement.py).

The device arithmetic is checked here without a GPU (torch.cuda is stubbed). The last test runs a
real two-process training with one vLLM engine per process: on two GPUs when there are, else on
the CPU (marked vllm and slow).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from llm_zoo_train.engines.vllm.placement import check_placement, engine_gpus, visible_devices  # noqa: E402


def fake_gpus(monkeypatch, count: int, current: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)


def test_tensor_parallel_engines_are_refused_in_multi_process_runs():
    check_placement(1, 4)
    check_placement(8, 1)
    with pytest.raises(ValueError, match=r"lockstep.*vllm_server"):
        check_placement(2, 2)
    with pytest.raises(ValueError, match=">= 1"):
        check_placement(1, 0)


def test_each_process_gets_its_own_gpu(monkeypatch):
    fake_gpus(monkeypatch, count=4, current=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert engine_gpus(world_size=4, tensor_parallel_size=1) == "6"  # the physical id of cuda:2
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert engine_gpus(world_size=4, tensor_parallel_size=1) == "2"


def test_a_single_process_leaves_the_gpus_to_vllm(monkeypatch):
    fake_gpus(monkeypatch, count=4, current=0)
    assert engine_gpus(world_size=1, tensor_parallel_size=4) is None
    with pytest.raises(ValueError, match="needs 8 GPUs"):
        engine_gpus(world_size=1, tensor_parallel_size=8)


def test_cpu_runs_set_nothing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert engine_gpus(world_size=2, tensor_parallel_size=1) is None


def test_visible_devices_is_restored(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with visible_devices("1"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with visible_devices("3"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    with visible_devices(None):
        assert "CUDA_VISIBLE_DEVICES" not in os.environ


@pytest.mark.vllm
@pytest.mark.slow
def test_two_processes_each_train_with_their_own_vllm_engine(tmp_path):
    """Two data-parallel processes, each with its own colocated vLLM engine (on its own GPU when
    there are two, else on the CPU), train both agents for 2 steps; every step's samples come from
    each process's own engine with the adapters the trainer holds (logp_mismatch ~ 0)."""
    pytest.importorskip("vllm")
    import test_vllm_engine

    model_dir = test_vllm_engine.build_vllm_tiny_model_dir(tmp_path / "model")
    if torch.cuda.device_count() >= 2:
        env, memory = {"ACCELERATE_USE_CPU": "0"}, "gpu_memory_utilization: 0.2"
    else:
        env, memory = {"VLLM_CPU_KVCACHE_SPACE": "1"}, "kv_cache_memory_bytes: 67108864, enforce_eager: true"
    test_vllm_engine.train_with_two_processes(model_dir, tmp_path, "vllm", memory, env)
