"""Math problems are distinct by content, not only by text: across the train / test split (a
training draw never asks a test problem with its operands swapped) and within an evaluation set."""

from __future__ import annotations

import numpy as np

from llm_zoo.data import math_generator
from llm_zoo.data.math import build_problem_set, word_problems


def swapped_twin(kind: str, params: dict) -> tuple:
    """An independent content form for the commutative level-1 kinds (the test's own rule)."""
    if kind in ("gcd", "lcm"):
        return (kind, *sorted((params["a"], params["b"])))
    if kind == "percent":
        return (kind, *sorted((params["p"], params["n"])))
    if kind == "order_of_operations":
        return (kind, params["a"], *sorted((params["b"], params["c"])), params["e"])
    return (kind, *sorted(params.items()))


def test_training_draws_never_ask_a_test_problem_with_its_operands_swapped():
    test = {
        swapped_twin(kind, params)
        for _, _, kind, _, params in (math_generator.generate(1, s) for s in range(math_generator.TEST_SEEDS))
    }
    rng = np.random.default_rng(0)
    draws = [
        math_generator.sample_seed(1, "train", lambda low, high: int(rng.integers(low, high)))
        for _ in range(6000)
    ]
    repeated = []
    for seed in draws:
        question, _, kind, _, params = math_generator.generate(1, seed)
        if swapped_twin(kind, params) in test:
            repeated.append(question)
    assert repeated == []  # before content keys: 45 of 20000 draws (e.g. "lcm of 16 and 20")


def test_content_keys_sort_commutative_operands_only():
    key = math_generator.content_key
    assert key("lcm", {"a": 30, "b": 18}) == key("lcm", {"a": 18, "b": 30})
    assert key("order_of_operations", {"a": 5, "b": 3, "c": 7, "e": 2}) == key(
        "order_of_operations", {"a": 5, "b": 7, "c": 3, "e": 2}
    )
    assert key("order_of_operations", {"a": 5, "b": 3, "c": 7, "e": 2}) != key(
        "order_of_operations", {"a": 2, "b": 3, "c": 7, "e": 5}
    )
    assert key("remainder", {"n": 100, "m": 7}) != key("remainder", {"n": 7, "m": 100})
    assert key("fraction_sum", {"terms": ["1/2", "-1/3", "5/4"]}) == key(
        "fraction_sum", {"terms": ["5/4", "1/2", "-1/3"]}
    )
    rows, rhs = [[1, 2], [3, -1]], [5, 1]
    assert key("system_two", {"rows": rows, "rhs": rhs, "target": "xy"}) == key(
        "system_two", {"rows": rows[::-1], "rhs": rhs[::-1], "target": "xy"}
    )


def test_an_evaluation_set_lists_each_problem_once():
    level_two = build_problem_set("generated", "test", 2)
    ids, distinct = level_two.ids(), level_two.distinct_ids()
    assert len(ids) == 100 and len(distinct) == 96  # four test seeds repeat a question at level 2
    questions = [level_two.get(i).question for i in distinct]
    assert len(set(questions)) == len(questions)
    assert len(build_problem_set("generated", "test", 1).distinct_ids()) == 100
    assert build_problem_set("generated", "train", 1).distinct_ids() is None  # infinite: no list


def test_word_problems_have_no_duplicate_across_splits():
    def normal(text: str) -> str:
        return " ".join(text.lower().split())

    train = {normal(p.question) for p in word_problems("train")}
    assert not [p.id for p in word_problems("test") if normal(p.question) in train]
