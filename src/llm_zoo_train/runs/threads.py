"""How many threads torch computes with on a CPU, chosen for the machine as it is now.

Torch's default is one thread per physical core. On a machine that is already busy with other
work, those threads fight the other processes for the cores, and torch's parallel regions wait
for their slowest thread (issue 28: on a 2-core machine at load 10-19, a tiny run's evaluation made
96 tokens in 6 min 47 s with the default threads; with one thread the whole run took 4 min 24 s).
So the command line
(``llm-zoo-train`` and ``llm-zoo-train eval``) chooses, on a CPU-only machine:

* the physical cores this process may run on (its CPU affinity, the cgroup's CPU quota),
* less the cores that other work keeps busy now: the smaller of the 1-minute load average and the
  CPU use measured over a quarter of a second (without this process), counted on those cores,
* shared among the processes of one launch (``LOCAL_WORLD_SIZE``),

and at least one. An explicit ``OMP_NUM_THREADS`` stays as it is (torch reads it). The command
prints its choice in one line, e.g. ``torch threads: 1 (2 physical cores, 1.6 busy with other
work)``. ``benchmarks/threads.py`` measures the choice against one thread and all cores.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MachineLoad", "choose_threads", "configure_torch_threads", "machine_load"]


@dataclass(frozen=True)
class MachineLoad:
    """What the choice looks at.

    Attributes:
        cores: Physical cores this process may run on (affinity and CPU quota).
        cpus: Logical CPUs this process may run on.
        machine_cpus: Logical CPUs of the machine (the load average counts on all of them).
        busy: Logical CPUs kept busy by other work, machine-wide.
    """

    cores: int
    cpus: int
    machine_cpus: int
    busy: float


def choose_threads(load: MachineLoad, processes: int = 1) -> int:
    """Torch threads for each of ``processes`` processes: the physical cores left idle by other
    work (rounded to the nearest whole core), shared among the processes, at least 1."""
    cores = max(1, load.cores)
    cpus = max(1, load.cpus)
    # Other work spreads over the machine: the part of it on this process's CPUs.
    busy_here = min(float(cpus), max(0.0, load.busy) * cpus / max(cpus, load.machine_cpus))
    free_cores = (cpus - busy_here) * cores / cpus
    usable = min(cores, math.floor(free_cores + 0.5))
    return max(1, usable // max(1, int(processes)))


def _cpu_quota() -> float | None:
    """CPUs the cgroup (v2) may use, or None when unlimited or unknown."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return max(1.0, int(quota) / int(period))
    except (ValueError, ZeroDivisionError):
        return None


def _busy_cpu_seconds() -> tuple[float, float]:
    """(seconds all CPUs spent busy, seconds this process spent on CPUs), both since boot/start."""
    import psutil

    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    own = psutil.Process().cpu_times()
    return sum(times) - idle, own.user + own.system


def machine_load(sample_s: float = 0.25) -> MachineLoad:
    """Measure :class:`MachineLoad` now (takes ``sample_s`` seconds)."""
    import psutil

    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    machine_cpus = psutil.cpu_count(logical=True) or affinity
    physical = psutil.cpu_count(logical=False) or machine_cpus
    cores = max(1, round(affinity * physical / machine_cpus))
    quota = _cpu_quota()
    if quota is not None:
        cores = max(1, min(cores, math.floor(quota)))
    busy_before, own_before = _busy_cpu_seconds()
    start = time.perf_counter()
    time.sleep(sample_s)
    busy_after, own_after = _busy_cpu_seconds()
    elapsed = max(time.perf_counter() - start, 1e-3)
    sampled = max(0.0, (busy_after - busy_before) - (own_after - own_before)) / elapsed
    # The load average remembers a run that has just ended; the sample misses bursts: take the lower.
    busy = min(os.getloadavg()[0], sampled) if hasattr(os, "getloadavg") else sampled
    return MachineLoad(cores=cores, cpus=affinity, machine_cpus=machine_cpus, busy=busy)


def configure_torch_threads(processes: int | None = None) -> str:
    """Set torch's threads as the module docstring says, unless ``OMP_NUM_THREADS`` is set or a GPU
    is present; returns the one line that says what was chosen and why."""
    import torch

    explicit = os.environ.get("OMP_NUM_THREADS", "").strip()
    if explicit:
        return f"torch threads: {torch.get_num_threads()} (OMP_NUM_THREADS={explicit})"
    if torch.cuda.is_available():
        return f"torch threads: {torch.get_num_threads()} (torch's default; the model runs on the GPU)"
    if processes is None:
        local = os.environ.get("LOCAL_WORLD_SIZE", "1")
        processes = int(local) if local.isdigit() and int(local) > 0 else 1
    load = machine_load()
    threads = choose_threads(load, processes)
    torch.set_num_threads(threads)
    shared = f", shared by {processes} processes" if processes > 1 else ""
    cores = "physical core" if load.cores == 1 else "physical cores"
    return (
        f"torch threads: {threads} ({load.cores} {cores}, {load.busy:.1f} CPUs busy with other work{shared}; "
        "set OMP_NUM_THREADS to choose)"
    )
