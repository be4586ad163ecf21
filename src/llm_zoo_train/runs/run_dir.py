"""The output directory of a run: a new run never clobbers an earlier one, ``--resume`` continues
only the run that wrote the checkpoint.

* :func:`start_run` is called before the model loads. It takes the directory's lock
  (:mod:`llm_zoo_train.runs.lock`: a second live run into the same directory is refused), then
  :func:`prepare_output_dir` removes temporary directories a killed checkpoint write left behind
  (``.tmp-checkpoint-*``, ``.old-checkpoint-*``) and refuses a *new* run into a directory that
  already holds files, unless ``training.overwrite_output_dir`` is true.
* :func:`begin_run` is called once the config, the env *and the model* are known to work (a
  mistyped model path leaves the earlier run intact). With ``overwrite_output_dir`` it deletes the
  earlier run's outputs (checkpoints, ``config.yaml``, ``metrics.jsonl``, adapters, plot, rollouts,
  tracker logs), so nothing stale - an old ``checkpoint-4`` beside the new ``checkpoint-1`` - is
  left for ``--resume`` to pick up; then it writes the run's ``config.yaml``, so an interrupted
  run can be inspected and evaluated before its first checkpoint.
* :func:`check_resume` compares a checkpoint's saved configuration with the one the run resumes
  with. Only settings that do not change what the run is may differ (:data:`RESUMABLE_KEYS`: the
  step budget, where and how often things are saved, evaluation, logging, engine options);
  anything else - model, env, agents, LoRA, rollout sampling, algorithm, optimiser, seed - is
  refused naming each differing key, because the result would be neither the old run nor a new one.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llm_zoo_train.config import Config, ConfigError, config_from_dict, config_to_dict, save_config
from llm_zoo_train.runs.checkpoint import (
    CHECKPOINT_PREFIX,
    changed_keys,
    read_trainer_state,
    write_checkpoint,
)
from llm_zoo_train.runs.finite import check_finite_weights
from llm_zoo_train.runs.launch_check import process_count_warning
from llm_zoo_train.runs.lock import LOCK_NAME, RunLock

__all__ = [
    "RESUMABLE_KEYS",
    "ResumePoint",
    "begin_run",
    "check_resume",
    "complete_finished_run",
    "output_dir_problem",
    "prepare_output_dir",
    "remove_path",
    "remove_stale_temporaries",
    "restore_final_adapters",
    "run_outputs",
    "save_final_adapters",
    "start_run",
    "step_evaluated",
]

#: Temporary siblings of a checkpoint being written or replaced (checkpoint.write_checkpoint).
STALE_PREFIXES = (
    f".tmp-{CHECKPOINT_PREFIX}",
    f".old-{CHECKPOINT_PREFIX}",
    ".tmp-adapters-",
    ".old-adapters-",
)
#: Files and directories a run writes into its output directory (besides checkpoint-STEP/).
RUN_OUTPUT_NAMES = (
    "config.yaml",
    "metrics.jsonl",
    "adapters",
    "learning_curve.png",
    "rollouts",
    "engine_adapters",
    "eval",
)

#: Config keys (a dotted key, or a section/prefix ending in ".") that may differ between a
#: checkpoint and the run resuming it: they change how long the run goes and what it records,
#: not what it trains (tests/test_checkpoint.py resumes with each changed and compares the
#: adapters bit for bit with an uninterrupted run). Not resumable, though they looked harmless:
#: ``rollout.max_rows_per_generate_call`` (the rows of one generation call change the batched
#: products' rounding, hence the samples and the adapters: measured, issue 53 D8) and ``vllm.*``
#: (its batching and memory settings do the same on a GPU). ``training.strategy`` and
#: ``fsdp_sharding`` are resumable because a checkpoint holds whole tensors under both: the
#: state is restored exactly, and the steps after it round as the new strategy does (the resume
#: says so: llm_zoo_train.trainer_state).
RESUMABLE_KEYS = (
    "training.max_steps",
    "training.strategy",
    "training.fsdp_sharding",
    "training.output_dir",
    "training.overwrite_output_dir",
    "training.save_steps",
    "training.save_total_limit",
    "training.keep_freed_memory",
    "rollout.save_rollouts",
    "model.cache_dir",
    "eval.",
    "logging.",
)


def remove_stale_temporaries(output_dir: str | Path) -> list[Path]:
    """Delete what an interrupted checkpoint write left in ``output_dir``; returns the paths."""
    directory = Path(output_dir)
    if not directory.is_dir():
        return []
    stale = [p for p in directory.iterdir() if p.name.startswith(STALE_PREFIXES)]
    for path in stale:
        remove_path(path)
    return stale


def remove_path(path: Path) -> None:
    """Delete ``path``: a directory with what it holds, a file, or a symbolic link itself (never
    what it points to)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def output_dir_problem(output_dir: str | Path) -> str | None:
    """Why ``training.output_dir`` cannot hold a run (a symbolic link that dangles or loops, a link
    to a file, a file), or ``None``; a link to a directory is followed."""
    path = Path(output_dir)
    if path.is_symlink():
        try:
            target = path.resolve(strict=True)
        except (OSError, RuntimeError) as err:  # RuntimeError: a loop, on some Python versions
            why = (
                "loops"
                if "loop" in str(err).lower() or getattr(err, "errno", None) == 40
                else "points to nothing"
            )
            return f"training.output_dir {path} is a symbolic link that {why} ({os.readlink(path)})"
        if not target.is_dir():
            return f"training.output_dir {path} is a symbolic link to {target}, which is not a directory"
        return None
    if path.exists() and not path.is_dir():
        return f"training.output_dir {path} is a file, not a directory"
    return None


def run_outputs(output_dir: str | Path, project_name: str | None = None) -> list[Path]:
    """The outputs of a run found in ``output_dir``: checkpoints, metrics, adapters, plot, rollouts,
    evaluation results and the tracker directory ``project_name``."""
    directory = Path(output_dir)
    if not directory.is_dir():
        return []
    names = set(RUN_OUTPUT_NAMES) | ({project_name} if project_name else set())
    return sorted(p for p in directory.iterdir() if p.name in names or p.name.startswith(CHECKPOINT_PREFIX))


def prepare_output_dir(config: Config, *, resuming: bool, remove: bool = True) -> list[str]:
    """Make ``training.output_dir`` ready for this run (see the module docstring).

    Args:
        config: The run's configuration.
        resuming: The run continues from a checkpoint (the directory may hold its earlier files).
        remove: Delete stale temporaries and, with ``overwrite_output_dir``, the earlier run's
            outputs. In a multi-process run only the main process removes; every process checks.

    Returns notes to print (what was removed). Raises :class:`ConfigError` when a new run would
    write into a directory that already holds files and ``training.overwrite_output_dir`` is off.
    """
    output_dir = Path(config.training.output_dir)
    stale = remove_stale_temporaries(output_dir) if remove else []
    notes = [f"removed an unfinished write (checkpoint or adapters): {p}" for p in stale]
    if resuming or not output_dir.is_dir():
        return notes
    present = sorted(
        p.name for p in output_dir.iterdir() if not p.name.startswith(STALE_PREFIXES) and p.name != LOCK_NAME
    )
    if not present:
        return notes
    if not config.training.overwrite_output_dir:
        shown = ", ".join(present[:4]) + (", ..." if len(present) > 4 else "")
        if not any(name.startswith(CHECKPOINT_PREFIX) for name in present):
            # --resume would find nothing to continue from: never send the user there
            raise ConfigError(
                f"training.output_dir {output_dir} holds an earlier run that stopped before its first "
                f"checkpoint ({shown}): start again there with --training.overwrite_output_dir true, "
                "or choose another --training.output_dir"
            )
        raise ConfigError(
            f"training.output_dir {output_dir} is not empty ({shown}): continue that run with --resume, "
            "choose another --training.output_dir, or replace it with --training.overwrite_output_dir true"
        )
    removed = run_outputs(output_dir, config.logging.project_name) if remove else []
    for path in removed:  # a symbolic link among them is removed itself, never what it points to
        if path.is_symlink() or not path.is_dir():
            path.unlink()
        else:
            shutil.rmtree(path)
    if removed:
        notes.append(
            f"training.overwrite_output_dir: removed the earlier run's {', '.join(p.name for p in removed)} "
            f"from {output_dir}"
        )
    return notes


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues.

    Attributes:
        checkpoint: The checkpoint directory.
        step: The training step the checkpoint was written after.
        changed: Resumable keys whose values differ from the checkpoint's (dotted names).
    """

    checkpoint: Path
    step: int
    changed: list[str]

    def finished(self, max_steps: int) -> bool:
        return self.step >= max_steps

    def final_evaluation_missing(self, eval_episodes: int) -> bool:
        """Whether the checkpoint's last step lacks the evaluation a run with ``eval_episodes``
        ends with (a signal stopped it after the checkpoint was written)."""
        if not eval_episodes or self.step == 0:
            return False
        return not step_evaluated(read_trainer_state(self.checkpoint).get("history", []), self.step)

    def describe(self, max_steps: int) -> str:
        """One line: what is resumed, or that the run is already finished."""
        if self.finished(max_steps):
            return (
                f"the run in {self.checkpoint.parent} is finished: {self.checkpoint.name} is step {self.step} "
                f"of training.max_steps {max_steps}; to train further resume with a larger "
                f"--training.max_steps (its adapters are in {self.checkpoint / 'adapters'})"
            )
        line = f"resuming from {self.checkpoint} (step {self.step} of {max_steps})"
        return line + (f" with changed settings: {', '.join(self.changed)}" if self.changed else "")


def step_evaluated(history: list[Mapping[str, Any]], step: int) -> bool:
    """Whether the training ``history`` holds an evaluation of ``step``."""
    record = next((r for r in reversed(history) if r.get("step") == step), {})
    return "eval/success_rate" in record


def _resumable(key: str) -> bool:
    return any(
        key == allowed or (allowed.endswith(".") and key.startswith(allowed)) for allowed in RESUMABLE_KEYS
    )


def _saved_config(checkpoint: Path) -> dict[str, Any]:
    """The checkpoint's config as a dict with today's defaults filled in, so a field added since
    the checkpoint was written does not count as changed when it keeps its default."""
    raw = yaml.safe_load((checkpoint / "config.yaml").read_text(encoding="utf-8")) or {}
    try:
        return config_to_dict(config_from_dict(raw, Config))
    except ConfigError:  # a key this version no longer knows: compare what is there
        return raw


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _lookup(tree: Mapping[str, Any], key: str) -> Any:
    value: Any = tree
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def check_resume(checkpoint: str | Path, config: Config) -> ResumePoint:
    """Check that ``config`` continues the run that wrote ``checkpoint``; ConfigError naming every
    differing key (with both values) when it does not. Loads no model."""
    checkpoint = Path(checkpoint)
    state = read_trainer_state(checkpoint)
    saved = _saved_config(checkpoint)
    current = config_to_dict(config)
    changed = changed_keys(saved, current)
    refused = [key for key in changed if not _resumable(key)]
    if refused:
        details = "; ".join(
            f"{k} {_show(_lookup(saved, k))} -> {_show(_lookup(current, k))}" for k in refused
        )
        raise ConfigError(
            f"{checkpoint} belongs to a different run: {details}. Resume with the run's own settings "
            f"(`llm-zoo-train --resume {checkpoint}` uses its config.yaml), or start a new run in another "
            "training.output_dir"
        )
    return ResumePoint(
        checkpoint=checkpoint, step=int(state["step"]), changed=[k for k in changed if _resumable(k)]
    )


def start_run(
    config: Config, checkpoint: Path | None, accelerator: Any
) -> tuple[ResumePoint | None, RunLock]:
    """What a trainer does before it loads the model: check the checkpoint against ``config``
    (ConfigError) and say where the run resumes or that it is finished, take the output
    directory's lock (main process; :class:`~llm_zoo_train.runs.lock.RunLockedError`), remove
    stale temporaries and refuse a new run into a non-empty directory without
    ``overwrite_output_dir`` (ConfigError; nothing is deleted yet: :func:`begin_run` does), and
    warn when the launcher started fewer processes than it was asked for. Returns the resume point
    (None for a new run) and the lock (release it when the run ends)."""
    problem = output_dir_problem(config.training.output_dir)
    if problem:
        raise ConfigError(f"{problem}: choose another --training.output_dir")
    point = check_resume(checkpoint, config) if checkpoint is not None else None
    lock = RunLock(config.training.output_dir)
    notes = []
    if accelerator.is_main_process:
        taken_over = lock.acquire()
        notes += [taken_over] if taken_over else []
    try:
        notes += prepare_output_dir(config, resuming=point is not None, remove=False)
        if accelerator.is_main_process:
            notes += [
                f"removed an unfinished write (checkpoint or adapters): {p}"
                for p in remove_stale_temporaries(config.training.output_dir)
            ]
    except BaseException:
        lock.release()
        raise
    if point is not None:
        notes.append(point.describe(config.training.max_steps))
    for note in notes:
        accelerator.print(note)
    accelerator.wait_for_everyone()  # every process has checked before the main one writes
    warning = process_count_warning(accelerator.num_processes)
    if warning and accelerator.is_main_process:
        print(f"llm-zoo-train: {warning}", file=sys.stderr)
    return point, lock


def begin_run(config: Config, resuming: bool, accelerator: Any) -> None:
    """Once the model has loaded: with ``overwrite_output_dir``, delete the earlier run's outputs
    (a new run only), then write the run's ``config.yaml`` (main process; the others wait)."""
    if accelerator.is_main_process:
        notes = [] if resuming else prepare_output_dir(config, resuming=False)
        for note in notes:
            accelerator.print(note)
        save_config(config, Path(config.training.output_dir) / "config.yaml")
    accelerator.wait_for_everyone()  # nothing is written before the main process has cleaned up


def save_final_adapters(output_dir: str | Path, policy: Any, write_cards: Callable[[Path], object]) -> Path:
    """Write ``output_dir/adapters`` atomically (a temporary directory renamed into place): every
    adapter, then the model cards ``write_cards(directory)`` adds. A run killed while saving leaves
    no half-written adapters; ``--resume`` then writes them from the last checkpoint
    (:func:`restore_final_adapters`)."""
    for name in policy.trainable:
        check_finite_weights(name, policy.adapter_parameters(name))

    def write(directory: Path) -> None:
        policy.save_adapters(directory)
        write_cards(directory)

    return write_checkpoint(Path(output_dir) / "adapters", write, manifest=False)


def complete_finished_run(point: ResumePoint) -> list[str]:
    """For ``--resume`` of a finished run: under the run's lock (a dead run's is taken over, a
    live one refuses with :class:`~llm_zoo_train.runs.lock.RunLockedError`), remove what an
    interrupted write left and write the final adapters when they are missing
    (:func:`restore_final_adapters`); the lock is released. Returns the notes to print."""
    output_dir = point.checkpoint.parent
    lock = RunLock(output_dir)
    taken_over = lock.acquire()
    try:
        notes = [taken_over] if taken_over else []
        notes += [
            f"removed an unfinished write (checkpoint or adapters): {p}"
            for p in remove_stale_temporaries(output_dir)
        ]
        restored = restore_final_adapters(point)
        return notes + ([restored] if restored else [])
    finally:
        lock.release()


def restore_final_adapters(point: ResumePoint) -> str | None:
    """For a finished run: write ``output_dir/adapters`` from its last checkpoint when they are
    missing or incomplete (the run was killed, or the disk filled, during the final save).
    Returns a note saying so (None: they were there)."""
    final = point.checkpoint.parent / "adapters"
    names = read_trainer_state(point.checkpoint).get("adapters", [])
    if not (final.is_dir() and all((final / name / "adapter_config.json").is_file() for name in names)):
        why = "missing"
    elif not _same_weights(point.checkpoint / "adapters", final, names):
        why = "an older step's"  # a run extended past an earlier end, stopped before its final save
    else:
        return None
    write_checkpoint(
        final, lambda d: shutil.copytree(point.checkpoint / "adapters", d, dirs_exist_ok=True), manifest=False
    )
    return f"the final adapters were {why}: wrote {final} from {point.checkpoint.name}"


def _same_weights(checkpoint_adapters: Path, final: Path, names: list[str]) -> bool:
    """Whether every adapter's weights in ``final`` are byte for byte the checkpoint's."""
    for name in names:
        for weights in (checkpoint_adapters / name).glob("*.safetensors"):
            copy = final / name / weights.name
            if not copy.is_file() or not filecmp.cmp(weights, copy, shallow=False):
                return False
    return True
