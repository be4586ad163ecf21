"""Both adapters of a two-agent team learn on the toy job (the regression test of issue #49).

On Plan-Path the team's training fell apart while one agent alone learned: the plan agent's prompt
carried its teammate's error text, and AT-GRPO drove it to answer with that text only (format
6% -> 0%). This job is the smallest place where two-agent training can fail the same way: two
agents, per-agent adapters, the second agent's prompt showing the first agent's reply. Each agent is
paid for writing its own letter, so a working trainer lifts *both* agents' rewards; one that routes
samples to the wrong adapter, masks the wrong tokens, lets one agent's advantages drown the other's
or teaches an agent its teammate's text leaves at least one flat or falling.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

import toy_envs_trainer  # noqa: F401  (registers test/Scripted-v0)
from train_helpers import toy_config

STEPS = 20


def _mean(records: list[dict], key: str) -> float:
    values = [r[key] for r in records if key in r]
    assert values, f"no {key} in the metrics"
    return sum(values) / len(values)


@pytest.mark.parametrize("adapters", ["per_agent", "shared"])
def test_both_agents_rewards_rise_when_trained_together(tiny_model_dir, tmp_path, adapters, one_torch_thread):
    from llm_zoo_train.trainer import Trainer

    config = toy_config(
        tiny_model_dir,
        tmp_path / "run",
        ["--training.max_steps", str(STEPS), "--agents.adapters", adapters, "--eval.num_episodes", "2"],
    )
    Trainer(config).train()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "step" in r and any(k.endswith("/reward") for k in r)]
    assert len(steps) >= STEPS, records[:2]
    for agent in ("alice", "bob"):
        key = f"{agent}/reward"
        first, last = _mean(steps[:3], key), _mean(steps[-3:], key)
        assert last > first + 0.1, (agent, adapters, [round(r[key], 3) for r in steps if key in r])
        if adapters == "per_agent":  # its own adapter trained on its own samples at most steps
            trained = [r.get(f"update/{agent}/samples", 0) for r in steps]
            assert sum(t > 0 for t in trained) >= STEPS // 2, (agent, trained)
