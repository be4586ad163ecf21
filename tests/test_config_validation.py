"""Nonsense is refused before any model loads: NaN and inf, seeds, lengths beyond the model's
positions, binary or oversized config files, an output_dir that is a file, missing CLI values."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from llm_zoo_train.__main__ import main
from train_helpers import one_line_error, write_toy_config


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--training.learning_rate", ".nan"], "training.learning_rate: expected a finite number, got nan"),
        (["--env.alpha", ".nan"], "env.alpha: expected a finite number"),
        (["--rollout.temperature", ".inf"], "rollout.temperature: expected a finite number, got inf"),
        (["--env.kwargs", "{max_turns: 1, bonus: .nan}"], "env.kwargs.bonus: expected a finite number"),
        (["--training.seed", "-1"], "training.seed must be in [0, 2**32 - 1], got -1"),
        (["--training.seed", str(2**40)], f"training.seed must be in [0, 2**32 - 1], got {2**40}"),
        (["--eval.seed", str(2**32 - 1)], "eval.seed must be in [0, 2**32 - eval.num_episodes]"),
        (["--training.max_steps"], "option --training.max_steps needs a value"),
        (
            ["--training.max_steps", "--eval.num_episodes", "3"],
            "option --training.max_steps needs a value, got the option --eval.num_episodes instead",
        ),
    ],
)
def test_bad_values_are_one_line_before_any_model_loads(tmp_path, capsys, no_model_loading, extra, message):
    import toy_envs_trainer  # noqa: F401

    config = write_toy_config(tmp_path / "no_model", tmp_path / "run", tmp_path / "c.yaml")
    assert main([str(config), "--print-config", *extra]) == 2
    assert message in one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_require_positive_refuses_nan():
    from llm_zoo_train.config.checks import require_positive
    from llm_zoo_train.config.typed import ConfigError

    with pytest.raises(ConfigError, match=r"x must be > 0 \(a finite number\), got nan"):
        require_positive("x", float("nan"))


def test_a_completion_longer_than_the_model_is_refused(tiny_model_dir, tmp_path, capsys, no_model_loading):
    import json

    import toy_envs_trainer  # noqa: F401

    positions = json.loads((tiny_model_dir / "config.json").read_text())["max_position_embeddings"]
    config = write_toy_config(tiny_model_dir, tmp_path / "run", tmp_path / "c.yaml")
    assert main([str(config), "--print-config", "--rollout.max_completion_length", str(10**10)]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert f"rollout.max_completion_length {10**10} leaves no room for the prompt" in line
    assert f"{positions} positions" in line


def test_binary_oversized_and_misspelled_config_files(tmp_path, capsys, no_model_loading):
    import toy_envs_trainer  # noqa: F401

    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 10)
    assert main([str(binary)]) == 2
    assert f"{binary}: not a text file" in one_line_error(capsys.readouterr().err)

    huge = tmp_path / "huge.yaml"
    huge.write_text("# padding\n" * 200_000)
    assert main([str(huge)]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert f"{huge}: 1.9 MiB is too large for a config file (at most 1 MiB)" in line

    typo = write_toy_config(tmp_path / "no_model", tmp_path / "run", tmp_path / "typo.yaml")
    typo.write_text(typo.read_text().replace("max_steps:", "max_stpes:"))
    assert main([str(typo)]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert f"{typo}: unknown config key 'training.max_stpes'" in line and "max_steps" in line


def test_an_output_dir_that_is_a_file(tmp_path, capsys, no_model_loading):
    import toy_envs_trainer  # noqa: F401

    (tmp_path / "taken").write_text("a file")
    for output in (tmp_path / "taken", tmp_path / "taken" / "run"):
        config = write_toy_config(tmp_path / "no_model", output, tmp_path / "c.yaml")
        assert main([str(config)]) == 2
        line = one_line_error(capsys.readouterr().err)
        assert f"training.output_dir {output}" in line and "a file, not a directory" in line
