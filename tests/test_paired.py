"""The exact McNemar test and paired comparisons of two variants on the same problems."""

from __future__ import annotations

import itertools

import pytest

from llm_zoo_train.evaluation.paired import mcnemar_exact, paired_comparison


@pytest.mark.parametrize(
    ("b", "c", "expected"),
    [
        (1, 9, 22 / 1024),  # statsmodels mcnemar([[., 1], [9, .]], exact=True).pvalue = 0.021484375
        (3, 12, 1152 / 32768),  # scipy binomtest(3, 15).pvalue = 0.03515625
        (0, 5, 0.0625),
        (5, 0, 0.0625),
        (0, 1, 1.0),
        (5, 5, 1.0),
        (0, 0, 1.0),
        (2, 8, 0.109375),  # binomtest(2, 10).pvalue
    ],
)
def test_mcnemar_exact_matches_known_values(b, c, expected):
    assert mcnemar_exact(b, c) == pytest.approx(expected, abs=1e-12)


def test_mcnemar_exact_is_the_two_sided_binomial_tail_by_enumeration():
    for b, c in [(4, 7), (1, 6), (9, 2)]:
        n = b + c
        outcomes = list(itertools.product((0, 1), repeat=n))  # every split of n fair coin flips
        extreme = sum(1 for flips in outcomes if min(sum(flips), n - sum(flips)) <= min(b, c))
        assert mcnemar_exact(b, c) == pytest.approx(min(1.0, extreme / len(outcomes)))


@pytest.mark.parametrize("bad", [(-1, 2), (1.5, 2), (True, 2)])
def test_mcnemar_exact_refuses_bad_counts(bad):
    with pytest.raises(ValueError, match="discordant counts must be integers >= 0"):
        mcnemar_exact(*bad)


def test_paired_comparison_pools_runs_problem_by_problem():
    a = [{"p1": True, "p2": True, "p3": False}, {"p1": True, "p2": False, "p3": False}]
    b = [{"p1": True, "p2": False, "p3": False}, {"p1": False, "p2": False, "p3": True}]
    result = paired_comparison(a, b)
    assert (result.pairs, result.both, result.only_a, result.only_b, result.neither) == (6, 1, 2, 1, 2)
    assert result.success_a == pytest.approx(3 / 6) and result.success_b == pytest.approx(2 / 6)
    assert result.p_value == pytest.approx(mcnemar_exact(2, 1))
    assert "only A 2, only B 1" in result.describe()


def test_paired_comparison_refuses_runs_on_different_problems():
    with pytest.raises(ValueError, match="different problems"):
        paired_comparison([{"p1": True}], [{"p2": True}])
    with pytest.raises(ValueError, match="same number"):
        paired_comparison([{"p1": True}], [])
