"""Math-v0: a reasoner and a tool agent solve a math problem together.

Roles, in turn order:

* ``reasoner`` - reasons in text and ends its reply with the final answer in ``\\boxed{...}``
  (the *last* ``\\boxed{}`` / ``\\fbox{}`` of the reply counts).
* ``tool_agent`` - writes one Python program in a fenced ```` ```python ```` block. The program is
  run in the sandbox (:func:`llm_zoo.sandbox.run_python`: no input, ``code_timeout_s`` seconds,
  resource limits). Its answer is the **last non-empty line of its standard output**, stripped
  (if that line holds a ``\\boxed{}``, its content; surrounding ``$`` are dropped).

Observations: each agent's prompt holds its role instructions, the problem, the round number and,
from the second turn on, the other agent's latest answer - the reasoner sees the tool agent's
program, its output and its answer; the tool agent sees the reasoner's reply (its last 3000
characters) and answer, and its own previous program and output - with a request to reconcile
the two. Prompts never say whether an answer is correct.

Answers are checked against the gold answer with math-verify through
:class:`llm_zoo.checkers.math_check.AnswerChecker` (gold first; worker process, hard timeout, exact fast
path for plain numbers, cache). A check that times out or fails counts as wrong. Before
math-verify, strict rules (:mod:`llm_zoo.checkers.math_strict`) judge in microseconds:

* an answer with a percent sign (``3744\\%``), an approximation marker (``\\approx``, ``\\sim``, a
  leading ``~``, "about", "approximately") or a leading relation (``= 3744``) is wrong unless
  the gold answer is stated the same way;
* an answer whose value would be huge or slow to evaluate (a factorial of more than 1000, a
  power of more than 10,000 digits such as ``9^{9^{9^{9}}}``, brackets nested more than 50 deep)
  is wrong without being evaluated (``check`` is ``refused``, never a timeout), and the agent's
  next prompt says why;
* when the gold and the answer are plain numbers (integers, decimals, ``a/b``,
  ``\\frac{a}{b}``), only exactly the gold's value is right: ``3744.0`` and ``\\frac{2}{4}`` are
  right for ``3744`` and ``1/2``, ``3744+10^{-9}`` and ``0.5000001`` are wrong. For a gold no
  decimal of the answer's length can write (``1/3``), a decimal of at least 6 significant
  digits within one unit of its last digit is right (``0.333333``, ``0.3333333333333333``).

Rewards (``c_r``, ``c_t`` = 1 if the reasoner's / tool agent's latest answer is correct, else 0;
a reply from which no answer can be read leaves its agent's latest answer wrong). Each agent is
paid the *change* of its level after each of its actions (a potential difference, starting
from 0), never the level itself, so a return does not grow with the number of turns:

* reasoner: level ``c_r``, plus ``FORMAT_PENALTY`` (-0.5) while its latest reply has no
  ``\\boxed{}``; role reward ``level(now) - level(before)``.
* tool agent: level ``c_t``, plus ``FORMAT_PENALTY`` (-0.5) while its latest reply has no code
  block, or its program fails (non-zero exit, killed, timeout) or prints nothing; role reward
  ``level(now) - level(before)``.
* global reward: the change of ``c_r`` made by this action (0 for the tool agent's actions); with
  the tool agent alone (``agents=("tool_agent",)``), the change of ``c_t``.
* each agent's reward: the acting agent's ``role + alpha * global``, its teammate's
  ``alpha * global`` on the same step (see :class:`llm_zoo.core.TextAECEnv`): the team's outcome
  reaches both returns.

So a reply without an answer costs 0.5 plus what its agent's previous answer was worth (a
second one in a row costs nothing more), and the next reply with an answer pays it back.

Bound: the returns telescope. Over any episode, whatever its length, the reasoner's return is
``(1 + alpha) * c_r(final)`` (``-0.5`` if its last reply had no answer), the tool agent's
``c_t(final) + alpha * c_r(final)`` (``-0.5`` likewise) and the team's (the sum of the global
rewards) ``c_r(final)``. ``c_r(final) = 1`` exactly when the episode succeeds, so every episode that does
not succeed pays the reasoner at most 0 and the team 0, and every succeeding one ``1 + alpha`` and
1; a correct answer repeated for 3 turns pays what it pays once. Within an AT-GRPO group (the K
candidates of one env, turn and agent) the candidates share the previous level, so the reward
ranks them exactly as the level does.

``format_ok`` is true when the agent produced an answer: a ``\\boxed{}`` (reasoner); a code block
whose program ran and printed a line (tool agent).

Termination: the episode ends (``terminated``) as soon as both agents have answered and the two
latest answers agree - ``check(gold=reasoner's answer, pred=tool agent's answer)`` with the same
checker, so a printed ``0.333333`` agrees with ``\\frac{1}{3}``. Otherwise every agent is
truncated after ``max_turns`` turns. ``success`` is decided on the episode's last action: the
reasoner's final answer is correct (the tool agent's, when it plays alone).

Problems (``dataset``, ``split``, ``difficulty``; see :mod:`llm_zoo.data.math`): ``"builtin"``
(default, offline: word problems 25% of draws, generated problems 75%), ``"generated"``,
``"word"``, a path to a MATH / GSM8K / AIME / generic JSONL, JSON or parquet file or to a
directory written by ``save_to_disk`` (a ``DatasetDict``'s is read at ``split``), a list of
records or :class:`~llm_zoo.data.math.MathProblem`, or a ``datasets.Dataset`` / ``DatasetDict``.
Each ``reset`` draws a problem with the env's rng; ``reset(options={"problem_id": id})`` picks
one. ``env.problem_set.ids()`` lists a finite set's ids (e.g. for evaluation).

Infos, besides the common keys: ``problem_id``, ``answer`` (the acting agent's extracted answer,
cut in the middle beyond 400 characters, or ``None``), ``correct``, ``check`` (how the checker
decided: ``exact``, ``math_verify``, ``timeout``, ...), ``agree``, ``reasoner_correct``, and for
the tool agent ``tool_status`` (``ok``, ``no_code``, ``error``, ``timeout``, ``no_output``).

``render()`` (``render_mode="ansi"``) shows the problem, every answer so far and whether it was
correct; the gold answer only once the episode is over (people play it with ``llm-zoo play``).

:func:`oracle_action` / :func:`oracle_policy` give perfect replies (for tests and benchmarks).

Options for small models (defaults unchanged; see :mod:`llm_zoo.envs.math_options`):

* ``agents``: the turn order. ``("reasoner", "tool_agent")`` (default); ``("tool_agent",
  "reasoner")``: the tool agent acts first, so the reasoner sees the tool's result before its
  scored answer of the turn; ``("reasoner",)``: the reasoner alone (the single-agent baseline;
  the episode then ends only by truncation after ``max_turns``); ``("tool_agent",)``: the tool
  agent alone, the fair single-agent baseline (the strongest single agent with the same tools):
  its program's last printed line is the answer, success and the global reward are that answer's
  correctness (math-verify), the episode ends only by truncation, and its compact prompt is the
  team's first-turn tool prompt.
* ``prompt_style="compact"``: short prompts. The tool agent is asked for one line of Python that
  prints the answer (with the example ``print(2 + 3)``) and sees the reasoner's answer and its own
  previous program when there are any; the reasoner sees the tool program's printed answer (or
  that it gave none) and is asked for the number only.
* ``answer_parser="lenient"``: the reasoner's last ``\\boxed{}`` if it wrote one, else the last
  number of its reply is its answer.
* ``code_parser="lenient"``: without a complete fenced block, the reply's lines starting with
  ``print(``, ``import`` or ``from ... import`` are the program.

The rewards keep their meaning under every option: answers are checked against the gold answer,
the program is run in the sandbox and read by its last printed line, and a reply from which no
answer can be read gets ``FORMAT_PENALTY``.

Parallel API: not parallelizable (``metadata["is_parallelizable"]`` is ``False``, so PettingZoo's
``aec_to_parallel`` refuses the env): the tool agent answers after reading the reasoner's reply of
the same turn, which a parallel step, where both answer at once, cannot show it.
``pettingzoo.utils.conversions.turn_based_aec_to_parallel`` is the faithful parallel view (one
agent acts per step). ``max_cycles`` is accepted as PettingZoo's name for ``max_turns``.

Version history:

* v0, rewards v2 (2026-12): the team's outcome reaches the tool agent's return too (it earned
  +1.000 for printing the right answer whether the reasoner then solved or not).
* v0, strict answer checks (issue 24): percent and approximation markers, leading relations and
  values too large to evaluate are wrong; plain-number answers must equal the gold exactly
  (except a decimal of 6 or more significant digits for a gold no decimal of its length writes). Before, math-verify took ``3744\\%`` and ``\\approx 3744+10^{-9}`` for ``3744`` and
  ``0.5000001`` for ``1/2``, and ``99999999!`` cost a hard timeout per check.
* v0: first version. Later additions that keep the defaults' behaviour: the ``agents``,
  ``prompt_style``, ``answer_parser`` and ``code_parser`` options; then the order
  ``agents=("tool_agent",)`` (the tool agent alone). The reasoner alone, the first single-agent
  baseline, compared Python against no Python (a strawman): the tool agent alone is the fair one. Why, measured with
  SmolLM2-135M-Instruct (bf16) on 48 generated difficulty-1 training problems, 32 new tokens
  unless said (readable = an answer could be read; correct = equal to the gold answer as a plain
  number, which undercounts replies such as ``The answer is 60.``):

  - default prompts, 2 rounds, greedy (earlier note): 0/24 episodes solved, 10-15% of answers read;
  - tool agent, "one line of Python that prints the answer, like print(2 + 3)": T=1 12/48
    readable, 5 ran, 0 correct; greedy 41/48 ran, 0 correct (it copies the example);
  - tool agent, a Python expression "like `12 * 3 - 4`, ... `math.gcd(12, 18)`": T=1 11/48
    readable, 4 ran, 0 correct; greedy 13/48 ran, 2 correct;
  - tool agent, four question -> ``print(...)`` examples: T=0.7 2/48 readable, 0 correct;
  - tool agent, the compact prompt "Write a short Python program that prints the answer to:
    <plain problem>", 48 tokens: T=0.7 24/48 readable, 5 ran, 1 correct; greedy 31/48 readable,
    20 ran, 9 correct;
  - reasoner shown the (correct) printed result, "Reply with the number only": T=1 32/48 readable
    by their last number (0 wrote ``\\boxed{}``), 7 correct; greedy 48/48 readable, 24 correct;
  - reasoner alone, the same prompt without a result: T=1 43/48 readable, 1 correct; greedy 48/48
    readable, 1 correct.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from llm_zoo.arguments import MAX_TIMEOUT_S, check_number
from llm_zoo.checkers.math_check import AnswerChecker, CheckResult, default_checker
from llm_zoo.core import Outcome, TextAECEnv
from llm_zoo.data.math import MathProblem, ProblemSet, build_problem_set
from llm_zoo.envs.math_options import (
    AGENT_ORDERS,
    ANSWER_PARSERS,
    CODE_PARSERS,
    PROMPT_STYLES,
    check_choice,
    compact_reasoner_prompt,
    compact_tool_prompt,
    read_reasoner_answer,
    read_tool_program,
)
from llm_zoo.parsing import ParseError, extract_boxed
from llm_zoo.sandbox import run_python

__all__ = ["FORMAT_PENALTY", "MathEnv", "answer_from_output", "oracle_action", "oracle_policy"]

#: Role reward for a reply from which no answer can be taken (see the module docstring).
FORMAT_PENALTY = -0.5
#: How much of the reasoner's reply the tool agent sees, and of program output the agents see.
_REPLY_TAIL_CHARS = 3000
_OUTPUT_TAIL_CHARS = 1500
#: Longer answers are shown cut in the middle (a 1 MB answer must not flood the other's prompt).
_ANSWER_SHOWN_CHARS = 400

_REASONER_ROLE = (
    "You are the reasoner in a team of two solving a math problem. Your teammate, the tool agent, "
    "solves the same problem by writing a Python program."
)
_REASONER_ALONE = "You are solving a math problem."
_REASONER_FORMAT = (
    "Reason step by step. End your reply with your final answer in \\boxed{...}, for example "
    "\\boxed{42} or \\boxed{\\frac{3}{4}}. Give an exact, simplified answer."
)
_TOOL_ROLE = (
    "You are the tool agent in a team of two solving a math problem. Your teammate, the reasoner, "
    "solves the same problem by reasoning in text."
)
_TOOL_ALONE = "You are solving a math problem by writing a Python program."


def _tool_format(timeout_s: float) -> str:
    return (
        "Write one complete Python 3 program in a single ```python ... ``` block that computes the "
        "answer and prints it. The last non-empty line your program prints is taken as your answer, "
        "so print the final answer last, on its own line, and exactly (e.g. 42, 3/4 or sqrt(2)). "
        "Prefer exact arithmetic (integers, fractions.Fraction) to floats. The program gets no input "
        f"and must finish within {timeout_s:g} seconds."
    )


def answer_from_output(stdout: str) -> str | None:
    """The tool agent's answer: the last non-empty line of ``stdout`` (a ``\\boxed{}`` in it is
    unwrapped, surrounding ``$`` dropped), or ``None`` if it printed nothing."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    line = lines[-1]
    with contextlib.suppress(ParseError):
        line = extract_boxed(line)
    return line.strip().strip("$").strip() or None


_TRACEBACK_PATH = re.compile(r'File "(?:[^"\n]*/)?([^"/\n]+)"')


def _refusal_feedback(result: CheckResult) -> str:
    """Why the checker refused to evaluate an answer (a rule about the form, not the gold)."""
    return f"Your answer was not accepted: {result.detail}." if result.method == "refused" else ""


def _clean_output(text: str) -> str:
    """Program output as the agents see it: traceback paths cut to file names (the sandbox's
    temporary directory differs on every run, and prompts must be deterministic)."""
    return _TRACEBACK_PATH.sub(r'File "\1"', text)


def _short(answer: str, limit: int = _ANSWER_SHOWN_CHARS) -> str:
    """An answer as prompts, infos and render show it: cut in the middle when very long."""
    if len(answer) <= limit:
        return answer
    return f"{answer[: limit // 2]} [... {len(answer) - limit} characters cut ...] {answer[-limit // 2 :]}"


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "[...]\n" + text[-limit:]


class MathEnv(TextAECEnv):
    """Math-v0 (see the module docstring for the full rules).

    Args:
        dataset: ``"builtin"``, ``"generated"``, ``"word"``, a file path, a ``save_to_disk``
            directory, a list of records or problems, or a ``datasets`` object.
        split: ``"train"`` or ``"test"``.
        difficulty: Keep only these levels (int or list); ``None`` keeps all.
        dataset_format: Format of a file / record dataset: ``"auto"``, ``"math"``, ``"gsm8k"``,
            ``"aime"`` or ``"generic"``.
        max_turns: Turns (one reply from each agent) before truncation.
        alpha: Weight of the global reward in each agent's reward.
        render_mode: ``None`` or ``"ansi"``.
        checker: The answer checker; default: the process-wide shared one.
        code_timeout_s: Wall-clock limit on the tool agent's program.
        agents: Turn order: ``("reasoner", "tool_agent")``, ``("tool_agent", "reasoner")``,
            ``("reasoner",)`` (the reasoner alone) or ``("tool_agent",)`` (the tool agent alone).
        prompt_style: ``"full"`` or ``"compact"`` (short prompts for small models).
        answer_parser: ``"strict"`` or ``"lenient"`` (how the reasoner's answer is read).
        code_parser: ``"strict"`` or ``"lenient"`` (how the tool agent's program is read).
    """

    metadata: ClassVar[dict[str, Any]] = {
        "render_modes": ["ansi"],
        "name": "math_v0",
        "is_parallelizable": False,
    }
    roles = ("reasoner", "tool_agent")
    reset_options = {"problem_id": "play the problem with this id"}

    def __init__(
        self,
        *,
        dataset: Any = "builtin",
        split: str = "train",
        difficulty: int | list[int] | None = None,
        dataset_format: str = "auto",
        max_turns: int = 3,
        alpha: float = 1.0,
        render_mode: str | None = None,
        checker: AnswerChecker | None = None,
        code_timeout_s: float = 5.0,
        agents: Sequence[str] = ("reasoner", "tool_agent"),
        prompt_style: str = "full",
        answer_parser: str = "strict",
        code_parser: str = "strict",
    ):
        super().__init__(max_turns=max_turns, alpha=alpha, render_mode=render_mode)
        check_number(
            "code_timeout_s", code_timeout_s, low=0, high=MAX_TIMEOUT_S, low_open=True, unit="seconds"
        )
        check_choice("agents", tuple(agents) if not isinstance(agents, str) else agents, AGENT_ORDERS)
        check_choice("prompt_style", prompt_style, PROMPT_STYLES)
        check_choice("answer_parser", answer_parser, ANSWER_PARSERS)
        check_choice("code_parser", code_parser, CODE_PARSERS)
        self.prompt_style, self.answer_parser, self.code_parser = prompt_style, answer_parser, code_parser
        if tuple(agents) != tuple(self.possible_agents):
            self.possible_agents = list(agents)
            self.observation_spaces = {a: self.observation_spaces[a] for a in self.possible_agents}
            self.action_spaces = {a: self.action_spaces[a] for a in self.possible_agents}
        self.problem_set: ProblemSet = build_problem_set(dataset, split, difficulty, dataset_format)
        self.split = split
        self.code_timeout_s = float(code_timeout_s)
        self.checker = checker if checker is not None else default_checker()
        self._lease = self.checker.lease()
        self.problem: MathProblem | None = None

    # ------------------------------------------------------------------ rules

    def _new_episode(self, rng: np.random.Generator, options: dict[str, Any] | None) -> None:
        problem_id = (options or {}).get("problem_id")
        self.problem = (
            self.problem_set.sample(rng) if problem_id is None else self.problem_set.get(problem_id)
        )
        self.reasoner_reply = ""
        self.reasoner_answer: str | None = None
        self.reasoner_correct = False
        self.tool_code: str | None = None
        self.tool_output = ""
        self.tool_status = ""
        self.tool_answer: str | None = None
        self.tool_correct = False
        self.agree = False
        self.history: list[tuple[int, str, str | None, bool]] = []  # (turn, agent, answer, correct)
        self._levels = {"reasoner": 0.0, "tool_agent": 0.0, "global": 0.0}  # c_r, c_t, c_r as paid

    def task_ids(self) -> list[str] | None:
        """The problem set's ids without content duplicates; ``None`` for the generated training
        split, which is unlimited (:meth:`llm_zoo.core.TextAECEnv.task_ids`)."""
        ids = self.problem_set.distinct_ids()
        return None if ids is None else [str(i) for i in ids]

    def _task_id(self) -> str:
        assert self.problem is not None
        return self.problem.id

    def _prompt(self, agent: str) -> str:
        assert self.problem is not None
        if self.prompt_style == "compact":
            return self._compact_prompt(agent)
        header = f"Problem:\n{self.problem.question}\n\nRound {self.turn + 1} of {self.max_turns}."
        if agent == "reasoner":
            role = _REASONER_ROLE if "tool_agent" in self.possible_agents else _REASONER_ALONE
            parts = [role, header]
            if self.tool_code is not None or self.tool_status:
                parts.append(self._tool_report(for_reasoner=True))
                previous = f"\\boxed{{{_short(self.reasoner_answer)}}}" if self.reasoner_answer else "(none)"
                parts.append(
                    f"Your previous answer: {previous}\nYour answer and the tool agent's answer do not "
                    "agree yet. Check both solutions, find any mistake, and answer again."
                )
            parts.append(_REASONER_FORMAT)
        else:
            parts = [_TOOL_ROLE if "reasoner" in self.possible_agents else _TOOL_ALONE, header]
            if self.reasoner_reply:
                answer = (
                    f"\\boxed{{{_short(self.reasoner_answer)}}}"
                    if self.reasoner_answer
                    else "(no \\boxed{} answer)"
                )
                parts.append(
                    f"The reasoner's reply:\n<<<\n{_tail(self.reasoner_reply, _REPLY_TAIL_CHARS)}\n>>>\n"
                    f"The reasoner's answer: {answer}"
                )
            if self.tool_code is not None or self.tool_status:
                parts.append(self._tool_report(for_reasoner=False))
                parts.append(
                    "Your answer and the reasoner's answer do not agree yet. Check your program and the "
                    "reasoning, fix what is wrong, and write the program again."
                )
            parts.append(_tool_format(self.code_timeout_s))
        return "\n\n".join(parts)

    def _compact_prompt(self, agent: str) -> str:
        assert self.problem is not None
        if agent == "reasoner":
            ran = self.tool_code is not None or bool(self.tool_status)
            shown = _short(self.tool_answer) if self.tool_answer is not None else None
            return compact_reasoner_prompt(self.problem.question, tool_result=shown, tool_ran=ran)
        previous = None
        if self.tool_code is not None:
            previous = _short(self.tool_answer) if self.tool_answer is not None else f"({self.tool_status})"
        return compact_tool_prompt(
            self.problem.question,
            reasoner_answer=_short(self.reasoner_answer) if self.reasoner_answer is not None else None,
            previous_program=_tail(self.tool_code, _ANSWER_SHOWN_CHARS)
            if self.tool_code is not None
            else None,
            previous_result=previous,
        )

    def _tool_report(self, *, for_reasoner: bool) -> str:
        whose = "The tool agent's" if for_reasoner else "Your previous"
        if self.tool_code is None:
            return f"{whose} reply had no ```python code block."
        code = _tail(self.tool_code.strip("\n"), _REPLY_TAIL_CHARS)
        lines = [f"{whose} program:\n```python\n{code}\n```"]
        status = {
            "ok": "It printed:",
            "no_output": "It printed nothing.",
            "error": "It failed. Its output and errors:",
            "timeout": f"It was stopped after {self.code_timeout_s:g} seconds. Its output:",
        }[self.tool_status]
        lines.append(status)
        if self.tool_output.strip():
            lines.append(_tail(self.tool_output, _OUTPUT_TAIL_CHARS))
        answer = _short(self.tool_answer) if self.tool_answer is not None else "(none)"
        lines.append(f"{'Its' if for_reasoner else 'Your'} answer: {answer}")
        return "\n".join(lines)

    def _act(self, agent: str, action: str) -> Outcome:
        assert self.problem is not None
        if agent == "reasoner":
            role_reward, format_ok, feedback, check, extra = self._reasoner_acts(action)
        else:
            role_reward, format_ok, feedback, check, extra = self._tool_acts(action)
        correct = self.reasoner_correct if agent == "reasoner" else self.tool_correct
        answer = self.reasoner_answer if agent == "reasoner" else self.tool_answer
        shown = _short(answer) if format_ok and answer is not None else None
        self.history.append((self.turn, agent, shown, bool(correct and format_ok)))
        self.agree = self._answers_agree()
        last_action = self.agree or (agent == self.possible_agents[-1] and self.turn + 1 >= self.max_turns)
        penalty = role_reward  # FORMAT_PENALTY or 0: part of the level (module docstring)
        # The team's answer is the reasoner's; the tool agent alone answers with its program.
        team_correct = self.reasoner_correct if "reasoner" in self.possible_agents else self.tool_correct
        return Outcome(
            role_reward=self._level_change(agent, float(bool(correct and format_ok)) + penalty),
            global_reward=self._level_change("global", float(team_correct)),
            format_ok=format_ok,
            feedback=feedback,
            terminated=self.agree,
            success=last_action and team_correct,
            info={
                "problem_id": self.problem.id,
                "answer": shown,
                "correct": bool(correct and format_ok),
                "check": check,
                "agree": self.agree,
                "reasoner_correct": self.reasoner_correct,
                **extra,
            },
        )

    def gold_answer(self, agent: str) -> str:
        """The answer ``agent``'s answer is checked against (Math-v0: the problem's, for both)."""
        assert self.problem is not None
        return self.problem.answer

    def _answers_agree(self) -> bool:
        """Whether the two latest answers agree (which ends the episode)."""
        if self.reasoner_answer is None or self.tool_answer is None:
            return False
        return self.checker.check(self.reasoner_answer, self.tool_answer).correct

    def _level_change(self, key: str, level: float) -> float:
        """Pay ``level`` as its change since ``key``'s last payment (module docstring: Bound)."""
        change, self._levels[key] = level - self._levels[key], level
        return change

    def _reasoner_acts(self, action: str) -> tuple[float, bool, str, str, dict[str, Any]]:
        assert self.problem is not None
        self.reasoner_reply = action
        try:
            answer = read_reasoner_answer(action, self.answer_parser)
        except ParseError as error:
            self.reasoner_answer, self.reasoner_correct = None, False
            return FORMAT_PENALTY, False, f"Your previous reply could not be used: {error}.", "none", {}
        result = self.checker.check(self.gold_answer("reasoner"), answer)
        self.reasoner_answer, self.reasoner_correct = answer, result.correct
        return 0.0, True, _refusal_feedback(result), result.method, {}

    def _tool_acts(self, action: str) -> tuple[float, bool, str, str, dict[str, Any]]:
        assert self.problem is not None
        self.tool_answer, self.tool_correct, self.tool_output = None, False, ""
        try:
            code = read_tool_program(action, self.code_parser)
        except ParseError as error:
            self.tool_code, self.tool_status = None, "no_code"
            feedback = f"Your previous reply could not be used: {error}."
            return FORMAT_PENALTY, False, feedback, "none", {"tool_status": "no_code"}
        self.tool_code = code
        run = run_python(code, timeout=self.code_timeout_s)
        answer = answer_from_output(run.stdout)
        if run.timed_out:
            status, output = "timeout", run.stdout
        elif run.exit_code != 0:
            status, output = "error", (run.stdout + "\n" + run.stderr).strip()
        elif answer is None:
            status, output = "no_output", run.stdout
        else:
            status, output = "ok", run.stdout
        self.tool_output = _clean_output(output)
        self.tool_status = status
        if status != "ok":
            return FORMAT_PENALTY, False, "", "none", {"tool_status": status}
        assert answer is not None
        result = self.checker.check(self.gold_answer("tool_agent"), answer)
        self.tool_answer, self.tool_correct = answer, result.correct
        return 0.0, True, _refusal_feedback(result), result.method, {"tool_status": status}

    def _render_state(self) -> str:
        assert self.problem is not None
        over = all(self.terminations.values()) or all(self.truncations.values())
        gold = self.problem.answer if over else "(shown when the episode is over)"
        lines = [
            f"Math-v0  problem {self.problem.id}  ({self.problem.source}, difficulty {self.problem.difficulty})",
            self.problem.question,
            f"gold answer: {gold}",
        ]
        for turn, agent, answer, correct in self.history:
            mark = "-" if answer is None else ("correct" if correct else "wrong")
            lines.append(f"  turn {turn + 1} {agent:<10} answer: {answer!s:<20} {mark}")
        state = "agreed" if self.agree else self.turn_label()
        lines.append(f"status: {state}; success: {self.success}")
        return "\n".join(lines)

    def close(self) -> None:
        """Release this env's claim on the checker (its workers stop when no env needs them)."""
        self._lease.release()


def oracle_action(env: MathEnv, agent: str) -> str:
    """A perfect reply for ``agent`` on ``env``'s current problem (tests and benchmarks):
    ``\\boxed{gold}`` for the reasoner, a program printing the gold answer for the tool agent (each
    agent's gold: :meth:`MathEnv.gold_answer`)."""
    gold = env.gold_answer(agent)
    if agent == "reasoner":
        return f"The answer follows from the problem statement.\n\n\\boxed{{{gold}}}"
    return f"```python\nanswer = {gold!r}\nprint(answer)\n```"


def oracle_policy(env: MathEnv) -> Callable[[str, str], str]:
    """``policy(agent, prompt) -> action`` playing :func:`oracle_action` on ``env`` (the shape
    ``benchmarks/env_speed.py`` and :func:`llm_zoo.testing.play_episode` expect)."""
    return lambda agent, prompt: oracle_action(env, agent)
