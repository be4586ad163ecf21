"""The command line's choice of torch threads on a CPU (llm_zoo_train.runs.threads)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llm_zoo_train.runs.threads import MachineLoad, choose_threads, machine_load


@pytest.mark.parametrize(
    ("load", "processes", "threads"),
    [
        (MachineLoad(cores=2, cpus=2, machine_cpus=2, busy=0.0), 1, 2),  # quiet: every core
        (MachineLoad(cores=2, cpus=2, machine_cpus=2, busy=0.3), 1, 2),  # a little noise: still both
        (MachineLoad(cores=2, cpus=2, machine_cpus=2, busy=0.6), 1, 1),  # most of a core taken
        (MachineLoad(cores=2, cpus=2, machine_cpus=2, busy=15.0), 1, 1),  # very busy: one, never zero
        (MachineLoad(cores=8, cpus=16, machine_cpus=16, busy=0.0), 1, 8),  # physical cores, not hyperthreads
        (MachineLoad(cores=8, cpus=16, machine_cpus=16, busy=8.0), 1, 4),  # half the CPUs busy
        (MachineLoad(cores=8, cpus=16, machine_cpus=16, busy=0.0), 2, 4),  # two processes share
        (MachineLoad(cores=8, cpus=16, machine_cpus=16, busy=0.0), 32, 1),
        # Pinned to 4 of 64 CPUs while 32 elsewhere are busy: half of that lands on ours.
        (MachineLoad(cores=4, cpus=4, machine_cpus=64, busy=32.0), 1, 2),
        (MachineLoad(cores=0, cpus=0, machine_cpus=0, busy=-1.0), 1, 1),  # nonsense in: one thread
    ],
)
def test_threads_are_the_idle_physical_cores_shared_among_processes(load, processes, threads):
    assert choose_threads(load, processes) == threads


def test_the_measured_load_is_plausible():
    load = machine_load(sample_s=0.05)
    assert 1 <= load.cores <= load.cpus <= load.machine_cpus
    assert load.busy >= 0.0


def _threads_line(env: dict[str, str], code: str) -> str:
    import os

    full = {**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}, **env}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


CHOOSE = (
    "import torch; from llm_zoo_train.runs.threads import configure_torch_threads; "
    "line = configure_torch_threads(); print(line, '|', torch.get_num_threads())"
)


def test_an_explicit_omp_num_threads_stays():
    pytest.importorskip("torch")
    line = _threads_line({"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}, CHOOSE)
    assert line == "torch threads: 1 (OMP_NUM_THREADS=1) | 1"


def test_without_omp_num_threads_the_choice_is_set_and_said():
    pytest.importorskip("torch")
    line, threads = _threads_line({"CUDA_VISIBLE_DEVICES": ""}, CHOOSE).split(" | ")
    assert line.startswith(f"torch threads: {threads} (") and "busy with other work" in line
    assert "set OMP_NUM_THREADS to choose" in line
