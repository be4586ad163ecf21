"""Loading and validating a training configuration.

:func:`load_config` reads a YAML file and command-line overrides into a :class:`Config` (names and
types checked); :func:`validate` checks values, the env id (through :mod:`llm_zoo`'s registry), the
env kwargs and the agent -> adapter map against the env's agents, and returns the
:class:`AgentPlan`. Nothing here loads a model.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from llm_zoo_train.config.agent_plan import AgentPlan, plan_agents
from llm_zoo_train.config.aliases import CONFIG_ALIASES
from llm_zoo_train.config.checks import check_env_servers, check_model_positions, check_values
from llm_zoo_train.config.sections import Config
from llm_zoo_train.config.typed import ConfigError, config_to_dict, format_fields, load_dataclass

__all__ = [
    "eval_env_kwargs",
    "format_help",
    "import_plugins",
    "load_config",
    "save_config",
    "train_env_kwargs",
    "validate",
]


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Read the YAML file at ``path`` (None: defaults), apply ``--key value`` overrides, check types."""
    return load_dataclass(Config, path, overrides, CONFIG_ALIASES)


def save_config(config: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False), encoding="utf-8")


def format_help() -> str:
    """Every field with its type, default and documentation, by section."""
    return format_fields(Config, CONFIG_ALIASES)


# --------------------------------------------------------------------------- validation


def import_plugins(modules: Sequence[str]) -> None:
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(f"env.plugins: cannot import {module!r}: {err}") from None


def validate(config: Config) -> AgentPlan:
    """Check values, the env and the agents (no model is loaded). Returns the agent plan."""
    check_values(config)
    for adapter, path in config.agents.init_adapters.items():
        if not (Path(path) / "adapter_config.json").is_file():
            raise ConfigError(
                f"agents.init_adapters.{adapter}: {path} is not a PEFT adapter directory (no adapter_config.json)"
            )

    import llm_zoo  # the env package has no heavy dependencies

    import_plugins(config.env.plugins)
    check_env_servers(config.env.servers)  # the caller makes its envs there (rollout.env_servers)
    try:
        env_spec = llm_zoo.spec(config.env.id)
    except (LookupError, ValueError) as err:  # the registry's own message lists the registered ids
        raise ConfigError(f"env.id: {err}") from None
    agents = None
    for where, kwargs in (
        ("env.kwargs", train_env_kwargs(config)),
        ("eval.env_kwargs", eval_env_kwargs(config)),
    ):
        try:
            env = env_spec.make(**kwargs)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{where}: cannot make {config.env.id}: {err}") from None
        agents = agents or list(env.possible_agents)
        env.close()
    assert agents is not None
    plan = plan_agents(config, agents)
    for adapter, settings in plan.lora.items():
        if settings.r < 1:
            overridden = "r" in config.agents.adapter_lora.get(adapter, {})
            where = f"agents.adapter_lora.{adapter}.r" if overridden else "lora.r"
            raise ConfigError(f"{where} must be >= 1 (the LoRA rank, e.g. 8), got {settings.r}")
    if not plan.trainable and config.training.max_steps > 0:
        raise ConfigError(
            "nothing to train: every agent is frozen; unfreeze one, or set training.max_steps 0 to only evaluate"
        )
    check_model_positions(
        plan.models,
        {
            "rollout.max_completion_length": config.rollout.max_completion_length,
            "eval.max_completion_length": config.eval.max_completion_length,
        },
    )
    return plan


def train_env_kwargs(config: Config) -> dict[str, Any]:
    """Constructor arguments of training envs (env.kwargs with alpha)."""
    return {**config.env.kwargs, "alpha": config.env.alpha}


def eval_env_kwargs(config: Config) -> dict[str, Any]:
    """Constructor arguments of evaluation envs (env.kwargs, alpha, eval.env_kwargs)."""
    return {**config.env.kwargs, "alpha": config.env.alpha, **config.eval.env_kwargs}
