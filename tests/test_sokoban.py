"""Sokoban-v0: game rules, rewards, level generation, malformed answers, oracle play."""

from __future__ import annotations

import math
import re
import string

import numpy as np
import pytest

import llm_zoo
import oracles
from llm_zoo.envs import grid_agents, sokoban
from llm_zoo.envs.sokoban import (
    SokobanEnv,
    SokobanState,
    generate_level,
    parse_board,
    render_board,
    room_topology,
    simulate_moves,
    step,
)
from llm_zoo.testing import check_env, malformed_actions, play_episode

ONE_PUSH = "#####\n#@$.#\n#####"
# Two boxes: R pushes the first onto its goal, then D, R push the second.
TWO_BOXES = "#######\n#@$.  #\n#  $. #\n#######"


def no_sandbox(*args, **kwargs):
    raise AssertionError("the sandbox must not run for this answer")


def play(board: str, moves: list[str]):
    level, state = parse_board(board)
    return simulate_moves(level, state, moves)


# ---------------------------------------------------------------- the env passes every check


def test_check_env_with_real_moves():
    solver = oracles.tool_answer(oracles.solver_program(oracles.solve_sokoban))
    check_env(
        "Sokoban-v0",
        sample_actions=[solver, '#### ["R", "D"]', "no idea", '#### ["U", "L", "L"]'],
    )


# ---------------------------------------------------------------- game rules and rewards, by hand


def test_parse_and_render_round_trip():
    on_goals = "#####\n#+*$#\n#   #\n#####"
    for board in (ONE_PUSH, TWO_BOXES, on_goals):
        level, state = parse_board(board)
        assert render_board(level, state) == board
    level, state = parse_board(on_goals)
    assert state.player == (1, 1) and state.boxes == {(1, 2), (1, 3)}
    assert level.goals == {(1, 1), (1, 2)} and (2, 1) not in level.walls and (0, 4) in level.walls


@pytest.mark.parametrize(
    ("board", "message"),
    [
        ("#####\n#@$ #\n#####", "as many goals as boxes"),
        ("#####\n# $.#\n#####", "exactly one player"),
        ("#####\n#@$.X\n#####", "unknown symbol"),
        ("", "empty"),
    ],
)
def test_parse_board_errors(board, message):
    with pytest.raises(ValueError, match=message):
        parse_board(board)


@pytest.mark.parametrize(
    ("board", "moves", "expected"),
    [
        ("#####\n#@ .#\n#  $#\n#####", ["R"], -0.01),  # plain move
        (ONE_PUSH, ["L"], -0.05),  # into a wall
        ("#####\n#.@$#\n#####", ["R"], -0.05),  # push a box into a wall
        ("#######\n#@$$..#\n#######", ["R"], -0.05),  # push two boxes at once
        (ONE_PUSH, ["R"], -0.01 + 1.0 + 10.0),  # box onto its goal, all boxes done
        ("######\n#@*  #\n# $. #\n######", ["R"], -0.01 - 1.0),  # box off a goal: undoes the +1
        ("######\n#@*.$#\n######", ["R"], -0.01),  # goal to goal: no change
        ("######\n#@*.$#\n######", ["R", "R"], -0.01 - 0.05),  # then against the other box
        (TWO_BOXES, ["R"], -0.01 + 1.0),  # one box of two onto a goal
        (TWO_BOXES, ["R", "D", "R"], (-0.01 + 1.0) - 0.01 + (-0.01 + 1.0 + 10.0)),  # 11.97
        (ONE_PUSH, ["R", "L", "L"], 10.99),  # moves after solving are ignored
        (ONE_PUSH, [], 0.0),
    ],
)
def test_move_rewards_by_hand(board, moves, expected):
    assert play(board, moves).reward == pytest.approx(expected)


def test_step_moves_player_and_boxes():
    level, state = parse_board(TWO_BOXES)
    after, reward, valid = step(level, state, "R")
    assert valid and after.player == (1, 2) and after.boxes == {(1, 3), (2, 3)}
    assert after.moves_taken == 1
    blocked, reward, valid = step(level, state, "U")
    assert not valid and blocked == state and reward == -0.05


def test_simulate_counts_and_ignores():
    result = play(TWO_BOXES, ["L", "R", "D", "R", "U", "U"])
    assert (result.applied, result.invalid, result.ignored, result.solved) == (4, 1, 2, True)
    assert result.state.moves_taken == 4
    assert result.reward == pytest.approx(-0.05 + 0.99 - 0.01 + 10.99)


def test_env_plays_a_given_board_and_terminates_on_success():
    env = SokobanEnv(alpha=0.5)
    env.reset(options={"board": TWO_BOXES})
    env.step("skip")
    env.step('#### ["R"]')
    info = env.infos["plan_agent"]
    assert info["role_reward"] == pytest.approx(0.99) and info["global_reward"] == 0.0
    assert info["boxes_on_goals"] == 1 and info["num_boxes"] == 2 and not env.success
    env.step("skip")
    env.step('#### ["D", "R"]')
    info = env.infos["plan_agent"]
    assert info["role_reward"] == pytest.approx(-0.01 + 10.99) and info["global_reward"] == 1.0
    assert env.rewards["plan_agent"] == pytest.approx(10.98 + 0.5)
    assert info["success"] and all(env.terminations.values())


def test_tool_moves_are_scored_on_a_copy():
    env = SokobanEnv()
    env.reset(options={"board": ONE_PUSH})
    start = env.puzzle_state
    env.step(oracles.tool_answer(oracles.printing_program(["R"])))
    info = env.infos["tool_agent"]
    assert info["role_reward"] == pytest.approx(10.99) and info["moves_solve"] and info["format_ok"]
    assert env.puzzle_state == start and not env.success and info["global_reward"] == 0.0


# ---------------------------------------------------------------- level generation


def test_room_topology_has_walls_all_around():
    floor = room_topology(np.random.default_rng(0), 7, 9, walk_steps=30)
    assert floor.shape == (7, 9) and floor.any()
    assert not floor[[0, -1], :].any() and not floor[:, [0, -1]].any()


def test_200_generated_levels_are_solvable_with_a_box_off_goal():
    lengths = []
    for seed in range(200):
        level, state = generate_level(np.random.default_rng(seed))
        board = render_board(level, state)
        assert (level.rows, level.cols) == (6, 6)
        assert len(level.goals) == len(state.boxes) == 1
        assert not state.boxes <= level.goals, seed
        assert state.player not in state.boxes and not state.boxes & level.walls
        moves = oracles.solve_sokoban(board)
        assert moves, seed
        lengths.append(len(moves))
    assert np.mean(lengths) > 3  # the backward search picks far-pulled boxes, not trivial levels


@pytest.mark.parametrize(("rows", "cols", "num_boxes"), [(5, 5, 1), (7, 7, 2), (8, 6, 2), (9, 9, 3)])
def test_configurable_sizes_play_to_success(rows, cols, num_boxes):
    env = llm_zoo.make("Sokoban-v0", rows=rows, cols=cols, num_boxes=num_boxes)
    for seed in range(3):
        play_episode(env, oracles.sokoban_policy(), seed=seed)
        assert (env.level.rows, env.level.cols, len(env.level.goals)) == (rows, cols, num_boxes)
        assert env.success


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rows": 4}, r"rows must be an integer in \[5, 64\] \(walls included\)"),
        ({"cols": 0}, r"cols must be an integer in \[5, 64\]"),
        ({"num_boxes": 0}, "num_boxes must be an integer >= 1"),
        ({"rows": 5, "cols": 5, "num_boxes": 5}, "do not fit"),
        ({"rows": 6.0}, "rows must be an integer"),
        ({"max_search_states": 0}, "max_search_states"),
        ({"alpha": 1.0, "render_mode": "rgb_array"}, "render_mode"),
    ],
)
def test_bad_parameters_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SokobanEnv(**kwargs)


def test_generation_failure_raises_at_reset():
    env = SokobanEnv(rows=5, cols=6, num_boxes=2, max_search_states=1)  # the search cannot start
    with pytest.raises(ValueError, match="no Sokoban level with 2 boxes in a 5 x 6 room after 100 attempts"):
        env.reset(seed=0)


# ---------------------------------------------------------------- malformed answers


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("import sys; sys.exit(2)", "exit code 2"),
        ("print(sys.stdin.read()", "SyntaxError"),
        ("print('**Actions List**: [\"NORTH\"]')", "move 1 is 'NORTH'"),
    ],
)
def test_tool_programs_that_fail_are_format_errors(source, error):
    env = SokobanEnv()
    env.reset(seed=0)
    start = env.puzzle_state
    env.step(f"```python\n{source}\n```")
    info = env.infos["tool_agent"]
    assert (info["format_ok"], info["role_reward"], info["program_ran"]) == (False, -1.0, True)
    assert error in env.observe("tool_agent")["prompt"]
    assert env.puzzle_state == start


def test_malformed_plan_answer_gets_feedback():
    env = SokobanEnv()
    env.reset(seed=0)
    env.step("skip")
    env.step("push right\n####")
    assert env.infos["plan_agent"]["format_ok"] is False and env.infos["plan_agent"]["role_reward"] == -1.0
    assert env.observe("plan_agent")["prompt"].startswith("Your previous answer could not be used")


def test_1000_random_strings_never_raise(monkeypatch):
    monkeypatch.setattr(grid_agents, "run_python", no_sandbox)  # none holds a complete code block
    rng = np.random.default_rng(1)
    printable = np.array(list(string.printable + "#*[]`@$"))
    noise = ["".join(rng.choice(printable, size=rng.integers(0, 300))) for _ in range(500)]
    env = SokobanEnv()
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


def test_oracle_solves_100_seeds():
    env = llm_zoo.make("Sokoban-v0")
    policy = oracles.sokoban_policy()
    for seed in range(100):
        trace = play_episode(env, policy, seed=seed)
        assert [step[0] for step in trace] == ["tool_agent", "plan_agent"], seed
        (*_, tool_info), (_, plan_prompt, _, plan_reward, plan_info) = trace
        assert env.success and plan_info["success"] and tool_info["moves_solve"]
        moves = oracles.solve_sokoban(oracles.board_from_prompt(plan_prompt))
        # One box, shortest solution: it lands on the goal only with the last push.
        expected = -0.01 * len(moves) + 1.0 + 10.0
        assert plan_info["role_reward"] == pytest.approx(expected), seed
        assert tool_info["role_reward"] == pytest.approx(expected), seed
        assert plan_reward == pytest.approx(expected + 1.0)


def test_tool_agent_solver_program_reads_the_board_from_stdin():
    solver = oracles.tool_answer(oracles.solver_program(oracles.solve_sokoban))

    def policy(agent, prompt):
        if agent == "tool_agent":
            return solver
        moves = re.search(r"Moves read from its output \(\d+\): (\[.*\])", prompt).group(1)
        return f"#### {moves}"

    env = SokobanEnv(rows=7, cols=7, num_boxes=2)
    for seed in range(3):
        trace = play_episode(env, policy, seed=seed)
        assert env.success and len(trace) == 2 and trace[0][4]["program_ran"]


# ---------------------------------------------------------------- prompts, determinism, clones


def test_prompt_shows_board_legend_and_format():
    env = SokobanEnv()
    env.reset(options={"board": TWO_BOXES})
    prompt = env.observe("tool_agent")["prompt"]
    assert f"```text\n{TWO_BOXES}\n```" in prompt
    assert "'$' box" in prompt and "'*' box on a goal" in prompt and "'+' player on a goal" in prompt
    assert '**Actions List**: ["U", "R", "D"]' in prompt and "0 of 2 boxes on goals" in prompt
    env.step("skip")
    assert '#### ["U", "R", "D"]' in env.observe("plan_agent")["prompt"]


def test_same_seed_same_level_and_distinct_task_ids():
    first, second = SokobanEnv(), SokobanEnv()
    first.reset(seed=7)
    second.reset(seed=7)
    assert first.observe("tool_agent") == second.observe("tool_agent") and first.task_id == second.task_id
    ids = set()
    for seed in range(30):
        first.reset(seed=seed)
        ids.add(first.task_id)
    assert len(ids) >= 25  # tiny rooms can repeat a level


def test_clone_branches_do_not_share_state():
    env = SokobanEnv()
    env.reset(options={"board": ONE_PUSH})
    env.step("skip")
    twin = env.clone()
    twin.step('#### ["R"]')
    assert twin.success and not env.success
    assert env.puzzle_state == SokobanState((1, 1), frozenset({(1, 2)}))


def test_render():
    env = SokobanEnv(render_mode="ansi")
    env.reset(options={"board": ONE_PUSH})
    assert ONE_PUSH in env.render() and "0 of 1 box on goals" in env.render()


def test_docstring_example_is_the_real_prompt():
    lines = sokoban.__doc__.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Turn 1 of 3."))
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "```")
    excerpt = "\n".join(line[8:] for line in lines[start : end + 1])
    env = SokobanEnv()
    env.reset(seed=0)
    assert excerpt in env.observe("tool_agent")["prompt"]


# ---------------------------------------------------------------- options for small models


BOARD_ONE_PUSH = "#####\n#@$.#\n#####"


def test_plan_agent_alone_solves_with_the_lenient_parser_on_a_compact_prompt():
    env = llm_zoo.make("Sokoban-v0", agents=("plan_agent",), prompt_style="compact", move_parser="lenient")
    env.reset(seed=0, options={"board": BOARD_ONE_PUSH})
    assert env.agents == ["plan_agent"]
    prompt = env.observe("plan_agent")["prompt"]
    assert "Push every box onto a goal" in prompt and "tool agent" not in prompt
    assert "Rewards per move" not in prompt  # compact: no reward table
    env.step("I walk right.")
    assert env.success and env.infos["plan_agent"]["moves"] == 1


def test_strict_parser_stays_the_default():
    env = llm_zoo.make("Sokoban-v0", agents=("plan_agent",))
    env.reset(seed=0, options={"board": BOARD_ONE_PUSH})
    env.step("I walk right.")
    assert not env.success and env.infos["plan_agent"]["format_ok"] is False


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"agents": ("tool_agent",)}, "agents must be"),
        ({"prompt_style": "tiny"}, "prompt_style must be one of"),
    ],
)
def test_bad_small_model_options_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        llm_zoo.make("Sokoban-v0", **kwargs)


def test_compact_team_passes_check_env():
    check_env(
        "Sokoban-v0", env_kwargs={"rows": 5, "cols": 5, "prompt_style": "compact", "move_parser": "lenient"}
    )
