"""Which base model each agent runs on: the config's independent model pools, checked.

By default every agent's adapter sits on the one base model of the ``model`` section. Two fields
of the ``agents`` section add more base models, each with its own tokenizer, chat template,
adapters, optimizers and engine::

    model: {name_or_path: smollm2-135m-instruct}          # the base model named `model`
    agents:
      adapters: per_agent
      models:                                            # more base models, by name
        big: {name_or_path: Qwen/Qwen3-1.7B, dtype: bfloat16}
      base_models: {reasoner: big}                       # agent -> base model; others: `model`

An entry of ``agents.models`` takes the ``model`` section's settings and overrides the fields it
names. :func:`plan_base_models` resolves this against the env's agents and refuses what cannot
work: an adapter shared by agents on different base models (LoRA weights fit one model's layer
shapes only), an agent acting with the bare base model (``null`` adapter) when there are several,
an engine that serves one base model (vLLM), asynchronous rollouts (their generation process
holds one model), and names that do not resolve.

This module loads no model and imports no torch; :mod:`llm_zoo_train.training.model_pools` builds the
models, engines and updaters from the plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llm_zoo_train.config.typed import ConfigError, config_from_dict, config_to_dict

if TYPE_CHECKING:  # config.py imports this module; the classes are read off the config at runtime
    from llm_zoo_train.config.sections import Config, ModelConfig

__all__ = [
    "DEFAULT_MODEL",
    "MULTI_MODEL_ENGINES",
    "BaseModelPlan",
    "base_model_label",
    "label_model",
    "plan_base_models",
]

#: The name of the ``model`` section's base model in ``agents.base_models`` and in messages.
DEFAULT_MODEL = "model"
#: Engines that can serve several base models in one run (one engine per base model).
MULTI_MODEL_ENGINES = ("hf", "replay")
_LABEL_PREFIX = "base_model:"


def base_model_label(model: str) -> str:
    """The engine-side name of base model ``model`` with no adapter (``"base_model:big"``).

    ``None`` names "the bare base model" when there is one; with several, evaluation of the base
    policy needs to say which. The ``:`` keeps the label apart from every adapter name."""
    return f"{_LABEL_PREFIX}{model}"


def label_model(adapter: str | None) -> str | None:
    """The base model named by a :func:`base_model_label` label; None for an adapter name or None."""
    if adapter is not None and adapter.startswith(_LABEL_PREFIX):
        return adapter[len(_LABEL_PREFIX) :]
    return None


@dataclass(frozen=True)
class BaseModelPlan:
    """The resolved agent -> base model assignment.

    Attributes:
        agent_models: Each env agent -> the name of its base model (``model``: the model section).
        adapter_models: Each adapter -> the name of the base model it sits on.
        models: Base model name -> its settings (``ModelConfig``), ``model`` first; only the
            models some agent runs on.
    """

    agent_models: dict[str, str]
    adapter_models: dict[str, str]
    models: dict[str, ModelConfig]


def plan_base_models(
    config: Config, agent_adapters: Mapping[str, str | None], possible_agents: Sequence[str]
) -> BaseModelPlan:
    """Resolve ``agents.models`` and ``agents.base_models`` against the env's agents and the
    agent -> adapter map; ConfigError naming the problem and the valid choices."""
    agents_cfg = config.agents
    possible = list(possible_agents)
    if DEFAULT_MODEL in agents_cfg.models:
        raise ConfigError(
            f"agents.models.{DEFAULT_MODEL}: the name {DEFAULT_MODEL!r} is the `model` section's base "
            "model; give this one another name"
        )
    settings: dict[str, Any] = {DEFAULT_MODEL: config.model}
    defaults = config_to_dict(config.model)
    for name, override in agents_cfg.models.items():
        if not isinstance(override, Mapping):
            raise ConfigError(
                f"agents.models.{name}: expected model settings such as {{name_or_path: ...}}, got {override!r}"
            )
        # type(config.model): the schema's own class, without importing config.py (which imports us)
        settings[name] = config_from_dict(
            {**defaults, **override}, type(config.model), f"agents.models.{name}."
        )

    unknown_agents = [a for a in agents_cfg.base_models if a not in possible]
    if unknown_agents:
        raise ConfigError(
            f"agents.base_models: {unknown_agents} are not agents of {config.env.id}; its agents: {possible}"
        )
    for agent, model in agents_cfg.base_models.items():
        if model not in settings:
            raise ConfigError(
                f"agents.base_models.{agent}: {model!r} is not a base model; base models: "
                f"{list(settings)} (`{DEFAULT_MODEL}` is the model section, the others are agents.models)"
            )
    agent_models = {a: agents_cfg.base_models.get(a, DEFAULT_MODEL) for a in possible}
    used = list(dict.fromkeys(agent_models.values()))
    unused = [name for name in agents_cfg.models if name not in used]
    if unused:
        raise ConfigError(
            f"agents.models: {unused} run no agent; put agents on them with agents.base_models "
            f"{{agent: name}} or remove them. Agents: {possible}"
        )
    if DEFAULT_MODEL not in used:
        (only,) = used  # every agent runs on one model of agents.models
        raise ConfigError(
            f"every agent runs on agents.models.{only}, so the `model` section is unused: put its "
            f"settings in `model` and drop agents.models and agents.base_models"
        )
    models = {name: settings[name] for name in sorted(used, key=lambda n: n != DEFAULT_MODEL)}

    adapter_models: dict[str, str] = {}
    for agent, adapter in agent_adapters.items():
        if adapter is None:
            continue
        first = adapter_models.setdefault(adapter, agent_models[agent])
        if first != agent_models[agent]:
            sharers = {a: agent_models[a] for a, name in agent_adapters.items() if name == adapter}
            raise ConfigError(
                f"adapter {adapter!r} is shared by agents on different base models "
                f"({', '.join(f'{a} on {m}' for a, m in sharers.items())}): a LoRA adapter fits the "
                "layers of one base model only. Give these agents their own adapters "
                "(agents.adapters: per_agent, or a map {agent: adapter}) or one base model"
            )
    if len(models) > 1:
        bare = [a for a, adapter in agent_adapters.items() if adapter is None]
        if bare:
            raise ConfigError(
                f"agents.adapters: {bare} act with the bare base model (null), which is not supported "
                f"with several base models ({', '.join(models)}); give them an adapter and keep them in "
                "agents.frozen: a new LoRA adapter starts at zero, so an untrained one is the base model"
            )
        engine = config.rollout.engine
        if engine not in MULTI_MODEL_ENGINES:
            raise ConfigError(
                f"rollout.engine {engine!r} serves one base model, but agents.base_models puts the "
                f"agents on {len(models)} ({', '.join(f'{a} on {m}' for a, m in agent_models.items())}); "
                f"use rollout.engine {' or '.join(MULTI_MODEL_ENGINES)}, or one base model"
            )
        if config.rollout.async_steps:
            raise ConfigError(
                f"rollout.async_steps {config.rollout.async_steps}: the generation process holds one "
                f"base model, but agents.base_models uses {len(models)} ({', '.join(models)}); use "
                "rollout.async_steps 0 with several base models"
            )
    return BaseModelPlan(agent_models, adapter_models, models)
