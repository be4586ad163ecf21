"""TRL ``GRPOConfig`` names as aliases of config fields, and the renamed ``generation_batch_size``."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing

import pytest

pytest.importorskip("yaml")

from llm_zoo_train.config import Config, ConfigError, config_to_dict, format_help, load_config
from llm_zoo_train.config.aliases import RENAMED, TRL_ALIASES, TRL_REFUSED


def _load(tmp_path, text="", overrides=()):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(path, list(overrides))


# The TRL spelling of one setting -> the config it must give, in YAML and on the command line.
EQUIVALENTS = [
    ("use_vllm: true", ["--use_vllm", "true"], "rollout.engine", "vllm"),
    ("use_vllm: false", ["--use_vllm", "false"], "rollout.engine", "hf"),
    ("vllm_gpu_memory_utilization: 0.5", ["--vllm_gpu_memory_utilization", "0.5"], "vllm.gpu_memory_utilization", 0.5),
    ("report_to: tensorboard", ["--report_to", "tensorboard"], "logging.log_with", ["tensorboard"]),
    ("report_to: [tensorboard, wandb]", ["--report_to", "[tensorboard, wandb]"], "logging.log_with", ["tensorboard", "wandb"]),
    ("report_to: none", ["--report_to", "none"], "logging.log_with", []),
    ("bf16: true", ["--bf16", "true"], "training.mixed_precision", "bf16"),
    ("fp16: true", ["--fp16=true"], "training.mixed_precision", "fp16"),
    ("bf16: false", ["--bf16", "false"], "training.mixed_precision", "no"),
    ("disable_tqdm: true", ["--disable_tqdm", "true"], "logging.progress_bar", False),
    ("vllm_importance_sampling_correction: true", ["--vllm_importance_sampling_correction", "true"], "algorithm.importance_sampling", True),
    ("vllm_importance_sampling_cap: 3.0", ["--vllm-importance-sampling-cap", "3"], "algorithm.importance_sampling_cap", 3.0),
    ("learning_rate: 1e-6", ["--learning_rate", "1e-6"], "training.learning_rate", 1e-6),
    ("top_k: null", ["--top_k", "null"], "rollout.top_k", 0),
    ("scale_rewards: false", ["--scale_rewards", "false"], "algorithm.scale_rewards", "none"),
    ("num_generations: 6", ["--num_generations", "6"], "rollout.num_generations", 6),
    ("eval_on_start: false", ["--eval_on_start", "false"], "eval.eval_on_start", False),
]  # fmt: skip


def _get(config, key):
    section, name = key.split(".")
    return getattr(getattr(config, section), name)


@pytest.mark.parametrize(
    ("yaml_text", "cli", "key", "expected"), EQUIVALENTS, ids=[e[0] for e in EQUIVALENTS]
)
def test_trl_name_sets_the_canonical_field_in_yaml_and_on_the_command_line(
    tmp_path, yaml_text, cli, key, expected
):
    assert _get(_load(tmp_path, yaml_text + "\n"), key) == expected
    assert _get(load_config(None, cli), key) == expected


def test_aliases_and_canonical_names_together(tmp_path):
    both = "report_to: tensorboard\nlogging: {log_with: [wandb]}\n"
    with pytest.raises(
        ConfigError, match=r"report_to \(alias of logging.log_with\) and logging.log_with both set"
    ):
        _load(tmp_path, both)
    with pytest.raises(
        ConfigError, match=r"--logging.log_with and --report_to \(alias of logging.log_with\) both"
    ):
        load_config(None, ["--logging.log_with", "[wandb]", "--report_to", "none"])
    with pytest.raises(ConfigError, match=r"bf16 \(alias of training.mixed_precision\) and fp16"):
        _load(tmp_path, "bf16: true\nfp16: true\n")
    with pytest.raises(ConfigError, match=r"both set training\.mixed_precision"):
        load_config(None, ["--training.mixed_precision", "bf16", "--fp16", "true"])
    # The command line overrides the file, whichever name each uses.
    config = _load(
        tmp_path,
        "report_to: tensorboard\ntraining: {mixed_precision: fp16}\n",
        ["--logging.log_with", "[]", "--bf16", "true"],
    )
    assert config.logging.log_with == [] and config.training.mixed_precision == "bf16"
    # The same name twice on the command line: the last wins, as for any option.
    assert load_config(None, ["--report_to", "wandb", "--report_to", "none"]).logging.log_with == []


def test_bad_alias_values_name_the_alias(tmp_path):
    cases = [
        (["--use_vllm", "yes"], "use_vllm: expected true or false, got 'yes'"),
        (["--report_to", "all"], "report_to: 'all' is not supported; name trackers among tensorboard, wandb"),
        (["--report_to", "mlflow"], "report_to: 'mlflow' is not supported"),
        (["--learning_rate", "fast"], "learning_rate: expected float, got 'fast'"),
        (["--loss_type", "gspo"], "loss_type: 'gspo' is not one of grpo, dr_grpo, dapo, bnpo"),
    ]
    for args, message in cases:
        with pytest.raises(ConfigError) as err:
            load_config(None, args)
        assert message in str(err.value), (args, str(err.value))


def test_trls_generation_batch_size_is_refused_not_mapped(tmp_path):
    for load in (
        lambda: _load(tmp_path, "generation_batch_size: 64\n"),
        lambda: load_config(None, ["--generation_batch_size", "64"]),
    ):
        with pytest.raises(ConfigError, match=r"TRL's generation_batch_size .* is not an option here") as err:
            load()
        assert "rollout.max_rows_per_generate_call" in str(err.value)


def test_renamed_generation_batch_size_still_works_with_a_warning(tmp_path):
    with pytest.warns(
        FutureWarning,
        match="rollout.generation_batch_size is deprecated: use rollout.max_rows_per_generate_call",
    ):
        assert (
            _load(tmp_path, "rollout: {generation_batch_size: 5}\n").rollout.max_rows_per_generate_call == 5
        )
    with pytest.warns(FutureWarning, match="deprecated"):
        assert (
            load_config(None, ["--rollout.generation_batch_size", "6"]).rollout.max_rows_per_generate_call
            == 6
        )
    with (
        pytest.raises(ConfigError, match=r"both set rollout\.max_rows_per_generate_call"),
        pytest.warns(FutureWarning),
    ):
        _load(tmp_path, "rollout: {generation_batch_size: 5, max_rows_per_generate_call: 4}\n")
    assert (
        "generation_batch_size" not in config_to_dict(Config())["rollout"]
    )  # saved configs use the new name


def test_every_alias_targets_a_real_field_and_shows_in_help():
    hints = typing.get_type_hints(Config)
    fields = {
        f"{s.name}.{f.name}" for s in dataclasses.fields(Config) for f in dataclasses.fields(hints[s.name])
    }
    sections = {s.name for s in dataclasses.fields(Config)}
    names = [a.name for a in TRL_ALIASES + TRL_REFUSED + RENAMED]
    assert len(names) == len(set(names)), "an alias is listed twice"
    help_text = format_help()
    for alias in TRL_ALIASES + RENAMED:
        assert alias.target in fields, alias
        assert alias.name not in sections, f"{alias.name} would shadow a section"
    # Each field's help lists its TRL name right under it.
    blocks = help_text.split("\n  --")
    block = next(b for b in blocks if b.startswith("logging.log_with ("))
    assert "alias: report_to" in block
    block = next(b for b in blocks if b.startswith("training.mixed_precision ("))
    assert "aliases: bf16: true -> bf16; fp16: true -> fp16" in block
    block = next(b for b in blocks if b.startswith("rollout.max_rows_per_generate_call ("))
    assert "formerly rollout.generation_batch_size (deprecated" in block


def test_help_and_print_config_from_the_command_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "llm_zoo_train", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "alias: use_vllm: true -> vllm, false -> hf" in result.stdout
    path = tmp_path / "trl.yaml"
    path.write_text("env: {id: PlanPath-v0}\nreport_to: none\nbf16: true\nlearning_rate: 2.0e-6\n")
    result = subprocess.run(
        [sys.executable, "-m", "llm_zoo_train", str(path), "--print-config", "--disable_tqdm", "true"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "mixed_precision: bf16" in result.stdout and "learning_rate: 2.0e-06" in result.stdout
    assert "progress_bar: false" in result.stdout and "report_to" not in result.stdout
