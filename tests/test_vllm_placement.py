"""Where colocated vLLM engines run in multi-process runs (engines/vllm_placement.py).

The device arithmetic is checked here without a GPU (torch.cuda is stubbed). The last test runs a
real two-process training with one vLLM engine per process: on two GPUs when there are, else on
the CPU (marked vllm and slow).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from llm_zoo_train.engines.vllm_placement import check_placement, engine_gpus, visible_devices  # noqa: E402


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
    import json

    import test_vllm_engine

    model_dir = test_vllm_engine.build_vllm_tiny_model_dir(tmp_path / "model")
    on_gpus = torch.cuda.device_count() >= 2
    env = dict(os.environ)
    if not on_gpus:
        env.update(ACCELERATE_USE_CPU="1", VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1")
    memory = (
        "gpu_memory_utilization: 0.2" if on_gpus else "kv_cache_memory_bytes: 67108864, enforce_eager: true"
    )
    config = tmp_path / "config.yaml"
    config.write_text(
        f"model: {{name_or_path: {model_dir}}}\n"
        "env: {id: PlanPath-v0, kwargs: {rows: 5, cols: 5, max_turns: 1}}\n"
        "rollout: {engine: vllm, num_generations: 2, envs_per_step: 2, max_completion_length: 8}\n"
        f"vllm: {{{memory}}}\n"
        "algorithm: {zero_variance_groups: keep, importance_sampling: true}\n"
        f"training: {{max_steps: 2, learning_rate: 0.01, output_dir: {tmp_path / 'run'}}}\n"
        "eval: {num_episodes: 2}\nlogging: {progress_bar: false, plot: false}\n"
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "llm_zoo_train"]
    done = subprocess.run([*command, str(config)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "update/tool_agent/samples" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for record in steps:
        for agent in ("tool_agent", "plan_agent"):
            assert record[f"update/{agent}/samples"] > 0
            assert record[f"update/{agent}/logp_mismatch"] < 1e-4
