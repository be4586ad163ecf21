"""PlanPath-v0: move from S to G on a grid with walls; a tool agent and a plan agent.

Roles (turn order)
    ``["tool_agent", "plan_agent"]``. Each turn the tool agent writes a Python program that
    computes the moves (a BFS solver, typically); it runs in the sandbox with the grid on its
    standard input, and the moves it prints are played on a *copy* of the state. The plan agent then
    sees the tool agent's program, output and moves, and submits the moves played on the real grid.
    See :mod:`llm_zoo.envs.grid_agents` for the shared mechanics.

Level
    A ``rows x cols`` grid (10 x 10 by default); each cell is a wall with probability
    ``wall_ratio`` (0.22). A start S and a goal G are drawn among the free cells, distinct; the
    grid is drawn again until breadth-first search finds a path from S to G, so every level is
    solvable. Parameters that make that impossible (fewer than two cells, ``wall_ratio`` outside
    ``[0, 1)``), a side over ``MAX_GRID_SIDE`` (256) or an argument of the wrong type (``rows=True``,
    ``rows="3"``) raise :class:`~llm_zoo.arguments.EnvArgumentError` (a ``ValueError``) at
    construction; if 1000 draws in a row fail (extreme wall ratios) ``reset`` raises ``ValueError``
    naming the parameters.

Observation
    ``{"prompt": str}``: the role, the rules, the turn, the grid, and the exact answer format.
    Legend: ``#`` wall, ``.`` free, ``S`` current position, ``G`` goal; row 0 is the top row. The
    plan agent's prompt also holds the tool agent's program, its output and the moves read from it
    (or why none could be read). Feedback on the agent's previous answer opens its next prompt.
    The start of the tool agent's first prompt (seed 0, 5 x 5)::

        You are the tool agent of a two-agent team solving a PlanPath puzzle. You write a program
        that computes the moves; the plan agent then reads your program, its output and its moves,
        and submits the team's moves.

        Task: move S (your current position) to G (the goal) on the board. Legend: '#' wall,
        '.' free cell, 'S' current position, 'G' goal. ...

        Turn 1 of 3. Position S = (row 1, col 3), goal G = (row 3, col 2); moves played so far: 0.

        Current board:
        ```text
        ..##.
        ...S.
        .#.#.
        #.G..
        ##...
        ```

        How to answer: write ONE Python program (standard library only) that computes the moves
        from the current board and prints them on one line of exactly this form:
        **Actions List**: ["U", "R", "D"]
        ...

Actions
    Any string. Tool agent: one ```` ```python ```` block whose program prints
    ``**Actions List**: ["U", "R", ...]``. Plan agent: text ending with ``#### ["U", "R", ...]``.
    Moves are ``"U"`` (row - 1), ``"D"`` (row + 1), ``"L"`` (col - 1), ``"R"`` (col + 1),
    case-insensitive, or the words up/down/left/right.

Rewards
    A state's value is ``V = -lambda * |p - G|_1`` (Manhattan distance to the goal) off the goal,
    and ``V = 1.0`` on it, ``+ 0.5`` more if the moves played in the whole episode (invalid ones
    included) equal the BFS shortest path length from S. A list of moves from ``p`` to ``p'``
    earns the plan agent (its role reward)::

        r = V(p') - V(p) + max(cost, -0.5),   cost = -0.01 per valid move, -0.10 per move that
                                                      hits a wall or leaves the grid (p' = p)

    with ``lambda = shaping_lambda = 1.0`` by default. The tool agent's moves, played on a copy
    of the real state, earn ``max(0, V(p') - best) + min(0, V(p') - V(p)) + max(cost, -0.5)``,
    ``best`` being the highest value seen so far in the episode (see
    :mod:`llm_zoo.envs.grid_agents`). Moves after G is reached are ignored. All of one agent's
    move costs in an episode take at most ``0.5`` together. An answer that cannot be used
    (``format_ok = False``) puts ``-1.0`` in its agent's level: the first such answer in a row
    costs ``1.0``, the next ones nothing more, and the agent's next usable answer pays it back.

    Global reward: the team's level is ``1.0`` once the real position is G, else ``0.0``; an
    action's global reward is the change it made (``1.0`` for the solving plan answer). Every
    agent, the one that acted or not, receives ``alpha`` times it on that step (the acting agent
    ``role_reward + alpha * global_reward``), so both agents' PettingZoo returns carry the
    team's outcome.

    Bounds (``d0`` = Manhattan distance from S to G), for every ``max_turns``: the value terms
    telescope, so walking in circles earns only its costs. Over an episode the plan agent's role
    return is at most ``lambda * (d0 - 1)`` when G is never reached, and at least
    ``lambda * d0 + 1 - 0.5`` when it is (however many turns were wasted first); the tool
    agent's is at most ``lambda * d0 + 1.5`` whatever happens. Counting the team's part, a
    succeeding episode pays the plan agent at least ``lambda + 0.5 + alpha`` more than any
    failing one (``2.5`` with the defaults), and the tool agent, holding its own answers fixed,
    ``alpha`` more. ``infos`` add ``moves``,
    ``moves_applied``, ``invalid_moves``, ``moves_solve`` (these moves reach G), ``position``,
    ``distance_to_goal``, ``moves_taken``, ``shortest_path_length``, and ``program_ran`` for the
    tool agent.

Termination
    Terminated (``success``) when the plan agent's moves reach G. Truncated after ``max_turns``
    turns (3 by default: each agent answers at most three times).

Options
    ``reset(options={"board": text})`` plays the given grid (same legend, one S and one G) instead
    of a generated one; a board that breaks these rules or has no path raises ``ValueError``. A
    task option it does not take (``problem_id``, ``problem_index``: generated levels have no ids)
    is refused; other keys are ignored, as PettingZoo expects.

    Constructor options for small models (the defaults give the behaviour described above; see
    :mod:`llm_zoo.envs.grid_agents`):

    ``agents=("plan_agent",)``
        The plan agent plays alone (the seed paper's single-agent baseline): no tool agent, no
        program; a turn is one plan answer. Default ``("tool_agent", "plan_agent")``.
    ``prompt_style="compact"``
        Short prompts: the task in two sentences, the board, the positions of S and G, and one
        example answer (``#### ["D", "R"]``); no reward table. The plan agent is shown the tool
        agent's moves (or why there are none), not its program. Default ``"full"``.
    ``move_parser="lenient"``
        When the plan agent's answer has no valid ``#### [...]`` list, its moves are every move
        word (up, down, left, right, any case) and every standalone capital U/D/L/R after the last
        ``####`` (in the whole answer when there is none), in order. An answer with no move at all
        still earns ``-1.0``. The rewards are unchanged. Default ``"strict"``.
    ``prompt_layout="fixed_first"``
        The same sections in another order: who the agent is, the task and how to answer first
        (the same for the agent all episode), then the turn and board, the tool agent's run (for
        the plan agent), and the feedback on the agent's previous answer last. A prefix cache then
        reuses the first part from turn to turn. Default ``"classic"`` (feedback first, the
        instructions last).

    Why (measured once with the untrained SmolLM2-135M-Instruct, 16 tasks on 3 x 3 grids with
    ``wall_ratio=0.1``, the plan agent alone, compact prompts, 32 new tokens): the strict parser
    read 0 of 64 answers sampled at T=1 and 0 of 16 greedy ones; the lenient parser read 24 of 64
    (4 solved) and 3 of 16 greedy (2 solved). With the full prompts on 4 x 4 grids the model wrote
    no parsable plan in 32 samples. See ``benchmarks/learning_plan_path.py`` for training with them.

Parallel API
    Not parallelizable: the plan agent answers after reading the tool agent's program, output and
    moves of the same turn, which PettingZoo's ``aec_to_parallel`` would hide from it (every agent
    of a parallel step answers at once), so ``is_parallelizable`` is ``False`` and that conversion
    refuses the env. ``turn_based_aec_to_parallel`` is the faithful parallel view (one agent per
    step); see "PettingZoo conventions" in :mod:`llm_zoo.core`. ``max_cycles`` = ``max_turns``.

Version history
    v0: initial. Later additions that keep the defaults' behaviour: the ``agents``,
    ``prompt_style``, ``move_parser`` and ``prompt_layout`` options.
    v0 (2026-12, rewards a policy cannot game): the shaping is a pure potential difference (the
    discount ``shaping_gamma = 0.99`` is gone: around any cycle it paid ``(1 - gamma)`` times the
    distances, +85 to +151 per answer for walking back and forth); move costs take at most 0.5
    per answer; the tool agent is paid once for any progress (it was paid again every turn for
    the same simulated moves). A shortest path of ``n`` moves earns ``d0 + 1.5 - 0.01 n``.
    v0 (2026-12): the board's state is the attribute ``puzzle_state`` (it was ``state``, which hid
    PettingZoo's ``state()``: calling it raised ``TypeError``).
    v0 (2026-12, rewards v2): the team's outcome reaches both agents' returns (the tool agent
    earned the same whether the plan agent then solved or not); the format penalty is a level
    the next usable answer pays back, and an agent's move costs take at most 0.5 per episode
    (solving at the last of 5 turns after 4 unusable answers paid 1.47, stopping one cell short
    1.90).
    v0 (2026-12): with ``prompt_style="compact"``, a tool answer that gave no moves leaves the plan
    agent's prompt as when it plays alone; it showed the error written to the tool agent, which a
    small plan agent copied (see :func:`~llm_zoo.envs.grid_agents.describe_tool_run`).
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from llm_zoo.arguments import EnvArgumentError, check_int, check_number
from llm_zoo.envs.grid_agents import MAX_MOVE_COST, MOVES, MovesResult, ToolPlanEnv, count, oracle_answer

__all__ = [
    "GOAL_REWARD",
    "INVALID_MOVE_PENALTY",
    "MAX_GRID_SIDE",
    "OPTIMAL_PATH_BONUS",
    "VALID_MOVE_PENALTY",
    "PlanPathEnv",
    "PlanPathLevel",
    "PlanPathState",
    "apply_move",
    "bfs_distances",
    "check_grid_params",
    "generate_grid",
    "oracle_action",
    "parse_grid",
    "render_grid",
    "shortest_path",
    "simulate_moves",
    "state_value",
]

VALID_MOVE_PENALTY = -0.01
INVALID_MOVE_PENALTY = -0.10
GOAL_REWARD = 1.0
OPTIMAL_PATH_BONUS = 0.5

WALL, FREE, POSITION, GOAL = "#", ".", "S", "G"

Cell = tuple[int, int]


@dataclass(frozen=True)
class PlanPathLevel:
    """A grid (rows of ``#`` and ``.``), a start, a goal and the BFS distance between them."""

    grid: tuple[str, ...]
    start: Cell
    goal: Cell
    shortest: int

    @property
    def rows(self) -> int:
        return len(self.grid)

    @property
    def cols(self) -> int:
        return len(self.grid[0])

    def __deepcopy__(self, memo: dict[int, Any]) -> PlanPathLevel:
        return self  # immutable


@dataclass(frozen=True)
class PlanPathState:
    """Where the player is and how many moves the episode has played (for the optimal bonus)."""

    position: Cell
    moves_taken: int = 0

    def __deepcopy__(self, memo: dict[int, Any]) -> PlanPathState:
        return self  # immutable


#: Largest ``rows`` and ``cols``. The board is in every prompt: 256 x 257 = 65,792 characters,
#: beyond any model's useful context already; drawing a 256 x 256 level takes about 0.2 s and 10 MB
#: (1024 x 1024: 5 s and 170 MB), and ``rows=10**9`` would ask for gigabytes.
MAX_GRID_SIDE = 256


def check_grid_params(rows: int, cols: int, wall_ratio: float) -> None:
    """Raise :class:`~llm_zoo.arguments.EnvArgumentError` (a ``ValueError`` and a ``TypeError``)
    unless a solvable grid of these parameters can exist and fits :data:`MAX_GRID_SIDE`."""
    why = "the board is in every prompt"
    rows = check_int("rows", rows, low=1, high=MAX_GRID_SIDE, why=why)
    cols = check_int("cols", cols, low=1, high=MAX_GRID_SIDE, why=why)
    if rows * cols < 2:
        raise EnvArgumentError(f"the grid needs at least 2 cells (rows, cols >= 1), got {rows} x {cols}")
    check_number("wall_ratio", wall_ratio, low=0.0, high=1.0, high_open=True)


def apply_move(grid: Sequence[str], position: Cell, move: str) -> tuple[Cell, bool]:
    """The position after ``move`` and whether it was valid (a wall or the edge leaves it in place)."""
    d_row, d_col = MOVES[move]
    row, col = position[0] + d_row, position[1] + d_col
    if 0 <= row < len(grid) and 0 <= col < len(grid[0]) and grid[row][col] != WALL:
        return (row, col), True
    return position, False


def bfs_distances(grid: Sequence[str], source: Cell) -> dict[Cell, int]:
    """Number of moves from ``source`` to every reachable free cell."""
    distances = {source: 0}
    queue = deque([source])
    while queue:
        cell = queue.popleft()
        for move in MOVES:
            neighbour, valid = apply_move(grid, cell, move)
            if valid and neighbour not in distances:
                distances[neighbour] = distances[cell] + 1
                queue.append(neighbour)
    return distances


def shortest_path(grid: Sequence[str], source: Cell, target: Cell) -> list[str] | None:
    """A shortest list of moves from ``source`` to ``target``, or ``None`` if there is none."""
    distances = bfs_distances(grid, target)  # walk back downhill from source
    if source not in distances:
        return None
    path, cell = [], source
    while cell != target:
        for move in MOVES:
            neighbour, valid = apply_move(grid, cell, move)
            if valid and distances.get(neighbour) == distances[cell] - 1:
                path.append(move)
                cell = neighbour
                break
    return path


def generate_grid(
    rng: np.random.Generator,
    rows: int = 10,
    cols: int = 10,
    wall_ratio: float = 0.22,
    *,
    max_attempts: int = 1000,
) -> PlanPathLevel:
    """Draw grids, starts and goals from ``rng`` until the goal is reachable from the start."""
    check_grid_params(rows, cols, wall_ratio)
    for _ in range(max_attempts):
        walls = rng.random((rows, cols)) < wall_ratio
        free = np.flatnonzero(~walls)
        if len(free) < 2:
            continue
        start_index, goal_index = rng.choice(free, size=2, replace=False)
        start, goal = divmod(int(start_index), cols), divmod(int(goal_index), cols)
        grid = tuple("".join(WALL if wall else FREE for wall in row) for row in walls)
        distance = bfs_distances(grid, start).get(goal)
        if distance is not None:
            return PlanPathLevel(grid, start, goal, distance)
    raise ValueError(
        f"no solvable {rows} x {cols} grid with wall_ratio={wall_ratio} in {max_attempts} attempts; "
        "lower wall_ratio"
    )


def state_value(level: PlanPathLevel, state: PlanPathState, shaping_lambda: float = 1.0) -> float:
    """The value ``V`` of a state (module docstring): ``-lambda * |p - G|_1`` off the goal; on it
    the goal reward, plus the optimal-path bonus if the episode's moves equal the shortest path."""
    if state.position == level.goal:
        return GOAL_REWARD + (OPTIMAL_PATH_BONUS if state.moves_taken == level.shortest else 0.0)
    (row, col), (goal_row, goal_col) = state.position, level.goal
    return -shaping_lambda * float(abs(row - goal_row) + abs(col - goal_col))


def simulate_moves(
    level: PlanPathLevel,
    state: PlanPathState,
    moves: Sequence[str],
    *,
    shaping_lambda: float = 1.0,
) -> MovesResult[PlanPathState]:
    """Play ``moves`` from ``state`` and score them (formulas in the module docstring)."""
    position, taken = state.position, state.moves_taken
    cost, applied, invalid = 0.0, 0, 0
    for move in moves:
        if position == level.goal:
            break
        position, valid = apply_move(level.grid, position, move)
        cost += VALID_MOVE_PENALTY if valid else INVALID_MOVE_PENALTY
        applied += 1
        invalid += not valid
        taken += 1
    after = PlanPathState(position, taken)
    return MovesResult.of(
        after,
        moves=len(moves),
        applied=applied,
        invalid=invalid,
        cost=cost,
        before=state_value(level, state, shaping_lambda),
        after=state_value(level, after, shaping_lambda),
        solved=position == level.goal,
    )


def render_grid(level: PlanPathLevel, position: Cell) -> str:
    """The grid as text: ``#`` wall, ``.`` free, ``S`` position, ``G`` goal (S wins on G)."""
    rows = [list(row) for row in level.grid]
    rows[level.goal[0]][level.goal[1]] = GOAL
    rows[position[0]][position[1]] = POSITION
    return "\n".join("".join(row) for row in rows)


def parse_grid(text: str) -> PlanPathLevel:
    """Read a grid written with ``#``, ``.``, one ``S`` and one ``G``; ``ValueError`` if unsolvable."""
    lines = [line.strip() for line in text.strip("\n").splitlines() if line.strip()]
    if not lines or len({len(line) for line in lines}) != 1:
        raise ValueError("the grid must have at least one row and rows of equal length")
    found: dict[str, list[Cell]] = {POSITION: [], GOAL: []}
    for row, line in enumerate(lines):
        for col, symbol in enumerate(line):
            if symbol not in (WALL, FREE, POSITION, GOAL):
                raise ValueError(f"unknown symbol {symbol!r} at row {row}, col {col}; use # . S G")
            if symbol in found:
                found[symbol].append((row, col))
    if len(found[POSITION]) != 1 or len(found[GOAL]) != 1:
        raise ValueError("the grid needs exactly one S and one G")
    grid = tuple(line.replace(POSITION, FREE).replace(GOAL, FREE) for line in lines)
    start, goal = found[POSITION][0], found[GOAL][0]
    distance = bfs_distances(grid, start).get(goal)
    if distance is None:
        raise ValueError("G cannot be reached from S")
    return PlanPathLevel(grid, start, goal, distance)


class PlanPathEnv(ToolPlanEnv[PlanPathState]):
    """Grid path planning for a tool agent and a plan agent; documented in the module docstring.

    Args:
        rows: Grid height, in ``[1, MAX_GRID_SIDE]`` (256: the board is in every prompt).
        cols: Grid width, in ``[1, MAX_GRID_SIDE]``; at least 2 cells in all.
        wall_ratio: Probability of each cell being a wall, in ``[0, 1)``.
        shaping_lambda: Weight ``lambda`` of the potential-based shaping term.
        max_turns: Turns before truncation.
        alpha: Weight of the global reward in each agent's reward.
        render_mode: ``None`` or ``"ansi"``.
        tool_timeout_s: Time limit of the tool agent's program.
        tool_memory_mb: Memory limit of the tool agent's program.
        agents: ``("tool_agent", "plan_agent")`` or ``("plan_agent",)`` (the plan agent alone).
        prompt_style: ``"full"`` or ``"compact"`` (short prompts for small models).
        move_parser: ``"strict"`` or ``"lenient"`` (how the plan agent's moves are read).
        prompt_layout: ``"classic"`` or ``"fixed_first"`` (the fixed text first, the feedback last,
            so a prefix cache reuses it from turn to turn; :mod:`llm_zoo.envs.grid_agents`).
    """

    metadata: ClassVar[dict[str, Any]] = {
        "render_modes": ["ansi"],
        "name": "plan_path_v0",
        "is_parallelizable": False,
    }
    puzzle_name: ClassVar[str] = "PlanPath"

    def __init__(
        self,
        *,
        rows: int = 10,
        cols: int = 10,
        wall_ratio: float = 0.22,
        shaping_lambda: float = 1.0,
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
        check_grid_params(rows, cols, wall_ratio)
        super().__init__(
            max_turns=max_turns,
            alpha=alpha,
            render_mode=render_mode,
            tool_timeout_s=tool_timeout_s,
            tool_memory_mb=tool_memory_mb,
            agents=agents,
            prompt_style=prompt_style,
            move_parser=move_parser,
            prompt_layout=prompt_layout,
        )
        self.rows, self.cols, self.wall_ratio = int(rows), int(cols), float(wall_ratio)
        check_number("shaping_lambda", shaping_lambda, low=0.0)
        self.shaping_lambda = float(shaping_lambda)
        self.level: PlanPathLevel

    def _new_puzzle(self, rng: np.random.Generator, options: dict[str, Any] | None) -> None:
        board = (options or {}).get("board")
        if board is not None:
            self.level = parse_grid(board)
        else:
            self.level = generate_grid(rng, self.rows, self.cols, self.wall_ratio)
        self.puzzle_state = PlanPathState(self.level.start, 0)

    def _task_id(self) -> str:
        picture = render_grid(self.level, self.level.start)
        digest = hashlib.sha1(picture.encode()).hexdigest()[:16]
        return f"{self.level.rows}x{self.level.cols}-{digest}"

    def _board(self) -> str:
        return render_grid(self.level, self.puzzle_state.position)

    def _task_text(self) -> str:
        return (
            "Task: move S (your current position) to G (the goal) on the board. Legend: '#' wall, "
            "'.' free cell, 'S' current position, 'G' goal. Rows are numbered from 0 at the top, "
            'columns from 0 at the left. Moves: "U" (row - 1), "D" (row + 1), "L" (column - 1), '
            '"R" (column + 1). A move into a wall or off the board fails and you stay where you are.\n'
            f"Rewards for a list of moves: {self.shaping_lambda:g} for each step it brings S closer to G "
            f"(Manhattan distance; each step farther away costs as much), {GOAL_REWARD:+g} on reaching G, "
            f"and {OPTIMAL_PATH_BONUS:+g} more if the moves played in the whole episode equal the shortest "
            f"path length; each move costs {-VALID_MOVE_PENALTY:g} ({-INVALID_MOVE_PENALTY:g} if it fails), "
            f"at most {MAX_MOVE_COST:g} per answer. Moves after G is reached are ignored. The puzzle is "
            "solved when S reaches G."
        )

    def _short_task_text(self) -> str:
        return (
            "Move S to G on the board. '#' is a wall, '.' is a free cell. Rows are numbered from 0 at "
            'the top, columns from 0 at the left. Moves: "U" (up), "D" (down), "L" (left), "R" (right).'
        )

    def _status_text(self) -> str:
        (row, col), (goal_row, goal_col) = self.puzzle_state.position, self.level.goal
        return (
            f"Position S = (row {row}, col {col}), goal G = (row {goal_row}, col {goal_col}); "
            f"moves played so far: {self.puzzle_state.moves_taken}."
        )

    def _simulate(self, state: PlanPathState, moves: Sequence[str]) -> MovesResult[PlanPathState]:
        return simulate_moves(self.level, state, moves, shaping_lambda=self.shaping_lambda)

    def _value(self, state: PlanPathState) -> float:
        return state_value(self.level, state, self.shaping_lambda)

    def _describe(self, result: MovesResult[PlanPathState]) -> str:
        row, col = result.state.position
        text = f"{count(result.applied, 'move')} played ({result.invalid} failed), ending at (row {row}, col {col})"
        if result.solved:
            text += ", which is the goal"
        else:
            text += f", {self._distance(result.state.position)} steps (Manhattan) from the goal"
        if result.ignored:
            text += f"; {count(result.ignored, 'move')} after reaching the goal ignored"
        return text

    def _distance(self, cell: Cell) -> int:
        return abs(cell[0] - self.level.goal[0]) + abs(cell[1] - self.level.goal[1])

    def _state_info(self) -> dict[str, Any]:
        return {
            "position": self.puzzle_state.position,
            "distance_to_goal": self._distance(self.puzzle_state.position),
            "moves_taken": self.puzzle_state.moves_taken,
            "shortest_path_length": self.level.shortest,
        }

    def _is_solved(self) -> bool:
        return self.puzzle_state.position == self.level.goal


def oracle_action(env: PlanPathEnv, agent: str) -> str:
    """A perfect answer for ``agent`` now: a shortest path from the current position (for
    :func:`llm_zoo.testing.check_env`'s reward-hack search and the tests)."""
    return oracle_answer(
        agent, shortest_path(env.level.grid, env.puzzle_state.position, env.level.goal) or []
    )
