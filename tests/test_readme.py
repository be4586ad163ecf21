"""The README works as written: its snippets run, its commands parse, its statements match the repository.

Every fenced block of ``README.md`` is run like a docs page block (:mod:`test_docs`): ``python`` and
``bash`` blocks run from an empty directory unless a ``<!-- skip-test: REASON -->`` marker says
why not (they install packages or train for minutes). The training commands of skipped blocks are
still checked with ``--print-config`` (every option and config value valid, no model loaded); the
CI sessions the README lists are the ones ``.ci/run`` runs; the CPU torch install command is the
one ``docs/getting-started.md`` gives.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from test_docs import Block, parse_blocks, run_block
from test_docs import test_doc_block as check_doc_block

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BLOCKS = parse_blocks(README)


def _text() -> str:
    return README.read_text(encoding="utf-8")


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_block_runs_or_says_why_not(block: Block, tmp_path: Path) -> None:
    if "skip-test" in block.markers:
        assert block.markers["skip-test"].strip(), f"{block.id}: skip-test needs a reason"
        pytest.skip(f"{block.id}: {block.markers['skip-test']}")
    if block.lang == "text" and block.markers.get("test") == "output-of-previous":
        check_doc_block(block, tmp_path)  # the shown output must be what the block before prints
        return
    assert block.lang in ("python", "bash"), f"{block.id}: a {block.lang!r} block is neither run nor marked"
    result = run_block(block, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{block.id} failed (exit {result.returncode}):\n{output[-4000:]}"


def test_the_use_an_environment_snippet_is_run() -> None:
    python = [b for b in BLOCKS if b.lang == "python"]
    assert python and all("skip-test" not in b.markers for b in python)
    assert any("llm_zoo.make(" in b.code and "def my_model" in b.code for b in python)


def _train_commands() -> list[list[str]]:
    commands = []
    for block in BLOCKS:
        if block.lang != "bash":
            continue
        for line in block.code.replace("\\\n", " ").split("\n"):
            words = shlex.split(line.split("#", 1)[0])
            if words[:1] == ["llm-zoo-train"] and len(words) > 1 and words[1].endswith(".yaml"):
                commands.append(words[1:])
    return commands


def test_readme_training_commands_have_valid_options(capsys) -> None:
    pytest.importorskip("llm_zoo_train.config", reason="the trainer is not installed")
    from llm_zoo_train.__main__ import main

    commands = _train_commands()
    assert commands, "no `llm-zoo-train CONFIG.yaml ...` command found in the README"
    for args in commands:
        config = REPO / args[0]
        assert config.is_file(), f"the README trains with {args[0]}, which does not exist"
        assert main([str(config), *args[1:], "--print-config"]) == 0, (args, capsys.readouterr().err)
    capsys.readouterr()


def test_readme_names_every_session_ci_runs_and_the_test_command_is_not_called_ci() -> None:
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    sessions = {s for line in re.findall(r"nox -s ([\w ]+)", ci) for s in line.split()}
    assert {"tests", "tests_vllm", "lint", "docs"} <= sessions
    text = _text()
    ci_paragraph = text[text.index("CI (`.ci/run`") :].split("\n\n")[0]
    for session in sessions:
        assert re.search(rf"\b{session}\b", ci_paragraph), (
            f".ci/run runs nox -s {session}; the README does not say so"
        )
    assert "what CI runs" not in text


def test_cpu_torch_install_agrees_with_getting_started_and_says_nothing_machine_specific() -> None:
    command = re.compile(r"pip install torch[^\n`]*--index-url https://download\.pytorch\.org/whl/cpu")
    readme = set(command.findall(_text()))
    guide = set(command.findall((REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")))
    assert readme and readme == guide, (readme, guide)
    assert "these machines" not in _text().lower()


def test_readme_says_how_to_get_the_commands_after_nox_demo() -> None:
    text = _text()
    demo = text.index("nox -s demo")
    train = text.index("## Train")
    assert "source .nox/demo/bin/activate" in text[demo:train]


def test_the_first_example_shows_a_success_and_a_failure(tmp_path: Path) -> None:
    """A newcomer sees what success looks like: the first snippet's scripted episodes print one
    successful and one failed episode, each answer with its reward and feedback."""
    first = next(block for block in BLOCKS if block.lang == "python")
    result = run_block(first, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    right, _, wrong = out.partition("A wrong answer")
    assert "success: True" in right and "success: False" not in right
    assert "success: False" in wrong and "success: True" not in wrong
    assert right.count("feedback: ") == wrong.count("feedback: ") == 2  # tool agent and plan agent
    assert re.search(r"plan_agent: role reward [+-]\d+\.\d{3}, team reward \+1\.0", right)
    # the team's outcome reaches the tool agent's return, though it acted before the plan agent solved
    returns = re.compile(r"returns: tool_agent ([+-]\d+\.\d{3}), plan_agent ([+-]\d+\.\d{3})")
    (tool_right, _), (tool_wrong, _) = returns.search(right).groups(), returns.search(wrong).groups()
    assert float(tool_right) == float(tool_wrong) + 1.0
