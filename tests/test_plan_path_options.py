"""PlanPath-v0 options for small models: the plan agent alone, compact prompts, the lenient parser."""

from __future__ import annotations

import pytest

import llm_zoo
import oracles
from llm_zoo.envs import grid_agents
from llm_zoo.envs.grid_agents import ToolRun, describe_tool_run, parse_lenient_moves, parse_plan_moves
from llm_zoo.envs.plan_path import PlanPathEnv
from llm_zoo.parsing import ParseError
from llm_zoo.testing import check_env, play_episode

# S at (0, 0), G at (2, 2), a wall in the middle: shortest path 4.
SMALL = "S..\n.#.\n..G"
SOLO = {"agents": ("plan_agent",)}
SMALL_MODEL = {"agents": ("plan_agent",), "prompt_style": "compact", "move_parser": "lenient"}


def no_sandbox(*args, **kwargs):
    raise AssertionError("the sandbox must not run for this answer")


# ---------------------------------------------------------------- every variant passes every check


@pytest.mark.parametrize(
    "options",
    [
        SOLO,
        {"prompt_style": "compact"},
        {"move_parser": "lenient"},
        SMALL_MODEL,
        {"prompt_layout": "fixed_first"},
    ],
    ids=["solo", "compact", "lenient", "solo-compact-lenient", "fixed-first"],
)
def test_check_env_over_the_variants(options):
    check_env(
        "PlanPath-v0",
        env_kwargs={"rows": 4, "cols": 4, **options},
        sample_actions=['#### ["R", "D"]', "no idea", "go down then right", '#### ["U", "L", "L"]'],
        num_cycles=20,
        fuzz_count=60,
    )


def test_defaults_are_unchanged():
    env = llm_zoo.make("PlanPath-v0")
    assert env.possible_agents == ["tool_agent", "plan_agent"]
    assert (env.prompt_style, env.move_parser, env.solo) == ("full", "strict", False)
    assert (env.prompt_layout, env.feedback_last) == ("classic", False)
    env.reset(seed=0)
    env.step("skip")
    env.step("go down and right")  # words without #### [...]: a format error by default
    assert env.infos["plan_agent"]["format_ok"] is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"agents": ("tool_agent",)}, "agents must be"),
        ({"agents": ("plan_agent", "tool_agent")}, "agents must be"),
        ({"agents": "plan_agent"}, "agents must be"),
        ({"prompt_style": "tiny"}, "prompt_style must be one of ['full', 'compact']"),
        ({"move_parser": "loose"}, "move_parser must be one of ['strict', 'lenient']"),
        ({"prompt_layout": "fixed"}, "prompt_layout must be one of ['classic', 'fixed_first']"),
    ],
)
def test_bad_options_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        llm_zoo.make("PlanPath-v0", **kwargs)


# ---------------------------------------------------------------- the fixed text first


def turn_prompts(options: dict, agent: str) -> list[str]:
    """``agent``'s prompts over three turns of unusable answers (feedback from the second on)."""
    env = llm_zoo.make("PlanPath-v0", max_turns=3, **options)
    env.reset(seed=3)
    prompts = []
    for acting in env.agent_iter(max_iter=6):
        _, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.step(None)
            continue
        if acting == agent:
            prompts.append(env.observe(agent)["prompt"])
        env.step("no idea")
    return prompts


def sections(prompt: str) -> list[str]:
    return prompt.split("\n\n")


@pytest.mark.parametrize(
    ("options", "agent"),
    [
        ({}, "tool_agent"),
        ({}, "plan_agent"),
        ({"prompt_style": "compact"}, "tool_agent"),
        ({"prompt_style": "compact"}, "plan_agent"),
        (SOLO, "plan_agent"),
    ],
    ids=["full-tool", "full-plan", "compact-tool", "compact-plan", "solo"],
)
def test_fixed_first_reorders_the_same_sections_and_keeps_a_common_prefix(options, agent):
    classic = turn_prompts(options, agent)
    fixed_first = turn_prompts({**options, "prompt_layout": "fixed_first"}, agent)
    assert len(classic) == len(fixed_first) == 3
    for old, new in zip(classic, fixed_first, strict=True):
        assert sorted(sections(old)) == sorted(sections(new))  # the same text, reordered
    # Later turns: the classic prompt opens with the feedback, the fixed-first one ends with it.
    feedback = sections(classic[1])[0]
    assert feedback.startswith("Your previous answer") and new.endswith(feedback)
    # The fixed text (who, the task, how to answer) opens every turn's prompt, word for word.
    first_turn = sections(fixed_first[0])
    fixed = "\n\n".join(
        first_turn[: next(i for i, s in enumerate(first_turn) if s.startswith(("Turn ", "Current board")))]
    )
    assert len(fixed) > len(fixed_first[0]) // 3
    assert all(prompt.startswith(fixed + "\n\n") for prompt in fixed_first)
    assert not classic[1].startswith(fixed)


# ---------------------------------------------------------------- the plan agent alone


@pytest.mark.parametrize("style", ["full", "compact"])
def test_oracle_solves_50_seeds_alone(style):
    env = llm_zoo.make("PlanPath-v0", agents=("plan_agent",), prompt_style=style)
    policy = oracles.plan_path_policy()
    for seed in range(50):
        trace = play_episode(env, policy, seed=seed)
        assert [step[0] for step in trace] == ["plan_agent"], seed
        (_, prompt, _, reward, info) = trace[0]
        assert env.success and info["success"] and info["format_ok"], seed
        assert "tool agent" not in prompt
        assert info["moves_taken"] == info["shortest_path_length"]
        assert reward == pytest.approx(info["role_reward"] + 1.0)  # alpha 1, global 1


def test_solo_turns_and_truncation():
    env = PlanPathEnv(agents=("plan_agent",), max_turns=2)
    env.reset(options={"board": SMALL})
    assert env.agent_selection == "plan_agent"
    env.step('#### ["L"]')  # into the edge: a valid answer, one failed move
    assert env.turn == 1 and not env.truncations["plan_agent"]
    assert "1 move played (1 failed)" in env.observe("plan_agent")["prompt"]
    env.step('#### ["U"]')
    assert env.turn == 2 and env.truncations["plan_agent"] and not env.success
    env.step(None)
    assert env.agents == []


def test_solo_success_terminates():
    env = PlanPathEnv(agents=("plan_agent",))
    env.reset(options={"board": SMALL})
    env.step('#### ["R", "R", "D", "D"]')
    assert env.success and env.terminations["plan_agent"]
    assert env.infos["plan_agent"]["global_reward"] == 1.0


# ---------------------------------------------------------------- compact prompts


def test_compact_prompts_are_short_and_complete():
    full = PlanPathEnv(rows=4, cols=4)
    compact = PlanPathEnv(rows=4, cols=4, prompt_style="compact")
    for env in (full, compact):
        env.reset(seed=3)
    for agent in ("tool_agent", "plan_agent"):
        short, long = compact.observe(agent)["prompt"], full.observe(agent)["prompt"]
        assert len(short) < len(long) / 2, agent
        board = oracles.board_from_prompt(long)
        assert oracles.board_from_prompt(short) == board
        assert "Position S = " in short and "Rewards per move" not in short
    assert "**Actions List**:" in compact.observe("tool_agent")["prompt"]
    assert '#### ["D", "R"]' in compact.observe("plan_agent")["prompt"]


def test_compact_plan_prompt_shows_the_tool_moves_not_the_program():
    env = PlanPathEnv(prompt_style="compact")
    env.reset(seed=0)
    moves = oracles.solve_grid_path(oracles.board_from_prompt(env.observe("tool_agent")["prompt"]))
    env.step(oracles.tool_answer(oracles.printing_program(moves)))
    prompt = env.observe("plan_agent")["prompt"]
    assert f"suggests these moves: {grid_agents.format_moves(moves)}" in prompt
    assert "print(" not in prompt
    env.step(oracles.plan_answer(moves))
    assert env.success


def test_compact_description_of_failed_tool_runs_carries_no_instructions_for_the_tool_agent():
    """The tool agent's error reads as an instruction ("open with ```python ..."), which a small plan
    agent copies: the compact view of a run without moves is empty (#49)."""
    fence_error = "found a ``` fence but no complete code block: open with ```python on its own line"
    for run in (
        ToolRun(code="x", ran=True, error="it crashed"),
        ToolRun(error=fence_error),
        ToolRun(code="print(1)", ran=True, stdout="1\n", error="no list"),
    ):
        view = describe_tool_run(run, compact=True)
        assert view == ""
    assert fence_error in describe_tool_run(ToolRun(error=fence_error))  # the full view keeps it


def test_compact_plan_prompt_after_an_unusable_tool_answer_is_the_solo_prompt():
    team, solo = (
        PlanPathEnv(prompt_style="compact"),
        PlanPathEnv(prompt_style="compact", agents=("plan_agent",)),
    )
    team.reset(seed=0)
    solo.reset(seed=0)
    team.step("```python\ndef f():\n    return 'D'")  # cut off: no closing fence
    assert team.observe("plan_agent")["prompt"] == solo.observe("plan_agent")["prompt"]


# ---------------------------------------------------------------- the lenient parser


@pytest.mark.parametrize(
    ("text", "moves"),
    [
        ("Go right, then Down, then DOWN.", ["R", "D", "D"]),
        ("moves: R R D", ["R", "R", "D"]),
        ('["R", "D"]', ["R", "D"]),
        ("Up is wrong. #### left, L", ["L", "L"]),  # only what follows the last ####
        ("USA, Dr. Lee, ULDR and upright", []),  # letters inside words do not count
        ("downright", []),
        ("", []),
    ],
)
def test_lenient_moves(text, moves):
    assert parse_lenient_moves(text) == moves


def test_lenient_moves_are_capped():
    assert len(parse_lenient_moves("U " * (grid_agents.MAX_MOVES + 50))) == grid_agents.MAX_MOVES


def test_a_strict_list_wins_over_words():
    assert parse_plan_moves('Going left first? No. #### ["R", "D"]', lenient=True) == ["R", "D"]
    with pytest.raises(ParseError, match="no `####` found"):
        parse_plan_moves("no moves here", lenient=True)
    with pytest.raises(ParseError, match="no `####` found"):
        parse_plan_moves("go right", lenient=False)


def test_lenient_env_plays_words_and_still_penalises_nothing_usable(monkeypatch):
    monkeypatch.setattr(grid_agents, "run_python", no_sandbox)
    env = PlanPathEnv(move_parser="lenient", shaping_lambda=0.0)
    env.reset(options={"board": SMALL})
    env.step("I have no program.")
    assert env.infos["tool_agent"]["format_ok"] is False  # the tool agent is always read strictly
    env.step("I go right, right, down and down.")
    info = env.infos["plan_agent"]
    assert env.success and info["format_ok"] and info["moves_taken"] == 4
    assert info["role_reward"] == pytest.approx(4 * -0.01 + 1.0 + 0.5)

    env.reset(options={"board": SMALL})
    env.step("skip")
    env.step("I cannot tell.")
    info = env.infos["plan_agent"]
    assert (info["format_ok"], info["role_reward"]) == (False, grid_agents.FORMAT_PENALTY)
    assert "no `####` found" in env.observe("plan_agent")["prompt"]


def test_sokoban_keeps_both_agents():
    env = llm_zoo.make("Sokoban-v0")
    assert env.possible_agents == ["tool_agent", "plan_agent"]
    assert (env.prompt_style, env.move_parser) == ("full", "strict")


@pytest.mark.slow
def test_learning_benchmark_quick_run(tmp_path, monkeypatch):
    """``benchmarks/learning_plan_path.py --quick`` trains all three variants and writes its files."""
    import importlib
    import json
    import sys
    from pathlib import Path

    pytest.importorskip("llm_zoo_train.trainer", reason="the trainer is not installed")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    monkeypatch.delitem(sys.modules, "learning_plan_path", raising=False)
    benchmark = importlib.import_module("learning_plan_path")
    benchmark.main(["--quick", "--output-dir", str(tmp_path)])
    result = json.loads((tmp_path / "learning_plan_path.json").read_text())
    assert (tmp_path / "learning_plan_path.png").stat().st_size > 0
    assert set(result["variants"]) == {"per_agent", "shared", "single_agent"}
    per_agent = result["variants"]["per_agent"]
    assert per_agent["role_swap"]["agent_adapters"] == {
        "tool_agent": "plan_agent",
        "plan_agent": "tool_agent",
    }
    assert result["variants"]["single_agent"]["agent_adapters"] == {"plan_agent": "plan_agent"}
    assert result["variants"]["shared"]["before"] is None  # the untrained shared adapter is the base model
    for run in result["variants"].values():
        assert run["after"]["num_episodes"] == 4 and [r["step"] for r in run["history"]][-1] == 1


@pytest.mark.slow
@pytest.mark.parametrize("task", ["plan_path", "sokoban"])
def test_team_benchmark_quick_run_on_the_grid_tasks(task, tmp_path, monkeypatch):
    """``benchmarks/learning_math.py --task plan_path|sokoban`` pairs the team with the plan agent
    alone board by board over seeds, and swaps the grid roles."""
    import importlib
    import json
    import sys
    from pathlib import Path

    pytest.importorskip("llm_zoo_train.trainer", reason="the trainer is not installed")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    monkeypatch.delitem(sys.modules, "learning_math", raising=False)
    benchmark = importlib.import_module("learning_math")
    argv = ["--task", task, "--quick", "--output-dir", str(tmp_path), "--variants", "per_agent,plan_alone"]
    benchmark.main([*argv, "--seeds", "0,1"])
    result = json.loads((tmp_path / f"learning_team_{task}.json").read_text())
    assert set(result["variants"]) == {"per_agent", "plan_alone", "role_swap"}
    assert result["variants"]["role_swap"][0]["agent_adapters"] == {
        "tool_agent": "plan_agent",
        "plan_agent": "tool_agent",
    }
    assert result["variants"]["plan_alone"][0]["agent_adapters"] == {"plan_agent": "plan_agent"}
    assert set(result["befores"]) == {"team", "plan_alone"}
    assert result["befores"]["team"]["solved"].keys() == result["befores"]["plan_alone"]["solved"].keys()
    paired = result["summary"]["comparisons"]["per_agent vs plan_alone"]
    assert paired["pairs"] >= 4 and 0 <= paired["p_value"] <= 1
    assert result["summary"]["verdict"]["best single agent"] == "plan_alone"
    with pytest.raises(SystemExit):  # the grid tasks have no tool agent alone
        benchmark.main(["--task", task, "--quick", "--output-dir", str(tmp_path), "--variants", "tool_alone"])
