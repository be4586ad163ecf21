"""Progress on the console while a run works: bars on a terminal, plain lines when not.

A training step has three long phases - the rollout, the update of each adapter and, on some
steps, the evaluation - and each can take minutes on a CPU. :class:`RunProgress` shows each as it
runs:

* on a terminal (with ``logging.progress_bar``): rich bars, the run's steps and below it the phase
  at work (episodes done, groups, completions and tokens/s; micro-batches of an update);
* otherwise (output redirected to a file or a pipe, or ``progress_bar: false``): one plain line
  when a phase ends, and a line every ``interval_s`` seconds while a long phase runs (from a
  background thread, so a single generate call of minutes still shows the run is alive), never
  the terminal's bar redraws.

Rollouts and evaluations are followed through the engine they generate with
(:meth:`RunProgress.rollout`, :meth:`RunProgress.evaluation`): the wrapper passes every call through
unchanged - same arguments, same results, so the rollout is the one it would be without progress -
and counts what it sees. During a call it also counts what the engine reports as it generates
(:func:`llm_zoo_train.engines.base.generation_progress`: the transformers engine reports every
decode step's tokens and the answers that end, the vLLM engines their finished requests), so the
tokens and tok/s move while the model generates, and while it reads the prompts before a batch's
first token the decoder layers the prompt pass has run move (``reading 64 prompts: 32 x 1,097
prompt tokens, layer 12/30``, :mod:`llm_zoo_train.engines.hf.reading`), although all
episodes of a batch end together at the last turn. Rollouts make one engine call per turn for
every live episode, with ``n = K`` candidates in tree mode (a look-ahead call has ``n = 1``), so the prompts of a call with
the episodes' ``n`` are the episodes still running; an episode counts as done once no call asks
for it. An update reports its micro-batches through the ``progress`` callback of
:meth:`llm_zoo_train.training.update.AdapterUpdater.update`.

:func:`run_summary` is the line the command line prints before it imports torch or loads a model.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from llm_zoo_train.config import Config
from llm_zoo_train.engines.base import generation_progress

#: Seconds between two redraws from an engine's live reports (a decode step can take milliseconds).
_REDRAW_S = 0.25

__all__ = ["Phase", "RunProgress", "WatchedEngine", "plural", "run_summary", "turn_limit"]


def plural(count: int, noun: str) -> str:
    """``1 step``, ``2 steps``, ``0 steps``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def turn_limit(env_kwargs: Mapping[str, Any]) -> int | None:
    """The ``max_turns`` (or PettingZoo's ``max_cycles``) an env is made with, when the config
    gives one (None: the env's own default, not known here)."""
    for key in ("max_turns", "max_cycles"):
        value = env_kwargs.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def launched_processes() -> int:
    """How many trainer processes the launcher started (``WORLD_SIZE`` of torchrun and
    ``accelerate launch``; 1 without one), read before torch or accelerate is imported."""
    value = os.environ.get("WORLD_SIZE", "1")
    return int(value) if value.isdigit() and int(value) > 0 else 1


_SHARDING_WORDS = {"full": "fully sharded", "no_shard": "not sharded (no_shard)"}


def run_summary(config: Config, processes: int | None = None) -> str:
    """One line saying what the run will do (printed within a second of the command): the env,
    the models, the steps, the trainer processes and envs per step across them, the remote env
    servers, the evaluations and the output directory."""
    r, t, e = config.rollout, config.training, config.eval
    processes = launched_processes() if processes is None else processes
    evaluation = plural(e.num_episodes, "evaluation episode") + (
        " before and after" if e.eval_on_start else " after training"
    )
    if e.eval_steps:
        evaluation += " and every step" if e.eval_steps == 1 else f" and every {e.eval_steps} steps"
    models = config.model.name_or_path
    extra = config.agents.models  # agents.models: more base models, each overriding `model`
    if extra:
        names = (f"{name}={spec.get('name_or_path', models)}" for name, spec in extra.items())
        models += f" and {', '.join(names)}"
    envs = f"{r.envs_per_step} envs"
    if processes > 1:  # envs_per_step is per process
        strategy = {"ddp": "ddp", "fsdp2": f"fsdp2 {_SHARDING_WORDS[t.fsdp_sharding]}"}[t.strategy]
        envs = f"{processes * r.envs_per_step} envs ({processes} processes x {r.envs_per_step}, {strategy})"
    servers = config.env.servers
    where = (
        f", envs on {plural(len(servers), 'remote env server')} ({', '.join(servers)})"
        if servers
        else ", envs played in the trainer"
    )
    return (
        f"llm-zoo-train: {config.env.id} with {models} ({r.engine} engine), "
        f"{plural(t.max_steps, 'step')} of {envs} x K={r.num_generations} {r.mode} rollouts"
        f"{' on 1 trainer process' if processes == 1 else ''}{where}, "
        f"{evaluation}; output {t.output_dir}"
    )


class Phase:
    """One phase at work: ``completed`` of ``total`` ``unit`` plus a free-form ``info`` text."""

    def __init__(self, owner: RunProgress, name: str, total: int | None, unit: str):
        self.owner, self.name, self.total, self.unit = owner, name, total, unit
        self.completed = 0
        #: Where the bar stands (a fraction of ``total``): ``completed``, or more while the units
        #: are part done (the episodes of a rollout, a move at a time).
        self.bar_progress = 0.0
        self.info = ""
        self.start = time.perf_counter()
        self._last_line = self.start
        self._task: Any = None
        self.closed = False
        if owner.bars is not None:
            self._task = owner.bars.add_task(name, total=total, completed=0, status="")
        owner.opened(self)

    def update(
        self,
        completed: int | None = None,
        *,
        total: int | None = None,
        info: str | None = None,
        bar_progress: float | None = None,
    ) -> None:
        """Record progress; redraws the bar, or prints a line if ``interval_s`` passed since the last.
        ``bar_progress`` moves the bar past ``completed`` while units are part done."""
        if completed is not None:
            self.completed = completed
        if total is not None:
            self.total = total
        if info is not None:
            self.info = info
        if bar_progress is not None:
            self.bar_progress = max(self.bar_progress, bar_progress)
        owner = self.owner
        if owner.bars is not None:
            shown = max(float(self.completed), self.bar_progress)
            owner.bars.update(self._task, completed=shown, total=self.total, status=self.info)
        else:
            self.heartbeat()

    def heartbeat(self) -> None:
        """Print the running line if ``interval_s`` passed since this phase's last line (plain mode)."""
        owner = self.owner
        with owner.lock:
            if self.closed or not owner.enabled or owner.bars is not None:
                return
            if time.perf_counter() - self._last_line >= owner.interval_s:
                owner.print(self.line(running=True))
                self._last_line = time.perf_counter()

    def line(self, *, running: bool = False) -> str:
        """E.g. ``step 3/20 rollout: 5/8 episodes, 40 groups, 3,200 tokens (210 tok/s), 15.2 s``."""
        count = f"{self.completed}/{self.total}" if self.total is not None else f"{self.completed}"
        parts = [f"{self.name}: {count} {self.unit}"]
        if self.info:
            parts.append(self.info)
        parts.append(f"{time.perf_counter() - self.start:.1f} s" + (" so far" if running else ""))
        return ", ".join(parts)

    def close(self) -> None:
        """End the phase: the bar goes, or its line is printed."""
        with self.owner.lock:
            if self.closed:
                return
            self.closed = True
            if self.owner.bars is not None:
                self.owner.bars.remove_task(self._task)
            elif self.owner.enabled:
                self.owner.print(self.line())
        self.owner.closed(self)

    def __enter__(self) -> Phase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, done: int, total: int) -> None:
        """The ``progress(done, total)`` callback form (e.g. micro-batches of an update)."""
        self.update(done, total=total)


class WatchedEngine:
    """An engine that reports the progress of one rollout or evaluation to a :class:`Phase`.

    Every ``generate`` call goes to ``engine`` unchanged; its result is returned unchanged. Other
    attributes are the engine's own.

    Args:
        engine: The engine that generates.
        phase: Where progress goes (its ``total`` is the number of episodes).
        episode_n: The ``n`` of the calls that advance episodes: K for tree rollouts, 1 otherwise.
        count_groups: Count the prompts of those calls as groups (tree rollouts: one group each).
        agents_per_turn: Agents that act in one turn of the env: each calls the engine once (one
            *agent move*), so the turn shown is the env's, not the count of calls.
        max_turns: The env's turn limit, shown as ``turn t of T`` (None: unknown, ``turn t``).
    """

    def __init__(
        self,
        engine: Any,
        phase: Phase,
        *,
        episode_n: int,
        count_groups: bool,
        agents_per_turn: int = 1,
        max_turns: int | None = None,
    ):
        self.engine = engine
        self.phase = phase
        self.episode_n = episode_n
        self.count_groups = count_groups
        self.agents_per_turn = max(1, agents_per_turn)
        self.max_turns = max_turns
        #: Calls that advanced the episodes: one agent move of every running episode each.
        self.moves = 0
        self.groups = self.completions = self.tokens = 0
        self.generation_seconds = 0.0
        #: Tokens and completions the engine has reported in the call now running.
        self._live_tokens = self._live_completions = 0
        self._call_start: float | None = None
        self._call_prompts = 0
        self._last_draw = 0.0
        #: The prompt pass now running, as the engine reports it: (rows, positions, layers done, layers).
        self._reading: tuple[int, int, int, int] | None = None

    def generate(self, prompts: Sequence[str], adapters: Sequence[str | None], n: int, sampling: Any) -> Any:
        if n == self.episode_n and self.phase.total is not None:
            # The prompts of this call are the episodes still running (one per live episode).
            self.phase.completed = max(self.phase.completed, self.phase.total - len(prompts))
            self.groups += len(prompts) if self.count_groups else 0
            self.moves += 1
        self._call_start = time.perf_counter()
        self._call_prompts = len(prompts)
        self._last_draw = 0.0
        self.phase.update(info=self.describe())  # the turn shows as it starts, not when it ends
        try:
            with generation_progress(self._generated, reading=self._read):
                results = self.engine.generate(prompts, adapters, n, sampling)
        finally:
            self.generation_seconds += time.perf_counter() - self._call_start
            self._call_start = None
            self._live_tokens = self._live_completions = 0
            self._reading = None
        # The results' own counts replace the live ones (exact, whatever the engine reported).
        self.completions += sum(len(group) for group in results)
        self.tokens += sum(len(c.token_ids) for group in results for c in group)
        self.phase.update(info=self.describe(), bar_progress=self._bar_progress(n, len(prompts)))
        return results

    def _bar_progress(self, n: int, live: int) -> float | None:
        """Episodes done plus the running ones' share of their moves, once a call that advanced
        them returned (the episodes of a batch end together, at their last move: without this
        the bar would stand still for the whole rollout). ``None`` without a known turn limit."""
        if n != self.episode_n or self.phase.total is None or not self.max_turns:
            return None
        done = self.phase.total - live
        return done + live * min(1.0, self.moves / (self.max_turns * self.agents_per_turn))

    def _generated(self, tokens: int, completions: int) -> None:
        """The engine's live report during a call; redraws at most every ``_REDRAW_S`` seconds."""
        self._live_tokens += tokens
        self._live_completions += completions
        self._redraw()

    def _read(self, rows: int, positions: int, layers_done: int, layers: int) -> None:
        """The engine's report from a prompt pass: ``layers_done`` of ``layers`` decoder layers
        have read ``rows`` prompts of ``positions`` tokens."""
        self._reading = (rows, positions, layers_done, layers) if layers_done < layers else None
        self._redraw()

    def _redraw(self) -> None:
        now = time.perf_counter()
        if now - self._last_draw >= _REDRAW_S:
            self._last_draw = now
            self.phase.update(info=self.describe())

    @property
    def turn(self) -> int:
        """The env's turn of the latest agent move (from 1; 0 before the first)."""
        return -(-self.moves // self.agents_per_turn)

    def describe(self) -> str:
        """E.g. ``turn 2 of 3 (move 2 of 2), 24 groups, 96 completions, 3,200 tokens (210 tok/s)``:
        the env's turn (every agent acting once), and with several agents which agent move of the
        turn is running (one engine call for every running episode). During a call the counts
        include what the engine has reported so far."""
        turn = f"turn {self.turn}" + (f" of {self.max_turns}" if self.max_turns else "")
        if self.agents_per_turn > 1 and self.moves:
            turn += f" (move {(self.moves - 1) % self.agents_per_turn + 1} of {self.agents_per_turn})"
        parts = [turn]
        if self.count_groups:
            parts.append(f"{self.groups} groups")
        parts.append(f"{self.completions + self._live_completions} completions")
        tokens = self.tokens + self._live_tokens
        seconds = self.generation_seconds
        if self._call_start is not None:
            seconds += time.perf_counter() - self._call_start
        if tokens or self._call_start is not None:
            rate = tokens / seconds if seconds > 0 else 0.0
            parts.append(f"{tokens:,} tokens ({rate:.0f} tok/s)")
        if self._call_start is not None:
            # Before a call's first token the model reads the prompts (one long forward pass on a
            # CPU), and again before each later batch: the engine may report its layers.
            reading = f"reading {self._call_prompts} prompts" if not self._live_tokens else ""
            if self._reading is not None:
                rows, positions, done, layers = self._reading
                reading += ": " if reading else "reading "
                reading += f"{rows} x {positions:,} prompt tokens, layer {done}/{layers}"
            if reading:
                parts.append(reading)
        return ", ".join(parts)

    def close(self) -> None:
        """The rollout returned: every episode is done."""
        if self.phase.total is not None:
            self.phase.completed = self.phase.total
        self.phase.update(info=self.describe())
        self.phase.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


class RunProgress:
    """The console progress of a run (see the module docstring).

    Args:
        console: A ``rich.console.Console`` (None: a new one on stdout, or stderr with ``stderr``).
        total_steps: Steps of the run (None: no step bar, e.g. ``llm-zoo-train eval``).
        done_steps: Steps already done (a resumed run).
        bars: Show bars when ``console`` is a terminal (``logging.progress_bar``).
        enabled: Show anything at all (False on all but the main process).
        interval_s: Seconds between the plain lines of a long phase (0: a line at every update, no
            background thread).
        stderr: Write to stderr instead of stdout (when ``console`` is None).
    """

    def __init__(
        self,
        console: Any = None,
        *,
        total_steps: int | None = None,
        done_steps: int = 0,
        bars: bool = True,
        enabled: bool = True,
        interval_s: float = 30.0,
        stderr: bool = False,
    ):
        self.enabled = enabled
        self.interval_s = interval_s
        self.total_steps = total_steps
        self.bars: Any = None
        self._step_task: Any = None
        #: Serialises the phases' lines with the heartbeat thread's.
        self.lock = threading.RLock()
        self._open: list[Phase] = []
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None
        #: Name of the heartbeat thread (plain mode), one per instance.
        self.thread_name = f"llm-zoo-progress-{id(self):x}"
        if not enabled:
            self.console = None
            return
        if console is None:
            from rich.console import Console

            console = Console(highlight=False, soft_wrap=True, stderr=stderr)
        self.console = console
        if bars and console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bars = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[status]}"),
                console=console,
                transient=False,
            )
            if total_steps is not None:
                self._step_task = self.bars.add_task(
                    "training", total=total_steps, completed=done_steps, status="", start=False
                )
            self.bars.start()

    @classmethod
    def disabled(cls) -> RunProgress:
        """Shows nothing (a trainer used from Python without :meth:`Trainer.train`)."""
        return cls(enabled=False)

    def print(self, text: str) -> None:
        """A line on the console (above the bars)."""
        if self.console is not None:
            self.console.print(text)

    def phase(self, name: str, total: int | None, unit: str) -> Phase:
        return Phase(self, name, total, unit)

    def opened(self, phase: Phase) -> None:
        """A phase started: in plain mode, make sure the heartbeat thread runs."""
        with self.lock:
            self._open.append(phase)
            if self.enabled and self.bars is None and self.interval_s > 0 and self._beater is None:
                self._beater = threading.Thread(target=self._beat, name=self.thread_name, daemon=True)
                self._beater.start()

    def closed(self, phase: Phase) -> None:
        with self.lock:
            if phase in self._open:
                self._open.remove(phase)

    def _beat(self) -> None:
        while not self._stop.wait(min(self.interval_s, 5.0)):
            with self.lock:
                current = self._open[-1] if self._open else None
            if current is not None:
                current.heartbeat()

    def _step_name(self, step: int) -> str:
        return f"step {step}/{self.total_steps}" if self.total_steps is not None else f"step {step}"

    def rollout(
        self,
        engine: Any,
        step: int,
        episodes: int,
        *,
        mode: str,
        num_generations: int,
        agents_per_turn: int = 1,
        max_turns: int | None = None,
    ) -> WatchedEngine:
        """``engine`` watched through step ``step``'s rollout of ``episodes`` episodes; call
        :meth:`WatchedEngine.close` when the rollout returns."""
        tree = mode == "tree"
        if self.bars is not None and self._step_task is not None:
            # the training clock runs from the first rollout, not from an evaluation before it
            self.bars.start_task(self._step_task)
        phase = self.phase(f"{self._step_name(step)} rollout", episodes, "episodes")
        return WatchedEngine(
            engine, phase, episode_n=num_generations if tree else 1, count_groups=tree,
            agents_per_turn=agents_per_turn, max_turns=max_turns,
        )  # fmt: skip

    def evaluation(
        self,
        engine: Any,
        episodes: int,
        name: str = "evaluation",
        *,
        agents_per_turn: int = 1,
        max_turns: int | None = None,
    ) -> WatchedEngine:
        """``engine`` watched through an evaluation of ``episodes`` episodes (one per seed)."""
        return WatchedEngine(
            engine, self.phase(name, episodes, "episodes"), episode_n=1, count_groups=False,
            agents_per_turn=agents_per_turn, max_turns=max_turns,
        )  # fmt: skip

    def update(self, step: int, adapter: str) -> Phase:
        """The phase of adapter ``adapter``'s update; pass it as the updater's ``progress``."""
        return self.phase(f"{self._step_name(step)} update {adapter}", None, "micro-batches")

    def step_done(self, step: int, status: str) -> None:
        if self.bars is not None and self._step_task is not None:
            self.bars.update(self._step_task, completed=step, status=status)

    def close(self) -> None:
        self._stop.set()
        if self._beater is not None:
            self._beater.join(timeout=10)
            self._beater = None
        if self.bars is not None:
            self.bars.stop()
            self.bars = None
