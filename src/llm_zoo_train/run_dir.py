"""The output directory of a run: a new run never clobbers an earlier one, ``--resume`` continues
only the run that wrote the checkpoint.

* :func:`prepare_output_dir` is called before a run writes anything. It removes temporary
  directories a killed checkpoint write left behind (``.tmp-checkpoint-*``, ``.old-checkpoint-*``).
  A *new* run into a directory that already holds files is refused, unless
  ``training.overwrite_output_dir`` is true; then the earlier run's outputs (checkpoints,
  ``metrics.jsonl``, adapters, plot, rollouts, tracker logs) are deleted first, so nothing stale -
  an old ``checkpoint-4`` beside the new ``checkpoint-1`` - is left for ``--resume`` to pick up.
* :func:`check_resume` compares a checkpoint's saved configuration with the one the run resumes
  with. Only settings that do not change what the run is may differ (:data:`RESUMABLE_KEYS`: the
  step budget, where and how often things are saved, evaluation, logging, engine options);
  anything else - model, env, agents, LoRA, rollout sampling, algorithm, optimiser, seed - is
  refused naming each differing key, because the result would be neither the old run nor a new one.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llm_zoo_train.checkpoint import CHECKPOINT_PREFIX, changed_keys, read_trainer_state
from llm_zoo_train.config import Config, ConfigError, config_from_dict, config_to_dict
from llm_zoo_train.launch_check import process_count_warning

__all__ = [
    "RESUMABLE_KEYS",
    "ResumePoint",
    "check_resume",
    "prepare_output_dir",
    "remove_stale_temporaries",
    "run_outputs",
    "start_run",
]

#: Temporary siblings of a checkpoint being written or replaced (checkpoint.write_checkpoint).
STALE_PREFIXES = (f".tmp-{CHECKPOINT_PREFIX}", f".old-{CHECKPOINT_PREFIX}")
#: Files and directories a run writes into its output directory (besides checkpoint-STEP/).
RUN_OUTPUT_NAMES = ("metrics.jsonl", "adapters", "learning_curve.png", "rollouts", "engine_adapters", "eval")

#: Config keys (a dotted key, or a section/prefix ending in ".") that may differ between a
#: checkpoint and the run resuming it: they change how long the run goes and what it records,
#: not what it trains.
RESUMABLE_KEYS = (
    "training.max_steps",
    "training.output_dir",
    "training.overwrite_output_dir",
    "training.save_steps",
    "training.save_total_limit",
    "rollout.save_rollouts",
    "rollout.generation_batch_size",
    "rollout.max_rows_per_generate_call",
    "model.cache_dir",
    "eval.",
    "logging.",
    "vllm.",
)


def remove_stale_temporaries(output_dir: str | Path) -> list[Path]:
    """Delete what an interrupted checkpoint write left in ``output_dir``; returns the paths."""
    directory = Path(output_dir)
    if not directory.is_dir():
        return []
    stale = [p for p in directory.iterdir() if p.name.startswith(STALE_PREFIXES)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


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
    notes = [f"removed an unfinished checkpoint write: {p}" for p in stale]
    if resuming or not output_dir.is_dir():
        return notes
    present = sorted(p.name for p in output_dir.iterdir() if not p.name.startswith(STALE_PREFIXES))
    if not present:
        return notes
    if not config.training.overwrite_output_dir:
        shown = ", ".join(present[:4]) + (", ..." if len(present) > 4 else "")
        raise ConfigError(
            f"training.output_dir {output_dir} is not empty ({shown}): continue that run with --resume, "
            "choose another --training.output_dir, or replace it with --training.overwrite_output_dir true"
        )
    removed = run_outputs(output_dir, config.logging.project_name) if remove else []
    for path in removed:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
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


def start_run(config: Config, checkpoint: Path | None, accelerator: Any) -> ResumePoint | None:
    """What a trainer does before it loads the model: check the checkpoint against ``config``
    (ConfigError) and say where the run resumes or that it is finished, prepare the output
    directory (ConfigError for a new run into a non-empty one), and warn when the launcher started
    fewer processes than it was asked for. Returns the resume point (None for a new run)."""
    point = check_resume(checkpoint, config) if checkpoint is not None else None
    notes = prepare_output_dir(config, resuming=point is not None, remove=accelerator.is_main_process)
    if point is not None:
        notes.append(point.describe(config.training.max_steps))
    for note in notes:
        accelerator.print(note)
    accelerator.wait_for_everyone()  # nothing is written before the main process has cleaned up
    warning = process_count_warning(accelerator.num_processes)
    if warning and accelerator.is_main_process:
        print(f"llm-zoo-train: {warning}", file=sys.stderr)
    return point
