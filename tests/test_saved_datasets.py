"""Datasets saved with ``datasets``' ``save_to_disk`` as Code-v0 / Math-v0 task sources
(:mod:`llm_zoo.data.saved_dataset`): the directories are written here, in tmp_path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import llm_zoo
from llm_zoo.data.code import CodeDatasetError, load_code_problems
from llm_zoo.data.math import DatasetError, load_math_records

datasets = pytest.importorskip("datasets")

FIXTURES = Path(__file__).parent / "fixtures"


def rows(name: str) -> list[dict]:
    text = (FIXTURES / name).read_text()
    return json.loads(text) if name.endswith(".json") else [json.loads(line) for line in text.splitlines()]


def save(path: Path, records: list[dict]) -> Path:
    datasets.Dataset.from_list(records).save_to_disk(str(path))
    return path


def save_dict(path: Path, splits: dict[str, list[dict]]) -> Path:
    datasets.DatasetDict({name: datasets.Dataset.from_list(r) for name, r in splits.items()}).save_to_disk(
        str(path)
    )
    return path


# ------------------------------------------------------------------------------------------- Math


def test_math_reads_a_saved_dataset_like_its_file(tmp_path):
    records = rows("math/gsm8k.jsonl")
    directory = save(tmp_path / "gsm8k", records)
    from_file = load_math_records(FIXTURES / "math/gsm8k.jsonl")
    assert load_math_records(directory) == from_file
    env = llm_zoo.make("Math-v0", dataset=str(directory), split="test")
    assert env.problem_set.ids() == [p.id for p in from_file]
    env.reset(seed=0)
    question = env.problem_set.get(env.problem.id).question
    assert question in env.observe(env.agent_selection)["prompt"]


def test_math_dataset_dict_directory_is_narrowed_to_the_env_split(tmp_path):
    records = rows("math/math_hendrycks.jsonl")
    directory = save_dict(tmp_path / "math", {"train": records[:2], "test": records[2:3]})
    test = llm_zoo.make("Math-v0", dataset=str(directory), split="test")
    assert [test.problem_set.get(i).answer for i in test.problem_set.ids()] == ["2\\sqrt{3}"]
    train = llm_zoo.make("Math-v0", dataset=directory, split="train")
    assert [train.problem_set.get(i).answer for i in train.problem_set.ids()] == ["\\frac{5}{6}", "3"]


def test_math_missing_split_names_the_splits_and_one_split_directory_works(tmp_path):
    records = rows("math/gsm8k.jsonl")
    directory = save_dict(tmp_path / "gsm8k", {"train": records[:1], "validation": records[1:]})
    with pytest.raises(
        DatasetError, match=r"splits \['train', 'validation'\], but it has no split 'test'.*gsm8k/train"
    ):
        llm_zoo.make("Math-v0", dataset=str(directory), split="test")
    with pytest.raises(DatasetError, match=r"no split was chosen"):
        load_math_records(directory)
    env = llm_zoo.make("Math-v0", dataset=str(directory / "validation"), split="test")
    assert len(env.problem_set.ids()) == len(records) - 1


def test_math_wrong_columns_name_the_column_and_the_record(tmp_path):
    directory = save(tmp_path / "bad", [{"id": "p1", "question": "1 + 1?", "reply": "2"}])
    with pytest.raises(DatasetError, match=r"bad: record 0 \(id 'p1'\) has no 'answer' field"):
        llm_zoo.make("Math-v0", dataset=str(directory))


# ------------------------------------------------------------------------------------------- Code


def test_code_reads_a_saved_dataset_and_plays_its_problems(tmp_path):
    directory = save(tmp_path / "apps", rows("code/apps.jsonl"))
    from_file = load_code_problems(FIXTURES / "code/apps.jsonl")
    assert load_code_problems(directory) == from_file
    env = llm_zoo.make("Code-v0", dataset=str(directory))
    assert [p.id for p in env.problems] == ["apps/4001", "apps/4002", "apps/4003"]
    env.reset(seed=0, options={"problem_id": "apps/4001"})
    env.step(f"```python\n{from_file[0].reference}```\n")
    info = env.infos["coder"]
    assert info["hidden_total"] == 3 and info["hidden_passed"] == 3


def test_code_dataset_dict_directory_is_narrowed_to_the_env_split(tmp_path):
    contests = rows("code/code_contests.json")
    directory = save_dict(tmp_path / "cc", {"train": contests[:1], "test": contests[1:]})
    test = llm_zoo.make("Code-v0", dataset=directory, split="test", dataset_format="code_contests")
    train = llm_zoo.make("Code-v0", dataset=directory, split="train", dataset_format="code_contests")
    assert [len(test.problems), len(train.problems)] == [1, 1]
    assert test.problems[0].id != train.problems[0].id
    with pytest.raises(
        CodeDatasetError, match=r"splits \['train', 'test'\], but no split was chosen.*cc/train"
    ):
        llm_zoo.make("Code-v0", dataset=directory, split="all")


def test_code_missing_split_and_wrong_columns_give_clear_errors(tmp_path):
    directory = save_dict(tmp_path / "apps", {"validation": rows("code/apps.jsonl")})
    with pytest.raises(CodeDatasetError, match=r"splits \['validation'\], but it has no split 'train'"):
        llm_zoo.make("Code-v0", dataset=str(directory))
    assert len(llm_zoo.make("Code-v0", dataset=directory / "validation").problems) == 3
    unknown = save(tmp_path / "unknown", [{"title": "t", "body": "b"}])
    with pytest.raises(
        CodeDatasetError,
        match=r"unknown, record 0: cannot tell the dataset format from the fields \['body', 'title'\]",
    ):
        load_code_problems(unknown)
    record = {k: v for k, v in rows("code/apps.jsonl")[0].items() if k != "question"}
    missing = save(tmp_path / "missing", [record])
    with pytest.raises(CodeDatasetError, match=r"missing, record 0 \(id 4001\): missing field 'question'"):
        load_code_problems(missing, format="apps")


# ------------------------------------------------------------------------------ bad directories


@pytest.mark.parametrize("loader", [load_code_problems, load_math_records], ids=["code", "math"])
def test_directories_that_are_not_saved_datasets(tmp_path, loader):
    error = CodeDatasetError if loader is load_code_problems else DatasetError
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "train.parquet").write_bytes(b"")
    with pytest.raises(
        error, match=r"plain: a directory, but not a dataset saved with datasets' save_to_disk"
    ):
        loader(tmp_path / "plain")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "dataset_dict.json").write_text("{not json")
    with pytest.raises(error, match=r"dataset_dict.json: cannot read the list of splits"):
        loader(broken, split="train")
    lost = save(tmp_path / "lost", rows("math/gsm8k.jsonl"))
    for shard in lost.glob("*.arrow"):
        shard.unlink()
    with pytest.raises(error, match=r"lost: cannot load the saved dataset"):
        loader(lost)


def test_without_datasets_installed_the_error_says_what_to_install(tmp_path, monkeypatch):
    directory = save(tmp_path / "gsm8k", rows("math/gsm8k.jsonl"))
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now fails as if not installed
    with pytest.raises(
        DatasetError,
        match=r"gsm8k: reading a dataset saved with save_to_disk needs the `datasets` package \(pip install datasets\)",
    ):
        llm_zoo.make("Math-v0", dataset=str(directory))
    with pytest.raises(CodeDatasetError, match=r"needs the `datasets` package"):
        load_code_problems(directory)


def test_saving_again_into_the_same_directory_is_read_again(tmp_path):
    """save_to_disk rewrites the files in place (the directory's own times stay): still re-read."""
    records = rows("math/gsm8k.jsonl")
    directory = save(tmp_path / "gsm8k", records[:1])
    first = llm_zoo.make("Math-v0", dataset=str(directory))
    assert llm_zoo.make("Math-v0", dataset=str(directory)).problem_set is first.problem_set  # parsed once
    save(directory, records)
    assert len(llm_zoo.make("Math-v0", dataset=str(directory)).problem_set.ids()) == len(records)


def test_the_envs_never_import_datasets_for_other_sources():
    code = (
        "import sys, llm_zoo;"
        f"llm_zoo.make('Math-v0', dataset={str(FIXTURES / 'math/gsm8k.jsonl')!r}).reset(seed=0);"
        "llm_zoo.make('Code-v0').reset(seed=0);"
        "assert 'datasets' not in sys.modules, 'datasets was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
