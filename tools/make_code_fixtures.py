"""Write the small Code-v0 dataset fixtures in ``tests/fixtures/code/``.

Each file imitates one public release exactly (field names, nesting, JSON-in-string encodings,
LiveCodeBench's compressed private tests), with a few tiny problems written for the tests:

* ``apps.jsonl``: APPS (``codeparrot/apps``): a stdin problem with solutions, a problem whose test
  input/output are lists of lines and whose ``solutions`` is empty, a call-based problem (``fn_name``, LeetCode-style ``Solution``).
* ``apps_malformed.jsonl``: record 1 has an ``input_output`` that is not JSON.
* ``code_contests.parquet`` and ``code_contests.json``: CodeContests (``deepmind/code_contests``):
  nested ``{input, output}`` test structs, ``solutions`` with a Python 2 (1), C++ (2) and Python 3
  (3) program, enum difficulty; one file-I/O problem (skipped).
* ``livecodebench.jsonl``: ``code_generation_lite``: an AtCoder problem whose private tests are
  base64(zlib(pickle(JSON))) as in the real release, a Codeforces one with plain JSON private
  tests, a LeetCode functional problem (call-based).

Usage: python tools/make_code_fixtures.py   (needs pyarrow for the parquet file)
"""

from __future__ import annotations

import base64
import json
import pickle
import zlib
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "code"

SUM_TWO = "a, b = map(int, input().split())\nprint(a + b)\n"
MAX_OF = "input()\nprint(max(map(int, input().split())))\n"


def apps_records() -> list[dict]:
    return [
        {
            "problem_id": 4001,
            "question": "Read two integers a and b and print a + b.\n\n-----Input-----\nOne line: a b\n"
            "\n-----Output-----\nPrint a + b.\n\n-----Examples-----\nInput\n1 2\n\nOutput\n3\n",
            "solutions": json.dumps([SUM_TWO, "print(sum(map(int, input().split())))\n"]),
            "input_output": json.dumps(
                {"inputs": ["1 2\n", "-5 5\n", "100 23\n"], "outputs": ["3\n", "0\n", "123\n"]}
            ),
            "difficulty": "introductory",
            "url": "https://example.invalid/apps/4001",
            "starter_code": "",
        },
        {
            "problem_id": 4002,
            "question": "Given n and n integers, print the largest.\n",
            "solutions": "",
            "input_output": json.dumps({"inputs": [["3", "1 9 4"], ["1", "-7"]], "outputs": [["9"], ["-7"]]}),
            "difficulty": "interview",
            "url": "https://example.invalid/apps/4002",
            "starter_code": "",
        },
        {
            "problem_id": 4003,
            "question": "Complete the function add(a, b).\n",
            "solutions": json.dumps(["class Solution:\n    def add(self, a, b):\n        return a + b\n"]),
            "input_output": json.dumps({"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]}),
            "difficulty": "competition",
            "url": "https://example.invalid/apps/4003",
            "starter_code": "class Solution:\n    def add(self, a, b):\n",
        },
    ]


def code_contests_records() -> list[dict]:
    def tests(pairs):
        return {"input": [i for i, _ in pairs], "output": [o for _, o in pairs]}

    base = {
        "source": 2,
        "incorrect_solutions": {"language": [], "solution": []},
        "cf_contest_id": 9001,
        "cf_points": 500.0,
        "cf_tags": ["math"],
        "is_description_translated": False,
        "untranslated_description": "",
        "time_limit": {"seconds": 1, "nanos": 0},
        "memory_limit_bytes": 256000000,
        "input_file": "",
        "output_file": "",
    }
    return [
        dict(
            base,
            name="9001_A. Sum of Two",
            description="Print the sum of two integers a and b given on one line.",
            public_tests=tests([("1 2\n", "3\n")]),
            private_tests=tests([("10 20\n", "30\n"), ("1 2\n", "3\n")]),
            generated_tests=tests([("-3 -4\n", "-7\n")]),
            solutions={
                "language": [1, 2, 3],
                "solution": ["a, b = map(int, raw_input().split())\nprint a + b\n", "int main(){}", SUM_TWO],
            },
            difficulty=7,
            cf_index="A",
            cf_rating=800,
        ),
        dict(
            base,
            name="9001_B. Largest",
            description="Given n and then n integers, print the largest.",
            public_tests=tests([("3\n1 9 4\n", "9\n")]),
            private_tests=tests([]),
            generated_tests=tests([("2\n-1 -2\n", "-1\n")]),
            solutions={"language": [2], "solution": ["int main(){}"]},
            difficulty=2,
            cf_index="B",
            cf_rating=1200,
        ),
        dict(
            base,
            name="9001_C. File Reader",
            description="Read input.txt and write output.txt.",
            public_tests=tests([("1\n", "1\n")]),
            private_tests=tests([]),
            generated_tests=tests([]),
            solutions={"language": [3], "solution": ["print(open('input.txt').read())"]},
            difficulty=9,
            cf_index="C",
            cf_rating=1500,
            input_file="input.txt",
            output_file="output.txt",
        ),
    ]


def compress_like_livecodebench(tests: list[dict]) -> str:
    """The encoding of the real release's ``private_test_cases``."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode("utf-8")


def livecodebench_records() -> list[dict]:
    def case(i, o, kind="stdin"):
        return {"input": i, "output": o, "testtype": kind}

    return [
        {
            "question_title": "Sum of Two",
            "question_content": "You are given integers A and B. Print A+B.\n\nInput\n\nA B\n\nOutput\n\nPrint the answer.",
            "platform": "atcoder",
            "question_id": "abc900_a",
            "contest_id": "abc900",
            "contest_date": "2024-01-06T00:00:00",
            "starter_code": "",
            "difficulty": "easy",
            "public_test_cases": json.dumps([case("1 2\n", "3\n")]),
            "private_test_cases": compress_like_livecodebench([case("5 7\n", "12\n"), case("0 0\n", "0\n")]),
            "metadata": "{}",
        },
        {
            "question_title": "Largest",
            "question_content": "Given n and n integers, print the largest.",
            "platform": "codeforces",
            "question_id": "1999B",
            "contest_id": "1999",
            "contest_date": "2024-08-01T00:00:00",
            "starter_code": "",
            "difficulty": "medium",
            "public_test_cases": json.dumps([case("3\n1 9 4\n", "9\n")]),
            "private_test_cases": json.dumps([case("2\n-1 -2\n", "-1\n")]),
            "metadata": "{}",
        },
        {
            "question_title": "add-two-numbers",
            "question_content": "Return a + b.",
            "platform": "leetcode",
            "question_id": "9999",
            "contest_id": "weekly-contest-999",
            "contest_date": "2024-02-01T00:00:00",
            "starter_code": "class Solution:\n    def add(self, a: int, b: int) -> int:\n        ",
            "difficulty": "hard",
            "public_test_cases": json.dumps([case("1\n2", "3", "functional")]),
            "private_test_cases": compress_like_livecodebench([case("4\n5", "9", "functional")]),
            "metadata": json.dumps({"func_name": "add"}),
        },
    ]


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def main() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    OUT.mkdir(parents=True, exist_ok=True)
    write_jsonl(OUT / "apps.jsonl", apps_records())
    malformed = apps_records()[:2]
    malformed[1] = dict(malformed[1], input_output='{"inputs": ["1"], "outputs": ')
    write_jsonl(OUT / "apps_malformed.jsonl", malformed)
    contests = code_contests_records()
    (OUT / "code_contests.json").write_text(json.dumps(contests, indent=1) + "\n", encoding="utf-8")
    pq.write_table(pa.Table.from_pylist(contests), OUT / "code_contests.parquet")
    write_jsonl(OUT / "livecodebench.jsonl", livecodebench_records())
    print(f"wrote fixtures to {OUT}")


if __name__ == "__main__":
    main()
