"""Env arguments are type- and range-checked when the env is made, reset or observed: one line
naming the argument, the value and what is expected (:mod:`llm_zoo.arguments`)."""

from __future__ import annotations

import math
import re
import time

import numpy as np
import pytest

import llm_zoo
from llm_zoo.arguments import EnvArgumentError, check_int, check_number
from llm_zoo.data.math import UnknownProblemError

ENV_IDS = ["PlanPath-v0", "Sokoban-v0", "Code-v0", "Math-v0"]


def make(env_id, **kwargs):
    env = llm_zoo.make(env_id, **kwargs)
    env.reset(seed=0)
    return env


@pytest.mark.parametrize(
    ("env_id", "kwargs", "message"),
    [
        ("PlanPath-v0", {"alpha": "high"}, "alpha must be a finite number, got 'high' (a str)"),
        ("Math-v0", {"alpha": math.nan}, "alpha must be a finite number, got nan (a float)"),
        ("Sokoban-v0", {"alpha": math.inf}, "alpha must be a finite number, got inf"),
        ("Code-v0", {"timeout": "3"}, "timeout must be a number in (0, 600] seconds, got '3' (a str)"),
        ("Code-v0", {"timeout": 1e9}, "timeout must be a number in (0, 600] seconds, got 1000000000.0"),
        ("Code-v0", {"memory_mb": 2.5}, "memory_mb must be an integer in [1, 65536], got 2.5 (a float)"),
        ("Code-v0", {"max_tests": 10**9}, "max_tests must be an integer in [1, 1000], got 1000000000"),
        ("Code-v0", {"max_hidden_tests": "2"}, "max_hidden_tests must be an integer >= 1, got '2'"),
        ("Math-v0", {"max_turns": "3"}, "max_turns must be an integer in [1, 10000], got '3' (a str)"),
        ("Math-v0", {"code_timeout_s": "5"}, "code_timeout_s must be a number in (0, 600] seconds"),
        ("PlanPath-v0", {"max_turns": 10**9}, "max_turns must be an integer in [1, 10000]"),
        (
            "PlanPath-v0",
            {"rows": True},
            "rows must be an integer in [1, 256] (the board is in every prompt), got True (a bool)",
        ),
        ("PlanPath-v0", {"wall_ratio": "0.2"}, "wall_ratio must be a number in [0, 1), got '0.2'"),
        ("PlanPath-v0", {"tool_timeout_s": True}, "tool_timeout_s must be a number in (0, 600], got True"),
        (
            "Sokoban-v0",
            {"rows": True},
            "rows must be an integer in [5, 64] (walls included), got True (a bool)",
        ),
        ("Sokoban-v0", {"num_boxes": "1"}, "num_boxes must be an integer >= 1, got '1'"),
        ("Sokoban-v0", {"tool_memory_mb": 10**9}, "tool_memory_mb must be an integer in [64, 65536]"),
        ("Sokoban-v0", {"max_search_states": 10**9}, "max_search_states must be an integer in [1, 1000000]"),
    ],
)
def test_wrong_types_and_ranges_are_refused_by_make_naming_argument_value_and_expectation(
    env_id, kwargs, message
):
    with pytest.raises(EnvArgumentError, match=re.escape(message)) as caught:
        llm_zoo.make(env_id, **kwargs)
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, ValueError)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("env_id", "kwargs", "bound"),
    [
        ("PlanPath-v0", {"rows": 10**9}, "[1, 256]"),
        ("PlanPath-v0", {"cols": 10**9}, "[1, 256]"),
        ("Sokoban-v0", {"rows": 10**9}, "[5, 64]"),
    ],
)
def test_huge_sizes_are_refused_at_once_with_the_bound_stated(env_id, kwargs, bound):
    start = time.perf_counter()
    with pytest.raises(ValueError, match=re.escape(bound)):
        llm_zoo.make(env_id, **kwargs)
    assert time.perf_counter() - start < 1.0


def test_sizes_at_the_bound_are_accepted():
    env = make("PlanPath-v0", rows=256, cols=2)
    assert env.level.rows == 256
    env = make("Sokoban-v0", rows=64, cols=5)
    assert env.level.rows == 64


def test_numpy_numbers_are_accepted_like_python_ones():
    env = make(
        "PlanPath-v0", rows=np.int64(4), cols=np.int32(5), alpha=np.float32(0.5), max_turns=np.int64(2)
    )
    assert (env.rows, env.cols, env.alpha, env.max_turns) == (4, 5, 0.5, 2)
    assert type(env.max_turns) is int


@pytest.mark.parametrize("env_id", ENV_IDS)
@pytest.mark.parametrize("seed", [-1, 1.5, "3", True])
def test_reset_refuses_a_seed_gymnasium_refuses(env_id, seed):
    env = llm_zoo.make(env_id)
    with pytest.raises(
        EnvArgumentError,
        match=re.escape(f"reset(seed=...) must be None or an integer >= 0 (as in Gymnasium), got {seed!r}"),
    ):
        env.reset(seed=seed)
    env.close()


def test_reset_takes_numpy_and_large_seeds():
    env = llm_zoo.make("PlanPath-v0")
    env.reset(seed=np.int64(7))
    first = env.observe("tool_agent")
    env.reset(seed=7)
    assert env.observe("tool_agent") == first
    env.reset(seed=2**40)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_observe_refuses_an_unknown_agent_naming_the_agents(env_id):
    env = make(env_id)
    names = ", ".join(repr(a) for a in env.possible_agents)
    with pytest.raises(EnvArgumentError, match=re.escape(f"unknown agent 'nobody'; the agents are {names}")):
        env.observe("nobody")
    env.close()


@pytest.mark.parametrize("env_id", ["PlanPath-v0", "Sokoban-v0"])
@pytest.mark.parametrize("option", ["problem_id", "problem_index"])
def test_generated_envs_refuse_a_problem_id(env_id, option):
    env = llm_zoo.make(env_id)
    with pytest.raises(ValueError, match=rf"does not take the reset option\(s\) '{option}'.*'board'"):
        env.reset(seed=0, options={option: "gen-1"})


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_other_options_are_ignored_as_pettingzoo_expects(env_id):
    env = llm_zoo.make(env_id)
    env.reset(seed=0, options={"options": 1})  # what pettingzoo.test.api_test does
    env.close()


def test_an_option_that_looks_like_a_typo_is_refused():
    env = llm_zoo.make("Code-v0")
    with pytest.raises(ValueError, match=r"'problem_idx'\. Did you mean 'problem_id'\?"):
        env.reset(seed=0, options={"problem_idx": 0})
    env = llm_zoo.make("Math-v0")
    with pytest.raises(ValueError, match="'problem_ids'"):
        env.reset(seed=0, options={"problem_ids": "word-001"})
    env.close()


def test_unknown_problem_ids_are_refused_on_code_and_math():
    code = llm_zoo.make("Code-v0")
    with pytest.raises(ValueError, match="unknown problem_id 'nope'"):
        code.reset(seed=0, options={"problem_id": "nope"})
    math_env = llm_zoo.make("Math-v0", dataset="word")
    with pytest.raises(ValueError, match="unknown problem id 'word-999'") as caught:
        math_env.reset(seed=0, options={"problem_id": "word-999"})
    assert isinstance(caught.value, (KeyError, UnknownProblemError))
    assert str(caught.value).startswith("unknown problem id")  # not quoted as a KeyError would be
    math_env.close()


def test_the_helpers_state_open_and_closed_bounds():
    with pytest.raises(EnvArgumentError, match=re.escape("x must be a number in (0, 1), got 1")):
        check_number("x", 1, low=0, high=1, low_open=True, high_open=True)
    assert check_number("x", 0, low=0) == 0.0
    with pytest.raises(EnvArgumentError, match=re.escape("x must be a number > 0, got 0")):
        check_number("x", 0, low=0, low_open=True)
    with pytest.raises(EnvArgumentError, match=re.escape("x must be an integer >= 2 (because), got 1")):
        check_int("x", 1, low=2, why="because")
