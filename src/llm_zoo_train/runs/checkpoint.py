"""Checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint is a directory ``OUTPUT_DIR/checkpoint-STEP/``::

    adapters/<name>/      every adapter, PEFT format (PeftModel.from_pretrained loads it)
    optimizers.pt         optimizer state per trainable adapter
    schedulers.pt         LR scheduler state per trainable adapter
    rng_state.pt          Python, NumPy, torch (CPU and CUDA) RNG states and the trainer's generator
    trainer_state.json    step, adapter version, metrics history, the kernels "auto" chose
    config.yaml           the run's configuration
    manifest.json         size and SHA-256 of every other file, written last (llm_zoo_train.runs.manifest)

It is written into a temporary sibling directory and renamed into place, so a run killed while
saving never leaves a half-written checkpoint that ``--resume`` would pick up. A write that fails
(a full disk) raises :class:`CheckpointWriteError` with a one-line reason and leaves the older
checkpoints as they were.

:func:`find_checkpoint` verifies a checkpoint against its manifest before a run resumes from it:
a damaged one (a file missing, truncated, emptied or edited; no manifest) is named in a one-line
warning and the newest older checkpoint that verifies is used instead; when none does it stops
with a one-line error. A file that verifies but cannot be loaded is reported the same way
(:class:`~llm_zoo_train.runs.manifest.CheckpointDamagedError`, naming the file).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from llm_zoo_train.config import Config, ConfigError, config_from_dict
from llm_zoo_train.runs.manifest import (
    MANIFEST,
    TRAINER_STATE,
    CheckpointDamagedError,
    verify_manifest,
    write_manifest,
)
from llm_zoo_train.runs.sharded_state import shard_optimizer_state

__all__ = [
    "CHECKPOINT_PREFIX",
    "CheckpointDamagedError",
    "CheckpointWriteError",
    "capture_rng_state",
    "changed_keys",
    "checkpoint_path",
    "checkpoint_step",
    "find_checkpoint",
    "follow_rebuilt_schedule",
    "list_checkpoints",
    "load_training_state",
    "read_trainer_state",
    "restore_rng_state",
    "rotate_checkpoints",
    "save_training_state",
    "verify_checkpoint",
    "warn_line",
    "write_checkpoint",
    "write_error",
]

CHECKPOINT_PREFIX = "checkpoint-"
_CHECKPOINT_NAME = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (e.g. the disk is full); the message says why and what to do.

    ``str(error)`` is the one-line message alone; ``error.errno`` is the failed write's errno.
    """

    def __init__(self, message: str, errno_value: int | None = None):
        super().__init__(message)
        self.errno = errno_value


def checkpoint_path(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / f"{CHECKPOINT_PREFIX}{step}"


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Checkpoints in ``output_dir`` (directories with a trainer state or a manifest), oldest
    first; whether they are intact is :func:`verify_checkpoint`'s question."""
    directory = Path(output_dir)
    if not directory.is_dir():
        return []
    found = []
    for child in directory.iterdir():
        match = _CHECKPOINT_NAME.match(child.name)
        if match and ((child / TRAINER_STATE).is_file() or (child / MANIFEST).is_file()):
            found.append((int(match[1]), child))
    return [path for _, path in sorted(found)]


def verify_checkpoint(checkpoint: str | Path) -> dict[str, Any]:
    """Check ``checkpoint`` against its manifest and return its trainer state;
    :class:`CheckpointDamagedError` naming the damaged file otherwise."""
    checkpoint = Path(checkpoint)
    verify_manifest(checkpoint)
    state_file = checkpoint / TRAINER_STATE
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        step = int(state["step"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointDamagedError(
            f"{state_file} is unreadable ({type(err).__name__})", state_file
        ) from None
    if checkpoint_step(checkpoint) not in (-1, step):
        raise CheckpointDamagedError(
            f"{state_file} says step {step}, the directory is {checkpoint.name}", state_file
        )
    problem = trainer_state_problem(state)
    if problem:
        raise CheckpointDamagedError(f"{state_file} is not a trainer state: {problem}", state_file)
    config_file = checkpoint / "config.yaml"
    if config_file.is_file():
        try:
            config = yaml.safe_load(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError, yaml.YAMLError) as err:
            raise CheckpointDamagedError(
                f"{config_file} is not YAML ({type(err).__name__})", config_file
            ) from None
        if not isinstance(config, dict):
            raise CheckpointDamagedError(
                f"{config_file} holds no config (a {type(config).__name__})", config_file
            )
        try:
            config_from_dict(config, Config)
        except ConfigError as err:  # an unknown key or a wrong type: a resume could not load it
            raise CheckpointDamagedError(f"{config_file} is not a run's config: {err}", config_file) from None
    return dict(state)


def _int_at_least(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def trainer_state_problem(state: Any) -> str | None:
    """What makes ``state`` (a parsed ``trainer_state.json``) unusable by a resume, or ``None``: a
    file that a manifest verifies may still hold the wrong thing (issue 53 D7: a bad ``history``
    or ``version`` raised a traceback during the resume instead of falling back)."""
    if not isinstance(state, dict):
        return f"a {type(state).__name__}, not an object"
    if not _int_at_least(state.get("step"), 0):
        return f"step {state.get('step')!r} is not a whole number >= 0"
    if "version" in state and not _int_at_least(state["version"], 0):
        return f"version {state['version']!r} is not a whole number >= 0"
    for key in ("adapters", "trainable"):
        if key in state and not _names(state[key]):
            return f"{key} is not a list of names"
    if "num_processes" in state and not _int_at_least(state["num_processes"], 1):
        return f"num_processes {state['num_processes']!r} is not a whole number >= 1"
    history = state.get("history", [])
    if not isinstance(history, list) or not all(
        isinstance(record, dict)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in record.values())
        for record in history
    ):
        return "history is not a list of metric records (name -> number)"
    if "history" in state:  # a training step records its metrics every step, evaluated or not
        recorded = {record.get("step") for record in history} - {0}
        if recorded != set(range(1, state["step"] + 1)):
            missing = sorted(set(range(1, state["step"] + 1)) - recorded)
            return (
                f"history lacks steps {missing[:5]}{' ...' if len(missing) > 5 else ''} of step {state['step']}"
                if missing
                else f"history holds steps past step {state['step']}"
            )
    for key, kind in (("kernel_choices", list), ("base_models", dict), ("async_rollout_steps", list)):
        if key in state and not isinstance(state[key], kind):
            return f"{key} is a {type(state[key]).__name__}, not a {kind.__name__}"
    steps = state.get("async_rollout_steps", [])
    if not all(_int_at_least(step, 0) for step in steps):
        return "async_rollout_steps is not a list of steps"
    return None


def checkpoint_step(path: Path) -> int:
    """The step in a checkpoint directory's name (-1 for another name)."""
    match = _CHECKPOINT_NAME.match(path.name)
    return int(match[1]) if match else -1


def warn_line(message: str) -> None:
    """Print ``llm-zoo-train: warning: MESSAGE`` (one line) to stderr."""
    print(f"llm-zoo-train: warning: {message}", file=sys.stderr, flush=True)


def find_checkpoint(path: str | Path, warn: Callable[[str], None] = warn_line) -> Path:
    """The checkpoint to resume from: ``path`` if it is a checkpoint, else the newest checkpoint
    inside it, provided it verifies (:func:`verify_checkpoint`). A damaged one is named through
    ``warn`` (one line) and the newest older checkpoint that verifies is taken instead;
    FileNotFoundError (one line) if there is none, or none intact."""
    path = Path(path)
    if (path / TRAINER_STATE).is_file() or (path / MANIFEST).is_file():
        step = checkpoint_step(path)
        older = [c for c in reversed(list_checkpoints(path.parent)) if 0 <= checkpoint_step(c) < step]
        candidates = [path, *older]
    else:
        candidates = list(reversed(list_checkpoints(path)))
    if not candidates:
        raise FileNotFoundError(
            f"no checkpoint to resume from in {path} (expected {path}/{CHECKPOINT_PREFIX}STEP/{TRAINER_STATE}); "
            "a run that stopped before its first checkpoint starts again without --resume, with "
            "--training.overwrite_output_dir true"
        )
    damaged = []
    for candidate in candidates:
        try:
            verify_checkpoint(candidate)
        except CheckpointDamagedError as err:
            damaged.append(f"{candidate.name}: {err}")
            continue
        if damaged:
            warn(f"skipped damaged checkpoint(s) ({'; '.join(damaged)}); resuming from {candidate} instead")
        return candidate
    raise FileNotFoundError(f"no intact checkpoint to resume from: {'; '.join(damaged)}")


def write_checkpoint(
    directory: str | Path, write: Callable[[Path], object], *, manifest: bool = True
) -> Path:
    """Create checkpoint ``directory`` atomically: ``write(tmp)`` fills a temporary directory,
    ``manifest.json`` is written last (unless ``manifest`` is false: the final adapters), and it
    is renamed to ``directory`` (replacing an older one of the same name)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{directory.name}-", dir=directory.parent))
    make_world_readable(tmp)
    try:
        try:
            write(tmp)
            if manifest:
                write_manifest(tmp)  # last: a checkpoint without it is incomplete
        except Exception as err:  # safetensors reports a full disk as its own SafetensorError
            converted = write_error(directory, err)
            if converted is err:
                raise
            raise converted from err
        if directory.exists():
            old = directory.with_name(f".old-{directory.name}-{os.getpid()}")
            os.rename(directory, old)
            os.rename(tmp, directory)
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:  # a file or a link where the checkpoint was: rmtree left it behind
                old.unlink(missing_ok=True)
        else:
            os.rename(tmp, directory)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return directory


def write_error(path: Path, err: BaseException) -> BaseException:
    """A one-line :class:`CheckpointWriteError` naming ``path`` for a failed write (an OSError,
    torch.save's RuntimeError, or safetensors' I/O SafetensorError); other errors are returned
    unchanged."""
    path = Path(path)
    try:
        free = shutil.disk_usage(path.parent if path.parent.exists() else Path.cwd()).free
    except OSError:
        free = 0
    text = str(err)
    # torch.save reports a full disk as "PytorchStreamWriter failed writing file ..." or as
    # "[enforce fail at inline_container.cc:NNN] . unexpected pos ..."
    torch_write = isinstance(err, RuntimeError) and any(
        mark in text for mark in ("write", "enforce fail", "unexpected pos", "PytorchStreamWriter")
    )
    # safetensors: "Error while serializing: I/O error: No space left on device (os error 28)"
    safetensors_write = type(err).__name__ == "SafetensorError" and "I/O error" in text
    torch_write = torch_write or safetensors_write
    out_of_space = (
        (isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT))
        or (safetensors_write and "os error 28" in text)
        or (torch_write and free < 1 << 30)
    )
    if out_of_space:
        return CheckpointWriteError(
            f"cannot write {path}: no space left on device ({free / 2**20:.0f} MiB free in "
            f"{path.parent}); free disk space or keep fewer checkpoints (training.save_total_limit), "
            "then resume from the last complete checkpoint with --resume",
            errno.ENOSPC,
        )
    if isinstance(err, OSError):
        return CheckpointWriteError(f"cannot write {path}: {err}", err.errno)
    if torch_write:
        first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
        return CheckpointWriteError(f"cannot write {path}: {first}", errno.EIO)
    return err


def make_world_readable(directory: Path) -> None:
    """Give a ``mkdtemp`` directory (mode 0700) the permissions a plain ``mkdir`` would (umask)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(directory, 0o777 & ~umask)


def rotate_checkpoints(output_dir: str | Path, keep: int | None) -> None:
    """Delete all but the newest ``keep`` checkpoints (``None``: keep all)."""
    if keep is None:
        return
    for old in list_checkpoints(output_dir)[:-keep] if keep > 0 else list_checkpoints(output_dir):
        shutil.rmtree(old, ignore_errors=True)


def save_training_state(
    directory: Path,
    *,
    policy: Any,
    optimizer_states: Mapping[str, Any],
    schedulers: Mapping[str, Any],
    scaler: Any,
    rng_states: list[dict[str, Any]],
    trainer_state: dict[str, Any],
) -> None:
    """Write adapters, optimizer states (whole tensors: :func:`~llm_zoo_train.runs.sharded_state.full_state`),
    scheduler/scaler states, RNG states (one per process) and the trainer state into ``directory``
    (the temporary directory of :func:`write_checkpoint`). ``policy`` saves whole adapters: the
    live policy, or its gathered copy under fsdp2."""
    policy.save_adapters(directory / "adapters")
    torch.save(dict(optimizer_states), directory / "optimizers.pt")
    torch.save({name: s.state_dict() for name, s in schedulers.items()}, directory / "schedulers.pt")
    if scaler is not None:
        torch.save(scaler.state_dict(), directory / "scaler.pt")
    torch.save({"ranks": rng_states}, directory / "rng_state.pt")
    write_json(directory / TRAINER_STATE, trainer_state)


def load_training_state(
    checkpoint: Path,
    *,
    policy: Any,
    optimizers: Mapping[str, Any],
    schedulers: Mapping[str, Any],
    scaler: Any,
) -> list[dict[str, Any]]:
    """Load what :func:`save_training_state` wrote into live objects; returns the RNG states (one
    per process that wrote the checkpoint) for :func:`restore_rng_state`."""
    for name in policy.adapter_names:
        with _loading(checkpoint / "adapters" / name):
            policy.load_adapter_weights(name, checkpoint / "adapters" / name)
    with _loading(checkpoint / "optimizers.pt"):
        optimizer_states = torch.load(checkpoint / "optimizers.pt", weights_only=True)
        for name, optimizer in optimizers.items():
            optimizer.load_state_dict(optimizer_states[name])
            shard_optimizer_state(optimizer)  # whole moments cut to the slices fsdp2 trains
    with _loading(checkpoint / "schedulers.pt"):
        scheduler_states = torch.load(checkpoint / "schedulers.pt", weights_only=True)
        for name in optimizers:
            schedulers[name].load_state_dict(scheduler_states[name])
    for name, optimizer in optimizers.items():
        follow_rebuilt_schedule(optimizer, schedulers[name])
    if scaler is not None and (checkpoint / "scaler.pt").is_file():
        with _loading(checkpoint / "scaler.pt"):
            scaler.load_state_dict(torch.load(checkpoint / "scaler.pt", weights_only=True))
    with _loading(checkpoint / "rng_state.pt"):
        return list(torch.load(checkpoint / "rng_state.pt", weights_only=True)["ranks"])


@contextlib.contextmanager
def _loading(path: Path) -> Iterator[None]:
    """Any error inside becomes a one-line :class:`CheckpointDamagedError` naming ``path`` (a JSON
    decode error, a bare EOFError, an UnpicklingError, a hub lookup for a missing file)."""
    try:
        yield
    except Exception as err:  # whatever the loader raises, the file is what is wrong
        reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
        reason = reason if len(reason) <= 160 else reason[:157] + "..."
        raise CheckpointDamagedError(
            f"cannot load {path}: {type(err).__name__}{': ' + reason if reason else ''}", path
        ) from err


def follow_rebuilt_schedule(optimizer: Any, scheduler: Any) -> None:
    """Set the optimizer's learning rates to what ``scheduler`` gives at its restored step.

    A loaded optimizer state carries the learning rate of the run that saved it (after its last
    scheduler step: 0 at the end of a linear decay). When the resumed run has another
    ``max_steps``, the rebuilt schedule is a different function of the step; without this the
    saved rate would be used until the scheduler's next step.
    """
    import warnings

    with warnings.catch_warnings():  # get_lr() outside step() warns; here it is what we want
        warnings.simplefilter("ignore")
        closed_form = getattr(scheduler, "_get_closed_form_lr", None)
        rates = closed_form() if closed_form is not None else scheduler.get_lr()
    for group, rate in zip(optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def changed_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts (e.g. a saved and a new config)."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new))
        return [c for k in keys for c in changed_keys(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [prefix.rstrip(".")]


def read_trainer_state(checkpoint: str | Path) -> dict[str, Any]:
    """The checkpoint's ``trainer_state.json``; :class:`CheckpointDamagedError` if unreadable."""
    path = Path(checkpoint) / TRAINER_STATE
    with _loading(path):
        return dict(json.loads(path.read_text(encoding="utf-8")))


def write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- RNG states


def capture_rng_state(trainer_rng: np.random.Generator) -> dict[str, Any]:
    """All RNG states as plain values and tensors (loadable with ``torch.load(weights_only=True)``)."""
    version, state, gauss = random.getstate()
    legacy = np.random.get_state(legacy=False)
    return {
        "python": [version, list(state), gauss],
        "numpy": json.dumps(legacy, default=_json_array),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "trainer": json.dumps(trainer_rng.bit_generator.state),
    }


def restore_rng_state(saved: dict[str, Any], trainer_rng: np.random.Generator) -> None:
    """Undo :func:`capture_rng_state` (the trainer's generator is restored in place)."""
    version, state, gauss = saved["python"]
    random.setstate((version, tuple(state), gauss))
    legacy = json.loads(saved["numpy"])
    legacy["state"]["key"] = np.asarray(legacy["state"]["key"], dtype=np.uint32)
    np.random.set_state(legacy)
    torch.set_rng_state(saved["torch"])
    if saved["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])
    trainer_rng.bit_generator.state = json.loads(saved["trainer"])


def _json_array(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.integer | np.floating):
        return value.item()
    raise TypeError(f"cannot serialise {type(value).__name__}")
