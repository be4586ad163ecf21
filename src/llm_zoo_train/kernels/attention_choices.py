"""One process's measured choices between torch's sdpa kernel and grouped products, by device and dtype.

:mod:`~llm_zoo_train.kernels.attention` (a decode step's attention) and
:mod:`~llm_zoo_train.kernels.update_attention` (the update's) each time both ways once per device
type and dtype in a process and keep what they chose here, in a form a checkpoint can carry
(:mod:`~llm_zoo_train.kernels.choices`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["AttentionChoices"]


class AttentionChoices:
    """Per ``(device type, dtype)``: whether the grouped products won, and the seconds each way
    took (torch's kernel, the grouped products). ``what`` names the attention in errors."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._chosen: dict[tuple[str, torch.dtype], tuple[bool, float, float]] = {}

    def __contains__(self, where: tuple[str, torch.dtype]) -> bool:
        return where in self._chosen

    def grouped(self, where: tuple[str, torch.dtype]) -> bool:
        """Whether the grouped products were chosen for ``where`` (measured or adopted)."""
        return self._chosen[where][0]

    def choose(
        self, where: tuple[str, torch.dtype], sdpa_s: float, grouped_s: float, min_speedup: float
    ) -> bool:
        """Record a measurement: the grouped products where torch's kernel took at least
        ``min_speedup`` times as long. Returns the choice."""
        self._chosen[where] = (sdpa_s >= min_speedup * grouped_s, sdpa_s, grouped_s)
        return self._chosen[where][0]

    def clear(self) -> None:
        """Forget every choice (each is measured again at its next use)."""
        self._chosen.clear()

    def record(self) -> dict[str, dict[str, Any]]:
        """The choices by ``"device/dtype"``, JSON-ready."""
        return {
            f"{device}/{str(dtype).removeprefix('torch.')}": {
                "kernel": "grouped" if grouped else "sdpa",
                "sdpa_s": sdpa_s,
                "grouped_s": grouped_s,
            }
            for (device, dtype), (grouped, sdpa_s, grouped_s) in self._chosen.items()
        }

    def adopt(self, choices: Mapping[str, Mapping[str, Any]], *, replace: bool = True) -> None:
        """Take ``choices`` (:meth:`record` of another process or an earlier run); with
        ``replace=False`` only where nothing was chosen here yet. A malformed entry raises
        ``ValueError`` (or ``KeyError``) and adopts none."""
        parsed: dict[tuple[str, torch.dtype], tuple[bool, float, float]] = {}
        for where, choice in choices.items():
            device, dtype_name = where.split("/")
            dtype = getattr(torch, dtype_name, None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"not a torch dtype: {dtype_name!r}")
            if choice["kernel"] not in ("sdpa", "grouped"):
                raise ValueError(f"unknown {self.what} {choice['kernel']!r}")
            parsed[(device, dtype)] = (
                choice["kernel"] == "grouped",
                float(choice["sdpa_s"]),
                float(choice["grouped_s"]),
            )
        for key, chosen in parsed.items():
            if replace or key not in self._chosen:
                self._chosen[key] = chosen
