"""Issue 54: PettingZoo's family-module convention, ``<family>_v0.env()`` / ``.parallel_env()``."""

from __future__ import annotations

import importlib

import pytest
from pettingzoo.test import api_test, parallel_api_test

import llm_zoo
from llm_zoo.arguments import EnvArgumentError

FAMILIES = {
    "plan_path_v0": "PlanPath-v0",
    "sokoban_v0": "Sokoban-v0",
    "code_v0": "Code-v0",
    "math_v0": "Math-v0",
    "math_relay_v0": "MathRelay-v0",
    "key_relay_v0": "KeyRelay-v0",
}


@pytest.mark.parametrize(("module", "env_id"), FAMILIES.items())
def test_every_built_in_env_has_a_family_module(module, env_id):
    family = importlib.import_module(f"llm_zoo.envs.{module}")
    env = family.env()
    assert isinstance(env, family.raw_env) and type(env) is type(llm_zoo.make(env_id))
    env.reset(seed=0)
    assert env.observe(env.agent_selection)["prompt"] == _first_prompt(env_id)
    parallel = family.parallel_env()
    observations, _ = parallel.reset(seed=0)
    assert set(observations) == set(env.possible_agents)
    env.close()
    parallel.close()


def _first_prompt(env_id: str) -> str:
    env = llm_zoo.make(env_id)
    env.reset(seed=0)
    return env.observe(env.agent_selection)["prompt"]


def test_plan_path_v0_passes_pettingzoos_own_tests_and_checks_its_arguments():
    from llm_zoo.envs import plan_path_v0

    api_test(plan_path_v0.env(rows=4, cols=4), num_cycles=5)
    parallel_api_test(plan_path_v0.parallel_env(rows=4, cols=4), num_cycles=5)
    with pytest.raises(EnvArgumentError, match="rows"):
        plan_path_v0.env(rows="4")


def test_one_accessor_for_an_envs_task_set():
    """Issue 54: Code-v0 had ``env.problems`` and Math-v0 ``env.problem_set``; ``task_ids()`` is
    the one accessor, and ``None`` says the tasks are drawn from an unlimited space."""
    code = llm_zoo.make("Code-v0", split="test")
    assert code.task_ids() == [problem.id for problem in code.problems]
    math = llm_zoo.make("Math-v0", split="test", dataset="generated")
    ids = math.task_ids()
    assert ids and len(ids) == len(set(ids))
    math.reset(seed=0, options={"problem_id": ids[3]})
    assert math.task_id == ids[3]
    assert llm_zoo.make("Math-v0", split="train", dataset="generated").task_ids() is None
    assert llm_zoo.make("PlanPath-v0").task_ids() is None
    for env in (code, math):
        env.close()
