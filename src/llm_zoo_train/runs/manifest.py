"""Checkpoint manifests: the size and SHA-256 of every file, written last.

A checkpoint directory is complete only when it holds ``manifest.json``: :func:`write_manifest`
hashes every other file of the directory and writes the manifest through a temporary file and a
rename, after everything else, so a checkpoint whose writer was killed, or whose files were later
truncated, emptied, edited or deleted, fails :func:`verify_manifest` with a message naming the
file. ``--resume`` then falls back to the newest checkpoint that verifies
(:func:`llm_zoo_train.runs.checkpoint.find_checkpoint`).

Format::

    {"format": 1, "files": {"adapters/alice/adapter_model.safetensors": {"size": N, "sha256": "..."}, ...}}
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

__all__ = ["MANIFEST", "TRAINER_STATE", "CheckpointDamagedError", "verify_manifest", "write_manifest"]

MANIFEST = "manifest.json"
#: The file every checkpoint's manifest must list (the resume reads it first).
TRAINER_STATE = "trainer_state.json"
#: What may be added to a checkpoint after its manifest: ``llm-zoo-train eval`` results and hidden
#: files (an interrupted manifest write's ``.manifest.json.partial``).
_WRITTEN_LATER = ("eval/", ".")
_FORMAT = 1
_CHUNK = 1 << 20


class CheckpointDamagedError(Exception):
    """A checkpoint that is incomplete, altered or unreadable; ``str(error)`` is one line naming
    the file, ``error.path`` is that file."""

    def __init__(self, message: str, path: Path):
        super().__init__(message)
        self.path = path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(directory: Path) -> list[str]:
    """Every regular file under ``directory`` but the manifest, as sorted POSIX relative paths."""
    return sorted(
        path.relative_to(directory).as_posix()
        for path in directory.rglob("*")
        if path.is_file() and path.name != MANIFEST
    )


def write_manifest(directory: str | Path) -> Path:
    """Hash every file in ``directory`` and write ``directory/manifest.json`` atomically."""
    directory = Path(directory)
    files = {
        name: {"size": (directory / name).stat().st_size, "sha256": _sha256(directory / name)}
        for name in _files(directory)
    }
    target = directory / MANIFEST
    partial = directory / f".{MANIFEST}.partial"
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump({"format": _FORMAT, "files": files}, handle, indent=1, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, target)
    return target


def verify_manifest(directory: str | Path) -> None:
    """Check every file of checkpoint ``directory`` against its manifest (sizes first, then
    hashes); :class:`CheckpointDamagedError` naming the first listed file that is missing or
    has another size or content, a file the manifest does not list (but ``eval/`` results and
    hidden files, written later), or the manifest itself when it is missing, unreadable or does
    not list the trainer state: a manifest that covers less than the checkpoint verifies nothing."""
    directory = Path(directory)
    manifest = directory / MANIFEST
    if not manifest.is_file():
        raise CheckpointDamagedError(
            f"{manifest} is missing: the checkpoint is incomplete (or was written before checkpoints had manifests)",
            manifest,
        )
    try:
        files = json.loads(manifest.read_text(encoding="utf-8"))["files"]
        listed = {str(name): (int(entry["size"]), str(entry["sha256"])) for name, entry in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointDamagedError(f"{manifest} is unreadable ({type(err).__name__})", manifest) from None
    present = set(_files(directory))
    if TRAINER_STATE not in listed:  # an empty manifest, or one that skips what a resume reads first
        raise CheckpointDamagedError(f"{manifest} does not list {TRAINER_STATE}", manifest)
    for name in sorted(present - set(listed)):
        if not name.startswith(_WRITTEN_LATER):
            raise CheckpointDamagedError(
                f"{directory / name} is not listed in {MANIFEST}: the checkpoint was altered",
                directory / name,
            )
    for name in sorted(set(listed) - present):
        raise CheckpointDamagedError(
            f"{directory / name} is missing (listed in {MANIFEST})", directory / name
        )
    for name, (size, _) in sorted(listed.items()):
        actual = (directory / name).stat().st_size
        if actual != size:
            raise CheckpointDamagedError(
                f"{directory / name} has {actual} bytes, {MANIFEST} says {size}", directory / name
            )
    for name, (_, digest) in sorted(listed.items()):
        if _sha256(directory / name) != digest:
            raise CheckpointDamagedError(
                f"{directory / name} differs from {MANIFEST} (SHA-256 mismatch)", directory / name
            )
