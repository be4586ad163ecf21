"""The fields of a math dataset record, read with errors that name the record.

Shared by the format converters of :mod:`llm_zoo.data.math`. Field names are matched in lower
case (:func:`lower_keys`). Text fields (question, answer, id) must hold one string or one finite
number: JSON's ``[1, 2]``, ``{"a": 1}`` or ``true`` would otherwise become the gold answer
``"[1, 2]"`` or ``"True"``, which no model's answer could match.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "ID_FIELDS",
    "DatasetError",
    "id_note",
    "level_of",
    "lower_keys",
    "record_id",
    "scalar_text",
    "split_of",
    "text_field",
]


#: The fields that hold a record's id, first found first used.
ID_FIELDS = ("id", "unique_id", "problem_id")


class DatasetError(ValueError):
    """A dataset file or record cannot be read; the message names the file and the record."""


def lower_keys(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with its keys in lower case (``Problem`` and ``problem`` alike)."""
    return {str(k).lower(): v for k, v in record.items()}


def text_field(keys: dict[str, Any], names: Sequence[str], index: int, origin: str) -> str:
    """The first non-empty field of ``names`` as text (:func:`scalar_text`); :class:`DatasetError`
    naming record ``index`` of ``origin`` when none is there."""
    for name in names:
        text = scalar_text(keys, name, index, origin)
        if text:
            return text
    raise DatasetError(
        f"{origin}: record {index}{id_note(keys)} has no {' / '.join(map(repr, names))} field (or it is empty)"
    )


def scalar_text(keys: dict[str, Any], name: str, index: int, origin: str) -> str:
    """``keys[name]`` as stripped text, ``""`` when absent; a value that is not one string or one
    finite number (a list, an object, a bool: JSON would make ``"[1, 2]"`` or ``"True"`` the gold
    answer) raises :class:`DatasetError`."""
    value = keys.get(name)
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, (bool, np.bool_))
        and math.isfinite(value)
    ):
        return str(value)
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise DatasetError(
        f"{origin}: record {index}{id_note(keys)}: {name!r} is {shown} (a {type(value).__name__}); it must be "
        'one string or one finite number (write a set or a tuple answer as text, e.g. "(1, 2)")'
    )


def id_note(keys: dict[str, Any]) -> str:
    """``" (id 'x')"`` for a record with an id field, ``""`` otherwise (for messages)."""
    for name in ID_FIELDS:
        if isinstance(keys.get(name), (str, int)) and keys[name] != "":
            return f" (id {keys[name]!r})"
    return ""


def level_of(value: Any, index: int, origin: str) -> int | None:
    """A difficulty as an int (``"Level 3"`` -> 3), ``None`` when there is none."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    match = re.search(r"\d+", str(value))
    if match is None:
        if "?" in str(value) or not str(value).strip():
            return None  # MATH has a few "Level ?" records
        raise DatasetError(f"{origin}: record {index} has an unreadable level {value!r}")
    return int(match.group())


def record_id(keys: dict[str, Any], prefix: str, index: int, origin: str) -> str:
    """The record's id, or ``{prefix}-{index}`` when it has none."""
    for name in ID_FIELDS:
        text = scalar_text(keys, name, index, origin)
        if text:
            return text
    return f"{prefix}-{index}"


def split_of(keys: dict[str, Any]) -> str | None:
    """The record's ``split`` field, ``None`` when it has none."""
    value = keys.get("split")
    return str(value) if value not in (None, "") else None
