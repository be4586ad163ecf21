"""A fingerprint of a base model's files, so a resume notices a base replaced under its path.

A checkpoint records each base model's fingerprint (``trainer_state.json``, ``base_models``); a
resume compares it with the files now at the same path, and refuses in one line naming the first
file that differs. The fingerprint of a directory is, for each regular file in it (not in
subdirectories, not hidden): its size and a SHA-256 of its bytes, ``[size, digest, how]``:

* ``"whole"``: every byte, while the directory's files hold at most :data:`WHOLE_BYTES` in all (a
  135M model in float32 is about 0.5 GiB: a fraction of a second on top of loading it). An
  outside fault matrix changed one byte in the middle of a weights file, outside what the first
  fingerprint read, and the resume went on silently with other weights;
* ``"sampled"``: larger models, the first and last 64 KiB and :data:`SAMPLES` blocks of 64 KiB
  spread evenly between (4 MiB a file whatever its size). A retrained or re-converted model
  differs in its weights' bytes everywhere and, in a safetensors file, in its header; a change of
  a few bytes in a large file can go unnoticed.

Checkpoints written before ``how`` was recorded hold ``[size, digest of the first and last
64 KiB]``; they are compared the same way. A model named by a hub id rather than a directory has
no fingerprint (nothing local to compare).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["SAMPLES", "WHOLE_BYTES", "base_model_problem", "fingerprint"]

_BLOCK = 64 * 1024
#: A directory with more files than this is not a model directory: no fingerprint.
_MAX_FILES = 500
#: Directories up to this size are hashed byte for byte.
WHOLE_BYTES = 1 << 30
#: Blocks read between the first and the last in a larger model's file.
SAMPLES = 62


def _model_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))


def fingerprint(path: str | Path) -> dict[str, list[Any]] | None:
    """``{file name: [size, digest, how]}`` of the model directory ``path``, or ``None`` when
    ``path`` is not a directory (a hub id) or holds no files."""
    directory = Path(path)
    if not directory.is_dir():
        return None
    files = _model_files(directory)
    if not files or len(files) > _MAX_FILES:
        return None
    sizes = {file: file.stat().st_size for file in files}
    how = "whole" if sum(sizes.values()) <= WHOLE_BYTES else "sampled"
    return {file.name: [size, _digest(file, how), how] for file, size in sizes.items()}


def _digest(file: Path, how: str) -> str:
    """The SHA-256 of ``file`` read as ``how`` says: ``whole``, ``sampled`` or ``edges`` (the first
    and last 64 KiB, as checkpoints recorded before ``how`` was)."""
    digest = hashlib.sha256()
    size = file.stat().st_size
    with file.open("rb") as handle:
        if how == "whole":
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
            return digest.hexdigest()
        digest.update(handle.read(_BLOCK))
        if how == "sampled":
            span = size - 2 * _BLOCK
            for index in range(1, SAMPLES + 1) if span > 0 else ():
                handle.seek(_BLOCK + span * index // (SAMPLES + 1))
                digest.update(handle.read(_BLOCK))
        if size > _BLOCK:
            handle.seek(max(_BLOCK, size - _BLOCK))
            digest.update(handle.read(_BLOCK))
    return digest.hexdigest()


def base_model_problem(
    recorded: Mapping[str, Any] | None,
    current: Mapping[str, dict[str, list[Any]] | None],
    paths: Mapping[str, str],
) -> str | None:
    """Why the base models now at ``paths`` are not those a checkpoint recorded (``recorded``:
    model name -> fingerprint; ``current``: the same of today's files), or ``None`` when they agree
    or there is nothing to compare (an older checkpoint, a hub id)."""
    if not isinstance(recorded, Mapping):
        return None
    for name, before in recorded.items():
        now = current.get(name)
        if not isinstance(before, Mapping) or now is None:
            continue
        for file in sorted(set(before) | set(now)):
            if file not in now:
                return f"the base model {name} at {paths[name]} lacks {file}, which the checkpoint's base had"
            if file not in before:
                return (
                    f"the base model {name} at {paths[name]} has {file}, which the checkpoint's base did not"
                )
            then = list(before[file])
            if then != list(now[file]) and not _same_as_recorded(then, Path(paths[name]) / file):
                what = "size" if then[0] != now[file][0] else "content"
                return (
                    f"the base model {name} at {paths[name]} is not the one the checkpoint was trained on: "
                    f"{file} changed ({what})"
                )
    return None


def _same_as_recorded(then: list[Any], file: Path) -> bool:
    """Whether ``file`` matches a record made another way (``how`` of another size class, or the
    edges-only record of an older checkpoint), read that way again."""
    how = then[2] if len(then) > 2 else "edges"
    try:
        return then[0] == file.stat().st_size and then[1] == _digest(file, how)
    except (OSError, TypeError):
        return False
