"""Paired comparison of two policies evaluated on the same problems: the exact McNemar test.

Two variants played on the same evaluation problems are not independent samples: a problem one
variant solves is more likely solved by the other. Only the *discordant* problems, solved by one
and not the other, say which is better; the exact McNemar test asks whether they split
unevenly: under "no difference" each discordant problem is A's with probability 1/2, so with
``b`` for A and ``c`` for B the two-sided p-value is ``min(1, 2 P(X <= min(b, c)))`` for
``X ~ Binomial(b + c, 1/2)``. Pure Python (no scipy).

With several training seeds per variant, :func:`paired_comparison` pairs run ``i`` of A with run
``i`` of B and pools the ``(seed, problem)`` pairs; this treats the seeds' problem pairs as
independent, which is exact within one seed and an approximation across them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from math import comb
from typing import Any

__all__ = ["PairedResult", "mcnemar_exact", "paired_comparison"]


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for ``b`` problems only A solved and ``c`` only B solved.

    ``1.0`` when there is no discordant problem. Raises ``ValueError`` for negative counts.
    """
    if isinstance(b, bool) or isinstance(c, bool) or int(b) != b or int(c) != c or b < 0 or c < 0:
        raise ValueError(f"discordant counts must be integers >= 0, got b={b!r}, c={c!r}")
    n = int(b) + int(c)
    if n == 0:
        return 1.0
    tail = sum(comb(n, i) for i in range(min(int(b), int(c)) + 1))
    return min(1.0, 2 * tail / 2**n)


@dataclass
class PairedResult:
    """Two variants on the same problems.

    Attributes:
        pairs: ``(seed, problem)`` pairs compared.
        both: Pairs both solved.
        only_a: Pairs only A solved (McNemar's ``b``).
        only_b: Pairs only B solved (``c``).
        neither: Pairs neither solved.
        success_a: A's success rate over the pairs.
        success_b: B's success rate over the pairs.
        p_value: Two-sided exact McNemar p-value.
    """

    pairs: int
    both: int
    only_a: int
    only_b: int
    neither: int
    success_a: float
    success_b: float
    p_value: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """E.g. ``A 23.4% vs B 20.3% on 128 pairs: only A 9, only B 5, McNemar p=0.42``."""
        return (
            f"A {100 * self.success_a:.1f}% vs B {100 * self.success_b:.1f}% on {self.pairs} pairs: only A "
            f"{self.only_a}, only B {self.only_b}, McNemar p={self.p_value:.3g}"
        )


def paired_comparison(a: Sequence[Mapping[str, bool]], b: Sequence[Mapping[str, bool]]) -> PairedResult:
    """Compare A and B run by run: ``a[i]`` and ``b[i]`` map problem id -> solved for training seed
    ``i``; each pair of runs must cover the same problems (else ``ValueError`` naming them)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need the same number (>= 1) of runs of A and B, got {len(a)} and {len(b)}")
    counts = {"both": 0, "only_a": 0, "only_b": 0, "neither": 0}
    for index, (run_a, run_b) in enumerate(zip(a, b, strict=True)):
        if set(run_a) != set(run_b):
            missing = sorted(set(run_a) ^ set(run_b))[:5]
            raise ValueError(f"run {index}: A and B were evaluated on different problems (e.g. {missing})")
        for problem, solved_a in run_a.items():
            solved_b = bool(run_b[problem])
            key = ("both" if solved_b else "only_a") if solved_a else ("only_b" if solved_b else "neither")
            counts[key] += 1
    pairs = sum(counts.values())
    return PairedResult(
        pairs=pairs,
        **counts,
        success_a=(counts["both"] + counts["only_a"]) / pairs if pairs else 0.0,
        success_b=(counts["both"] + counts["only_b"]) / pairs if pairs else 0.0,
        p_value=mcnemar_exact(counts["only_a"], counts["only_b"]),
    )
