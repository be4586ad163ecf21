"""Oracle players for the grid puzzles, written for the tests independently of the env code.

They read the board from the prompt text, as a model would, solve it by breadth-first search, and
answer in the format the prompt asks for. The two solvers are self-contained functions (their own
imports, no helpers) so that their source doubles as the *tool agent's program*: see
:func:`solver_program`, which the tests run in the sandbox with the board on stdin.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable

__all__ = [
    "Policy",
    "board_from_prompt",
    "plan_answer",
    "plan_path_policy",
    "printing_program",
    "sokoban_policy",
    "solve_grid_path",
    "solve_sokoban",
    "solver_program",
    "tool_answer",
]

Policy = Callable[[str, str], str]

_BOARD = re.compile(r"Current board:\n```text\n(.*?)\n```", re.DOTALL)


def board_from_prompt(prompt: str) -> str:
    """The board block of a PlanPath / Sokoban prompt."""
    match = _BOARD.search(prompt)
    if match is None:
        raise AssertionError("the prompt shows no board")
    return match.group(1)


def solve_grid_path(board: str) -> list[str] | None:
    """A shortest move list from S to G on a '#'/'.' grid, or None."""
    from collections import deque

    grid = [line for line in board.split("\n") if line]
    cells = {(r, c): ch for r, line in enumerate(grid) for c, ch in enumerate(line)}
    start = next(cell for cell, ch in cells.items() if ch == "S")
    goal = next(cell for cell, ch in cells.items() if ch == "G")
    steps = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
    came_from = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            moves = []
            while came_from[cell] is not None:
                cell, move = came_from[cell]
                moves.append(move)
            return moves[::-1]
        for move, (dr, dc) in steps.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if cells.get(nxt, "#") != "#" and nxt not in came_from:
                came_from[nxt] = (cell, move)
                queue.append(nxt)
    return None


def solve_sokoban(board: str) -> list[str] | None:
    """A shortest move list that puts every box on a goal, by BFS over (player, boxes), or None."""
    from collections import deque

    grid = [line for line in board.split("\n") if line.strip()]
    walls, goals, boxes, player = set(), set(), set(), None
    for r, line in enumerate(grid):
        for c, ch in enumerate(line):
            if ch == "#":
                walls.add((r, c))
            if ch in ".*+":
                goals.add((r, c))
            if ch in "$*":
                boxes.add((r, c))
            if ch in "@+":
                player = (r, c)
    steps = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
    start = (player, frozenset(boxes))
    came_from = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        (pr, pc), boxes_now = state
        if boxes_now <= goals:
            moves = []
            while came_from[state] is not None:
                state, move = came_from[state]
                moves.append(move)
            return moves[::-1]
        for move, (dr, dc) in steps.items():
            target = (pr + dr, pc + dc)
            if target in walls:
                continue
            new_boxes = boxes_now
            if target in boxes_now:
                beyond = (target[0] + dr, target[1] + dc)
                if beyond in walls or beyond in boxes_now:
                    continue
                new_boxes = (boxes_now - {target}) | {beyond}
            nxt = (target, new_boxes)
            if nxt not in came_from:
                came_from[nxt] = (state, move)
                queue.append(nxt)
    return None


def solver_program(solver: Callable[[str], list[str] | None]) -> str:
    """A complete program: ``solver``'s source, then read the board from stdin and print the moves."""
    return (
        "import json\nimport sys\n\n"
        + inspect.getsource(solver)
        + f"\n\nmoves = {solver.__name__}(sys.stdin.read())\n"
        + 'print("**Actions List**:", json.dumps(moves))\n'
    )


def printing_program(moves: list[str]) -> str:
    """The cheapest tool program: it prints moves found beforehand."""
    return f"print('**Actions List**: {json.dumps(moves)}')\n"


def tool_answer(program: str) -> str:
    return f"I will solve it with breadth-first search.\n\n```python\n{program}```\n"


def plan_answer(moves: list[str]) -> str:
    return f"The tool agent's moves check out against the board.\n\n#### {json.dumps(moves)}"


def _policy(solver: Callable[[str], list[str] | None], tool: str) -> Policy:
    if tool not in ("print", "solver"):
        raise ValueError(f"tool must be 'print' or 'solver', got {tool!r}")

    def policy(agent: str, prompt: str) -> str:
        moves = solver(board_from_prompt(prompt))
        if moves is None:
            raise AssertionError(f"the oracle found no solution for\n{board_from_prompt(prompt)}")
        if agent == "plan_agent":
            return plan_answer(moves)
        program = solver_program(solver) if tool == "solver" else printing_program(moves)
        return tool_answer(program)

    return policy


def plan_path_policy(tool: str = "print") -> Policy:
    """Oracle for PlanPath-v0. ``tool="print"``: the tool agent prints the oracle's moves (fast);
    ``tool="solver"``: it submits the BFS solver program, which reads the grid from stdin."""
    return _policy(solve_grid_path, tool)


def sokoban_policy(tool: str = "print") -> Policy:
    """Oracle for Sokoban-v0; ``tool`` as in :func:`plan_path_policy`."""
    return _policy(solve_sokoban, tool)
