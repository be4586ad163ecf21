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
