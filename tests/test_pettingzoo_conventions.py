"""PettingZoo's conventions on the built-in envs: ``max_cycles``, the parallel API, ``render()``
without a render mode (llm_zoo.core.TextAECEnv)."""

from __future__ import annotations

import inspect
import types

import pytest
from pettingzoo.test import max_cycles_test, parallel_api_test
from pettingzoo.utils.conversions import aec_to_parallel, turn_based_aec_to_parallel

import llm_zoo

BUILTIN_IDS = ("PlanPath-v0", "Sokoban-v0", "Code-v0", "Math-v0")


def _simultaneous(env_id: str, max_cycles: int):
    """PettingZoo's simultaneous parallel view (every agent of a turn answers at once). Users are
    refused it (is_parallelizable is False: it hides same-turn answers); max_cycles_test only
    counts its cycles, which are the env's turns."""
    env = llm_zoo.make(env_id, max_cycles=max_cycles)
    env.metadata = {**env.metadata, "is_parallelizable": True}
    return aec_to_parallel(env)


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_max_cycles_is_pettingzoos_name_for_the_turn_limit(env_id):
    module = types.SimpleNamespace(
        env=lambda max_cycles: llm_zoo.make(env_id, max_cycles=max_cycles),
        parallel_env=lambda max_cycles: _simultaneous(env_id, max_cycles),
    )
    max_cycles_test(module)
    assert llm_zoo.make(env_id, max_cycles=2).max_turns == 2
    assert "max_cycles" in inspect.signature(type(llm_zoo.make(env_id))).parameters
    with pytest.raises(TypeError, match="give max_turns or max_cycles"):
        llm_zoo.make(env_id, max_turns=2, max_cycles=3)


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_the_simultaneous_parallel_conversion_is_refused_and_the_turn_based_one_works(env_id):
    env = llm_zoo.make(env_id)
    assert env.metadata["is_parallelizable"] is False
    with pytest.raises(AssertionError, match="is_parallelizable"):
        aec_to_parallel(env)
    parallel_api_test(turn_based_aec_to_parallel(llm_zoo.make(env_id)), num_cycles=4)


def test_the_turn_based_view_shows_the_plan_agent_its_teammates_answer_of_the_same_turn():
    program = "```python\nprint('**Actions List**: [\"R\"]')\n```"
    parallel = turn_based_aec_to_parallel(llm_zoo.make("PlanPath-v0"))
    observations, _ = parallel.reset(seed=0, options={"board": "S.G"})
    assert "has not answered yet" in observations["plan_agent"]["prompt"]
    observations, *_ = parallel.step({"tool_agent": program, "plan_agent": "ignored: not its turn"})
    assert "print('**Actions List**" in observations["plan_agent"]["prompt"]


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_render_without_a_render_mode_warns_as_pettingzoo_does(env_id):
    env = llm_zoo.make(env_id)
    env.reset(seed=0)
    with pytest.warns(UserWarning, match="without specifying any render mode.*ansi"):
        assert env.render() is None
    env.close()
