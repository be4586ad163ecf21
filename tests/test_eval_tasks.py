"""Evaluation on distinct held-out problems, and how many distinct tasks an evaluation played."""

from __future__ import annotations

import pytest

from llm_zoo_train.config import Config, load_config
from llm_zoo_train.engines.base import SamplingParams
from llm_zoo_train.evaluation.evaluate import evaluate
from llm_zoo_train.evaluation.plan import UsageError, plan_splits
from llm_zoo_train.evaluation.tasks import eval_tasks, task_ids
from toy_envs_trainer import ScriptedEngine

SOLO_TEST = {"dataset": "generated", "difficulty": 1, "split": "test", "max_turns": 1, "agents": ["reasoner"],
             "prompt_style": "compact", "answer_parser": "lenient"}  # fmt: skip
GREEDY = SamplingParams(max_tokens=4, temperature=0.0, seed=0)


def play(seeds, problem_ids=None):
    engine = ScriptedEngine(script=lambda prompt, adapter, index: "7")
    result, episodes = evaluate(engine, "Math-v0", SOLO_TEST, seeds, {"reasoner": None}, GREEDY, problem_ids)
    return result, episodes


def test_seeded_evaluation_reports_the_problems_it_repeated():
    seeds = [1_073_741_824 + i for i in range(64)]  # the default eval seeds, drawn with replacement
    result, episodes = play(seeds)
    assert result.num_episodes == 64 and result.distinct_tasks == len({e.task_id for e in episodes}) == 45
    assert "64 episodes, 45 distinct tasks)" in result.describe()
    assert result.metrics()["eval/distinct_tasks"] == 45.0


def test_distinct_problems_are_drawn_without_replacement_and_fixed():
    tasks = eval_tasks("Math-v0", SOLO_TEST, 64, 7, distinct=True)
    assert tasks.available == 100 and len(tasks.problem_ids) == len(set(tasks.problem_ids)) == 64
    assert tasks.seeds == [7 + i for i in range(64)]
    assert eval_tasks("Math-v0", SOLO_TEST, 64, 7, distinct=True) == tasks  # the same every time
    everything = eval_tasks("Math-v0", SOLO_TEST, 1000, 7, distinct=True)
    assert everything.problem_ids == task_ids("Math-v0", SOLO_TEST) and len(everything.seeds) == 100
    result, episodes = play(tasks.seeds, tasks.problem_ids)
    assert [e.task_id for e in episodes] == tasks.problem_ids
    assert result.distinct_tasks == result.num_episodes == 64
    assert "distinct" not in result.describe()


def test_seeded_tasks_stay_the_default():
    assert Config().eval.distinct_problems is False
    tasks = eval_tasks("Math-v0", SOLO_TEST, 3, 10, distinct=False)
    assert (tasks.seeds, tasks.problem_ids) == ([10, 11, 12], None)


def test_an_unlimited_problem_space_is_refused_or_stays_seeded():
    train = {**SOLO_TEST, "split": "train"}
    with pytest.raises(ValueError, match=r"eval\.distinct_problems needs an env with a finite problem list"):
        eval_tasks("Math-v0", train, 8, 0, distinct=True)
    assert eval_tasks("Math-v0", train, 8, 0, distinct=True, required=False).problem_ids is None
    assert task_ids("PlanPath-v0", {}) is None


def test_the_eval_command_plays_distinct_problems_of_the_test_split(tmp_path):
    config_file = tmp_path / "c.yaml"
    config_file.write_text(
        "env: {id: Math-v0, kwargs: {dataset: generated, difficulty: 1, agents: [reasoner]}}\n"
        "eval: {num_episodes: 30, distinct_problems: true}\n"
    )
    config = load_config(config_file)
    train, test = plan_splits(config, ["train", "test"])
    assert train.problem_ids is None and len(train.seeds) == 30  # unlimited: seeded
    assert len(set(test.problem_ids)) == 30
    config.eval.env_kwargs = {"split": "train"}
    with pytest.raises(UsageError, match="finite problem list"):
        plan_splits(config, ["eval"])
