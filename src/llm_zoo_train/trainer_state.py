"""Saving a :class:`~llm_zoo_train.trainer.Trainer`'s state into a checkpoint and loading it back.

What goes into a checkpoint and how it is written atomically is :mod:`llm_zoo_train.runs.checkpoint`;
this module collects the trainer's pieces (adapters, optimizers, schedulers, the mixed-precision
scaler, every process's RNG states, step, adapter version, metrics history, config, model cards,
the kernels ``"auto"`` chose (:mod:`llm_zoo_train.kernels.choices`), and the rollouts
generated ahead with ``rollout.async_steps``) and puts them back, so that a
resumed run continues exactly as the uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from llm_zoo_train.config import save_config
from llm_zoo_train.kernels.choices import (
    KernelChoicesError,
    adopt_kernel_choices,
    measured_kernel_choices,
)
from llm_zoo_train.models.sharding import saveable
from llm_zoo_train.reporting.model_card import write_model_cards
from llm_zoo_train.runs.checkpoint import (
    CheckpointDamagedError,
    capture_rng_state,
    checkpoint_path,
    checkpoint_step,
    find_checkpoint,
    list_checkpoints,
    load_training_state,
    read_trainer_state,
    restore_rng_state,
    rotate_checkpoints,
    save_training_state,
    warn_line,
    write_checkpoint,
)
from llm_zoo_train.runs.finite import check_finite_weights
from llm_zoo_train.runs.sharded_state import full_state

__all__ = [
    "capture_save_point",
    "load_trainer_checkpoint",
    "restore_trainer",
    "save_interrupted",
    "save_trainer_checkpoint",
]


def save_trainer_checkpoint(trainer: Any, rng_state: dict[str, Any] | None = None) -> Path:
    """Write ``output_dir/checkpoint-STEP`` of ``trainer`` (the main process writes; every process
    contributes its RNG states: ``rng_state``, or those of now) and rotate old checkpoints; returns
    the checkpoint's path. :class:`~llm_zoo_train.runs.finite.NonFiniteError` before anything is
    written when an adapter's weights are not finite."""
    accelerator = trainer.accelerator
    # Under fsdp2 the adapters and their optimizer states are gathered whole by every process
    # (collectives), before the main process writes them alone.
    policy = saveable(trainer.policy)
    optimizer_states = {name: full_state(o.state_dict()) for name, o in trainer.optimizers.items()}
    for name in trainer.plan.trainable:
        check_finite_weights(name, policy.adapter_parameters(name), trainer.step)
    rng_states = [rng_state if rng_state is not None else capture_rng_state(trainer.rng)]
    # What each process's "auto" options measured, and its rollout generation process's: a resumed
    # run multiplies as this one did (llm_zoo_train.kernels.choices).
    async_rollouts = getattr(trainer, "async_rollouts", None)
    kernel_choices = [
        {
            "trainer": measured_kernel_choices(),
            "rollout_process": async_rollouts.kernel_choices if async_rollouts is not None else None,
        }
    ]
    if accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        rng_states = gather_object(rng_states)
        kernel_choices = gather_object(kernel_choices)
    path = checkpoint_path(trainer.output_dir, trainer.step)
    if accelerator.is_main_process:
        state = {
            "step": trainer.step,
            "version": trainer.version,
            "adapters": trainer.plan.adapters,
            "trainable": trainer.plan.trainable,
            "num_processes": accelerator.num_processes,
            "strategy": _strategy(trainer.config),
            "history": trainer.history,
            "kernel_choices": kernel_choices,  # one per process
            # each base model's files: a resume refuses a base replaced under the same path
            "base_models": getattr(trainer, "base_fingerprints", {}),
        }
        if getattr(trainer, "async_rollouts", None) is not None:
            # Resume checks that each of them is in the checkpoint: a missing one is an error,
            # never a rollout generated again with newer adapters.
            state["async_rollout_steps"] = trainer.async_rollouts.ready_steps

        def write(directory: Path) -> None:
            save_training_state(
                directory,
                policy=policy,
                optimizer_states=optimizer_states,
                schedulers=trainer.schedulers,
                scaler=accelerator.scaler,
                rng_states=rng_states,
                trainer_state=state,
            )
            save_config(trainer.config, directory / "config.yaml")
            if getattr(trainer, "async_rollouts", None) is not None:
                trainer.async_rollouts.save(directory)  # rollouts generated ahead of this step
            write_model_cards(
                directory / "adapters",
                trainer.config,
                trainer.plan,
                trainer.step,
                trainer.history,
                final_dir=path / "adapters",
            )

        write_checkpoint(path, write)
        rotate_checkpoints(trainer.output_dir, trainer.config.training.save_total_limit)
    accelerator.wait_for_everyone()
    return path


def load_trainer_checkpoint(trainer: Any, checkpoint: Path) -> None:
    """Restore ``trainer`` from ``checkpoint`` (already checked by :func:`llm_zoo_train.runs.run_dir.check_resume`):
    weights, optimizer and scheduler states (the learning rate follows the current schedule), RNG
    states, step, version and history."""
    accelerator = trainer.accelerator
    state = read_trainer_state(checkpoint)
    ranks = load_training_state(
        checkpoint,
        policy=trainer.policy,
        optimizers=trainer.optimizers,
        schedulers=trainer.schedulers,
        scaler=accelerator.scaler,
    )
    if len(ranks) != accelerator.num_processes:
        accelerator.print(
            f"checkpoint was written by {len(ranks)} process(es), resuming with "
            f"{accelerator.num_processes}: the run continues but is not bit-identical"
        )
    written_by = state.get("strategy", "ddp")  # checkpoints from before fsdp2 were ddp's
    if written_by != _strategy(trainer.config):
        accelerator.print(
            f"checkpoint was written under training.strategy {written_by}, resuming under "
            f"{_strategy(trainer.config)}: the state is restored exactly; later steps round as "
            f"{trainer.config.training.strategy} does, so the run is not bit-identical to one that stayed"
        )
    restore_rng_state(ranks[min(accelerator.process_index, len(ranks) - 1)], trainer.rng)
    kernel_choices = _own_kernel_choices(state, accelerator.process_index, checkpoint)
    trainer.step, trainer.version = int(state["step"]), int(state["version"])
    trainer.history = list(state["history"])
    if getattr(trainer, "async_rollouts", None) is not None:
        trainer.async_rollouts.restore(checkpoint, state.get("async_rollout_steps"))
        trainer.async_rollouts.kernel_choices = kernel_choices.get("rollout_process")


def _strategy(config: Any) -> str:
    """``training.strategy`` as a checkpoint records it (fsdp2 with its sharding)."""
    training = config.training
    return training.strategy if training.strategy == "ddp" else f"fsdp2/{training.fsdp_sharding}"


def _own_kernel_choices(state: dict[str, Any], process_index: int, checkpoint: Path) -> dict[str, Any]:
    """Adopt this process's recorded kernel choices (the nearest rank's when the checkpoint had
    fewer processes); return its record. A record that cannot be read is one warning line, and
    the choices are measured again (none recorded: a checkpoint from before they were)."""
    records = state.get("kernel_choices")
    if records is None:
        return {}
    try:
        if not isinstance(records, list) or not records or not all(isinstance(r, dict) for r in records):
            raise KernelChoicesError("expected a list of one record per process")
        record = records[min(process_index, len(records) - 1)]
        if record.get("rollout_process") is not None and not isinstance(record["rollout_process"], dict):
            raise KernelChoicesError("rollout_process: not a record")
        adopt_kernel_choices(record.get("trainer") or {})
        return record
    except KernelChoicesError as err:
        warn_line(
            f"{checkpoint.name}: the kernel choices it recorded cannot be read ({err}); measuring them"
            " again: the run continues but may not be bit-identical"
        )
        return {}


def restore_trainer(trainer: Any, checkpoint: Path, warn: Callable[[str], None]) -> Path:
    """:func:`load_trainer_checkpoint`, falling back to older intact checkpoints when one cannot
    be loaded (each is named through ``warn``, one line); returns the checkpoint loaded.
    :class:`CheckpointDamagedError` (one line) when no checkpoint is left."""
    while True:
        try:
            load_trainer_checkpoint(trainer, checkpoint)
            return checkpoint
        except CheckpointDamagedError as err:
            step = checkpoint_step(checkpoint)
            older = [c for c in reversed(list_checkpoints(checkpoint.parent)) if checkpoint_step(c) < step]
            if not older:
                raise CheckpointDamagedError(
                    f"no intact checkpoint to resume from: {checkpoint.name}: {err}", err.path
                ) from err
            damaged = checkpoint
            checkpoint = find_checkpoint(older[0], warn)
            warn(f"skipped damaged checkpoint {damaged.name} ({err}); resuming from {checkpoint} instead")


def capture_save_point(trainer: Any) -> tuple[int, dict[str, Any], set[int]]:
    """What a checkpoint of the step ``trainer`` just completed needs beyond its live objects: the
    RNG states now and the asynchronous rollouts asked for so far (:func:`save_interrupted`)."""
    rollouts = getattr(trainer, "async_rollouts", None)
    requested = rollouts.requested_steps if rollouts is not None else set()
    return trainer.step, capture_rng_state(trainer.rng), requested


def save_interrupted(trainer: Any, save_point: tuple[int, dict[str, Any], set[int]]) -> Path | None:
    """Save a checkpoint of the last completed step after Ctrl-C or SIGTERM, from ``save_point``
    (:func:`capture_save_point` at the end of that step). None: nothing to save (no step done,
    or the step was already saved as it is), or the save failed, which is said in one line."""
    step, rng_state, requested = save_point
    if step == 0 or step != trainer.step:
        return None
    existing = checkpoint_path(trainer.output_dir, step)
    if existing.is_dir():
        return existing
    try:
        if trainer.async_rollouts is not None:
            trainer.async_rollouts.wait_for_in_flight()
            trainer.async_rollouts.keep_only(requested)  # those asked for during the next step go
        return save_trainer_checkpoint(trainer, rng_state=rng_state)
    except Exception as err:  # the run stops anyway: say why it could not be saved
        warn_line(f"could not save a checkpoint of step {step}: {err}")
        return None
