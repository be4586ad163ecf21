"""Progress while a run works: bars on a terminal, one plain line per phase otherwise, early first output."""

from __future__ import annotations

import dataclasses
import io
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

import toy_envs_trainer
from llm_zoo_train.engines.base import SamplingParams
from llm_zoo_train.reporting.progress import RunProgress
from llm_zoo_train.rollout.tree import evaluation_rollout, independent_rollout, tree_rollout

TESTS = Path(__file__).parent
ENV = toy_envs_trainer.SCRIPTED_ENV_ID
SAMPLING = SamplingParams(max_tokens=8, temperature=1.0, seed=7)


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=120, highlight=False, soft_wrap=True), out


def _rollout(rollout, engine, k=4, seeds=(1, 2, 3)):
    agents = {"alice": "alice", "bob": "bob"}
    return rollout(ENV, {"max_turns": 2}, list(seeds), engine, agents, k, SAMPLING, np.random.default_rng(0))


@pytest.mark.parametrize("rollout", [tree_rollout, independent_rollout])
def test_watching_a_rollout_changes_nothing_and_counts_episodes(rollout):
    plain = _rollout(rollout, toy_envs_trainer.ScriptedEngine())
    console, out = _console(terminal=False)
    progress = RunProgress(console, total_steps=3)
    tree = rollout is tree_rollout
    episodes = 3 if tree else 3 * 4
    watched = progress.rollout(
        toy_envs_trainer.ScriptedEngine(),
        2,
        episodes,
        mode="tree" if tree else "independent",
        num_generations=4,
    )
    seen = []
    inner_generate = watched.engine.generate

    def recording_generate(prompts, adapters, n, sampling):
        seen.append(watched.phase.completed)
        return inner_generate(prompts, adapters, n, sampling)

    watched.engine.generate = recording_generate
    samples = _rollout(rollout, watched)
    watched.close()
    progress.close()
    assert [dataclasses.asdict(s) for s in samples] == [dataclasses.asdict(s) for s in plain]
    assert seen == sorted(seen) and seen[0] == 0  # episodes done only grows
    calls = watched.engine.calls
    assert watched.completions == sum(len(c.prompts) * c.n for c in calls)  # look-ahead calls too
    assert watched.tokens >= sum(len(s.completion_token_ids) for s in samples) > 0
    if tree:
        assert watched.groups == len({s.group_key for s in samples})  # one group per candidate prompt
    line = out.getvalue().strip()
    assert line.startswith(f"step 2/3 rollout: {episodes}/{episodes} episodes, ")
    assert "completions" in line and "tok/s" in line and "\x1b" not in line and len(line.splitlines()) == 1


def test_evaluation_progress_reaches_every_episode():
    console, out = _console(terminal=False)
    progress = RunProgress(console)
    watched = progress.evaluation(toy_envs_trainer.ScriptedEngine(), 5)
    results = evaluation_rollout(
        ENV, {"max_turns": 2}, [1, 2, 3, 4, 5], watched, {"alice": None, "bob": None}, SAMPLING
    )
    watched.close()
    progress.close()
    assert len(results) == 5 and watched.phase.completed == 5
    assert out.getvalue().startswith("evaluation: 5/5 episodes, ")


def test_plain_lines_per_phase_and_at_intervals_only():
    console, out = _console(terminal=False)
    progress = RunProgress(console, total_steps=2, interval_s=3600.0)
    assert progress.bars is None  # not a terminal: no bar, whatever progress_bar says
    with progress.update(1, "alice") as phase:
        for done in range(1, 6):
            phase(done, 5)
    progress.step_done(1, "success 0%")
    progress.close()
    assert out.getvalue().splitlines() == [out.getvalue().splitlines()[0]]
    assert out.getvalue().startswith("step 1/2 update alice: 5/5 micro-batches, ")
    console, out = _console(terminal=False)
    progress = RunProgress(console, total_steps=2, interval_s=0.0)  # a line at every update
    with progress.update(2, "bob") as phase:
        phase(1, 2)
        phase(2, 2)
    lines = out.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == ["step 2/2 update bob: 1/2 micro-batches"] + [
        "step 2/2 update bob: 2/2 micro-batches"
    ] * 2
    assert lines[0].endswith("so far") and not lines[-1].endswith("so far")


def test_a_long_silent_phase_still_prints_lines():
    """A single engine call of minutes: the background heartbeat prints the phase while it waits."""
    console, out = _console(terminal=False)
    progress = RunProgress(console, interval_s=0.05)
    phase = progress.phase("evaluation", 4, "episodes")
    time.sleep(0.6)  # no update at all, as inside one long generate call
    phase.close()
    progress.close()
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2 and all(line.endswith("s so far") for line in lines[:-1]), lines
    assert lines[0].startswith("evaluation: 0/4 episodes, ") and lines[-1].startswith(
        "evaluation: 0/4 episodes, "
    )
    assert not lines[-1].endswith("so far")
    assert not any(t.name == progress.thread_name for t in threading.enumerate())  # the thread stopped


def test_bars_on_a_terminal():
    console, out = _console(terminal=True)
    progress = RunProgress(console, total_steps=4, done_steps=1)
    assert progress.bars is not None
    with progress.update(2, "alice") as phase:
        phase(3, 4)
        assert [t.description for t in progress.bars.tasks] == ["training", "step 2/4 update alice"]
        assert progress.bars.tasks[1].completed == 3 and progress.bars.tasks[1].total == 4
    assert [t.description for t in progress.bars.tasks] == ["training"]  # the phase bar is gone
    progress.step_done(2, "success 50%")
    assert progress.bars.tasks[0].completed == 2
    progress.close()
    assert "training" in out.getvalue() and "2/4" in out.getvalue()
    off = RunProgress(_console(terminal=True)[0], total_steps=4, bars=False)
    assert off.bars is None  # logging.progress_bar false (TRL: disable_tqdm): plain lines


def test_disabled_progress_prints_nothing():
    progress = RunProgress.disabled()
    watched = progress.evaluation(toy_envs_trainer.ScriptedEngine(), 2)
    evaluation_rollout(ENV, {"max_turns": 1}, [1, 2], watched, {"alice": None, "bob": None}, SAMPLING)
    watched.close()
    with progress.update(1, "a") as phase:
        phase(1, 1)
    progress.print("nothing")
    assert progress.console is None


@pytest.mark.usefixtures("one_torch_thread")
def test_a_training_run_reports_every_phase(tiny_model_dir, tmp_path, capsys):
    pytest.importorskip("peft")
    from llm_zoo_train.trainer import Trainer
    from train_helpers import toy_config

    config = toy_config(
        tiny_model_dir, tmp_path / "run", ["--training.max_steps", "1", "--eval.num_episodes", "2"]
    )
    trainer = Trainer(config)
    seen: list[tuple[str, int, int]] = []
    update = trainer.updater.update

    def recording_update(adapter, samples, progress=None):
        def record(done, total):
            seen.append((adapter, done, total))
            progress(done, total)

        return update(adapter, samples, record)

    trainer.updater.update = recording_update
    trainer.train()
    trainer.close()
    for adapter in ("alice", "bob"):  # each update shows its micro-batches before the first ends
        calls = [(done, total) for name, done, total in seen if name == adapter]
        assert calls[0] == (0, calls[-1][1]) and calls[-1][0] == calls[-1][1] > 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"loading model {tiny_model_dir} ..." and lines[1].startswith("model loaded in ")
    first_eval = next(i for i, line in enumerate(lines) if line.startswith("evaluation: 2/2 episodes, "))
    assert lines[first_eval + 1].startswith("eval success rate before training:")
    # 8 envs x 1 turn of 2 agents (the env's turn, not the 2 engine calls): 16 groups of K=4
    # candidates (and the look-ahead completions)
    rollout = next(
        i
        for i, line in enumerate(lines)
        if line.startswith("step 1/1 rollout: 8/8 episodes, turn 1 of 1 (move 2 of 2), 16 groups, ")
    )
    assert "tok/s" in lines[rollout]
    updates = [line for line in lines if line.startswith("step 1/1 update ")]
    assert [line.split(":")[0] for line in updates] == ["step 1/1 update alice", "step 1/1 update bob"]
    assert all(re.search(r": (\d+)/\1 micro-batches, ", line) for line in updates)
    assert first_eval < rollout < lines.index(updates[0])
    assert sum(line.startswith("evaluation: ") for line in lines) == 2  # before and after training
    # The step's summary line prints when the step ends, before the final evaluation runs.
    step_line = next(i for i, line in enumerate(lines) if line.startswith("step 1 | reward "))
    final_eval = max(i for i, line in enumerate(lines) if line.startswith("evaluation: "))
    assert lines.index(updates[-1]) < step_line < final_eval


def test_the_command_prints_what_it_will_do_before_importing_torch(tiny_model_dir, tmp_path):
    from train_helpers import write_toy_config

    config = write_toy_config(tiny_model_dir, tmp_path / "run", tmp_path / "toy.yaml")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    script = Path(sys.executable).parent / "llm-zoo-train"
    start = time.perf_counter()
    process = subprocess.Popen(
        [str(script) if script.exists() else "llm-zoo-train", str(config), "--training.max_steps", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        seconds = time.perf_counter() - start
        second = process.stdout.readline()
        third = process.stdout.readline()
    finally:
        process.kill()
        process.wait()
    assert (
        first.startswith("llm-zoo-train: test/Scripted-v0 with ") and ", 1 step of 8 envs x K=4 tree" in first
    )
    assert second.startswith("torch threads: ")  # what the run computes with (OMP_NUM_THREADS or chosen)
    assert third.startswith("loading model ")
    assert seconds < 30, f"the first line took {seconds:.1f} s"


class _SlowReportingEngine:
    """Reports tokens while it generates, as the transformers engine does at every decode step."""

    def __init__(self, seen: list[str], phase_of):
        self.seen, self.phase_of = seen, phase_of

    def generate(self, prompts, adapters, n, sampling):
        from llm_zoo_train.engines.base import Completion, report_generated

        self.seen.append(self.phase_of().info)  # the turn shows as the call starts
        for _ in range(3):
            report_generated(len(prompts) * n)
            self.seen.append(self.phase_of().info)
            time.sleep(0.3)  # the display redraws at most every 0.25 s
        report_generated(0, len(prompts) * n)
        return [[Completion("x", [1], [5, 6, 7], [0.0] * 3, "length")] * n for _ in prompts]

    def load_adapters(self, paths, version):
        pass


@pytest.mark.parametrize("terminal", [False, True])
def test_tokens_and_tok_s_move_during_a_generate_call(terminal):
    console, _ = _console(terminal=terminal)
    progress = RunProgress(console, total_steps=1)
    seen: list[str] = []
    holder = {}
    engine = _SlowReportingEngine(seen, lambda: holder["watched"].phase)
    watched = holder["watched"] = progress.rollout(engine, 1, 2, mode="independent", num_generations=1)
    watched.generate(["a", "b"], [None, None], 1, SAMPLING)
    assert seen[0].startswith("turn 1, 0 completions") and seen[0].endswith(", reading 2 prompts")
    assert [re.search(r"([\d,]+) tokens \(\d+ tok/s\)", s).group(1) for s in seen[1:]] == ["2", "4", "6"]
    assert watched.describe().startswith("turn 1, 2 completions, 6 tokens")  # the results' count
    if terminal:
        assert progress.bars.tasks[-1].fields["status"] == watched.describe()
    watched.close()
    progress.close()


class _SlowReadingEngine:
    """Reads two batches of prompts layer by layer, as the transformers engine's hooks report them
    (llm_zoo_train.engines.hf.reading), with decode steps in between."""

    def __init__(self, seen: list[str], phase_of):
        self.seen, self.phase_of = seen, phase_of

    def generate(self, prompts, adapters, n, sampling):
        from llm_zoo_train.engines.base import Completion, report_generated, report_reading

        for _ in range(2):  # two batches: each is read, then decoded
            for layer in (1, 2, 3):
                report_reading(len(prompts), 1097, layer, 3)
                self.seen.append(self.phase_of().info)
                time.sleep(0.3)  # the display redraws at most every 0.25 s
            report_generated(len(prompts) * n)
            self.seen.append(self.phase_of().info)
            time.sleep(0.3)
        return [[Completion("x", [1], [5, 6], [0.0] * 2, "length")] * n for _ in prompts]

    def load_adapters(self, paths, version):
        pass


@pytest.mark.parametrize("terminal", [False, True])
def test_the_layers_of_a_prompt_pass_move_before_and_between_the_tokens(terminal):
    console, out = _console(terminal=terminal)
    progress = RunProgress(console, total_steps=None, interval_s=0)
    seen: list[str] = []
    holder = {}
    engine = _SlowReadingEngine(seen, lambda: holder["watched"].phase)
    watched = holder["watched"] = progress.evaluation(engine, 2)
    watched.generate(["a", "b"], [None, None], 1, SAMPLING)
    reading = [re.search(r"reading.*", s).group(0) if "reading" in s else None for s in seen]
    assert reading == [
        "reading 2 prompts: 2 x 1,097 prompt tokens, layer 1/3",
        "reading 2 prompts: 2 x 1,097 prompt tokens, layer 2/3",
        "reading 2 prompts",  # the pass has ended: the first token comes next
        None,
        "reading 2 x 1,097 prompt tokens, layer 1/3",  # the second batch, after tokens
        "reading 2 x 1,097 prompt tokens, layer 2/3",
        None,
        None,
    ]
    assert "2 tokens" in seen[4]
    assert "reading" not in watched.describe()  # the call has returned
    if not terminal:
        assert "layer 2/3" in out.getvalue()  # plain lines carry the same words
    watched.close()
    progress.close()


def test_vllm_progress_bar_class_counts_finished_requests_and_draws_nothing(capsys):
    """vLLM's LLM.generate(use_tqdm=cls) calls cls(iterable, desc=...) to add requests, then
    cls(total=...), reads format_dict and n, sets postfix, update(n) per finished request."""
    from llm_zoo_train.engines.base import generation_progress
    from llm_zoo_train.engines.vllm.requests import FinishedRequests

    reports: list[tuple[int, int]] = []
    with generation_progress(lambda tokens, done: reports.append((tokens, done))):
        assert list(FinishedRequests([1, 2, 3], desc="Adding requests")) == [1, 2, 3]
        bar = FinishedRequests(total=3, desc="Processed prompts", dynamic_ncols=True, postfix="x")
        assert bar.format_dict["elapsed"] >= 0
        bar.postfix = "est. speed"
        bar.update(2)
        bar.update(1)
        assert bar.n == 3
        bar.refresh()
        bar.close()
    assert reports == [(0, 2), (0, 1)]
    captured = capsys.readouterr()
    assert captured.out == captured.err == ""


def test_the_run_summary_counts_in_words():
    from llm_zoo_train.config import load_config
    from llm_zoo_train.reporting.progress import run_summary

    one = load_config(
        str(TESTS.parent / "examples" / "math_smollm2_cpu.yaml"),
        ["--training.max_steps", "1", "--eval.num_episodes", "1", "--eval.eval_steps", "1"],
    )
    line = run_summary(one)
    assert ", 1 step of " in line and "1 evaluation episode " in line and "every step;" in line
    two = load_config(
        str(TESTS.parent / "examples" / "math_smollm2_cpu.yaml"),
        ["--training.max_steps", "2", "--eval.num_episodes", "2", "--eval.eval_steps", "2"],
    )
    line = run_summary(two)
    assert ", 2 steps of " in line and "2 evaluation episodes " in line and "every 2 steps;" in line


class NoAnswers:
    """An engine that answers every prompt with no completion (progress counts only the calls)."""

    def generate(self, prompts, adapters, n, sampling):
        return [[] for _ in prompts]


def test_the_turn_shown_is_the_envs_not_the_count_of_engine_calls():
    """Issue 54: the rollout line said "turn 2" with max_turns 1 (two agents, two engine calls)."""

    console, _ = _console(terminal=False)
    progress = RunProgress(console, interval_s=0)
    watched = progress.rollout(
        NoAnswers(), 1, 3, mode="tree", num_generations=2, agents_per_turn=2, max_turns=5
    )
    descriptions = []
    for _ in range(3):
        watched.generate(["a", "b", "c"], [None] * 3, 2, SAMPLING)
        descriptions.append(watched.describe().split(",")[0])
    assert descriptions == [
        "turn 1 of 5 (move 1 of 2)",
        "turn 1 of 5 (move 2 of 2)",
        "turn 2 of 5 (move 1 of 2)",
    ]
    watched.close()
    alone = progress.evaluation(NoAnswers(), 1)
    alone.generate(["a"], [None], 1, SAMPLING)
    assert alone.describe().startswith("turn 1,")
    alone.close()
    progress.close()


def test_the_training_clock_starts_with_the_first_rollout_not_the_evaluation_before_it():
    """Issue 54: the training bar's clock ran through the evaluation before training."""
    console, _ = _console(terminal=True)
    progress = RunProgress(console, total_steps=2)
    training = progress.bars.tasks[0]
    evaluation = progress.evaluation(object(), 2)
    evaluation.close()
    assert training.start_time is None  # the clock has not started
    watched = progress.rollout(object(), 1, 2, mode="tree", num_generations=2)
    assert training.start_time is not None
    watched.close()
    progress.close()


def test_the_run_summary_names_the_processes_and_the_env_servers(monkeypatch):
    """Issue 54: a 2-process torchrun run and an env.servers run never said so."""
    from llm_zoo_train.config import load_config
    from llm_zoo_train.reporting.progress import run_summary

    config = load_config(
        str(TESTS.parent / "examples" / "math_smollm2_cpu.yaml"),
        ["--env.servers", "[http://127.0.0.1:8001, http://127.0.0.1:8002]"],
    )
    monkeypatch.setenv("WORLD_SIZE", "2")
    line = run_summary(config)
    per_process = config.rollout.envs_per_step
    assert f"of {2 * per_process} envs (2 processes x {per_process}, ddp) x K=" in line
    assert "envs on 2 remote env servers (http://127.0.0.1:8001, http://127.0.0.1:8002)" in line
    config.training.strategy = "fsdp2"  # issue 55: the header says the strategy
    assert f"(2 processes x {per_process}, fsdp2 fully sharded) x K=" in run_summary(config)
    config.training.fsdp_sharding = "no_shard"
    assert f"(2 processes x {per_process}, fsdp2 not sharded (no_shard)) x K=" in run_summary(config)
    monkeypatch.delenv("WORLD_SIZE")
    assert (
        f"of {per_process} envs x K={config.rollout.num_generations} tree rollouts on 1 trainer process, "
        in run_summary(config)
    )
    config.env.servers = []
    assert "trainer process, envs played in the trainer, " in run_summary(config)


def test_the_rollout_bar_moves_a_move_at_a_time():
    """Issue 54: the episode bar sat at 0/8 for the whole rollout (episodes end at their last move)."""

    console, _ = _console(terminal=True)
    progress = RunProgress(console, total_steps=1)
    watched = progress.rollout(
        NoAnswers(), 1, 4, mode="tree", num_generations=2, agents_per_turn=2, max_turns=2
    )
    bar = progress.bars.tasks[1]
    shown = []
    for _ in range(4):  # 2 turns of 2 agents, every episode running to the end
        watched.generate(["p"] * 4, [None] * 4, 2, SAMPLING)
        shown.append(bar.completed)
    assert shown == [1.0, 2.0, 3.0, 4.0] and watched.phase.completed == 0  # the count of ended episodes
    watched.close()
    assert watched.phase.completed == 4
    progress.close()
