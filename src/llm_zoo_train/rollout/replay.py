"""The replay engine: serves the completions a run recorded with ``rollout.save_rollouts``.

``rollout.save_rollouts: true`` writes, per step (``-rankR`` per process in multi-process runs):

* ``output_dir/rollouts/step_NNNNNN.jsonl``: the samples (prompt text, adapter, prompt and
  completion token ids, behaviour log-probabilities, finish reason, rewards, advantages);
* ``output_dir/rollouts/step_NNNNNN.generations.jsonl``: every engine call of the rollout, in
  order (prompts, adapters, ``n`` and the completions), written by :class:`GenerationRecorder`.
  It also holds what no sample records: the team-credit look-ahead actions.

:class:`ReplayEngine` plays a recording back: before step N's rollout the trainer calls
:meth:`ReplayEngine.load_step`, and each :meth:`~ReplayEngine.generate` call is answered with the
recorded call of the same position, after checking that it asks for the same prompts, adapters
and ``n``. Without a ``.generations.jsonl`` file (a recording of samples only) each call is
answered from the samples: the next recorded completions of each ``(prompt, adapter)``, in
sampling order - exact whenever every generation became a sample (no team-credit look-ahead).

Everything else in the step is recomputed: the envs are stepped with the recorded texts (so the
rewards, the tree's greedy choice and the advantages are those of the recording), and the update
runs on the live model. With the same config, seed and starting adapters, a replayed step
therefore ends with bit-identical adapters - for regression tests, debugging a step that went
wrong, or comparing an algorithm change on exactly the same samples.

A prompt the recording does not hold (the env, its kwargs or the seed differ), or completions left
unserved at the end of the step (a different ``num_generations``), raise
:class:`ReplayMismatchError` naming the step.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from llm_zoo_train.engines.base import Completion, SamplingParams, check_generate_args
from llm_zoo_train.rollout.samples import read_jsonl

__all__ = ["GenerationRecorder", "ReplayEngine", "ReplayMismatchError", "recorded_step_file"]

GENERATIONS_SUFFIX = ".generations.jsonl"


class ReplayMismatchError(RuntimeError):
    """The rollout asked for something the recording does not hold."""


def recorded_step_file(path: str | Path, step: int, rank: int = 0, num_processes: int = 1) -> Path:
    """The file holding ``step``'s samples of process ``rank`` under ``path`` (a ``rollouts``
    directory, or a single ``.jsonl`` file, which then serves every step)."""
    path = Path(path)
    if path.is_file():
        return path
    suffix = f"-rank{rank}" if num_processes > 1 else ""
    found = path / f"step_{step:06d}{suffix}.jsonl"
    if not found.is_file():
        recorded = sorted(p.name for p in path.glob("step_*.jsonl")) if path.is_dir() else []
        shown = ", ".join(recorded[:5]) + (", ..." if len(recorded) > 5 else "") if recorded else "none"
        raise ReplayMismatchError(
            f"replay: no recording of step {step} ({found.name}) in {path}; recorded: {shown}"
        )
    return found


class GenerationRecorder:
    """Wraps an engine and keeps every :meth:`generate` call with its completions.

    Args:
        engine: The engine that really generates.
    """

    def __init__(self, engine: Any):
        self.engine = engine
        self.calls: list[dict[str, Any]] = []

    def generate(
        self, prompts: Sequence[str], adapters: Sequence[str | None], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        results = self.engine.generate(prompts, adapters, n, sampling)
        self.calls.append(
            {
                "prompts": list(prompts),
                "adapters": list(adapters),
                "n": int(n),
                "completions": [[asdict(c) for c in group] for group in results],
            }
        )
        return results

    def load_adapters(self, paths: Mapping[str, str], version: int) -> None:
        self.engine.load_adapters(paths, version)

    def write(self, path: str | Path) -> None:
        """One JSON line per call, in call order."""
        with open(path, "w", encoding="utf-8") as handle:
            for call in self.calls:
                handle.write(json.dumps(call, ensure_ascii=False) + "\n")


class ReplayEngine:
    """An :class:`~llm_zoo_train.engines.base.Engine` answering from recorded rollouts.

    Args:
        path: A ``rollouts`` directory written by ``rollout.save_rollouts`` or one step's file.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.step: int | None = None
        self._queues: dict[tuple[str, str | None], deque[Completion]] = {}
        self._calls: deque[dict[str, Any]] | None = None  # the recorded calls, when there is a log

    def load_step(self, step: int, rank: int = 0, num_processes: int = 1) -> Path:
        """Serve ``step``'s recording (of process ``rank``) from now on; returns its file."""
        file = recorded_step_file(self.path, step, rank, num_processes)
        self.step, self._queues, self._calls = step, {}, None
        calls_file = file.with_name(file.name.removesuffix(".jsonl") + GENERATIONS_SUFFIX)
        if calls_file.is_file():
            with open(calls_file, encoding="utf-8") as handle:
                self._calls = deque(json.loads(line) for line in handle if line.strip())
            return calls_file
        queues: dict[tuple[str, str | None], deque[Completion]] = {}
        for sample in read_jsonl(file):
            queues.setdefault((sample.prompt, sample.adapter), deque()).append(
                Completion(
                    text=sample.completion,
                    prompt_token_ids=list(sample.prompt_token_ids),
                    token_ids=list(sample.completion_token_ids),
                    logprobs=list(sample.behaviour_logprobs),
                    finish_reason=sample.finish_reason,
                )
            )
        self.step, self._queues = step, queues
        return file

    def generate(
        self, prompts: Sequence[str], adapters: Sequence[str | None], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        """The next ``n`` recorded completions of each ``(prompt, adapter)``; ``sampling`` is not
        used (the recording already is the sample)."""
        check_generate_args(prompts, adapters, n, sampling)
        if self.step is None:
            raise ReplayMismatchError("replay: load_step(step) must be called before generate")
        if self._calls is not None:
            return self._next_call(list(prompts), list(adapters), int(n))
        results = []
        for prompt, adapter in zip(prompts, adapters, strict=True):
            queue = self._queues.get((prompt, adapter))
            if not queue or len(queue) < n:
                have = len(queue) if queue else 0
                raise ReplayMismatchError(
                    f"replay: step {self.step} recorded {have} more completion(s) of adapter {adapter!r} "
                    f"for the prompt {prompt[:60]!r}..., {n} wanted: the env, its kwargs, the seed or "
                    "rollout.num_generations differ from the recorded run"
                )
            results.append([queue.popleft() for _ in range(n)])
        return results

    def _next_call(self, prompts: list[str], adapters: list[str | None], n: int) -> list[list[Completion]]:
        assert self._calls is not None
        if not self._calls:
            raise ReplayMismatchError(
                f"replay: the rollout of step {self.step} makes more engine calls than were recorded: the "
                "env, its kwargs, the seed or the rollout settings differ from the recorded run"
            )
        call = self._calls.popleft()
        if (call["prompts"], call["adapters"], call["n"]) != (prompts, adapters, n):
            first = next(
                (i for i, (a, b) in enumerate(zip(call["prompts"], prompts, strict=False)) if a != b), None
            )
            where = (
                f"prompt {first} {prompts[first][:60]!r}..."
                if first is not None
                else "the adapters, n or count"
            )
            raise ReplayMismatchError(
                f"replay: step {self.step} asks for other generations than recorded ({where} differs): the env, "
                "its kwargs, the seed or rollout.num_generations differ from the recorded run"
            )
        return [[Completion(**c) for c in group] for group in call["completions"]]

    def check_all_served(self) -> None:
        """Raise if the step's recording holds completions the rollout never asked for."""
        if self._calls is not None:
            left = sum(len(g) for call in self._calls for g in call["completions"])
        else:
            left = sum(len(queue) for queue in self._queues.values())
        if left:
            raise ReplayMismatchError(
                f"replay: step {self.step} left {left} recorded completion(s) unused: the rollout "
                "differs from the recorded one (rollout.mode, num_generations or envs_per_step)"
            )

    def load_adapters(self, paths: Mapping[str, str], version: int) -> None:
        """Nothing to load: recorded completions do not depend on the current weights."""
