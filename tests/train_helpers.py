"""Shared pieces of the trainer-loop tests: a toy-env config on the tiny model, and thread setup.

The toy env is ``test/Scripted-v0`` from ``toy_envs_trainer`` (alice is rewarded for writing
"a", bob for "b"; reward = fraction of the reply's characters that are the letter). The tiny random
model is nearly uniform over its 400 tokens, so LoRA on ``lm_head`` is what lets it learn in a few
dozen updates.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

TOY_CONFIG: dict[str, Any] = {
    "env": {"id": "test/Scripted-v0", "kwargs": {"max_turns": 1}, "plugins": ["toy_envs_trainer"]},
    "lora": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj", "lm_head"]},
    "rollout": {"num_generations": 4, "envs_per_step": 8, "max_completion_length": 8},
    "training": {"max_steps": 4, "learning_rate": 0.02, "per_device_train_batch_size": 16, "seed": 0},
    "eval": {"num_episodes": 4, "temperature": 1.0},
    "logging": {"progress_bar": False, "plot": False},
}


def write_toy_config(model_dir: str | Path, output_dir: str | Path, path: str | Path) -> Path:
    """Write the toy config (model and output dir filled in) as YAML to ``path``."""
    data = {**TOY_CONFIG, "model": {"name_or_path": str(model_dir)}}
    data["training"] = {**TOY_CONFIG["training"], "output_dir": str(output_dir)}
    Path(path).write_text(yaml.safe_dump(data), encoding="utf-8")
    return Path(path)


def toy_config(model_dir: str | Path, output_dir: str | Path, overrides: Sequence[str] = ()) -> Any:
    """The toy config as a :class:`~llm_zoo_train.config.Config`, with ``--key value`` overrides."""
    from llm_zoo_train.config import load_config

    path = write_toy_config(model_dir, output_dir, Path(output_dir).parent / f"{Path(output_dir).name}.yaml")
    return load_config(path, list(overrides))


def history_without_timing(history: Sequence[dict[str, float]]) -> list[dict[str, float]]:
    """Metrics records without wall-clock values (``time/*``), which differ between runs."""
    return [{k: v for k, v in record.items() if not k.startswith("time/")} for record in history]


def one_line_error(err: str, program: str = "llm-zoo-train") -> str:
    """The ``PROGRAM: error: ...`` line of stderr; the error must be one line, no traceback."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"{program}: error:")]
    assert len(lines) == 1, err
    return lines[0]
