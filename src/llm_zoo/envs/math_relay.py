"""MathRelay-v0: a tool agent computes, a reasoner finishes with a key only it holds.

A task where the two agents must cooperate, by construction, and where each role's job is small
enough for a 135M model: the information is split between them.

Roles, in turn order (default ``("tool_agent", "reasoner")``):

* ``tool_agent`` - sees a math problem (Math-v0's, with an integer answer) and writes a short
  Python program that prints its answer (the *intermediate*). The program runs in the sandbox as in
  Math-v0; its answer is the last non-empty line it prints. It never sees the key.
* ``reasoner`` - never sees the problem. It sees what the tool agent's program printed and a *key*
  (``key_digits`` digits, the first not zero, drawn at each reset), and replies with the *team
  answer*: the intermediate with the key written right after it (``42`` and key ``7``: ``427``;
  ``-16`` and ``7``: ``-167``). Its answer is read as in Math-v0 (``answer_parser``: the last
  ``\\boxed{}``, or with ``"lenient"``, the default, the last number of the reply).

So neither agent can succeed alone. The tool agent's prompt is the same for every key, so whatever
it prints, it prints the team answer with probability at most ``1 / 9`` (one key digit; ``1 / 90``
with two). The reasoner's prompt is the same for every problem with the same key, so it answers
right at most as often as the most frequent intermediate occurs (4 of the 98 level-1 test problems,
about 4%). ``tests/test_math_relay.py`` checks both, and that an oracle team always solves.

Observations: compact prompts (Math-v0's ``prompt_style="compact"`` for the tool agent: "Write a
short Python program that prints the answer to: ..."; later rounds show it the reasoner's latest
answer and its own previous program). The reasoner's prompt holds its key, the tool's printed
result (or that there was none) and the rule with an example. Prompts never say whether an answer
is correct.

Rewards: Math-v0's, with each agent's answer checked against its own gold answer
(:meth:`MathRelayEnv.gold_answer`): the tool agent's against the intermediate, the reasoner's
against the team answer; with the tool agent alone (``agents=("tool_agent",)``), its answer *is*
the team's and is checked against the team answer. Each agent is paid the change of its level
(``1`` if its latest answer is correct, else ``0``; plus the ``FORMAT_PENALTY`` of -0.5 while its
latest reply gave no answer); the global reward is the change of the team answer's correctness;
the acting agent's reward is ``role + alpha * global`` and its teammate's ``alpha * global``
(:class:`llm_zoo.core.TextAECEnv`). As in Math-v0 the returns telescope: the
reasoner's is ``(1 + alpha) * c_r(final)``, the tool agent's ``c_t(final) + alpha * c_r(final)`` (``-0.5`` without an
answer), the team's ``c_r(final)``, so no failing episode pays the reasoner or the team more than a
succeeding one, and the tool agent earns most by printing the intermediate the reasoner needs.

Termination: the episode ends (``terminated``) when the reasoner's latest answer is the tool
agent's latest answer with the key written after it (the reasoner used the tool's result); else
every agent is truncated after ``max_turns`` turns (default 1). ``success``: the team answer is
correct on the episode's last action.

Problems: Math-v0's (``dataset``, ``split``, ``difficulty``, ``dataset_format``; default the
generated difficulty-1 problems), keeping only those whose answer is an integer (98 of the 100
level-1 test problems; ``difficulty=[1, 2]`` gives 167 distinct ones). ``reset(options={"problem_id": id,
"key": "7"})`` picks the problem and the key. Infos: Math-v0's, plus ``key``.

:func:`oracle_action` gives perfect replies (the tool agent prints the intermediate, the reasoner
the team answer); :func:`relay_answer` computes the team answer.

Version history:

* v0: first version.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from llm_zoo.arguments import check_int
from llm_zoo.checkers.math_check import AnswerChecker
from llm_zoo.core import Outcome
from llm_zoo.data.math import MathProblem, ProblemSet, UnknownProblemError
from llm_zoo.envs.math import MathEnv, oracle_action

__all__ = [
    "MathRelayEnv",
    "integer_answers",
    "oracle_action",
    "oracle_policy",
    "relay_answer",
    "relay_reasoner_prompt",
]

_INTEGER = re.compile(r"-?\d+")
#: Longer printed results are shown cut in the middle (a 5000-digit print must not flood the prompt).
_SHOWN_CHARS = 400
#: Draws of a generated problem before a set without integer answers is given up on.
_MAX_DRAWS = 1000


def relay_answer(intermediate: str, key: str) -> str | None:
    """The team answer: ``intermediate`` (an integer) with ``key`` written right after it;
    ``None`` when ``intermediate`` is not an integer."""
    text = intermediate.strip()
    return text + key if _INTEGER.fullmatch(text) else None


def relay_reasoner_prompt(key: str, *, tool_result: str | None, tool_ran: bool, alone: bool) -> str:
    """The reasoner's prompt: its key, the tool's printed result (``tool_result``; ``tool_ran``
    without one: the program gave nothing), the rule with an example, and a request for the number.
    ``alone``: no tool agent plays (the reasoner is told the number is hidden from it)."""
    example = "for example 35 and the key 2 give 352"
    if alone:
        parts = [
            f"Your key: {key}",
            f"The answer is a hidden number with your key written right after it ({example}).",
        ]
    else:
        if tool_result is not None:
            if len(tool_result) > _SHOWN_CHARS:
                cut = len(tool_result) - _SHOWN_CHARS
                tool_result = f"{tool_result[: _SHOWN_CHARS // 2]} [... {cut} characters cut ...] {tool_result[-_SHOWN_CHARS // 2 :]}"
            shown = f"Your teammate's Python program printed: {tool_result}"
        elif tool_ran:
            shown = "Your teammate's Python program gave no result."
        else:
            shown = "Your teammate's Python program has not run yet."
        parts = [shown, f"Your key: {key}",
                 f"The answer is the printed number with your key written right after it ({example})."]  # fmt: skip
    parts.append("What is the answer? Reply with the number only.")
    return "\n".join(parts)


class _IntegerAnswers(ProblemSet):
    """The problems of another set whose answer is an integer (see :func:`integer_answers`)."""

    def __init__(self, inner: ProblemSet):
        fixed = [p for p in inner.fixed if _INTEGER.fullmatch(p.answer.strip())]
        if not fixed and not inner.levels:
            raise ValueError(f"no problem of {inner!r} has an integer answer (MathRelay-v0 needs one)")
        super().__init__(fixed, inner.levels, inner.split, inner.fixed_share)

    def sample(self, rng: np.random.Generator) -> MathProblem:
        for _ in range(_MAX_DRAWS):
            problem = super().sample(rng)
            if _INTEGER.fullmatch(problem.answer.strip()):
                return problem
        raise ValueError(f"no problem with an integer answer in {_MAX_DRAWS} draws from {self!r}")

    def get(self, problem_id: str) -> MathProblem:
        problem = super().get(problem_id)
        if not _INTEGER.fullmatch(problem.answer.strip()):
            raise UnknownProblemError(
                f"problem {problem_id!r} has the answer {problem.answer!r}, not an integer: MathRelay-v0 "
                "plays only problems with an integer answer"
            )
        return problem

    def ids(self) -> list[str] | None:
        ids = super().ids()
        if ids is None:
            return None
        return [i for i in ids if _INTEGER.fullmatch(ProblemSet.get(self, i).answer.strip())]


def integer_answers(problem_set: ProblemSet) -> ProblemSet:
    """``problem_set`` restricted to the problems whose answer is an integer (draws skip the others,
    ``ids()`` lists only them, ``get`` refuses them with an error naming the answer)."""
    return _IntegerAnswers(problem_set)


class MathRelayEnv(MathEnv):
    """MathRelay-v0 (see the module docstring for the full rules).

    Args:
        dataset: As Math-v0's (default ``"generated"``); only problems with an integer answer are played.
        split: ``"train"`` or ``"test"``.
        difficulty: Keep only these levels (default 1; ``None`` keeps all).
        dataset_format: As Math-v0's.
        max_turns: Turns (one reply from each agent) before truncation (default 1).
        alpha: Weight of the global reward in each agent's reward.
        render_mode: ``None`` or ``"ansi"``.
        checker: The answer checker; default: the process-wide shared one.
        code_timeout_s: Wall-clock limit on the tool agent's program.
        agents: Turn order, as Math-v0's (default ``("tool_agent", "reasoner")``; ``("tool_agent",)``
            and ``("reasoner",)``: one agent alone, which cannot do better than chance).
        key_digits: Digits of the reasoner's key (1-3; the first is never 0).
        answer_parser: ``"strict"`` or ``"lenient"`` (default; how the reasoner's answer is read).
        code_parser: ``"strict"`` or ``"lenient"`` (default; how the tool agent's program is read).
    """

    metadata: ClassVar[dict[str, Any]] = {
        "render_modes": ["ansi"],
        "name": "math_relay_v0",
        "is_parallelizable": False,
    }
    reset_options = {
        "problem_id": "play the problem with this id",
        "key": "the reasoner's key (key_digits digits, the first not 0)",
    }

    def __init__(
        self,
        *,
        dataset: Any = "generated",
        split: str = "train",
        difficulty: int | list[int] | None = 1,
        dataset_format: str = "auto",
        max_turns: int = 1,
        alpha: float = 1.0,
        render_mode: str | None = None,
        checker: AnswerChecker | None = None,
        code_timeout_s: float = 5.0,
        agents: Sequence[str] = ("tool_agent", "reasoner"),
        key_digits: int = 1,
        answer_parser: str = "lenient",
        code_parser: str = "lenient",
    ):
        check_int("key_digits", key_digits, low=1, high=3)
        super().__init__(
            dataset=dataset, split=split, difficulty=difficulty, dataset_format=dataset_format,
            max_turns=max_turns, alpha=alpha, render_mode=render_mode, checker=checker,
            code_timeout_s=code_timeout_s, agents=agents, prompt_style="compact",
            answer_parser=answer_parser, code_parser=code_parser,
        )  # fmt: skip
        self.key_digits = int(key_digits)
        self.problem_set = integer_answers(self.problem_set)
        self.key = ""

    def _new_episode(self, rng: np.random.Generator, options: dict[str, Any] | None) -> None:
        super()._new_episode(rng, options)
        key = (options or {}).get("key")
        if key is None:
            key = str(int(rng.integers(10 ** (self.key_digits - 1), 10**self.key_digits)))
        key = str(key)
        if len(key) != self.key_digits or not key.isdigit() or key[0] == "0":
            raise ValueError(
                f"key must be {self.key_digits} digit(s), the first not 0 (key_digits={self.key_digits}); got {key!r}"
            )
        self.key = key

    def gold_answer(self, agent: str) -> str:
        """The tool agent's gold is the intermediate (the problem's answer) when a reasoner plays;
        otherwise, and for the reasoner, the team answer (:func:`relay_answer`)."""
        assert self.problem is not None
        if agent == "tool_agent" and "reasoner" in self.possible_agents:
            return self.problem.answer
        team = relay_answer(self.problem.answer, self.key)
        assert team is not None  # the problem set holds integer answers only
        return team

    def _answers_agree(self) -> bool:
        if self.reasoner_answer is None or self.tool_answer is None:
            return False
        relayed = relay_answer(self.tool_answer, self.key)
        return relayed is not None and self.checker.check(relayed, self.reasoner_answer).correct

    def _prompt(self, agent: str) -> str:
        if agent == "tool_agent":
            return super()._prompt(agent)
        ran = self.tool_code is not None or bool(self.tool_status)
        return relay_reasoner_prompt(
            self.key,
            tool_result=self.tool_answer,
            tool_ran=ran,
            alone="tool_agent" not in self.possible_agents,
        )

    def _act(self, agent: str, action: str) -> Outcome:
        outcome = super()._act(agent, action)
        outcome.info["key"] = self.key
        return outcome

    def _render_state(self) -> str:
        over = all(self.terminations.values()) or all(self.truncations.values())
        team = self.gold_answer("reasoner") if over else "(shown when the episode is over)"
        return f"{super()._render_state()}\nreasoner's key: {self.key}; team answer: {team}"


def oracle_policy(env: MathRelayEnv) -> Callable[[str, str], str]:
    """``policy(agent, prompt) -> action`` playing :func:`oracle_action` on ``env``."""
    return lambda agent, prompt: oracle_action(env, agent)
