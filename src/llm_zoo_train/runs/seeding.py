"""Random streams of a run, all derived from its one seed.

A run draws from several independent streams (which tasks a step trains on, how ties between
branches are broken, the engine's sampling seed, the evaluation tasks). Each stream's seed is
hashed from ``(run seed, step, process, stream)``, so changing one stream's use never shifts
another's numbers, and the trainer, the evaluation command and the benchmarks agree on them.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

__all__ = ["Stream", "derive_seed"]


class Stream(IntEnum):
    """The independent random streams of a run (the last part of a derived seed)."""

    TASKS = 1
    """Which task seeds a training step plays."""
    TIES = 2
    """Tie-breaking between equally rewarded branches of a tree rollout."""
    SAMPLING = 3
    """The engine's sampling seed for a step."""
    EVAL = 4
    """The evaluation tasks."""


def derive_seed(*parts: int) -> int:
    """A 32-bit seed that depends on every part (NumPy's SeedSequence hashing)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])
