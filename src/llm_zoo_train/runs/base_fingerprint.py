"""A cheap fingerprint of a base model's files, so a resume notices a base replaced under its path.

A checkpoint records each base model's fingerprint (``trainer_state.json``, ``base_models``); a
resume compares it with the files now at the same path, and refuses in one line naming the first
file that differs. The fingerprint of a directory is, for each regular file in it (not in
subdirectories, not hidden): its size and a SHA-256 of its first and last 64 KiB. That reads
128 KiB a file whatever the model's size, and a retrained or re-converted model differs in its
weights' bytes and, in a safetensors file, in its header (the first bytes). A model named by a hub
id rather than a directory has no fingerprint (nothing local to compare).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["base_model_problem", "fingerprint"]

_EDGE_BYTES = 64 * 1024
#: A directory with more files than this is not a model directory: no fingerprint.
_MAX_FILES = 500


def fingerprint(path: str | Path) -> dict[str, list[Any]] | None:
    """``{file name: [size, edge hash]}`` of the model directory ``path``, or ``None`` when ``path``
    is not a directory (a hub id) or holds no files."""
    directory = Path(path)
    if not directory.is_dir():
        return None
    files = sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files or len(files) > _MAX_FILES:
        return None
    record: dict[str, list[Any]] = {}
    for file in files:
        size = file.stat().st_size
        digest = hashlib.sha256()
        with file.open("rb") as handle:
            digest.update(handle.read(_EDGE_BYTES))
            if size > _EDGE_BYTES:
                handle.seek(max(_EDGE_BYTES, size - _EDGE_BYTES))
                digest.update(handle.read(_EDGE_BYTES))
        record[file.name] = [size, digest.hexdigest()]
    return record


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
            if list(before[file]) != list(now[file]):
                what = "size" if before[file][0] != now[file][0] else "content"
                return (
                    f"the base model {name} at {paths[name]} is not the one the checkpoint was trained on: "
                    f"{file} changed ({what})"
                )
    return None
