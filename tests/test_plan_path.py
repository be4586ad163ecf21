"""PlanPath-v0: game rules, rewards, level generation, the tool/plan agent mechanics, oracle play."""

from __future__ import annotations

import math
import re
import string

import numpy as np
import pytest

import llm_zoo
import oracles
from llm_zoo.envs import grid_agents, plan_path
from llm_zoo.envs.grid_agents import ToolRun, describe_tool_run, shorten
from llm_zoo.envs.plan_path import (
    PlanPathEnv,
    PlanPathState,
    apply_move,
    bfs_distances,
    generate_grid,
    parse_grid,
    render_grid,
    shortest_path,
    simulate_moves,
)
from llm_zoo.testing import check_env, malformed_actions, play_episode

# S at (0, 0), G at (2, 2), a wall in the middle: shortest path 4.
SMALL = "S..\n.#.\n..G"


def no_sandbox(*args, **kwargs):
    raise AssertionError("the sandbox must not run for this answer")


def program(source: str) -> str:
    return f"```python\n{source}\n```"


def step_tool_then_plan(env, tool_action: str, plan_action: str) -> None:
    env.step(tool_action)
    env.step(plan_action)


# ---------------------------------------------------------------- the env passes every check


def test_check_env_with_real_moves():
    solver = oracles.tool_answer(oracles.solver_program(oracles.solve_grid_path))
    check_env(
        "PlanPath-v0",
        sample_actions=[solver, '#### ["R", "D"]', "no idea", '#### ["U", "L", "L"]'],
    )


# ---------------------------------------------------------------- game rules


def test_apply_move_walls_and_edges():
    grid = parse_grid(SMALL).grid
    assert apply_move(grid, (0, 0), "R") == ((0, 1), True)
    assert apply_move(grid, (0, 1), "D") == ((0, 1), False)  # wall
    assert apply_move(grid, (0, 0), "U") == ((0, 0), False)  # off the grid
    assert apply_move(grid, (2, 2), "R") == ((2, 2), False)


def test_bfs_and_shortest_path():
    level = parse_grid(SMALL)
    assert bfs_distances(level.grid, (0, 0))[(2, 2)] == 4
    assert (1, 1) not in bfs_distances(level.grid, (0, 0))
    path = shortest_path(level.grid, level.start, level.goal)
    assert len(path) == 4
    assert simulate_moves(level, PlanPathState(level.start), path).solved
    assert shortest_path((".#.",), (0, 0), (0, 2)) is None


def test_parse_and_render_round_trip():
    level = parse_grid(SMALL)
    assert (level.start, level.goal, level.shortest) == ((0, 0), (2, 2), 4)
    assert render_grid(level, level.start) == SMALL
    assert render_grid(level, (1, 0)) == "...\nS#.\n..G"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("S.\n.", "equal length"),
        ("S.x\n..G", "unknown symbol"),
        ("..\n.G", "one S"),
        ("S#\n#G", "cannot be reached"),
    ],
)
def test_parse_grid_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_grid(text)


# ---------------------------------------------------------------- rewards, by hand


@pytest.mark.parametrize(
    ("position", "moves", "lam", "expected"),
    [
        ((0, 0), ["R"], 1.0, -0.01 + (-3 + 4)),  # valid move, one step closer: 0.99
        ((0, 1), ["D"], 1.0, -0.10),  # wall bump, stays
        ((0, 0), ["U"], 1.0, -0.10),  # off the grid
        ((0, 0), ["R"], 0.5, -0.01 + 0.5 * 1),  # shaping towards G: 0.49
        ((0, 1), ["L"], 0.5, -0.01 - 0.5 * 1),  # shaping away from G: -0.51
        ((0, 0), ["R", "R", "D", "D"], 0.0, 4 * -0.01 + 1.0 + 0.5),  # goal + shortest bonus
        ((0, 0), ["D", "D", "R", "R"], 0.0, 4 * -0.01 + 1.0 + 0.5),  # another shortest path
        ((0, 0), ["R", "L", "R", "R", "D", "D"], 0.0, 6 * -0.01 + 1.0),  # goal, no bonus
        ((0, 0), ["U", "R", "R", "D", "D"], 0.0, -0.10 + 4 * -0.01 + 1.0),  # a bump counts as a move
        ((0, 0), ["R", "R", "D", "D", "U", "L"], 0.0, 4 * -0.01 + 1.5),  # moves after G ignored
        ((0, 0), ["R", "R", "D", "D"], 0.5, 4 * -0.01 + 0.5 * 4 + 1.5),  # shaping telescopes to 4 * 0.5
        ((0, 0), ["R", "L"] * 10, 1.0, -0.2),  # back and forth: only the costs
        ((0, 0), ["R", "L"] * 500, 1.0, -0.5),  # the costs take at most 0.5 from an answer
        ((0, 0), [], 1.0, 0.0),
    ],
)
def test_move_rewards_by_hand(position, moves, lam, expected):
    level = parse_grid(SMALL)
    result = simulate_moves(level, PlanPathState(position), moves, shaping_lambda=lam)
    assert result.reward == pytest.approx(expected)


def test_simulate_counts_and_ignores():
    level = parse_grid(SMALL)
    result = simulate_moves(level, PlanPathState((0, 0)), ["U", "R", "R", "D", "D", "L", "L"])
    assert (result.applied, result.invalid, result.ignored, result.solved) == (5, 1, 2, True)
    assert result.state == PlanPathState((2, 2), 5)


def test_bonus_counts_moves_over_the_whole_episode():
    env = PlanPathEnv(shaping_lambda=0.0, alpha=0.5)
    env.reset(options={"board": SMALL})
    step_tool_then_plan(env, "skip", '#### ["R", "R"]')
    assert env.infos["plan_agent"]["role_reward"] == pytest.approx(2 * -0.01)
    assert env.infos["plan_agent"]["global_reward"] == 0.0
    step_tool_then_plan(env, "skip", '#### ["D", "D"]')
    info = env.infos["plan_agent"]
    assert info["role_reward"] == pytest.approx(2 * -0.01 + 1.0 + 0.5)  # 4 moves in all = shortest
    assert info["global_reward"] == 1.0 and info["success"]
    assert env.rewards["plan_agent"] == pytest.approx(1.48 + 0.5 * 1.0)
    assert all(env.terminations.values())


def test_wasted_turn_moves_lose_the_bonus():
    env = PlanPathEnv(shaping_lambda=0.0)
    env.reset(options={"board": SMALL})
    step_tool_then_plan(env, "skip", '#### ["R", "L"]')
    step_tool_then_plan(env, "skip", '#### ["R", "R", "D", "D"]')
    assert env.infos["plan_agent"]["role_reward"] == pytest.approx(4 * -0.01 + 1.0)
    assert env.success


def test_tool_moves_are_scored_on_a_copy():
    env = PlanPathEnv()
    env.reset(options={"board": SMALL})
    env.step(oracles.tool_answer(oracles.printing_program(["R", "R", "D", "D"])))
    info = env.infos["tool_agent"]
    expected = simulate_moves(env.level, PlanPathState((0, 0)), ["R", "R", "D", "D"]).reward
    assert info["role_reward"] == pytest.approx(expected) and info["moves_solve"]
    assert info["format_ok"] and info["program_ran"]
    assert env.puzzle_state == PlanPathState((0, 0), 0) and not env.success
    assert info["global_reward"] == 0.0
    assert "it printed 4 moves" in env.observe("tool_agent")["prompt"]


# ---------------------------------------------------------------- level generation


def test_200_generated_levels_are_solvable():
    for seed in range(200):
        level = generate_grid(np.random.default_rng(seed))
        board = render_grid(level, level.start)
        assert (level.rows, level.cols) == (10, 10)
        assert level.start != level.goal
        assert set(board) <= set("#.SG\n") and board.count("S") == board.count("G") == 1
        moves = oracles.solve_grid_path(board)
        assert moves is not None and len(moves) == level.shortest, seed


def test_wall_ratio_is_respected():
    fractions = [
        "".join(generate_grid(np.random.default_rng(seed)).grid).count("#") / 100 for seed in range(200)
    ]
    assert 0.18 < np.mean(fractions) < 0.24
    assert "#" not in "".join(generate_grid(np.random.default_rng(0), 6, 6, 0.0).grid)


@pytest.mark.parametrize(
    ("rows", "cols", "wall_ratio"), [(1, 2, 0.0), (3, 7, 0.3), (15, 12, 0.22), (25, 25, 0.35)]
)
def test_configurable_sizes_play_to_success(rows, cols, wall_ratio):
    env = llm_zoo.make("PlanPath-v0", rows=rows, cols=cols, wall_ratio=wall_ratio)
    for seed in range(3):
        play_episode(env, oracles.plan_path_policy(), seed=seed)
        assert (env.level.rows, env.level.cols) == (rows, cols)
        assert env.success


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rows": 0}, r"rows must be an integer in \[1, 256\]"),
        ({"rows": 1, "cols": 1}, "at least 2 cells"),
        ({"cols": -3}, r"cols must be an integer in \[1, 256\]"),
        ({"rows": 2.5}, "rows must be an integer"),
        ({"wall_ratio": 1.0}, "wall_ratio"),
        ({"wall_ratio": -0.1}, "wall_ratio"),
        ({"max_turns": 0}, "max_turns"),
        ({"tool_timeout_s": 0}, "tool_timeout_s"),
    ],
)
def test_bad_parameters_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PlanPathEnv(**kwargs)


def test_hopeless_wall_ratio_raises_at_reset():
    env = PlanPathEnv(rows=2, cols=2, wall_ratio=0.999)
    with pytest.raises(ValueError, match="no solvable 2 x 2 grid"):
        env.reset(seed=0)


# ---------------------------------------------------------------- malformed answers


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ("I would go right twice, then down twice.", "no code block"),
        ("```python\n", "no complete code block"),
        ("```python\n```", "empty"),
    ],
)
def test_tool_answer_without_program_never_reaches_the_sandbox(monkeypatch, answer, error):
    monkeypatch.setattr(grid_agents, "run_python", no_sandbox)
    env = PlanPathEnv()
    env.reset(seed=0)
    env.step(answer)
    info = env.infos["tool_agent"]
    assert (info["format_ok"], info["role_reward"], info["program_ran"]) == (False, -1.0, False)
    assert error in info["feedback"]
    assert "contained no usable program" in env.observe("plan_agent")["prompt"]


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("raise SystemExit(3)", "exit code 3"),
        ("1 / 0", "ZeroDivisionError"),
        ("while True:\n    pass", "time limit"),
        ("print('R R D D')", "could not read moves"),
        ("print('**Actions List**: [R, D]')", "not a valid list literal"),
        ("print('**Actions List**: \"R\"')", "followed by a list"),
        ('print(\'**Actions List**: ["R", "X"]\')', "move 2 is 'X'"),
        ("print('**Actions List**: [\"R\"]'); raise ValueError('late')", "exit code 1"),
    ],
)
def test_tool_programs_that_fail_are_format_errors(source, error):
    env = PlanPathEnv(tool_timeout_s=1.0)
    env.reset(seed=0)
    start = env.puzzle_state
    env.step(program(source))
    info = env.infos["tool_agent"]
    assert (info["format_ok"], info["role_reward"], info["program_ran"]) == (False, -1.0, True)
    assert error in info["feedback"], info["feedback"]
    assert env.puzzle_state == start
    next_prompt = env.observe("tool_agent")["prompt"]
    assert next_prompt.startswith("Your previous answer could not be used (-1)") and error in next_prompt
    assert "No moves could be read from it" in env.observe("plan_agent")["prompt"]


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ("", "no `####` found"),
        ("#### R, R, D", "must be followed by a list"),
        ('#### ["R", "X"]', "move 2 is 'X'"),
        ("#### [1, 2]", "move 1 is 1"),
        ('#### ["R"', "not closed"),
    ],
)
def test_malformed_plan_answers(answer, error):
    env = PlanPathEnv()
    env.reset(seed=0)
    env.step("skip")
    start = env.puzzle_state
    env.step(answer)
    info = env.infos["plan_agent"]
    assert (info["format_ok"], info["role_reward"]) == (False, -1.0)
    assert env.puzzle_state == start
    assert error in env.observe("plan_agent")["prompt"]


def test_words_and_lowercase_moves_are_accepted():
    env = PlanPathEnv(shaping_lambda=0.0)
    env.reset(options={"board": SMALL})
    env.step("skip")
    env.step('Going around the wall.\n#### ["right", "r", "Down", "D"]')
    assert env.success and env.infos["plan_agent"]["format_ok"]


def test_1000_random_strings_never_raise(monkeypatch):
    monkeypatch.setattr(grid_agents, "run_python", no_sandbox)  # none holds a complete code block
    rng = np.random.default_rng(0)
    printable = np.array(list(string.printable + "#*[]`"))
    noise = ["".join(rng.choice(printable, size=rng.integers(0, 300))) for _ in range(500)]
    env = PlanPathEnv()
    env.reset(seed=0)
    malformed_before: set[str] = set()  # agents whose latest answer was unusable
    for index, action in enumerate(malformed_actions(rng, 500) + noise):
        if not env.agents:
            env.reset(seed=index)
            malformed_before = set()
        agent = env.agent_selection
        if env.terminations[agent] or env.truncations[agent]:
            env.step(None)
            continue
        env.step(action)
        # the penalty is a level: the first unusable answer in a row costs 1, the next ones nothing
        charged = 0.0 if agent in malformed_before else -1.0
        assert env.infos[agent]["format_ok"] is False and env.infos[agent]["role_reward"] == charged
        malformed_before.add(agent)
        assert math.isfinite(env.rewards[agent])
        assert isinstance(env.observe(agent)["prompt"], str)


# ---------------------------------------------------------------- oracle play through the env


def expected_path_reward(start, goal, moves, lam=1.0):
    """Independent recomputation for a shortest path of valid moves: steps, shaping, goal, bonus."""
    deltas = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
    position, total = start, 0.0
    for move in moves:
        after = (position[0] + deltas[move][0], position[1] + deltas[move][1])
        distance_before = abs(position[0] - goal[0]) + abs(position[1] - goal[1])
        distance_after = abs(after[0] - goal[0]) + abs(after[1] - goal[1])
        total += -0.01 + lam * (distance_before - distance_after)
        position = after
    assert position == goal
    return total + 1.0 + 0.5


def test_oracle_solves_100_seeds_with_the_shortest_path_bonus():
    env = llm_zoo.make("PlanPath-v0")
    policy = oracles.plan_path_policy()
    for seed in range(100):
        trace = play_episode(env, policy, seed=seed)
        assert [step[0] for step in trace] == ["tool_agent", "plan_agent"], seed
        (*_, tool_info), (_, plan_prompt, _, plan_reward, plan_info) = trace
        assert env.success and plan_info["success"] and tool_info["moves_solve"]
        moves = oracles.solve_grid_path(oracles.board_from_prompt(plan_prompt))
        expected = expected_path_reward(env.level.start, env.level.goal, moves)
        assert plan_info["role_reward"] == pytest.approx(expected), seed
        assert tool_info["role_reward"] == pytest.approx(expected), seed
        assert plan_reward == pytest.approx(expected + 1.0)  # alpha = 1, global = 1
        assert plan_info["moves_taken"] == plan_info["shortest_path_length"] == len(moves)


def test_tool_agent_bfs_program_reads_the_grid_from_stdin():
    """The sandbox path end to end: a real BFS program, and a plan agent that copies its moves."""
    solver = oracles.tool_answer(oracles.solver_program(oracles.solve_grid_path))
    assert "sys.stdin.read()" in solver and "Actions List" in solver

    def policy(agent, prompt):
        if agent == "tool_agent":
            return solver
        moves = re.search(r"Moves read from its output \(\d+\): (\[.*\])", prompt).group(1)
        return f"The program's moves avoid every wall.\n#### {moves}"

    env = PlanPathEnv(rows=8, cols=12)
    for seed in range(3):
        trace = play_episode(env, policy, seed=seed)
        assert env.success and len(trace) == 2
        assert trace[0][4]["program_ran"] and trace[0][4]["moves_solve"]
        assert "```python\nimport json\nimport sys" in trace[1][1]  # the plan agent saw the program


# ---------------------------------------------------------------- episodes, prompts, determinism


def test_truncation_after_max_turns():
    env = PlanPathEnv()
    trace = play_episode(env, lambda agent, prompt: "pass", seed=1)
    assert [step[0] for step in trace] == ["tool_agent", "plan_agent"] * 3
    assert [step[4]["turn"] for step in trace] == [0, 0, 1, 1, 2, 2]
    assert not env.success and env.agents == []
    assert all(not step[4]["format_ok"] for step in trace)


def test_prompts_state_the_answer_format_and_the_board():
    env = PlanPathEnv()
    env.reset(options={"board": SMALL})
    tool_prompt = env.observe("tool_agent")["prompt"]
    assert '**Actions List**: ["U", "R", "D"]' in tool_prompt and "```python" in tool_prompt
    assert "standard input" in tool_prompt and f"```text\n{SMALL}\n```" in tool_prompt
    assert "Turn 1 of 3" in tool_prompt
    env.step(oracles.tool_answer(oracles.printing_program(["D", "D", "R", "R"])))
    plan_prompt = env.observe("plan_agent")["prompt"]
    assert '#### ["U", "R", "D"]' in plan_prompt
    assert '```python\nprint(\'**Actions List**: ["D"' in plan_prompt
    assert 'Moves read from its output (4): ["D", "D", "R", "R"]' in plan_prompt


def test_same_seed_same_level_and_task_id():
    first, second = PlanPathEnv(), PlanPathEnv()
    first.reset(seed=42)
    second.reset(seed=42)
    assert first.observe("tool_agent") == second.observe("tool_agent")
    assert first.task_id == second.task_id
    ids = set()
    for seed in range(30):
        first.reset(seed=seed)
        ids.add(first.task_id)
    assert len(ids) == 30
    first.reset(options={"board": SMALL})
    second.reset(seed=5, options={"board": SMALL})
    assert first.task_id == second.task_id and first.task_id.startswith("3x3-")


def test_clone_branches_do_not_share_state():
    env = PlanPathEnv(shaping_lambda=0.0)
    env.reset(options={"board": SMALL})
    env.step("skip")
    twin = env.clone()
    twin.step('#### ["R", "R", "D", "D"]')
    assert twin.success and not env.success
    assert env.puzzle_state == PlanPathState((0, 0), 0) and env.agent_selection == "plan_agent"


def test_render():
    env = PlanPathEnv(render_mode="ansi")
    env.reset(options={"board": SMALL})
    assert SMALL in env.render()
    assert PlanPathEnv().render() is None


def test_shorten_and_describe_tool_run():
    assert shorten("abc", 5) == "abc"
    cut = shorten("x" * 50 + "y" * 50, 20)
    assert cut.startswith("x" * 13) and cut.endswith("y" * 7) and "80 characters cut" in cut
    assert "not answered" in describe_tool_run(None)
    view = describe_tool_run(ToolRun(code="print(1)", ran=True, stdout="1\n", error="no list"))
    assert "```python\nprint(1)\n```" in view and "No moves could be read from it: no list." in view
    huge = describe_tool_run(ToolRun(code="#" * 100_000, ran=True, stdout="z" * 100_000, moves=("U",)))
    assert len(huge) < 10_000


def test_docstring_example_is_the_real_prompt():
    lines = plan_path.__doc__.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Turn 1 of 3."))
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "```")
    excerpt = "\n".join(line[8:] for line in lines[start : end + 1])
    env = PlanPathEnv(rows=5, cols=5)
    env.reset(seed=0)
    assert excerpt in env.observe("tool_agent")["prompt"]


def test_env_speed_benchmark_smoke(tmp_path, monkeypatch):
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "env_speed.py"
    monkeypatch.syspath_prepend(str(path.parent))  # the benchmarks import their shared _common module
    spec = importlib.util.spec_from_file_location("env_speed", path)
    env_speed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(env_speed)
    output = tmp_path / "speed.json"
    env_speed.main(
        ["--env", "PlanPath-v0", "--seconds", "0.3", "--sandbox-runs", "2", "--output", str(output)]
    )
    results = json.loads(output.read_text())
    entry = results["envs"]["PlanPath-v0"]
    assert entry["random"]["steps"] > 0 and entry["random"]["success_rate"] == 0.0
    assert entry["oracle"]["episodes"] > 0 and entry["oracle"]["success_rate"] == 1.0
    assert results["sandbox"]["ok"] == 2 and results["sandbox"]["runs_per_s"] > 0
