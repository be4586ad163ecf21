"""Build ``src/llm_zoo/data/code_problems.json``, the built-in Code-v0 problem set.

The stdin/stdout problems are written in ``tools/code_problems/{easy,medium,hard}.py`` (statement,
reference solution, test inputs), the call-based ones in ``tools/code_problems/calls.py``
(statement, function name, signature, reference, argument lists). This script runs every
reference on every test input through the llm-zoo sandbox (call-based: through the call harness,
:mod:`llm_zoo.checkers.call_harness`), takes its output / return value as the expected one, assigns the
fixed train/test split and writes the JSON file the package ships. It also checks that each
statement's example is test 0 and that the reference gives the example's answer, and that every
return value survives the JSON round trip.

Split: within each kind and difficulty, problems sorted by slug; every fourth starting with the
second (index % 4 == 1) is ``test``, the rest ``train`` (about 75/25 per difficulty).

Usage:
    python tools/build_code_problems.py            # rebuild the JSON file
    python tools/build_code_problems.py --check    # rebuild in memory, fail if the file differs
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from code_problems import calls, easy, hard, medium  # noqa: E402
from code_problems.calls import CallProblem  # noqa: E402
from code_problems.common import Spec  # noqa: E402

from llm_zoo.checkers.call_harness import args_text, call_stdin, call_text, harness_program, read_call_result  # noqa: E402
from llm_zoo.envs.code import outputs_match  # noqa: E402
from llm_zoo.sandbox import run_python  # noqa: E402

OUTPUT = HERE.parent / "src" / "llm_zoo" / "data" / "code_problems.json"
MIN_TESTS = 5
DIFFICULTIES = ("easy", "medium", "hard")
RUN_TIMEOUT_S = 20.0
SLOW_RUN_S = 1.0


def all_specs() -> list[Spec]:
    specs = [*easy.PROBLEMS, *medium.PROBLEMS, *hard.PROBLEMS]
    slugs = [s.slug for s in specs]
    duplicates = sorted({slug for slug in slugs if slugs.count(slug) > 1})
    if duplicates:
        raise SystemExit(f"duplicate slugs: {duplicates}")
    for s in specs:
        if s.difficulty not in DIFFICULTIES:
            raise SystemExit(f"{s.slug}: difficulty {s.difficulty!r} not in {DIFFICULTIES}")
        if len(set(s.inputs)) < MIN_TESTS:
            raise SystemExit(f"{s.slug}: {len(set(s.inputs))} distinct inputs, need at least {MIN_TESTS}")
    return specs


def splits(specs: list[Spec] | list[CallProblem]) -> dict[str, str]:
    result = {}
    for difficulty in DIFFICULTIES:
        slugs = sorted(s.slug for s in specs if s.difficulty == difficulty)
        for index, slug in enumerate(slugs):
            result[slug] = "test" if index % 4 == 1 else "train"
    return result


def expected_outputs(spec: Spec) -> tuple[list[str], float]:
    """Run the reference on every input; fail loudly on any error. Returns outputs and max time."""
    outputs, slowest = [], 0.0
    for number, stdin in enumerate(spec.inputs):
        run = run_python(spec.reference, stdin=stdin, timeout=RUN_TIMEOUT_S, memory_mb=1024)
        if not run.ok or not run.stdout.strip():
            raise SystemExit(
                f"{spec.slug} input {number}: reference failed (exit {run.exit_code}, timed out "
                f"{run.timed_out}):\n{run.stderr[-2000:]}"
            )
        outputs.append(run.stdout)
        slowest = max(slowest, run.duration_s)
    return outputs, slowest


def check_example(spec: Spec, outputs: list[str]) -> None:
    """The statement's example (``Input:`` ... ``Output:`` ...) must be test 0 with its real output."""
    match = re.search(r"\nExample\nInput:\n(.*?)Output:\n(.*)\Z", spec.statement, re.DOTALL)
    if match is None:
        raise SystemExit(f"{spec.slug}: the statement has no 'Example / Input: / Output:' section")
    example_in, example_out = match.groups()
    if example_in != spec.inputs[0]:
        raise SystemExit(f"{spec.slug}: the example input is not test 0:\n{example_in!r}\n{spec.inputs[0]!r}")
    if not outputs_match(outputs[0], example_out):
        raise SystemExit(
            f"{spec.slug}: the reference prints {outputs[0]!r}, the example says {example_out!r}"
        )


def call_records() -> list[dict]:
    """The call-based problems: expected values from the reference through the call harness."""
    problems = calls.PROBLEMS
    taken = {s.slug for s in all_specs()}
    slugs = [p.slug for p in problems]
    clashes = sorted({slug for slug in slugs if slugs.count(slug) > 1 or slug in taken})
    if clashes:
        raise SystemExit(f"duplicate slugs: {clashes}")
    split_of = splits(problems)
    records = []
    for problem in problems:
        if len({repr(a) for a in problem.args}) < MIN_TESTS:
            raise SystemExit(f"{problem.slug}: fewer than {MIN_TESTS} distinct argument lists")
        program = harness_program(problem.reference, problem.name, problem.class_name)
        expected = []
        for number, args in enumerate(problem.args):
            run = run_python(
                program, stdin=call_stdin(args_text(args)), timeout=RUN_TIMEOUT_S, memory_mb=1024
            )
            if not run.ok:
                raise SystemExit(f"{problem.slug} test {number}: reference failed:\n{run.stderr[-2000:]}")
            value = read_call_result(run.stdout)
            if json.loads(json.dumps(value)) != value:
                raise SystemExit(f"{problem.slug} test {number}: {value!r} does not survive JSON")
            expected.append(value)
            if run.duration_s > SLOW_RUN_S:
                print(
                    f"warning: {problem.slug}: a reference run took {run.duration_s:.2f} s", file=sys.stderr
                )
        target = f"{problem.class_name}().{problem.name}" if problem.class_name else problem.name
        example = f"Example: {call_text(target, args_text(problem.args[0]))} returns {expected[0]!r}"
        if example not in problem.statement:
            raise SystemExit(f"{problem.slug}: the statement lacks the line {example!r}")
        records.append(
            {
                "id": f"builtin/{problem.slug}",
                "title": problem.title,
                "difficulty": problem.difficulty,
                "source": "builtin",
                "split": split_of[problem.slug],
                "statement": problem.statement,
                "reference": problem.reference,
                "call": {
                    "name": problem.name,
                    "class_name": problem.class_name,
                    "signature": problem.signature,
                },
                "tests": [{"input": a, "output": o} for a, o in zip(problem.args, expected, strict=True)],
            }
        )
    return records


def build() -> list[dict]:
    specs = all_specs()
    split_of = splits(specs)
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(expected_outputs, specs))
    records = []
    for spec, (outputs, slowest) in zip(specs, results, strict=True):
        check_example(spec, outputs)
        if slowest > SLOW_RUN_S:
            print(f"warning: {spec.slug}: slowest reference run took {slowest:.2f} s", file=sys.stderr)
        records.append(
            {
                "id": f"builtin/{spec.slug}",
                "title": spec.title,
                "difficulty": spec.difficulty,
                "source": "builtin",
                "split": split_of[spec.slug],
                "statement": spec.statement,
                "reference": spec.reference,
                "tests": [{"input": i, "output": o} for i, o in zip(spec.inputs, outputs, strict=True)],
            }
        )
    return records + call_records()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the shipped file is out of date")
    args = parser.parse_args()
    start = time.monotonic()
    records = build()
    text = json.dumps(records, indent=1, ensure_ascii=False) + "\n"
    counts = {d: sum(r["difficulty"] == d for r in records) for d in DIFFICULTIES}
    tests = sum(r["split"] == "test" for r in records)
    summary = (
        f"{len(records)} problems {counts}, {len(records) - tests} train / {tests} test, "
        f"{sum(len(r['tests']) for r in records)} tests, built in {time.monotonic() - start:.1f} s"
    )
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text(encoding="utf-8") != text:
            print(f"{OUTPUT} is out of date: run python tools/build_code_problems.py", file=sys.stderr)
            return 1
        print(f"up to date: {summary}")
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT}: {summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
