import io
import os
import signal
import subprocess
import sys
import time

import pytest

from llm_zoo import register
from llm_zoo.cli import INTERRUPTED_EXIT_CODE, main
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
    assert "-> team success: not yet (bob still to act this turn)" in text
    assert "-> team success: yes" in text
    assert "-> details: said_keyword=True" in text
    assert "episode over in turn 1 of 3: success=True" in text


def test_play_quit_and_end_of_input_stop_cleanly():
    assert run(["play", "test/CliKeyword-v0"], stdin="/quit\n")[0] == 0
    code, text = run(["play", "test/CliKeyword-v0", "--env-arg", "max_turns=1"], stdin="x\n/end\n")
    assert code == 0 and "stopped." in text


def test_env_args_are_passed_and_bad_ones_are_clear(capsys):
    code, text = run(["play", "test/CliKeyword-v0", "--env-arg", "max_turns=1"], stdin="x\n/end\ny\n/end\n")
    assert code == 0
    assert "episode over in turn 1 of 1: success=False" in text
    assert run(["play", "test/CliKeyword-v0", "--env-arg", "max_turn=1"])[0] == 2
    assert "unknown argument(s) 'max_turn'" in capsys.readouterr().err
    assert run(["check", "Nope-v0"])[0] == 2
    assert "no environment registered with id 'Nope-v0'" in capsys.readouterr().err


def test_check_reports_ok():
    code, text = run(["check", "test/CliKeyword-v0"])
    assert code == 0 and text.startswith("OK test/CliKeyword-v0")


def test_header_and_board_count_turns_the_same_way():
    answers = "x\n/end\ny\n/end\nz\n/end\n"
    code, text = run(["play", "test/CliKeyword-v0", "--seed", "1", "--env-arg", "max_turns=2"], stdin=answers)
    assert code == 0
    headers = [line for line in text.splitlines() if line.startswith("=========== ")]
    assert headers == [
        "=========== alice, turn 1 of 2 ===========",
        "=========== bob, turn 1 of 2 ===========",
        "=========== alice, turn 2 of 2 ===========",
        "=========== bob, turn 2 of 2 ===========",
    ]


def test_plan_path_board_and_header_agree_and_the_tool_agent_line_is_honest():
    program = "print('**Actions List**: [\"D\"]')"
    answers = f"```python\n{program}\n```\n/end\nno idea\n/end\n"
    code, text = run(["play", "PlanPath-v0", "--seed", "0", "--env-arg", "max_turns=2"], stdin=answers)
    assert code == 0
    assert "=========== tool_agent, turn 1 of 2 ===========" in text
    assert "PlanPath | turn 1 of 2 |" in text  # the board after the tool agent, same turn
    assert "-> this answer's moves, played from the board it was shown, reach the goal: no" in text
    assert "-> team success: not yet (plan_agent still to act this turn)" in text
    assert "PlanPath | turn 2 of 2 |" in text  # after the plan agent: turn 2 is next
    assert "=========== tool_agent, turn 2 of 2 ===========" in text
    assert "success=False" not in text  # the old line that read as the tool agent's failure


class _InterruptedInput(io.StringIO):
    """Typed input that ends in Ctrl-C (a KeyboardInterrupt while reading the next line)."""

    def __next__(self):
        line = self.readline()
        if not line:
            raise KeyboardInterrupt
        return line


def test_ctrl_c_exits_130_without_a_traceback(capsys):
    out = io.StringIO()
    code = main(["play", "test/CliKeyword-v0"], stdin=_InterruptedInput("apple\n/end\n"), out=out)
    assert code == INTERRUPTED_EXIT_CODE == 130
    assert "bob, turn 1 of 3" in out.getvalue()  # alice's answer was played first
    assert capsys.readouterr().err == "\nllm-zoo: interrupted\n"


def test_end_of_input_with_nothing_typed_stops_cleanly():
    code, text = run(["play", "test/CliKeyword-v0"], stdin="")
    assert code == 0 and text.rstrip().endswith("stopped.")


@pytest.mark.parametrize("piped", ["", "apple\n/end\n"])
def test_piped_input_and_sigint_in_a_real_process(piped):
    """The installed command: piped input ends cleanly (exit 0); SIGINT while waiting for input
    exits 130 with one line on stderr and no traceback."""
    command = [sys.executable, "-m", "llm_zoo.cli", "play", "Math-v0", "--seed", "0"]
    finished = subprocess.run(command, input=piped, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert "Traceback" not in finished.stderr and "stopped." in finished.stdout
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A test run started in the background (nohup, `cmd &` in a script) inherits an ignored
        # SIGINT, and Python then keeps ignoring it: give the command the default disposition.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        seen = ""
        while "--- your answer" not in seen and time.monotonic() < deadline:
            seen += process.stdout.readline()
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
    assert process.returncode == INTERRUPTED_EXIT_CODE, stderr
    assert "Traceback" not in stderr and stderr.strip() == "llm-zoo: interrupted"
