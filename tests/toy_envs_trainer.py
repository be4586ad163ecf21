"""Toy environments and a scripted engine for the trainer tests.

Importing this module registers:

* ``test/Scripted-v0`` -> :class:`ScriptedEnv`: two agents whose reward is the fraction of their
  reply's characters that are "their" letter, so the K candidates of a group get different rewards
  (non-zero variance) and a tiny random model can learn it fast. It records every action it
  receives and shows the history in every prompt, so tests can check which action landed where.
* ``test/Keyword-v0`` -> :class:`toy_envs.KeywordEnv`.

:class:`ScriptedEngine` implements :class:`llm_zoo_train.engines.base.Engine` without a model:
it answers with texts chosen by a script (or seeded random strings), so structural rollout tests
are exact and fast.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

import llm_zoo
from llm_zoo.core import Outcome, TextAECEnv
from llm_zoo_train.engines.base import Completion, SamplingParams
from toy_envs import KeywordEnv

__all__ = ["ScriptedEngine", "ScriptedEnv", "letter_fraction"]

SCRIPTED_ENV_ID = "test/Scripted-v0"
KEYWORD_ENV_ID = "test/Keyword-v0"


def letter_fraction(text: str, letter: str) -> float:
    """Fraction of the characters of ``text`` equal to ``letter`` (0 for an empty text)."""
    return text.count(letter) / len(text) if text else 0.0


class ScriptedEnv(TextAECEnv):
    """Two agents, ``alice`` then ``bob``, each rewarded for writing its own letter.

    Rewards: ``role_reward = letter_fraction(action, letter[agent])`` (``letters`` = "ab" by
    default: alice wants "a", bob wants "b"); an empty reply gets ``-0.5`` and ``format_ok=False``.
    ``global_reward = 1`` when both agents' latest fractions are >= 0.5 (that is also
    ``success``), else 0.

    Termination: a reply containing ``STOP`` ends the episode for every agent; otherwise
    ``max_turns`` truncates.

    Observations show the problem number (drawn from the seed), the agent, the turn and the full
    history of actions so far, so the prompt after a step reflects the action that was taken.
    ``infos[agent]`` adds ``action`` (the text received), ``history_before`` (the history the action
    was applied to, as a list of ``"agent=action"``) and ``problem``.
    """

    metadata = {"render_modes": ["ansi"], "name": "scripted_v0", "is_parallelizable": True}
    roles = ("alice", "bob")

    def __init__(self, *, letters: str = "ab", max_turns: int = 3, alpha: float = 1.0, render_mode=None):
        super().__init__(max_turns=max_turns, alpha=alpha, render_mode=render_mode)
        if len(letters) != len(self.roles):
            raise ValueError(f"letters must have one letter per role {self.roles}, got {letters!r}")
        self.letters = dict(zip(self.roles, letters, strict=True))

    def _new_episode(self, rng, options):
        self.problem = int(rng.integers(1_000_000))
        self.history: list[str] = []
        self.latest = {a: 0.0 for a in self.roles}

    def _prompt(self, agent):
        history = "; ".join(self.history) or "(none)"
        return (
            f"Problem {self.problem}. You are {agent}, turn {self.turn}. "
            f"Write the letter {self.letters[agent]!r} many times. History: {history}"
        )

    def _act(self, agent, action):
        before = list(self.history)
        self.history.append(f"{agent}={action}")
        info = {"action": action, "history_before": before, "problem": self.problem}
        if not action:
            self.latest[agent] = 0.0
            return Outcome(-0.5, 0.0, format_ok=False, feedback="Your reply was empty.", info=info)
        self.latest[agent] = letter_fraction(action, self.letters[agent])
        both = all(value >= 0.5 for value in self.latest.values())
        return Outcome(self.latest[agent], float(both), success=both, terminated="STOP" in action, info=info)

    def _render_state(self):
        return f"problem={self.problem} turn={self.turn} history={self.history}"


llm_zoo.register(SCRIPTED_ENV_ID, ScriptedEnv, description="trainer tests: letter rewards", override=True)
llm_zoo.register(KEYWORD_ENV_ID, KeywordEnv, description="trainer tests: keywords", override=True)


@dataclass
class EngineCall:
    """One recorded :meth:`ScriptedEngine.generate` call."""

    prompts: list[str]
    adapters: list[str | None]
    n: int
    sampling: SamplingParams


@dataclass
class ScriptedEngine:
    """An :class:`~llm_zoo_train.engines.base.Engine` that answers from a script, without a model.

    Args:
        script: ``script(prompt, adapter, sample_index) -> text``. When ``None``, answers are random
            strings over ``alphabet`` (1 to ``max_chars`` characters), drawn from
            ``np.random.default_rng(sampling.seed)`` per call when the call is seeded, else from the
            engine's own generator.
        alphabet: Characters of the random answers.
        max_chars: Longest random answer.
        seed: Seed of the engine's own generator (unseeded calls).

    Token ids are the characters' code points followed by an end token ``0``; every token's
    logprob is ``-0.5``. Every call is recorded in :attr:`calls`.
    """

    script: Callable[[str, str | None, int], str] | None = None
    alphabet: str = "abc"
    max_chars: int = 4
    seed: int = 0
    calls: list[EngineCall] = field(default_factory=list)
    loaded: list[tuple[dict[str, str], int]] = field(default_factory=list)

    def __post_init__(self):
        self._rng = np.random.default_rng(self.seed)

    def generate(
        self, prompts: Sequence[str], adapters: Sequence[str | None], n: int, sampling: SamplingParams
    ):
        if len(prompts) != len(adapters):
            raise ValueError("one adapter per prompt")
        self.calls.append(EngineCall(list(prompts), list(adapters), n, sampling))
        rng = self._rng if sampling.seed is None else np.random.default_rng(sampling.seed)
        results = []
        for prompt, adapter in zip(prompts, adapters, strict=True):
            completions = []
            for index in range(n):
                if self.script is not None:
                    text = self.script(prompt, adapter, index)
                else:
                    length = int(rng.integers(1, self.max_chars + 1))
                    text = "".join(rng.choice(list(self.alphabet), size=length))
                token_ids = [ord(c) for c in text] + [0]
                completions.append(
                    Completion(
                        text=text,
                        prompt_token_ids=[ord(c) for c in prompt],
                        token_ids=token_ids,
                        logprobs=[-0.5] * len(token_ids),
                        finish_reason="stop",
                    )
                )
            results.append(completions)
        return results

    def load_adapters(self, paths: Mapping[str, str], version: int) -> None:
        self.loaded.append((dict(paths), version))
