"""Team credit that estimates the team outcome: several look-ahead samples averaged, greedy
teammates, and the count of credited globals that disagree with what a candidate itself caused.

The toy env ``test/Relay-v0`` (tests/toy_envs_credit.py) is Math-v0's case in miniature: the
reporter copies a right tool answer and, when sampled, sometimes guesses right after a wrong one;
a one-sample look-ahead then credits the wrong tool candidate with the team's success.
"""

from __future__ import annotations

import numpy as np
import pytest

from llm_zoo_train.config import Config, ConfigError, validate
from llm_zoo_train.engines.base import SamplingParams
from llm_zoo_train.rollout.team_credit import check_team_credit, credit_disagreements
from llm_zoo_train.rollout.tree import independent_rollout, tree_rollout
from toy_envs_credit import RELAY_ENV_ID
from toy_envs_trainer import ScriptedEngine

ADAPTERS = {"tool": "tool_lora", "reporter": "reporter_lora"}
SAMPLING = SamplingParams(max_tokens=8, temperature=1.0, seed=5)


class GuessingEngine(ScriptedEngine):
    """Tool candidate k is right for even k. The reporter copies a right tool; after a wrong one it
    guesses right with probability 1/2 when sampling, and answers 'wrong' when greedy."""

    def generate(self, prompts, adapters, n, sampling):
        self.calls.append(type("Call", (), {"prompts": list(prompts), "n": n, "sampling": sampling})())
        rng = np.random.default_rng(sampling.seed)
        out = []
        for prompt, adapter in zip(prompts, adapters, strict=True):
            group = []
            for index in range(n):
                if adapter == "tool_lora":
                    text = "ok" if index % 2 == 0 else "no"
                elif prompt.endswith("said: ok"):
                    text = "right"
                else:
                    text = "right" if sampling.temperature > 0 and rng.random() < 0.5 else "wrong"
                group.append(self._completion(prompt, text))
            out.append(group)
        return out

    @staticmethod
    def _completion(prompt, text):
        from llm_zoo_train.engines.base import Completion

        ids = [ord(c) for c in text] + [0]
        return Completion(text, [ord(c) for c in prompt], ids, [-0.5] * len(ids), "stop")


def tool_groups(samples_per_branch=1, teammate="sampled", seeds=range(12)):
    engine = GuessingEngine()
    samples = tree_rollout(
        RELAY_ENV_ID, {"max_turns": 1}, list(seeds), engine, ADAPTERS, 4, SAMPLING,
        np.random.default_rng(0), team_credit_samples=samples_per_branch, team_credit_teammate=teammate,
    )  # fmt: skip
    groups: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        if s.agent == "tool":
            groups.setdefault(s.group_key, []).append((float(s.extra["info"]["correct"]), s.credited_global))
    return list(groups.values()), samples, engine


def test_one_sample_credits_failed_programs_when_the_teammate_guesses_right():
    groups, _, _ = tool_groups(teammate="sampled")
    counts = credit_disagreements(groups)
    assert counts["candidates"] == 48 and counts["withheld_correct"] == 0
    assert counts["credited_failed"] > 0 and counts["pairs_tied"] > 0


def test_averaged_samples_estimate_the_guess_rate_and_keep_right_programs_ahead():
    groups, samples, engine = tool_groups(samples_per_branch=16)
    counts = credit_disagreements(groups)
    assert counts["pairs"] == 12 * 4 and counts["pairs_misordered"] == counts["pairs_tied"] == 0
    assert counts["groups_flipped"] == 0
    failed = [credited for group in groups for own, credited in group if own == 0]
    assert all(c < 1.0 for c in failed) and 0.3 < float(np.mean(failed)) < 0.7  # about the guess rate
    assert all(credited == 1.0 for group in groups for own, credited in group if own == 1)
    tool = [s for s in samples if s.agent == "tool"]
    assert {s.lookahead_steps for s in tool} == {16}  # the cost: 16 teammate actions per candidate
    (lookahead_call,) = [call for call in engine.calls if call.n == 1]
    assert len(lookahead_call.prompts) == 12 * 4 * 16  # still one engine call per position


def test_greedy_teammates_credit_exactly_what_the_program_caused_here():
    groups, _, engine = tool_groups(teammate="greedy")
    counts = credit_disagreements(groups)
    assert counts["disagreements"] == 0 and counts["pairs_misordered"] == counts["pairs_tied"] == 0
    (lookahead_call,) = [call for call in engine.calls if call.n == 1]
    assert lookahead_call.sampling.temperature == 0.0
    candidates = [call for call in engine.calls if call.n == 4]
    assert all(call.sampling.temperature == 1.0 for call in candidates)  # candidates still sampled


def test_auto_teammates_are_greedy_with_one_sample_and_sampled_with_several():
    default, _, engine = tool_groups(teammate="auto")
    greedy, _, _ = tool_groups(teammate="greedy")
    assert default == greedy
    assert [call.sampling.temperature for call in engine.calls if call.n == 1] == [0.0]
    several, _, _ = tool_groups(samples_per_branch=3, teammate="auto")
    assert several == tool_groups(samples_per_branch=3, teammate="sampled")[0]
    assert several != tool_groups(samples_per_branch=1, teammate="sampled")[0]
    assert check_team_credit(1, "auto") == (1, "greedy") and check_team_credit(4, "auto") == (4, "sampled")
    assert Config().rollout.team_credit_teammate == "auto"


def test_disagreement_counts_on_known_groups():
    counts = credit_disagreements([[(1, 0.0), (0, 1.0), (1, 1.0), (0, 0.0)], [(0, 0.25), (1, 0.75)]])
    assert counts == {
        "candidates": 6, "credited_failed": 1, "withheld_correct": 1, "disagreements": 2, "pairs": 5,
        "pairs_misordered": 1, "pairs_tied": 2, "groups": 2, "groups_flipped": 1, "groups_spurious": 0,
    }  # fmt: skip
    spurious = credit_disagreements([[(0, 0.0), (0, 1.0)], [(1, 1.0), (1, 1.0)]])
    assert (spurious["groups_spurious"], spurious["groups_flipped"]) == (1, 0)
    assert credit_disagreements([])["candidates"] == 0


def test_team_credit_choices_are_checked():
    assert check_team_credit(3, "sampled") == (3, "sampled")
    for samples, teammate, message in (
        (0, "sampled", "team_credit_samples must be an int >= 1"),
        (True, "sampled", "team_credit_samples must be an int >= 1"),
        (1, "mean", "team_credit_teammate must be one of 'auto', 'sampled', 'greedy'"),
        (2, "greedy", "greedy teammates answer the same every time"),
    ):
        with pytest.raises(ValueError, match=message):
            check_team_credit(samples, teammate)
    config = Config()
    config.rollout.team_credit_samples = 4
    validate(config)
    config.rollout.mode = "independent"
    with pytest.raises(ConfigError, match=r"rollout\.team_credit_samples / team_credit_teammate apply to"):
        validate(config)
    config.rollout.team_credit_samples = 1
    validate(config)  # the default teammate, auto, is valid in independent mode: nothing is generated
    config.rollout.team_credit_teammate = "greedy"
    with pytest.raises(ConfigError, match=r"keep 1 / auto"):
        validate(config)
    with pytest.raises(ValueError, match="apply to tree rollouts only"):
        independent_rollout(
            RELAY_ENV_ID, {"max_turns": 1}, [0], GuessingEngine(), ADAPTERS, 2, SAMPLING,
            np.random.default_rng(0), team_credit_samples=2,
        )  # fmt: skip
