"""The *tool agent / plan agent* pattern shared by the grid puzzles PlanPath-v0 and Sokoban-v0.

Each turn has two steps, in this order:

1. The **tool agent** answers with one Python program in a ```` ```python ```` block. The program
   runs in the sandbox (:func:`llm_zoo.sandbox.run_python`) with the current board on its standard
   input, and must print a line ``**Actions List**: ["U", "R", ...]``. The moves are simulated on a
   *copy* of the state: the real state does not change, and the tool agent's role reward is the
   reward those moves would earn from the current state.
2. The **plan agent** sees the task, the tool agent's program, its output and the moves read from
   it (or why none could be read), and ends its answer with ``#### ["U", "R", ...]``. These moves
   are applied to the real state; its role reward is the reward they earn.

An answer that cannot be used - no code block; a program that crashes, times out or prints no
parsable ``**Actions List**`` line; a list that is not a list literal; a move other than U, D, L, R -
makes :data:`FORMAT_PENALTY` part of that agent's level (``format_ok = False``) and puts an
explanation at the top of its next prompt. It never raises. Text without a complete code block
never reaches the sandbox. The penalty is a level, not a fine: the first unusable answer in a row
costs ``1.0``, the next ones nothing more, and the agent's next usable answer pays it back. So
only the last answer's form counts, and an agent that flounders for many turns and then solves
still earns the whole success bonus.

The team's level is ``1.0`` once the real state is solved, else ``0.0``; the global reward of an
action is its change (``1.0`` for the plan answer that solves, ``0.0`` otherwise), and ``alpha``
times it reaches both agents (:class:`~llm_zoo.core.TextAECEnv`).

Rewards a policy cannot game. Each puzzle gives every state a *value* ``V`` (a potential plus the
bonuses of a solved state) and every move a *cost* (<= 0). An answer's moves, from state ``s`` to
``s'``, earn:

* plan agent: ``V(s') - V(s) + max(cost of its moves, -MAX_MOVE_COST)``. Over the episode the
  value terms telescope to ``V(last state) - V(start)``: moves that come back where they started
  (circling, pushing a box on and off a goal) earn nothing but their costs.
* tool agent (moves played on a copy of the real state ``s``): ``max(0, V(s') - best) +
  min(0, V(s') - V(s)) + max(cost, -MAX_MOVE_COST)``, where ``best`` is the highest value seen so
  far in the episode (the start, every real state, every state a tool answer reached). It is paid
  once for any progress: the same simulated solution, answered again every turn, earns nothing
  more, and its return over an episode is at most ``V(solved) - V(start)``.

An answer's costs take at most :data:`MAX_MOVE_COST` from it, and all the answers of one agent in
one episode at most :data:`MAX_EPISODE_COST` together (later costs are not charged), so wasted
turns cannot cost a succeeding episode more than the success bonus is worth, whatever
``max_turns``: each puzzle's docstring states the resulting bound.

Options for small models (constructor arguments; the defaults are the behaviour above):

* ``agents=("plan_agent",)``: the plan agent plays alone (the seed paper's single-agent baseline):
  no tool agent, no program; its prompt has no tool section. Default ``("tool_agent", "plan_agent")``.
* ``prompt_style="compact"``: short prompts (the board, the positions, the moves, one example
  answer; no reward table) for models that lose the thread in the full ones. Default ``"full"``.
* ``prompt_layout="fixed_first"``: the text that stays the same for an agent through an episode
  (who it is, the task, how to answer) opens its prompt, and what changes comes after it: the
  turn and board, the tool agent's run (for the plan agent), and the feedback on its previous
  answer last. An engine's prefix cache then reuses the fixed part from turn to turn. Measured on
  PlanPath-v0 (4 turns, 8 seeds, random answers; SmolLM2's tokenizer): the prefix an agent's
  later prompt shares with its previous one, in whole 128-token blocks, 19% with the default
  layout and 65% with this one on the full prompts, 12% and 39% on compact 3 x 3 ones. Default
  ``"classic"``: the feedback opens the prompt, the instructions close it.
* ``move_parser="lenient"``: the plan agent's moves are read from its ``#### [...]`` list when
  there is one; otherwise every move word (up, down, left, right, any case) and every standalone
  capital ``U``/``D``/``L``/``R`` after the last ``####`` (or in the whole answer when there is
  none), in order. An answer with none earns the format penalty as before. Default ``"strict"``
  (only the ``#### [...]`` list). The tool agent's program output is always read strictly.

:class:`ToolPlanEnv` implements the pattern once; a puzzle supplies its rules through a handful of
hooks (the board text, the task text, a pure ``simulate`` function, a "solved" test).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from llm_zoo.arguments import MAX_MEMORY_MB, MAX_TIMEOUT_S, check_int, check_number
from llm_zoo.core import Outcome, TextAECEnv
from llm_zoo.envs.grid_answers import (
    ACTIONS_LIST_MARKER,
    FINAL_MOVES_MARKER,
    MAX_MOVES,
    ToolRun,
    count,
    describe_tool_run,
    format_moves,
    oracle_answer,
    parse_lenient_moves,
    parse_plan_moves,
    shorten,
)
from llm_zoo.parsing import ParseError, extract_code_block, extract_moves
from llm_zoo.sandbox import run_python

__all__ = [
    "ACTIONS_LIST_MARKER",
    "FINAL_MOVES_MARKER",
    "FORMAT_PENALTY",
    "MAX_EPISODE_COST",
    "MAX_MOVES",
    "MAX_MOVE_COST",
    "MOVES",
    "MOVE_PARSERS",
    "PROMPT_LAYOUTS",
    "PROMPT_STYLES",
    "MovesResult",
    "ToolPlanEnv",
    "ToolRun",
    "count",
    "describe_tool_run",
    "format_moves",
    "oracle_answer",
    "parse_lenient_moves",
    "parse_plan_moves",
    "run_tool_agent",
    "shorten",
]

#: Row and column change of each move. Row 0 is the top row.
MOVES: dict[str, tuple[int, int]] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
#: Role reward of an answer that cannot be used (see the module docstring).
FORMAT_PENALTY = -1.0
#: The most that the per-move costs take from one answer (see the module docstring).
MAX_MOVE_COST = 0.5
#: The most that the per-move costs take from one agent over a whole episode.
MAX_EPISODE_COST = 0.5
#: Values of the ``prompt_style`` option (see the module docstring).
PROMPT_STYLES = ("full", "compact")
#: Values of the ``prompt_layout`` option (see the module docstring).
PROMPT_LAYOUTS = ("classic", "fixed_first")
#: Values of the ``move_parser`` option.
MOVE_PARSERS = ("strict", "lenient")
#: The agent lists a tool/plan env can be played with.
AGENT_SETS = (("tool_agent", "plan_agent"), ("plan_agent",))


def run_tool_agent(text: str, *, stdin: str, timeout: float, memory_mb: int) -> ToolRun:
    """Extract the program from the tool agent's answer, run it, and read its moves.

    The sandbox is only started when ``text`` contains a complete code block.
    """
    try:
        code = extract_code_block(text)
    except ParseError as err:
        return ToolRun(error=str(err))
    result = run_python(code, stdin=stdin, timeout=timeout, memory_mb=memory_mb)
    ran = ToolRun(code=code, ran=True, stdout=result.stdout, stderr=result.stderr)
    if result.timed_out:
        return replace(ran, error=f"your program was stopped after the {timeout:g} s time limit")
    if result.exit_code != 0:
        last_lines = "\n".join(result.stderr.strip().splitlines()[-3:])
        detail = f": {last_lines}" if last_lines else ""
        return replace(ran, error=f"your program failed (exit code {result.exit_code}){detail}")
    try:
        moves = extract_moves(result.stdout, ACTIONS_LIST_MARKER, max_moves=MAX_MOVES)
    except ParseError as err:
        reason = str(err).replace("end your answer with", "print a line")
        return replace(ran, error=f"could not read moves from your program's output: {reason}")
    return replace(ran, moves=tuple(moves))


S = TypeVar("S")


@dataclass(frozen=True)
class MovesResult(Generic[S]):
    """The effect of a list of moves from some state, computed without changing anything.

    Attributes:
        state: The state after the moves.
        reward: The plan agent's reward for these moves: ``value_after - value_before + cost``.
        applied: Moves executed (valid or not) before the puzzle was solved.
        invalid: How many of those were invalid (the player stayed put).
        ignored: Moves after the puzzle was solved, which are ignored.
        solved: Whether ``state`` is solved.
        value_before: The value ``V`` of the state the moves start from.
        value_after: The value ``V`` of ``state``.
        cost: The moves' costs, already limited to ``-MAX_MOVE_COST`` (<= 0).
    """

    state: S
    reward: float
    applied: int
    invalid: int
    ignored: int
    solved: bool
    value_before: float = 0.0
    value_after: float = 0.0
    cost: float = 0.0

    @classmethod
    def of(
        cls,
        state: S,
        moves: int,
        applied: int,
        invalid: int,
        cost: float,
        before: float,
        after: float,
        solved: bool,
    ) -> MovesResult[S]:
        """The result of ``moves`` moves, ``applied`` of them played, with their raw ``cost``
        (limited here to ``-MAX_MOVE_COST``) and the values before and after."""
        cost = max(cost, -MAX_MOVE_COST)
        return cls(
            state, after - before + cost, applied, invalid, moves - applied, solved, before, after, cost
        )

    def tool_reward(self, best: float) -> float:
        """The tool agent's reward for these moves when the best value seen so far is ``best``."""
        return max(0.0, self.value_after - best) + min(0.0, self.value_after - self.value_before) + self.cost


class ToolPlanEnv(TextAECEnv, Generic[S]):
    """A grid puzzle played by a tool agent and a plan agent (see the module docstring).

    Subclasses set ``metadata["name"]`` and :attr:`puzzle_name`, build the level and ``self.puzzle_state``
    in :meth:`_new_puzzle`, and implement :meth:`_board`, :meth:`_task_text`, :meth:`_status_text`,
    :meth:`_simulate`, :meth:`_describe`, :meth:`_state_info` and :meth:`_is_solved`.

    Args:
        max_turns: Turns (a tool answer then a plan answer) before truncation.
        alpha: Weight of the global reward in each agent's reward.
        render_mode: ``None`` or ``"ansi"``.
        tool_timeout_s: Wall-clock (and CPU) seconds the tool agent's program may run, in
            ``(0, MAX_TIMEOUT_S]`` (600).
        tool_memory_mb: Memory limit of the tool agent's program, in MiB, in ``[64, MAX_MEMORY_MB]``
            (65,536).
        agents: The agents, in turn order: ``("tool_agent", "plan_agent")`` or ``("plan_agent",)``
            (the plan agent alone).
        prompt_style: ``"full"`` or ``"compact"`` (short prompts for small models).
        move_parser: ``"strict"`` or ``"lenient"`` (how the plan agent's moves are read).
        prompt_layout: ``"classic"`` or ``"fixed_first"`` (the fixed text first, the feedback
            last: see the module docstring).
    """

    roles: ClassVar[tuple[str, ...]] = ("tool_agent", "plan_agent")
    #: Name of the puzzle used in the prompts.
    puzzle_name: ClassVar[str] = "puzzle"
    #: A generated puzzle has no problem ids: the seed picks the level (see TextAECEnv).
    reset_options: ClassVar[dict[str, str] | None] = {
        "board": "a board (text) to play instead of the one generated from the seed; there are no problem ids"
    }

    def __init__(
        self,
        *,
        max_turns: int = 3,
        alpha: float = 1.0,
        render_mode: str | None = None,
        tool_timeout_s: float = 5.0,
        tool_memory_mb: int = 512,
        agents: Sequence[str] = ("tool_agent", "plan_agent"),
        prompt_style: str = "full",
        move_parser: str = "strict",
        prompt_layout: str = "classic",
    ):
        super().__init__(max_turns=max_turns, alpha=alpha, render_mode=render_mode)
        tool_timeout_s = check_number(
            "tool_timeout_s", tool_timeout_s, low=0, high=MAX_TIMEOUT_S, low_open=True
        )
        tool_memory_mb = check_int("tool_memory_mb", tool_memory_mb, low=64, high=MAX_MEMORY_MB)
        if isinstance(agents, str) or tuple(agents) not in AGENT_SETS:
            choices = " or ".join(str(list(a)) for a in AGENT_SETS)
            raise ValueError(f"agents must be {choices}, got {agents!r}")
        if prompt_style not in PROMPT_STYLES:
            raise ValueError(f"prompt_style must be one of {list(PROMPT_STYLES)}, got {prompt_style!r}")
        if move_parser not in MOVE_PARSERS:
            raise ValueError(f"move_parser must be one of {list(MOVE_PARSERS)}, got {move_parser!r}")
        if prompt_layout not in PROMPT_LAYOUTS:
            raise ValueError(f"prompt_layout must be one of {list(PROMPT_LAYOUTS)}, got {prompt_layout!r}")
        self.tool_timeout_s = float(tool_timeout_s)
        self.tool_memory_mb = int(tool_memory_mb)
        self.prompt_style = prompt_style
        self.move_parser = move_parser
        self.prompt_layout = prompt_layout
        self.feedback_last = prompt_layout == "fixed_first"
        if tuple(agents) != tuple(self.possible_agents):  # a subset of the roles, same order
            self.possible_agents = list(agents)
            self.observation_spaces = {a: self.observation_spaces[a] for a in self.possible_agents}
            self.action_spaces = {a: self.action_spaces[a] for a in self.possible_agents}
        self.puzzle_state: S
        self.last_tool_run: ToolRun | None = None
        self.best_value = 0.0

    # ------------------------------------------------------------------ puzzle hooks

    def _new_puzzle(self, rng: np.random.Generator, options: dict[str, Any] | None) -> None:
        """Build the level and set ``self.puzzle_state``. Use only ``rng`` for randomness."""
        raise NotImplementedError

    def _board(self) -> str:
        """The current board as text: shown in the prompts and fed to the tool program's stdin."""
        raise NotImplementedError

    def _task_text(self) -> str:
        """What the puzzle is: goal, legend, moves, rewards."""
        raise NotImplementedError

    def _status_text(self) -> str:
        """One or two lines about the current state (position, boxes left, moves so far)."""
        raise NotImplementedError

    def _simulate(self, state: S, moves: Sequence[str]) -> MovesResult[S]:
        """The effect of ``moves`` from ``state``; must not change the env."""
        raise NotImplementedError

    def _describe(self, result: MovesResult[S]) -> str:
        """A short sentence on where ``result`` leaves the puzzle, for feedback."""
        raise NotImplementedError

    def _state_info(self) -> dict[str, Any]:
        """Env-specific ``infos`` entries about the real state (plain values)."""
        raise NotImplementedError

    def _is_solved(self) -> bool:
        """Whether the real state is solved."""
        raise NotImplementedError

    def _value(self, state: S) -> float:
        """The value ``V`` of ``state`` (see the module docstring): the one ``_simulate`` uses."""
        raise NotImplementedError

    # ------------------------------------------------------------------ TextAECEnv rules

    def _new_episode(self, rng: np.random.Generator, options: dict[str, Any] | None) -> None:
        self.last_tool_run = None
        self._new_puzzle(rng, options)
        self.best_value = self._value(self.puzzle_state)
        # per agent: the format penalty in its level (0 or FORMAT_PENALTY), the costs it may still pay
        self._penalty = dict.fromkeys(self.possible_agents, 0.0)
        self._cost_left = dict.fromkeys(self.possible_agents, MAX_EPISODE_COST)
        self._team_level = 0.0

    def _global_reward(self) -> float:
        """The change of the team's level (1 once the real state is solved) since it was last paid."""
        level = 1.0 if self._is_solved() else 0.0
        change, self._team_level = level - self._team_level, level
        return change

    def _usable_answer_reward(self, agent: str, value_terms: float, cost: float) -> float:
        """A usable answer's role reward: its value terms, its costs within what the episode has
        left to charge (``MAX_EPISODE_COST``), and the payback of a format penalty in the level."""
        charged = max(cost, -self._cost_left[agent])
        self._cost_left[agent] += charged
        payback, self._penalty[agent] = -self._penalty[agent], 0.0
        return value_terms + charged + payback

    def _short_task_text(self) -> str:
        """The task in a few lines, for ``prompt_style="compact"`` (default: :meth:`_task_text`)."""
        return self._task_text()

    @property
    def solo(self) -> bool:
        """Whether the plan agent plays alone (``agents=("plan_agent",)``)."""
        return "tool_agent" not in self.possible_agents

    def _prompt(self, agent: str) -> str:
        if self.prompt_style == "compact":
            return self._compact_prompt(agent)
        board = f"Current board:\n```text\n{self._board()}\n```"
        turn = f"Turn {min(self.turn, self.max_turns - 1) + 1} of {self.max_turns}. {self._status_text()}"
        if self.solo:
            header = (
                f"You are the plan agent solving a {self.puzzle_name} puzzle on your own; the moves you "
                "submit are played on the real board."
            )
            return self._laid_out(
                [header, self._task_text()], [f"{turn}\n\n{board}"], self._plan_instructions()
            )
        header = (
            f"You are the {agent.replace('_', ' ')} of a two-agent team solving a {self.puzzle_name} puzzle. "
        )
        if agent == "tool_agent":
            header += (
                "You write a program that computes the moves; the plan agent then reads your program, "
                "its output and its moves, and submits the team's moves."
            )
        else:
            header += (
                "The tool agent has written a program that computes moves; you check its work and "
                "submit the team's moves, which are played on the real board."
            )
        changing = [f"{turn}\n\n{board}"]
        if agent == "tool_agent":
            instructions = self._tool_instructions()
        else:
            changing.append(describe_tool_run(self.last_tool_run))
            instructions = self._plan_instructions()
        return self._laid_out([header, self._task_text()], changing, instructions)

    def _laid_out(self, fixed: list[str], changing: list[str], instructions: str) -> str:
        """The prompt's sections in ``prompt_layout``'s order: ``classic`` puts the instructions
        last, ``fixed_first`` with the fixed sections, before what changes from turn to turn."""
        if self.prompt_layout == "fixed_first":
            return "\n\n".join([*fixed, instructions, *changing])
        return "\n\n".join([*fixed, *changing, instructions])

    def _tool_instructions(self) -> str:
        return (
            "How to answer: write ONE Python program (standard library only) that computes the moves "
            "from the current board and prints them on one line of exactly this form:\n"
            f'{ACTIONS_LIST_MARKER} ["U", "R", "D"]\n'
            "The program receives the current board on standard input, one row per line exactly as "
            "shown above, so it can read it with sys.stdin.read(); you may also copy the board into the "
            f"code. It runs without network access and is stopped after {self.tool_timeout_s:g} s. Put "
            "the whole program in one ```python ... ``` block; if there are several blocks, only the "
            f"last one is run. An answer without a runnable program or without the {ACTIONS_LIST_MARKER} "
            f"line earns {FORMAT_PENALTY:+g}."
        )

    def _compact_prompt(self, agent: str) -> str:
        board = f"Current board:\n```text\n{self._board()}\n```"
        turn = f"Turn {min(self.turn, self.max_turns - 1) + 1} of {self.max_turns}. {self._status_text()}"
        changing = [board, turn]
        if agent == "tool_agent":
            instructions = (
                "Write a Python program that reads the board from standard input and prints the moves "
                f'as {ACTIONS_LIST_MARKER} ["D", "R"]. Put it in one ```python block.'
            )
        else:
            tool_view = "" if self.solo else describe_tool_run(self.last_tool_run, compact=True)
            if tool_view:
                changing.append(tool_view)
            instructions = f'End your answer with {FINAL_MOVES_MARKER} and your moves, for example: {FINAL_MOVES_MARKER} ["D", "R"]'
        return self._laid_out([self._short_task_text()], changing, instructions)

    def _plan_instructions(self) -> str:
        if self.solo:
            check = "reason briefly if you need to"
        else:
            check = "check the tool agent's moves against the board (they may be wrong), reason briefly if you need to"
        return (
            f"How to answer: {check}, and end your answer with the moves to play from the current "
            "board, on one line of exactly this form:\n"
            f'{FINAL_MOVES_MARKER} ["U", "R", "D"]\n'
            f'Each move is "U", "D", "L" or "R". Only the list after the last {FINAL_MOVES_MARKER} '
            f"counts; an answer without a valid list earns {FORMAT_PENALTY:+g}."
        )

    def _act(self, agent: str, action: str) -> Outcome:
        if agent == "tool_agent":
            return self._act_tool(action)
        return self._act_plan(action)

    def _act_tool(self, action: str) -> Outcome:
        run = run_tool_agent(
            action, stdin=self._board() + "\n", timeout=self.tool_timeout_s, memory_mb=self.tool_memory_mb
        )
        self.last_tool_run = run
        info: dict[str, Any] = {"program_ran": run.ran}
        if run.moves is None:
            return self._format_failure(
                "tool_agent",
                run.error,
                "Answer with one ```python block whose program prints a line "
                f'{ACTIONS_LIST_MARKER} ["U", "R", ...].',
                info,
            )
        result = self._simulate(self.puzzle_state, run.moves)
        self.best_value = max(self.best_value, result.value_before)
        value_terms = result.tool_reward(self.best_value) - result.cost
        reward = self._usable_answer_reward("tool_agent", value_terms, result.cost)
        self.best_value = max(self.best_value, result.value_after)
        feedback = (
            f"Result of your previous program: it printed {count(len(run.moves), 'move')}; played from the board "
            f"you were given, {self._describe(result)} (reward {reward:+.3f})."
        )
        return self._moves_outcome(result, feedback, info, reward=reward)

    def _act_plan(self, action: str) -> Outcome:
        try:
            moves = parse_plan_moves(action, lenient=self.move_parser == "lenient")
        except ParseError as err:
            return self._format_failure(
                "plan_agent",
                str(err),
                f'End your answer with a line {FINAL_MOVES_MARKER} ["U", "R", ...].',
                {},
            )
        result = self._simulate(self.puzzle_state, moves)
        self.puzzle_state = result.state
        self.best_value = max(self.best_value, result.value_after)
        reward = self._usable_answer_reward("plan_agent", result.reward - result.cost, result.cost)
        feedback = f"Result of your previous moves: {self._describe(result)} (reward {reward:+.3f})."
        solved = self._is_solved()
        return self._moves_outcome(result, feedback, {}, terminated=solved, reward=reward)

    def _moves_outcome(
        self,
        result: MovesResult[S],
        feedback: str,
        info: dict[str, Any],
        *,
        terminated: bool = False,
        reward: float | None = None,
    ) -> Outcome:
        info.update(
            moves=result.applied + result.ignored,
            moves_applied=result.applied,
            invalid_moves=result.invalid,
            moves_solve=result.solved,
            **self._state_info(),
        )
        return Outcome(
            role_reward=result.reward if reward is None else reward,
            global_reward=self._global_reward(),
            feedback=feedback,
            terminated=terminated,
            success=terminated,
            info=info,
        )

    def _format_failure(self, agent: str, error: str, reminder: str, info: dict[str, Any]) -> Outcome:
        info.update(moves=0, moves_applied=0, invalid_moves=0, moves_solve=False, **self._state_info())
        charge, self._penalty[agent] = FORMAT_PENALTY - self._penalty[agent], FORMAT_PENALTY
        feedback = (
            f"Your previous answer could not be used ({FORMAT_PENALTY:+g}): {error.rstrip('.')}. {reminder} "
            "Your next usable answer earns the penalty back."
        )
        return Outcome(
            role_reward=charge,
            global_reward=self._global_reward(),
            format_ok=False,
            feedback=feedback,
            info=info,
        )

    def _render_state(self) -> str:
        return f"{self.puzzle_name} | {self.turn_label()} | {self._status_text()}\n{self._board()}"
