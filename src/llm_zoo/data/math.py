"""Math problems: the problem record, the built-in sets, and loaders for public formats.

Built-in sets (offline, shipped in the package, written for llm-zoo):

* ``"generated"`` - :mod:`llm_zoo.data.math_generator`: levels 1-3, unlimited training problems,
  a fixed test set of ``TEST_SEEDS`` problems per level. Ids ``gen-L{level}-{seed}``.
* ``"word"`` - ``math_word_problems.json``: 38 word problems (27 train, 11 test), ids ``word-NNN``,
  each with an exact answer, a ``split``, a ``difficulty`` (1-3) and a ``topic``.
* ``"builtin"`` - both: each draw is a word problem with probability ``WORD_SHARE`` (0.25) and a
  generated one otherwise (level uniform among the allowed levels).

Public formats (from local JSONL / JSON / parquet files, directories written by ``datasets``'
``save_to_disk`` (a ``DatasetDict``'s is narrowed to the env's split,
:mod:`llm_zoo.data.saved_dataset`), or Hugging Face ``datasets`` objects, which are used
duck-typed: any iterable of dict records, or a mapping of split names to such iterables, e.g. a
``DatasetDict``):

* ``"math"`` (Hendrycks MATH): ``problem``, ``level`` (``"Level 3"``, or an int), ``type`` (or
  ``subject``), ``solution``; the answer is the last ``\\boxed{}`` of the solution, or the
  ``answer`` field where there is one (MATH-500).
* ``"gsm8k"``: ``question``, ``answer`` ending with ``#### 42``; the final answer has its commas
  stripped (``#### 1,200`` -> ``1200``).
* ``"aime"``: ``ID``/``Problem``/``Answer`` or ``id``/``problem``/``answer``/``year`` (keys match
  case-insensitively; ``question`` is accepted for ``problem``); integer answers lose leading
  zeros.
* ``"generic"``: ``question`` (or ``problem``) and ``answer``, optional ``id``, ``split``,
  ``difficulty`` (or ``level``), ``topic`` - the format of the built-in word problems.

``format="auto"`` picks ``math`` when records have a ``solution`` and a ``level`` / ``type`` /
``subject``, ``gsm8k`` when the answer contains ``####``, ``aime`` when keys are the capitalised
``ID``/``Problem``/``Answer`` or there is a ``year``, and ``generic`` otherwise. A record that does
not fit its format, whose question or gold answer is not one string or finite number (``[1, 2]``,
``{"a": 1}``, ``true``), or whose id another record already has raises :class:`DatasetError` naming
the file and the record (its index, counted from 0 without blank lines, and its id).

A file or directory is parsed once per process (:func:`llm_zoo.data.files.cached_load`, keyed by its resolved
path, size and modification time); envs made on it share one immutable :class:`ProblemSet`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from llm_zoo.data import math_generator
from llm_zoo.data.files import base_suffix, cached_load, duplicate_id, object_file_message, read_text
from llm_zoo.data.math_fields import (
    DatasetError,
    level_of,
    lower_keys,
    record_id,
    scalar_text,
    split_of,
    text_field,
)
from llm_zoo.data.saved_dataset import SavedDatasetError, load_saved_dataset
from llm_zoo.parsing import ParseError, extract_boxed

__all__ = [
    "BUILTIN_DATASETS",
    "FORMATS",
    "WORD_SHARE",
    "DatasetError",
    "MathProblem",
    "ProblemSet",
    "UnknownProblemError",
    "build_problem_set",
    "generated_problem",
    "load_math_records",
    "problem_key",
    "problems_from_records",
    "read_records",
    "word_problems",
]

FORMATS = ("auto", "math", "gsm8k", "aime", "generic")
BUILTIN_DATASETS = ("builtin", "generated", "word")
SPLITS = ("train", "test")
#: In the ``"builtin"`` set, the probability that a draw is a word problem.
WORD_SHARE = 0.25


class UnknownProblemError(KeyError, ValueError):
    """No problem has the id asked for. A ``KeyError`` (a lookup by id) and a ``ValueError`` (a
    wrong ``reset`` option), whose message is shown as written (``KeyError`` would quote it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class MathProblem:
    """One problem with an exact answer.

    Attributes:
        id: Stable id, unique within its set (``gen-L2-1000123``, ``word-007``, ``MATH-42``).
        question: The problem statement shown to the agents.
        answer: The gold answer as a string (LaTeX or plain), checked with math-verify.
        source: ``"generated"``, ``"word"``, ``"MATH"``, ``"GSM8K"``, ``"AIME"`` or ``"custom"``.
        difficulty: Level (1-3 built-in, 1-5 MATH), ``None`` when the source has none.
        topic: Subject area (``"algebra"``, MATH's ``type``), may be empty.
        split: ``"train"`` / ``"test"`` when the record says, else ``None``.
        solution: A reference solution when the source has one (never shown to the agents).
        params: For generated problems, the numbers the problem was built from.
    """

    id: str
    question: str
    answer: str
    source: str
    difficulty: int | None = None
    topic: str = ""
    split: str | None = None
    solution: str = ""
    params: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)


# ---------------------------------------------------------------------------- built-in sets


def generated_problem(level: int, seed: int) -> MathProblem:
    """The generated problem ``gen-L{level}-{seed}``."""
    question, answer, kind, topic, params = math_generator.generate(level, seed)
    split = (
        "test"
        if seed < math_generator.TEST_SEEDS
        else ("train" if seed >= math_generator.TRAIN_SEED_START else None)
    )
    return MathProblem(
        id=f"gen-L{level}-{seed}", question=question, answer=answer, source="generated",
        difficulty=level, topic=topic, split=split, params={"kind": kind, **params},
    )  # fmt: skip


def problem_key(problem: MathProblem) -> tuple[Any, ...]:
    """What ``problem`` asks, for finding duplicates by content: a generated problem's
    :func:`~llm_zoo.data.math_generator.content_key` (commutative operands sorted), else its question
    in lower case with whitespace collapsed and the answer (same text, same gold: same problem)."""
    if problem.source == "generated" and "kind" in problem.params:
        params = {k: v for k, v in problem.params.items() if k != "kind"}
        return ("generated", problem.difficulty, *math_generator.content_key(problem.params["kind"], params))
    return ("text", " ".join(problem.question.lower().split()), problem.answer.strip())


@lru_cache(maxsize=1)
def _word_problems() -> tuple[MathProblem, ...]:
    text = resources.files("llm_zoo.data").joinpath("math_word_problems.json").read_text("utf-8")
    records = json.loads(text)
    return tuple(_generic(r, i, "math_word_problems.json", "word") for i, r in enumerate(records))


def word_problems(split: str | None = None) -> list[MathProblem]:
    """The built-in word problems, all or those of ``split``."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    return [p for p in _word_problems() if split is None or p.split == split]


_GENERATED_ID = re.compile(r"^gen-L(\d+)-(\d+)$")


class ProblemSet:
    """Where an env's problems come from: a fixed list, the generator, or both.

    Immutable and shared between an env and its clones (copying returns the same object).

    Args:
        fixed: Problems to draw uniformly from.
        levels: Generator levels to draw from (empty: no generated problems).
        split: Split of the generated problems (``"train"`` or ``"test"``).
        fixed_share: Probability that a draw comes from ``fixed`` when both are present.
    """

    def __init__(
        self,
        fixed: Sequence[MathProblem] = (),
        levels: Sequence[int] = (),
        split: str = "train",
        fixed_share: float = WORD_SHARE,
    ):
        self.fixed = tuple(fixed)
        self.levels = tuple(levels)
        self.split = split
        self.fixed_share = float(fixed_share) if self.fixed and self.levels else float(bool(self.fixed))
        self._by_id: dict[str, MathProblem] = {}
        for problem in self.fixed:
            if problem.id in self._by_id:
                raise DatasetError(f"duplicate problem id {problem.id!r}: ids must be unique")
            self._by_id[problem.id] = problem
        if not self.fixed and not self.levels:
            raise DatasetError("the problem set is empty (check the dataset, split and difficulty)")

    def sample(self, rng: np.random.Generator) -> MathProblem:
        """Draw a problem with ``rng``."""
        if self.fixed and (not self.levels or rng.random() < self.fixed_share):
            return self.fixed[int(rng.integers(len(self.fixed)))]
        level = self.levels[int(rng.integers(len(self.levels)))]
        seed = math_generator.sample_seed(level, self.split, lambda low, high: int(rng.integers(low, high)))
        return generated_problem(level, seed)

    def get(self, problem_id: str) -> MathProblem:
        """The problem with this id (any generated id ``gen-L{level}-{seed}`` works)."""
        problem = self._by_id.get(str(problem_id))
        if problem is not None:
            return problem
        match = _GENERATED_ID.match(str(problem_id))
        if match and self.levels:
            return generated_problem(int(match[1]), int(match[2]))
        examples = ", ".join(repr(p.id) for p in self.fixed[:5])
        if self.levels:
            examples += (", " if examples else "") + f"'gen-L{self.levels[0]}-<seed>'"
        raise UnknownProblemError(f"unknown problem id {problem_id!r}; ids look like {examples}")

    def ids(self) -> list[str] | None:
        """Every problem id when the set is finite (a fixed list, or the generated test split)."""
        if self.levels and self.split != "test":
            return None
        generated = [
            f"gen-L{level}-{seed}" for level in self.levels for seed in range(math_generator.TEST_SEEDS)
        ]
        return [p.id for p in self.fixed] + generated

    def distinct_ids(self) -> list[str] | None:
        """:meth:`ids` without content duplicates (:func:`problem_key`; the first id of each
        content is kept), for evaluating on distinct problems; ``None`` when the set is infinite."""
        ids = self.ids()
        if ids is None:
            return None
        seen: set[tuple[Any, ...]] = set()
        distinct = []
        for problem_id in ids:
            key = problem_key(self.get(problem_id))
            if key not in seen:
                seen.add(key)
                distinct.append(problem_id)
        return distinct

    def __copy__(self) -> ProblemSet:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ProblemSet:
        return self

    def __repr__(self) -> str:
        return f"ProblemSet(fixed={len(self.fixed)}, levels={self.levels}, split={self.split!r})"


def _difficulties(difficulty: int | Iterable[int] | None) -> tuple[int, ...] | None:
    if difficulty is None:
        return None
    values = (difficulty,) if isinstance(difficulty, (int, np.integer)) else tuple(difficulty)
    if not values or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        raise ValueError(f"difficulty must be an int, a list of ints or None, got {difficulty!r}")
    return tuple(int(v) for v in values)


def build_problem_set(
    dataset: Any = "builtin",
    split: str = "train",
    difficulty: int | Iterable[int] | None = None,
    format: str = "auto",
) -> ProblemSet:
    """The :class:`ProblemSet` for ``Math-v0``'s ``dataset`` / ``split`` / ``difficulty`` arguments.

    ``dataset`` is a built-in name (:data:`BUILTIN_DATASETS`), a path to a JSONL / JSON / parquet
    file, a sequence of :class:`MathProblem`, or a ``datasets`` object / iterable of records.
    For files and record lists, problems whose record names a split are kept only if it is
    ``split``; problems without a split are all kept. ``difficulty`` keeps problems of those
    levels (problems without a level are dropped when it is set).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    levels = _difficulties(difficulty)
    if isinstance(dataset, str) and dataset in BUILTIN_DATASETS:
        if levels is not None:
            bad = [v for v in levels if v not in math_generator.LEVELS]
            if bad:
                raise ValueError(
                    f"unknown difficulty {bad[0]!r} for the built-in sets; valid: {list(math_generator.LEVELS)}"
                )
        allowed = levels or math_generator.LEVELS
        words = [p for p in word_problems(split) if p.difficulty in allowed] if dataset != "generated" else []
        generated = allowed if dataset != "word" else ()
        return ProblemSet(words, generated, split)
    if (
        isinstance(dataset, str)
        and not os.path.exists(dataset)
        and not dataset.endswith((".jsonl", ".json", ".parquet", ".jsonl.gz", ".json.gz"))
    ):
        raise ValueError(
            f"unknown dataset {dataset!r}: use one of {', '.join(map(repr, BUILTIN_DATASETS))}, a path to a "
            ".jsonl/.json/.parquet (or .jsonl.gz/.json.gz) file or save_to_disk directory, or a list / "
            "datasets.Dataset of records"
        )
    if isinstance(dataset, (str, os.PathLike)):
        # One ProblemSet per file, split and levels, shared by every env made on it.
        return cached_load(dataset, _file_problem_set, split, levels, format)
    if isinstance(dataset, Sequence) and dataset and all(isinstance(p, MathProblem) for p in dataset):
        problems = list(dataset)
    else:
        problems = load_math_records(dataset, format=format, split=split)
    return _selected(problems, split, levels, _name(dataset))


def _file_problem_set(path: str, split: str, levels: tuple[int, ...] | None, format: str) -> ProblemSet:
    return _selected(load_math_records(path, format=format, split=split), split, levels, path)


def _selected(
    problems: Sequence[MathProblem], split: str, levels: tuple[int, ...] | None, origin: str
) -> ProblemSet:
    """The :class:`ProblemSet` of ``problems`` in ``split`` (or without one) and of ``levels``."""
    problems = [p for p in problems if p.split is None or p.split == split]
    if levels is not None:
        problems = [p for p in problems if p.difficulty in levels]
    if not problems:
        shown = None if levels is None else list(levels)
        raise DatasetError(f"no problems left in {origin} for split={split!r}, difficulty={shown!r}")
    return ProblemSet(problems)


# ---------------------------------------------------------------------------- reading records


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``.jsonl``, ``.json`` (a list of records, or JSON lines, as
    ``datasets.Dataset.to_json`` writes) or ``.parquet`` file; ``.jsonl.gz`` / ``.json.gz`` are
    decompressed. A ``.json`` file holding one object gets an error naming its keys."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise DatasetError(f"dataset file not found: {path!r}")
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as parquet
        except ImportError:
            raise DatasetError(f"reading {path!r} needs the 'pyarrow' package: pip install pyarrow") from None
        try:
            return list(parquet.read_table(path).to_pylist())
        except Exception as error:
            raise DatasetError(f"{path}: not a readable parquet file ({error})") from None
    try:
        text = read_text(path)
    except ValueError as error:
        raise DatasetError(str(error)) from None
    stripped = text.lstrip()
    suffix = base_suffix(path)
    if suffix == ".json" and stripped.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # JSON lines, as datasets.Dataset.to_json writes: read below
        if isinstance(data, dict) and "\n" in stripped.rstrip():  # one line would be one JSON-lines record
            raise DatasetError(object_file_message(path, data))
    if suffix == ".json" and stripped.startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as error:
            raise DatasetError(f"{path}: invalid JSON at line {error.lineno}: {error.msg}") from None
        for index, record in enumerate(records):
            if not isinstance(record, dict):
                raise DatasetError(f"{path}: record {index} is a {type(record).__name__}, not an object")
        return records
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DatasetError(f"{path}: line {number} is not valid JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise DatasetError(f"{path}: line {number} is a {type(record).__name__}, not an object")
        records.append(record)
    return records


def load_math_records(source: Any, *, format: str = "auto", split: str | None = None) -> list[MathProblem]:
    """Problems from a file path, a ``datasets`` object, or an iterable of record dicts.

    A mapping of split names to record collections (a ``DatasetDict``, in memory or a
    ``save_to_disk`` directory) is narrowed to ``split``.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown dataset format {format!r}; valid formats: {', '.join(FORMATS)}")
    if isinstance(source, (str, os.PathLike)):
        if os.path.isdir(source):
            return list(cached_load(source, _parse_saved, format, split))
        return list(cached_load(source, _parse_file, format))  # parsed once per process
    if isinstance(source, Mapping):
        if split is None or split not in source:
            raise DatasetError(
                f"the dataset has splits {sorted(map(str, source))}; pick one with split= (got {split!r})"
            )
        source = source[split]
    if isinstance(source, (bytes, Mapping)) or not isinstance(source, Iterable):
        raise DatasetError(
            f"cannot read problems from a {type(source).__name__}: pass a file path, a datasets.Dataset "
            "or a list of records"
        )
    return problems_from_records(source, format=format, origin=_name(source))


def _parse_file(path: str, format: str) -> tuple[MathProblem, ...]:
    return tuple(problems_from_records(read_records(path), format=format, origin=path))


def _parse_saved(path: str, format: str, split: str | None) -> tuple[MathProblem, ...]:
    try:
        directory, records = load_saved_dataset(path, split)
    except SavedDatasetError as error:
        raise DatasetError(str(error)) from None
    return tuple(problems_from_records(records, format=format, origin=directory))


def problems_from_records(
    records: Iterable[Any], *, format: str = "auto", origin: str = "records"
) -> list[MathProblem]:
    """Convert records of a public format (see the module docstring) to problems.

    Raises :class:`DatasetError` naming the record (index, and id when it has one) when it does not
    fit the format, its question or answer is not one string or number (``[1, 2]``, ``{"a": 1}``,
    ``true``), or its id is already used by another record.
    """
    problems = []
    chosen = format
    first_index: dict[str, int] = {}
    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise DatasetError(f"{origin}: record {index} is a {type(record).__name__}, not a dict")
        if chosen == "auto":
            chosen = _detect(record)
        problem = _CONVERTERS[chosen](record, index, origin)
        duplicate = duplicate_id(first_index, problem.id, index)
        if duplicate:
            raise DatasetError(f"{origin}: record {index}: {duplicate}")
        problems.append(problem)
    if not problems:
        raise DatasetError(f"{origin}: no records")
    return problems


def _name(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    name = getattr(getattr(source, "info", None), "dataset_name", None)
    return f"dataset {name!r}" if name else f"{type(source).__name__} of records"


def _detect(record: Mapping[str, Any]) -> str:
    keys = lower_keys(record)
    if "solution" in keys and "problem" in keys and ({"level", "type", "subject"} & set(keys)):
        return "math"
    if "####" in str(keys.get("answer", "")):
        return "gsm8k"
    if {"ID", "Problem", "Answer"} <= set(map(str, record)) or "year" in keys:
        return "aime"
    return "generic"


def _from_math(record: Mapping[str, Any], index: int, origin: str) -> MathProblem:
    keys = lower_keys(record)
    question = text_field(keys, ("problem",), index, origin)
    solution = str(keys.get("solution") or "")
    answer = scalar_text(keys, "answer", index, origin)
    if not answer:
        try:
            answer = extract_boxed(solution)
        except ParseError:
            bare = re.findall(r"\\boxed\s+([^\s$]+)", solution)  # "\boxed 5", seen in MATH
            if not bare:
                raise DatasetError(
                    f"{origin}: record {index} has no \\boxed{{}} answer in its solution"
                ) from None
            answer = bare[-1]
    return MathProblem(
        id=record_id(keys, "MATH", index, origin), question=question, answer=answer, source="MATH",
        difficulty=level_of(keys.get("level"), index, origin),
        topic=str(keys.get("type") or keys.get("subject") or ""), split=split_of(keys), solution=solution,
    )  # fmt: skip


def _from_gsm8k(record: Mapping[str, Any], index: int, origin: str) -> MathProblem:
    keys = lower_keys(record)
    question = text_field(keys, ("question",), index, origin)
    full = text_field(keys, ("answer",), index, origin)
    if "####" not in full:
        raise DatasetError(f"{origin}: record {index} has no '#### <answer>' at the end of its answer")
    solution, _, final = full.rpartition("####")
    answer = final.strip().replace(",", "").rstrip(".").strip()
    if not answer:
        raise DatasetError(f"{origin}: record {index} has nothing after '####'")
    return MathProblem(
        id=record_id(keys, "GSM8K", index, origin), question=question, answer=answer, source="GSM8K",
        split=split_of(keys), solution=solution.strip(),
    )  # fmt: skip


def _from_aime(record: Mapping[str, Any], index: int, origin: str) -> MathProblem:
    problem = _generic(record, index, origin, "AIME")
    year = lower_keys(record).get("year")
    topic = f"AIME {year}" if year not in (None, "") else problem.topic
    return MathProblem(
        id=problem.id, question=problem.question, answer=problem.answer, source="AIME",
        difficulty=problem.difficulty, topic=topic, split=problem.split, solution=problem.solution,
    )  # fmt: skip


def _generic(record: Mapping[str, Any], index: int, origin: str, source: str = "custom") -> MathProblem:
    keys = lower_keys(record)
    question = text_field(keys, ("question", "problem"), index, origin)
    answer = text_field(keys, ("answer",), index, origin)
    if re.fullmatch(r"[+-]?\d+", answer):
        answer = str(int(answer))  # "073" -> "73"
    prefix = {"custom": "custom", "word": "word", "AIME": "AIME"}[source]
    return MathProblem(
        id=record_id(keys, prefix, index, origin), question=question, answer=answer, source=source,
        difficulty=level_of(keys.get("difficulty", keys.get("level")), index, origin),
        topic=str(keys.get("topic") or ""), split=split_of(keys), solution=str(keys.get("solution") or ""),
    )  # fmt: skip


_CONVERTERS = {"math": _from_math, "gsm8k": _from_gsm8k, "aime": _from_aime, "generic": _generic}
