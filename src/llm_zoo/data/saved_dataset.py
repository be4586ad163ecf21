"""Datasets saved with Hugging Face ``datasets``' ``save_to_disk``, as task sources.

``datasets.Dataset.save_to_disk(path)`` writes a directory holding ``dataset_info.json``,
``state.json`` and Arrow shards; ``DatasetDict.save_to_disk(path)`` writes ``dataset_dict.json``
(``{"splits": [...]}``) and one such directory per split. ``Code-v0`` and ``Math-v0`` accept
either directory wherever they accept a dataset file (``make("Math-v0", dataset="data/gsm8k")``):

* a ``Dataset`` directory is read like a file: its records, in order, in one of the loader's
  formats;
* a ``DatasetDict`` directory is narrowed to the env's ``split`` (``"train"`` / ``"test"``); a
  split the directory does not have is an error naming the splits it has. A split with another
  name (``"validation"``) is read by passing its own directory (``data/gsm8k/validation``).

Reading needs the ``datasets`` package (``pip install datasets``), imported only when such a
directory is read: ``pip install llm-zoo`` does not install it. Columns are taken as saved, with
any output format (``set_format("numpy")``) reset, so records hold plain Python values and are
checked by the loader like the records of any other source. A directory parsed once is not read
again while its files keep their sizes and modification times (:func:`llm_zoo.data.files.cached_load`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "DATASET_DICT_FILE",
    "DATASET_FILES",
    "SavedDatasetError",
    "is_saved_dataset",
    "load_saved_dataset",
    "saved_dataset_dir",
    "saved_splits",
]

#: The file ``DatasetDict.save_to_disk`` writes at the top of its directory.
DATASET_DICT_FILE = "dataset_dict.json"
#: The files ``Dataset.save_to_disk`` writes next to its Arrow shards.
DATASET_FILES = ("dataset_info.json", "state.json")


class SavedDatasetError(ValueError):
    """A ``save_to_disk`` directory that cannot be read: the message names it and the problem."""


def is_saved_dataset(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return False
    if os.path.isfile(os.path.join(path, DATASET_DICT_FILE)):
        return True
    return all(os.path.isfile(os.path.join(path, name)) for name in DATASET_FILES)


def saved_splits(path: str | os.PathLike[str]) -> list[str] | None:
    """The split names of a ``DatasetDict`` directory, in saved order; ``None`` for a ``Dataset``
    directory. Raises :class:`SavedDatasetError` for a directory that is neither."""
    path = os.fspath(path)
    if not is_saved_dataset(path):
        raise SavedDatasetError(
            f"{path}: a directory, but not a dataset saved with datasets' save_to_disk (it has neither "
            f"{DATASET_DICT_FILE} nor {' and '.join(DATASET_FILES)}); pass such a directory or a "
            ".jsonl/.json/.parquet file"
        )
    listing = os.path.join(path, DATASET_DICT_FILE)
    if not os.path.isfile(listing):
        return None
    try:
        with open(listing, encoding="utf-8") as handle:
            splits = json.load(handle)["splits"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SavedDatasetError(f"{listing}: cannot read the list of splits ({err})") from None
    if not isinstance(splits, list) or not all(isinstance(name, str) for name in splits):
        raise SavedDatasetError(f"{listing}: 'splits' should be a list of names, got {splits!r}")
    return splits


def saved_dataset_dir(path: str | os.PathLike[str], split: str | None) -> str:
    """The ``Dataset`` directory to read for ``path``: ``path`` itself for a ``Dataset`` directory,
    ``path/<split>`` for a ``DatasetDict`` directory.

    Raises :class:`SavedDatasetError` when ``path`` is not a saved dataset, or is a ``DatasetDict``
    and ``split`` is ``None`` or not one of its splits (the message names the splits it has).
    """
    path = os.fspath(path)
    splits = saved_splits(path)
    if splits is None:
        return path
    if split not in splits:
        asked = "no split was chosen" if split is None else f"it has no split {split!r}"
        example = os.path.join(path, splits[0]) if splits else path
        raise SavedDatasetError(
            f"{path}: a DatasetDict with the splits {splits}, but {asked}; use split= one of them, "
            f"or pass one split's directory (e.g. {example})"
        )
    return os.path.join(path, split)


def load_saved_dataset(
    path: str | os.PathLike[str], split: str | None = None
) -> tuple[str, Iterable[Mapping[str, Any]]]:
    """Open the saved dataset at ``path`` (the ``split`` of a ``DatasetDict`` directory).

    Returns ``(directory, records)``: the ``Dataset`` directory read (to name in errors) and the
    dataset, an iterable of record dicts holding plain Python values, memory-mapped, not copied.
    Raises :class:`SavedDatasetError` naming the directory when it cannot be read, including when
    ``datasets`` is not installed.
    """
    directory = saved_dataset_dir(path, split)
    try:
        import datasets
    except ImportError:
        raise SavedDatasetError(
            f"{directory}: reading a dataset saved with save_to_disk needs the `datasets` package "
            "(pip install datasets)"
        ) from None
    try:
        dataset = datasets.load_from_disk(directory)
    except Exception as err:  # datasets / pyarrow / fsspec raise many kinds for a damaged directory
        raise SavedDatasetError(
            f"{directory}: cannot load the saved dataset ({type(err).__name__}: {err})"
        ) from None
    if not isinstance(dataset, datasets.Dataset):
        # A DatasetDict nested inside a split directory: not something save_to_disk writes.
        raise SavedDatasetError(f"{directory}: expected one split's records, got a {type(dataset).__name__}")
    return directory, dataset.with_format(None)
