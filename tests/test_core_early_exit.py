"""An agent that terminates before the others, in an env that does no bookkeeping of its own.

The PettingZoo AEC API allows an env to set ``terminations[agent] = True`` for one agent while the
others play on. :class:`llm_zoo.core.TextAECEnv` must then select the dead agent once (stepped with
``None``), move on to a live agent, and count a turn as one action by every agent still playing.
"""

from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.test import api_test

import llm_zoo
from llm_zoo_train.engines.base import SamplingParams
from llm_zoo_train.rollout.tree import evaluation_rollout, tree_rollout
from tiny_model import tiny_lora_engine
from toy_envs_early import SCOUT_QUITS_ENV_ID, ScoutQuitsEnv
from toy_envs_trainer import ScriptedEngine

VARIANTS = [
    pytest.param({"scout_last": False, "quit_in": "step"}, id="scout-first-quits-in-step"),
    pytest.param({"scout_last": True, "quit_in": "step"}, id="scout-last-quits-in-step"),
    pytest.param({"scout_last": False, "quit_in": "act"}, id="scout-first-quits-in-act"),
    pytest.param({"scout_last": True, "quit_in": "act"}, id="scout-last-quits-in-act"),
]
ADAPTERS = {"scout": "scout_lora", "builder": "builder_lora"}


def play(env: ScoutQuitsEnv) -> list[tuple[str, int, str | None]]:
    """Play an episode with the AEC loop; return (agent, turn, action) for every step."""
    played = []
    for agent in env.agent_iter(max_iter=100):
        _, _, terminated, truncated, _ = env.last()
        action = None if terminated or truncated else ("map" if agent == "scout" else "build")
        played.append((agent, env.turn, action))
        env.step(action)
    return played


@pytest.mark.parametrize("kwargs", VARIANTS)
def test_selection_moves_on_to_the_live_agent_and_turns_count_the_players_left(kwargs):
    env = llm_zoo.make(SCOUT_QUITS_ENV_ID, max_turns=3, **kwargs)
    env.reset(seed=0)
    played = play(env)
    acted = [(agent, turn) for agent, turn, action in played if action is not None]
    scout_first = [("scout", 0), ("builder", 0)]
    first = scout_first if not kwargs["scout_last"] else scout_first[::-1]
    assert acted == [*first, ("builder", 1), ("builder", 2)]
    # The scout is stepped with None exactly once, then never selected again.
    assert [(a, act) for a, _, act in played if act is None].count(("scout", None)) == 1
    assert env.agents == [] and env.success
    assert env.turn_label() == "over in turn 3 of 3"


@pytest.mark.parametrize("kwargs", VARIANTS)
def test_pettingzoo_api_test_passes_with_an_agent_that_quits_early(kwargs):
    api_test(ScoutQuitsEnv(max_turns=3, **kwargs), num_cycles=30)


@pytest.mark.parametrize("kwargs", VARIANTS)
def test_clones_of_an_env_with_a_dead_agent_play_on_alone(kwargs):
    env = ScoutQuitsEnv(max_turns=3, **kwargs)
    env.reset(seed=1)
    while env.agent_selection != "builder" or "scout" in env.agents:
        agent = env.agent_selection
        env.step(None if env.terminations[agent] or env.truncations[agent] else "map build")
    clone = env.clone()
    assert play(clone) == play(env)


@pytest.mark.parametrize("kwargs", VARIANTS)
@pytest.mark.parametrize("lookahead", [-1, 0])
def test_tree_rollout_runs_an_env_whose_agent_quits_without_bookkeeping(kwargs, lookahead):
    engine = ScriptedEngine(
        script=lambda prompt, adapter, index: "map" if adapter == "scout_lora" else "build"
    )
    samples = tree_rollout(
        SCOUT_QUITS_ENV_ID,
        {"max_turns": 3, **kwargs},
        [1, 2],
        engine,
        ADAPTERS,
        2,
        SamplingParams(max_tokens=8, temperature=1.0, seed=11),
        np.random.default_rng(0),
        team_credit_lookahead=lookahead,
    )
    assert sorted({(s.turn, s.agent) for s in samples}) == [
        (0, "builder"),
        (0, "scout"),
        (1, "builder"),
        (2, "builder"),
    ]
    scout_prompts = [p for call in engine.calls for p in call.prompts if "you are the scout" in p]
    assert scout_prompts and all("turn 0:" in p for p in scout_prompts)  # never after it quit
    (result, _) = evaluation_rollout(
        SCOUT_QUITS_ENV_ID,
        {"max_turns": 3, **kwargs},
        [1, 2],
        engine,
        ADAPTERS,
        SamplingParams(temperature=0),
    )
    assert result.turns == 3 and result.success


def test_tree_rollout_with_the_tiny_model_and_an_agent_that_quits(tiny_model_dir, one_torch_thread):
    pytest.importorskip("torch")
    engine = tiny_lora_engine(tiny_model_dir, ["scout_lora", "builder_lora"], max_batch_size=8)
    samples = tree_rollout(
        SCOUT_QUITS_ENV_ID,
        {"max_turns": 2, "scout_last": True},
        [0, 1],
        engine,
        ADAPTERS,
        2,
        SamplingParams(max_tokens=4, temperature=1.0, seed=3),
        np.random.default_rng(0),
    )
    turns = sorted({(s.env_index, s.turn, s.agent) for s in samples})
    assert turns == [(e, t, a) for e in (0, 1) for t, a in ((0, "builder"), (0, "scout"), (1, "builder"))]
    assert all(len(s.completion_token_ids) >= 1 for s in samples)
