import io

from llm_zoo import register
from llm_zoo.cli import main
from toy_envs import KeywordEnv

register("test/CliKeyword-v0", KeywordEnv, description="toy env for the CLI tests", override=True)


def run(argv, stdin=""):
    out = io.StringIO()
    code = main(argv, stdin=io.StringIO(stdin), out=out)
    return code, out.getvalue()


def test_list_shows_ids_and_descriptions():
    code, text = run(["list"])
    assert code == 0
    assert "PlanPath-v0" in text and "Math-v0" in text
    assert any(
        line.split() == ["test/CliKeyword-v0", *["toy", "env", "for", "the", "CLI", "tests"]]
        for line in text.splitlines()
    )


def test_play_shows_each_agent_its_prompt_and_takes_multiline_answers():
    answers = "I say\napple\n/end\nbanana\n/end\n"
    code, text = run(["play", "test/CliKeyword-v0", "--seed", "4"], stdin=answers)
    assert code == 0
    assert "=========== alice, turn 1 of 3 ===========" in text
    assert "alice, say the word 'apple'" in text
    assert "bob, say the word 'banana'" in text
    assert "success=True" in text
    assert "episode over after 1 turn(s): success=True" in text


def test_play_quit_and_end_of_input_stop_cleanly():
    assert run(["play", "test/CliKeyword-v0"], stdin="/quit\n")[0] == 0
    code, text = run(["play", "test/CliKeyword-v0", "--env-arg", "max_turns=1"], stdin="x\n/end\n")
    assert code == 0 and "stopped." in text


def test_env_args_are_passed_and_bad_ones_are_clear(capsys):
    code, text = run(["play", "test/CliKeyword-v0", "--env-arg", "max_turns=1"], stdin="x\n/end\ny\n/end\n")
    assert code == 0
    assert "episode over after 1 turn(s)" in text
    assert run(["play", "test/CliKeyword-v0", "--env-arg", "max_turn=1"])[0] == 2
    assert "unknown argument(s) 'max_turn'" in capsys.readouterr().err
    assert run(["check", "Nope-v0"])[0] == 2
    assert "no environment registered with id 'Nope-v0'" in capsys.readouterr().err


def test_check_reports_ok():
    code, text = run(["check", "test/CliKeyword-v0"])
    assert code == 0 and text.startswith("OK test/CliKeyword-v0")
