"""Majority@K (llm_zoo_train.evaluation.majority): the vote, and K real episodes of KeyRelay-v0's
oracle single agent scored by the env, with an engine whose answers are scripted per repetition."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence

import pytest

import llm_zoo
from llm_zoo_train.engines.base import Completion, SamplingParams
from llm_zoo_train.evaluation.majority import evaluate_majority, majority_vote
from llm_zoo_train.rollout.tree import EpisodeResult


def episode(answer: str | None, success: bool, index: int = 0) -> EpisodeResult:
    return EpisodeResult(env_index=index, task_id="t", success=success, turns=1, answer=answer)


def test_the_commonest_answer_wins_even_over_an_earlier_right_one():
    right, wrong = episode("7", True), episode("3", False)
    assert majority_vote([right, wrong, wrong]) is wrong
    assert majority_vote([wrong, right, right]) is right


def test_a_tie_goes_to_the_answer_reached_first():
    first, second = episode("3", False), episode("7", True)
    assert majority_vote([first, second]) is first
    assert majority_vote([second, first]) is second


def test_episodes_without_an_answer_do_not_vote():
    silent_success = episode(None, True)  # success without an answer cannot win a vote
    right = episode("7", True)
    assert majority_vote([silent_success, silent_success, right]) is right


def test_a_task_nobody_answered_fails():
    chosen = majority_vote([episode(None, True), episode(None, False)])
    assert chosen.success is False and chosen.answer is None
    with pytest.raises(ValueError, match="at least one episode"):
        majority_vote([])


class RepetitionEngine:
    """Answers KeyRelay-v0's oracle prompt from ``script[task][repetition]``: ``"right"`` gives the
    query's value, a number gives that number. The task is the query key; the repetition is how many
    times this prompt was asked before (``task_of`` maps each task's prompt to its seed)."""

    def __init__(self, script: dict[int, Sequence[str]], task_of: dict[str, int]):
        self.script, self.task_of = script, task_of
        self.asked: dict[str, int] = defaultdict(int)
        self.seeds: list[int | None] = []

    def generate(self, prompts, adapters, n, sampling: SamplingParams):
        self.seeds.append(sampling.seed)
        results = []
        for prompt in prompts:
            table = dict(re.findall(r"^([a-z]+): (\d+)$", prompt, re.MULTILINE))
            query = re.search(r"under the key ([a-z]+)\?", prompt).group(1)
            repetition = self.asked[prompt]
            self.asked[prompt] += 1
            plan = self.script[self.task_of[prompt]][repetition]
            text = f"It is {table[query]}." if plan == "right" else f"It is {plan}."
            results.append([Completion(text, [1], [2, 0], [-0.5, -0.5], "stop")])
        return results


def play(script: dict[int, Sequence[str]], k: int):
    seeds = sorted(script)
    task_of = {}
    for seed in seeds:
        env = llm_zoo.make("KeyRelay-v0", agents=("oracle",))
        env.reset(seed=seed)
        task_of[env.observe("oracle")["prompt"]] = seed
    engine = RepetitionEngine(script, task_of)
    sampling = SamplingParams(max_tokens=8, temperature=0.7, seed=11)
    result, winners, repetitions = evaluate_majority(
        engine, "KeyRelay-v0", {"agents": ("oracle",)}, seeds, {"oracle": None}, sampling, k
    )
    return engine, result, winners, repetitions


def test_majority_at_k_plays_k_episodes_per_task_and_the_env_scores_the_winner():
    script = {
        0: ["right", "right", "right"],  # always right
        1: ["111", "right", "right"],  # wrong first: one greedy-like sample fails, the vote wins
        2: ["right", "222", "222"],  # right once: pass@3 would count it, the vote does not
        3: ["333", "444", "right"],  # three different answers: the first one wins the tie
    }
    engine, result, winners, repetitions = play(script, 3)
    assert [w.success for w in winners] == [True, True, False, False]
    assert [w.answer for w in winners][2:] == ["222", "333"]
    assert (result.successes, result.num_episodes) == (2, 4)
    assert len(repetitions) == 3 and all(len(r) == 4 for r in repetitions)
    assert [[e.success for e in r] for r in repetitions] == [
        [True, False, True, False], [True, True, False, False], [True, True, False, True]
    ]  # fmt: skip
    assert len(set(engine.seeds)) == len(engine.seeds) == 3  # each repetition its own stream


def test_majority_at_1_is_one_episode_per_task():
    _, result, winners, repetitions = play({0: ["right"], 1: ["5"]}, 1)
    assert [w.success for w in winners] == [True, False] and len(repetitions) == 1
    assert result.successes == 1


def test_bad_k_and_greedy_repetitions_are_refused():
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    with pytest.raises(ValueError, match="K >= 1"):
        evaluate_majority(None, "KeyRelay-v0", {}, [0], {}, greedy, 0)
    with pytest.raises(ValueError, match="temperature above 0"):
        evaluate_majority(None, "KeyRelay-v0", {}, [0], {}, greedy, 3)
