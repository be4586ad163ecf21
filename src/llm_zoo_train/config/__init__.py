"""The training configuration: its sections, loading and validation (the public names).

A config is one YAML file of ten sections (:mod:`~llm_zoo_train.config.sections`), every field
overridable on the command line; :func:`load_config` reads it and checks names and types, and
:func:`validate` checks values, the env and the agents before any model is loaded
(:mod:`~llm_zoo_train.config.loading`). The modules of this package import one another directly,
never this ``__init__``, so that it can gather their public names without an import cycle:

* :mod:`~llm_zoo_train.config.typed`: dataclass <-> YAML with types checked, overrides, help text;
* :mod:`~llm_zoo_train.config.aliases`: TRL's flat ``GRPOConfig`` names accepted as aliases;
* :mod:`~llm_zoo_train.config.checks`: value checks;
* :mod:`~llm_zoo_train.config.base_models` and :mod:`~llm_zoo_train.config.agent_plan`: which
  base model and which adapter each agent uses.
"""

from llm_zoo_train.config.agent_plan import AgentPlan, plan_agents
from llm_zoo_train.config.loading import (
    eval_env_kwargs,
    format_help,
    import_plugins,
    load_config,
    save_config,
    train_env_kwargs,
    validate,
)
from llm_zoo_train.config.sections import (
    AgentsConfig,
    AlgorithmConfig,
    Config,
    EnvConfig,
    EvalConfig,
    LoggingConfig,
    LoraSettings,
    ModelConfig,
    RolloutConfig,
    TrainingConfig,
    VLLMConfig,
)
from llm_zoo_train.config.typed import (
    ConfigError,
    config_from_dict,
    config_to_dict,
    field_docs,
    parse_overrides,
)

__all__ = [
    "AgentPlan",
    "AgentsConfig",
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "EnvConfig",
    "EvalConfig",
    "LoggingConfig",
    "LoraSettings",
    "ModelConfig",
    "RolloutConfig",
    "TrainingConfig",
    "VLLMConfig",
    "config_from_dict",
    "config_to_dict",
    "eval_env_kwargs",
    "field_docs",
    "format_help",
    "import_plugins",
    "load_config",
    "parse_overrides",
    "plan_agents",
    "save_config",
    "train_env_kwargs",
    "validate",
]
