"""Programming problems for ``Code-v0``: the built-in set and loaders for public dataset formats.

A :class:`CodeProblem` is a statement, hidden ground-truth tests (standard input -> expected
standard output), a reference solution where the source has one, a difficulty and an origin.

Sources, chosen with :func:`load_code_problems` (or ``make("Code-v0", dataset=...)``):

* ``"builtin"``: the problems written for this project, shipped as ``code_problems.json`` next to
  this module (built by ``tools/build_code_problems.py``), each with a fixed ``split``.
* A local file, ``.jsonl`` (one record per line), ``.json`` (a list of records) or ``.parquet``
  (needs ``pyarrow``), in one of the formats below; the format is given or sniffed from the first
  record's fields.
* A list of :class:`CodeProblem`, or any iterable of record dicts, e.g. a Hugging Face
  ``datasets.Dataset`` (duck-typed: ``datasets`` is never imported).

Formats (field names exactly as in the public releases):

* ``"apps"`` (APPS, ``codeparrot/apps``): ``problem_id``, ``question``, ``solutions`` (JSON string,
  list of programs), ``input_output`` (JSON string ``{"inputs": [...], "outputs": [...]}``, an input
  or output may itself be a list of lines), ``difficulty`` (introductory / interview /
  competition -> easy / medium / hard), ``url``, ``starter_code``. The first solution is the
  reference. Problems whose ``input_output`` has ``fn_name`` are call-based and skipped.
* ``"code_contests"`` (CodeContests, ``deepmind/code_contests``): ``name``, ``description``,
  ``public_tests`` / ``private_tests`` / ``generated_tests`` (``{"input": [...], "output":
  [...]}``, all three become hidden tests, duplicates dropped), ``solutions`` (``{"language":
  [...], "solution": [...]}``; the first ``language == 3`` (PYTHON3) solution is the reference,
  Python 2 and other languages are ignored), ``difficulty`` (enum EASY=1, MEDIUM=2, HARD..HARDEST
  =3..5, Codeforces letters A=7, B=8, ...; mapped by :data:`CODE_CONTESTS_DIFFICULTY`). Problems
  that read a named file (``input_file`` / ``output_file`` set) are skipped. The reference is
  taken as published, not re-checked.
* ``"livecodebench"`` (``livecodebench/code_generation_lite``): ``question_title``,
  ``question_content``, ``platform``, ``question_id``, ``contest_id``, ``contest_date``,
  ``starter_code``, ``difficulty``, ``public_test_cases`` (JSON string, list of ``{input, output,
  testtype}``), ``private_test_cases``, ``metadata``. Only ``testtype == "stdin"`` tests are used;
  ``"functional"`` (LeetCode call-based) tests are skipped, and a problem left without tests is
  skipped. There is no reference solution.
* ``"llm_zoo"``: this project's own format (the built-in file): ``id``, ``statement``, ``tests``
  (list of ``{"input", "output"}``), optional ``title``, ``reference``, ``difficulty``,
  ``source``, ``split``, ``metadata``.

LiveCodeBench's ``private_test_cases`` is, in the real release, not JSON but
``base64(zlib(pickle(json_string)))`` (LiveCodeBench's own loader calls ``pickle.loads`` on it).
This module never runs ``pickle.loads`` on downloaded data: it uses an unpickler whose
``find_class`` refuses every global, so only plain values (str, numbers, lists, dicts, ...) can be
built, requires the result to be a ``str`` and parses that with ``json``. Decompressed payloads
over :data:`MAX_DECOMPRESSED_BYTES` are refused.

Errors: a missing file, an unreadable record or a record lacking a field raises
:class:`CodeDatasetError` naming the file, the record index and, when known, its id.
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import json
import os
import pickle
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "CODE_CONTESTS_DIFFICULTY",
    "FORMATS",
    "MAX_DECOMPRESSED_BYTES",
    "CodeDatasetError",
    "CodeProblem",
    "TestCase",
    "load_builtin_problems",
    "load_code_problems",
    "read_records",
    "sniff_format",
]

#: Largest decompressed LiveCodeBench test payload accepted (bytes).
MAX_DECOMPRESSED_BYTES = 256 << 20

#: CodeContests ``difficulty`` enum value -> easy / medium / hard (0 UNKNOWN and 6 EXTERNAL -> unknown).
#: 1 EASY, 2 MEDIUM, 3-5 HARD/HARDER/HARDEST; 7.. are Codeforces letters A, B, C, ...
CODE_CONTESTS_DIFFICULTY = {1: "easy", 2: "medium", 3: "hard", 4: "hard", 5: "hard", 7: "easy", 8: "easy"}
CODE_CONTESTS_DIFFICULTY.update({9: "medium", 10: "medium"})
CODE_CONTESTS_DIFFICULTY.update({letter: "hard" for letter in range(11, 29)})
_PYTHON3 = 3
_APPS_DIFFICULTY = {"introductory": "easy", "interview": "medium", "competition": "hard"}
BUILTIN_FILE = "code_problems.json"


class CodeDatasetError(ValueError):
    """A problem source could not be read: the message names the file and the record."""


@dataclass(frozen=True)
class TestCase:
    """One test: the program gets ``input`` on stdin and must print ``output`` (judged leniently,
    see :func:`llm_zoo.envs.code.outputs_match`)."""

    __test__ = False  # not a pytest test class

    input: str
    output: str


@dataclass(frozen=True)
class CodeProblem:
    """A stdin/stdout programming problem.

    Attributes:
        id: Unique id, prefixed by the source (``"builtin/..."``, ``"apps/..."``, ...).
        statement: The problem text shown to the agents.
        tests: Hidden ground-truth tests (at least one).
        reference: A reference solution (Python 3 program), or ``None`` if the source has none.
        difficulty: ``"easy"``, ``"medium"``, ``"hard"`` or ``"unknown"``.
        source: ``"builtin"``, ``"apps"``, ``"code_contests"``, ``"livecodebench"`` or as given.
        title: A short name (may be empty).
        split: ``"train"`` / ``"test"`` for the built-in set; ``None`` when the source file itself
            is one split (it then belongs to whichever split is asked for).
        metadata: Source-specific extras (url, contest, raw difficulty, ...). Read-only by convention.
    """

    id: str
    statement: str
    tests: tuple[TestCase, ...]
    reference: str | None = None
    difficulty: str = "unknown"
    source: str = "builtin"
    title: str = ""
    split: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"a problem id must be a non-empty string, got {self.id!r}")
        object.__setattr__(self, "tests", tuple(self.tests))
        if not self.tests or not all(isinstance(t, TestCase) for t in self.tests):
            raise ValueError(f"problem {self.id!r}: tests must be a non-empty sequence of TestCase")

    def __deepcopy__(self, memo: dict) -> CodeProblem:
        return self  # immutable: env clones share problems instead of copying every test


# ---------------------------------------------------------------------------------------- reading


def read_records(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(index, record)`` from a ``.jsonl``, ``.json`` (list) or ``.parquet`` file."""
    path = Path(path)
    if not path.is_file():
        raise CodeDatasetError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        yield from _read_parquet(path)
    elif suffix == ".jsonl":
        with path.open(encoding="utf-8") as handle:
            index = -1
            for line in handle:
                if not line.strip():
                    continue
                index += 1
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise CodeDatasetError(f"{path}, record {index}: not valid JSON ({err})") from None
                yield index, _as_record(record, f"{path}, record {index}")
    elif suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise CodeDatasetError(f"{path}: not valid JSON ({err})") from None
        if not isinstance(data, list):
            raise CodeDatasetError(
                f"{path}: a .json dataset must be a list of records, got {type(data).__name__}"
            )
        for index, record in enumerate(data):
            yield index, _as_record(record, f"{path}, record {index}")
    else:
        raise CodeDatasetError(f"{path}: unknown file type {suffix!r}; expected .jsonl, .json or .parquet")


def _read_parquet(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise CodeDatasetError(
            f"{path}: reading parquet needs the `pyarrow` package (pip install pyarrow)"
        ) from None
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=256)
        index = 0
        for batch in batches:
            for record in batch.to_pylist():
                yield index, record
                index += 1
    except (OSError, ValueError) as err:  # pyarrow's errors derive from these
        raise CodeDatasetError(f"{path}: cannot read parquet ({err})") from None


def _as_record(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, Mapping):
        raise CodeDatasetError(f"{where}: expected an object with named fields, got {type(record).__name__}")
    return dict(record)


def sniff_format(record: Mapping[str, Any]) -> str:
    """Name the format of one record from its fields; raise :class:`CodeDatasetError` if unknown."""
    keys = set(record)
    if {"question", "input_output"} <= keys:
        return "apps"
    if {"question_content", "public_test_cases"} <= keys:
        return "livecodebench"
    if "description" in keys and keys & {"public_tests", "private_tests", "generated_tests"}:
        return "code_contests"
    if {"id", "statement", "tests"} <= keys:
        return "llm_zoo"
    raise CodeDatasetError(
        f"cannot tell the dataset format from the fields {sorted(keys)[:12]}; pass format= one of {sorted(FORMATS)}"
    )


# ---------------------------------------------------------------------------------------- loading


def load_code_problems(
    source: str | os.PathLike | Iterable[Any],
    *,
    format: str | None = None,
    split: str | None = None,
) -> list[CodeProblem]:
    """Load problems from ``"builtin"``, a file path, or an iterable of records / problems.

    Args:
        source: ``"builtin"``; a path to a ``.jsonl`` / ``.json`` / ``.parquet`` file; a list of
            :class:`CodeProblem`; or an iterable of record dicts (e.g. a ``datasets.Dataset``).
        format: One of :data:`FORMATS` (``"apps"``, ``"code_contests"``, ``"livecodebench"``,
            ``"llm_zoo"``), or ``None`` to sniff it from the first record.
        split: For ``"builtin"`` only: ``"train"``, ``"test"`` or ``None`` (all).

    Records whose tests cannot be run through stdin/stdout (call-based, file I/O, no tests) are
    skipped; every other problem in the source is returned, in order.
    """
    if isinstance(source, str) and source == "builtin":
        return load_builtin_problems(split)
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown dataset format {format!r}; choose one of {sorted(FORMATS)}")
    if isinstance(source, (str, os.PathLike)):
        origin = str(source)
        records: Iterable[tuple[int, Any]] = read_records(source)
    elif isinstance(source, Mapping):
        raise CodeDatasetError(
            f"got a mapping with keys {sorted(map(str, source))[:8]} (a DatasetDict?); pass one split, "
            "e.g. dataset['test'], or a list of records"
        )
    elif isinstance(source, Iterable):
        origin = type(source).__name__
        records = enumerate(source)
    else:
        raise TypeError(
            f"dataset must be 'builtin', a file path or an iterable of records, got {type(source).__name__}"
        )
    problems = []
    for index, record in records:
        if isinstance(record, CodeProblem):
            problems.append(record)
            continue
        where = f"{origin}, record {index}"
        record = _as_record(record, where)
        if format is None:
            try:
                format = sniff_format(record)
            except CodeDatasetError as err:
                raise CodeDatasetError(f"{where}: {err}") from None
        try:
            problem = FORMATS[format](record)
        except CodeDatasetError as err:
            raise CodeDatasetError(f"{where}{_id_note(record)}: {err}") from None
        if problem is not None:
            problems.append(problem)
    return problems


def _id_note(record: Mapping[str, Any]) -> str:
    for key in ("id", "problem_id", "question_id", "name"):
        if record.get(key) not in (None, ""):
            return f" (id {record[key]!r})"
    return ""


@functools.lru_cache(maxsize=1)
def _builtin_problems() -> tuple[CodeProblem, ...]:
    text = resources.files("llm_zoo.data").joinpath(BUILTIN_FILE).read_text(encoding="utf-8")
    records = json.loads(text)
    return tuple(
        _from_llm_zoo_checked(record, f"{BUILTIN_FILE}, record {index}")
        for index, record in enumerate(records)
    )


def _from_llm_zoo_checked(record: dict[str, Any], where: str) -> CodeProblem:
    try:
        return from_llm_zoo(record)
    except CodeDatasetError as err:
        raise CodeDatasetError(f"{where}{_id_note(record)}: {err}") from None


def load_builtin_problems(split: str | None = None) -> list[CodeProblem]:
    """The built-in problems, all or one split (``"train"`` / ``"test"``)."""
    problems = _builtin_problems()
    if split is None:
        return list(problems)
    splits = sorted({p.split for p in problems if p.split})
    if split not in splits:
        raise ValueError(f"unknown split {split!r} for the built-in code problems; choose one of {splits}")
    return [p for p in problems if p.split == split]


# ---------------------------------------------------------------------------------------- formats


def _get(record: Mapping[str, Any], key: str, kind: type | tuple[type, ...] = str) -> Any:
    if key not in record or record[key] is None:
        raise CodeDatasetError(f"missing field {key!r}")
    value = record[key]
    if not isinstance(value, kind):
        raise CodeDatasetError(f"field {key!r} should be {_kind_name(kind)}, got {type(value).__name__}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _json_field(record: Mapping[str, Any], key: str, default: Any) -> Any:
    """A field holding JSON text (empty -> ``default``); already-decoded values pass through."""
    value = record.get(key)
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as err:
        raise CodeDatasetError(f"field {key!r} is not valid JSON ({err})") from None


def _text(value: Any, what: str) -> str:
    """A test input/output: a string, or a list of lines (APPS has both)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value) + "\n"
    raise CodeDatasetError(f"{what} should be a string or a list of strings, got {type(value).__name__}")


def _pairs(inputs: Any, outputs: Any, what: str) -> list[TestCase]:
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise CodeDatasetError(f"{what}: inputs and outputs should be lists")
    if len(inputs) != len(outputs):
        raise CodeDatasetError(f"{what}: {len(inputs)} inputs but {len(outputs)} outputs")
    return [
        TestCase(_text(i, f"{what} input {n}"), _text(o, f"{what} output {n}"))
        for n, (i, o) in enumerate(zip(inputs, outputs, strict=True))
    ]


def from_llm_zoo(record: Mapping[str, Any]) -> CodeProblem:
    """A record in this project's own format (see the module docstring)."""
    raw_tests = _get(record, "tests", list)
    tests = []
    for n, test in enumerate(raw_tests):
        if (
            not isinstance(test, Mapping)
            or not isinstance(test.get("input"), str)
            or not isinstance(test.get("output"), str)
        ):
            raise CodeDatasetError(f"test {n} should be an object with string fields 'input' and 'output'")
        tests.append(TestCase(test["input"], test["output"]))
    if not tests:
        raise CodeDatasetError("field 'tests' is empty")
    reference = record.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise CodeDatasetError(f"field 'reference' should be a string, got {type(reference).__name__}")
    metadata = record.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        raise CodeDatasetError("field 'metadata' should be an object")
    return CodeProblem(
        id=_get(record, "id"),
        statement=_get(record, "statement"),
        tests=tuple(tests),
        reference=reference or None,
        difficulty=str(record.get("difficulty") or "unknown"),
        source=str(record.get("source") or "llm_zoo"),
        title=str(record.get("title") or ""),
        split=record.get("split") or None,
        metadata=dict(metadata),
    )


def from_apps(record: Mapping[str, Any]) -> CodeProblem | None:
    """An APPS record; ``None`` for a call-based problem or one without tests."""
    problem_id = _get(record, "problem_id", (int, str))
    question = _get(record, "question")
    io_spec = _json_field(record, "input_output", {})
    if not isinstance(io_spec, Mapping):
        raise CodeDatasetError("field 'input_output' should hold a JSON object")
    if io_spec.get("fn_name"):
        return None  # call-based: tests call a function, not stdin/stdout
    tests = _pairs(io_spec.get("inputs", []), io_spec.get("outputs", []), "input_output")
    if not tests:
        return None
    solutions = _json_field(record, "solutions", [])
    if not isinstance(solutions, list) or not all(isinstance(s, str) for s in solutions):
        raise CodeDatasetError("field 'solutions' should hold a JSON list of strings")
    raw_difficulty = str(record.get("difficulty") or "")
    return CodeProblem(
        id=f"apps/{problem_id}",
        statement=question,
        tests=tuple(tests),
        reference=solutions[0] if solutions else None,
        difficulty=_APPS_DIFFICULTY.get(raw_difficulty, "unknown"),
        source="apps",
        metadata={"url": record.get("url") or "", "raw_difficulty": raw_difficulty},
    )


def from_code_contests(record: Mapping[str, Any]) -> CodeProblem | None:
    """A CodeContests record; ``None`` for a file-I/O problem or one without tests."""
    name = _get(record, "name")
    description = _get(record, "description")
    if record.get("input_file") or record.get("output_file"):
        return None  # reads/writes named files, not stdin/stdout
    tests: list[TestCase] = []
    seen: set[TestCase] = set()
    for key in ("public_tests", "private_tests", "generated_tests"):
        group = record.get(key) or {}
        if not isinstance(group, Mapping):
            raise CodeDatasetError(f"field {key!r} should be an object with 'input' and 'output' lists")
        for test in _pairs(group.get("input") or [], group.get("output") or [], key):
            if test not in seen:
                seen.add(test)
                tests.append(test)
    if not tests:
        return None
    solutions = record.get("solutions") or {}
    if not isinstance(solutions, Mapping):
        raise CodeDatasetError("field 'solutions' should be an object with 'language' and 'solution' lists")
    languages, programs = solutions.get("language") or [], solutions.get("solution") or []
    reference = next(
        (p for lang, p in zip(languages, programs, strict=False) if lang == _PYTHON3 and isinstance(p, str)),
        None,
    )
    raw_difficulty = record.get("difficulty")
    difficulty = (
        CODE_CONTESTS_DIFFICULTY.get(raw_difficulty, "unknown")
        if isinstance(raw_difficulty, int)
        else "unknown"
    )
    return CodeProblem(
        id=f"code_contests/{name}",
        statement=description,
        tests=tuple(tests),
        reference=reference,
        difficulty=difficulty,
        source="code_contests",
        title=name,
        metadata={"raw_difficulty": raw_difficulty, "cf_rating": record.get("cf_rating")},
    )


def from_livecodebench(record: Mapping[str, Any]) -> CodeProblem | None:
    """A LiveCodeBench ``code_generation_lite`` record; ``None`` if it has no stdin tests."""
    question_id = _get(record, "question_id", (str, int))
    content = _get(record, "question_content")
    public = _json_field(record, "public_test_cases", [])
    private = decode_livecodebench_tests(record.get("private_test_cases"))
    tests = []
    for n, case in enumerate([*public, *private]):
        if not isinstance(case, Mapping) or "input" not in case or "output" not in case:
            raise CodeDatasetError(f"test case {n} should be an object with 'input', 'output', 'testtype'")
        if case.get("testtype", "stdin") != "stdin":
            continue  # "functional": calls a LeetCode method, cannot run through stdin/stdout
        tests.append(
            TestCase(_text(case["input"], f"test {n} input"), _text(case["output"], f"test {n} output"))
        )
    if not tests:
        return None
    raw_difficulty = str(record.get("difficulty") or "").lower()
    return CodeProblem(
        id=f"livecodebench/{question_id}",
        statement=content,
        tests=tuple(tests),
        reference=None,
        difficulty=raw_difficulty if raw_difficulty in {"easy", "medium", "hard"} else "unknown",
        source="livecodebench",
        title=str(record.get("question_title") or ""),
        metadata={
            "platform": record.get("platform") or "",
            "contest_id": record.get("contest_id") or "",
            "contest_date": str(record.get("contest_date") or ""),
        },
    )


class _PlainValuesUnpickler(pickle.Unpickler):
    """Unpickles plain values only: every global (class, function) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only plain values are allowed")


def decode_livecodebench_tests(value: Any) -> list[Any]:
    """Decode LiveCodeBench ``private_test_cases``: JSON text, or base64(zlib(pickle(JSON text)))."""
    if value is None or value == "":
        return []
    if isinstance(value, list):
        return value
    if not isinstance(value, str):
        raise CodeDatasetError(f"field 'private_test_cases' should be a string, got {type(value).__name__}")
    try:
        decoded = json.loads(value)
    except json.JSONDecodeError:
        try:
            decoded = json.loads(_unpack_compressed(value))
        except json.JSONDecodeError as err:
            raise CodeDatasetError(f"field 'private_test_cases' holds invalid JSON ({err})") from None
    if not isinstance(decoded, list):
        raise CodeDatasetError("field 'private_test_cases' should decode to a list of test cases")
    return decoded


def _unpack_compressed(value: str) -> str:
    problem = "field 'private_test_cases' is neither JSON nor base64(zlib(pickle(JSON)))"
    try:
        packed = base64.b64decode(value.encode("ascii"), validate=True)
        inflater = zlib.decompressobj()
        raw = inflater.decompress(packed, MAX_DECOMPRESSED_BYTES)
        if inflater.unconsumed_tail:
            raise CodeDatasetError(f"{problem}: decompressed size exceeds {MAX_DECOMPRESSED_BYTES} bytes")
        text = _PlainValuesUnpickler(io.BytesIO(raw)).load()
    except CodeDatasetError:
        raise
    except (binascii.Error, UnicodeEncodeError, zlib.error) as err:
        raise CodeDatasetError(f"{problem} ({type(err).__name__}: {err})") from None
    except Exception as err:  # a malformed pickle can fail in many ways; none may crash the loader
        raise CodeDatasetError(f"{problem} (unpickling failed: {type(err).__name__}: {err})") from None
    if not isinstance(text, str):
        raise CodeDatasetError(f"{problem}: the pickle holds {type(text).__name__}, expected str")
    return text


#: Format name -> record converter (returns ``None`` for a record that is skipped).
FORMATS: dict[str, Callable[[Mapping[str, Any]], CodeProblem | None]] = {
    "apps": from_apps,
    "code_contests": from_code_contests,
    "livecodebench": from_livecodebench,
    "llm_zoo": from_llm_zoo,
}
