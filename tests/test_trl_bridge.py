"""Issue 54: the TRL bridge lives in the package (llm_zoo.integrations.trl) and needs no TRL."""

from __future__ import annotations

import importlib.util

import pytest

import llm_zoo
from llm_zoo.envs.math import FORMAT_PENALTY, oracle_action
from llm_zoo.integrations.trl import EnvReward, env_dataset_rows


def test_rows_and_rewards_come_from_an_env_in_this_process():
    rows = env_dataset_rows(None, "Math-v0", [0, 1, 2], prompt_style="compact")
    env = llm_zoo.make("Math-v0", prompt_style="compact")
    for row in rows:
        env.reset(seed=row["seed"])
        assert row["agent"] == env.agent_selection == "reasoner"
        assert row["prompt"] == [{"role": "user", "content": env.observe("reasoner")["prompt"]}]
    reward = EnvReward(None, "Math-v0", prompt_style="compact")
    answers = []
    for row in rows:
        env.reset(seed=row["seed"])
        answers.append(oracle_action(env, "reasoner"))
    malformed = [[{"role": "assistant", "content": "no idea"}]]
    right = [[{"role": "assistant", "content": text}] for text in answers]
    values = reward([r["prompt"] for r in rows], right, [r["seed"] for r in rows], [r["agent"] for r in rows])
    assert values == [1.0 + env.alpha] * 3  # right answers: the role's level plus the team's
    (bad,) = reward([rows[0]["prompt"]], malformed, [0], ["reasoner"])
    assert bad == FORMAT_PENALTY and len(reward.calls) == 4
    env.close()


@pytest.mark.skipif(importlib.util.find_spec("starlette") is None, reason="needs llm-zoo[serve]")
def test_the_same_rewards_from_a_server():
    from llm_zoo.serve import ServerThread

    local = EnvReward(None, "PlanPath-v0", rows=4, cols=4)
    with ServerThread() as url:
        rows = env_dataset_rows(url, "PlanPath-v0", [0, 1], rows=4, cols=4)
        assert rows == env_dataset_rows(None, "PlanPath-v0", [0, 1], rows=4, cols=4)
        served = EnvReward(url, "PlanPath-v0", rows=4, cols=4)
        completions = ["I give up.", '```python\nprint("**Actions List**: [\\"U\\"]")\n```']  # plain text too
        args = (
            [r["prompt"] for r in rows],
            completions,
            [r["seed"] for r in rows],
            [r["agent"] for r in rows],
        )
        assert served(*args) == local(*args)
