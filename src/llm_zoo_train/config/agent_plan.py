"""The agents -> adapters -> base models plan of a config, resolved against an env's agents.

:func:`plan_agents` turns the ``agents`` section (``adapters``: ``per_agent``, ``shared`` or a map;
``frozen``; ``adapter_lora``; ``init_adapters``; ``models`` and ``base_models``; ``sampling`` is
checked here too, :mod:`llm_zoo_train.config.agent_sampling`) into an
:class:`AgentPlan`: which adapter acts for each agent, which adapters train, each adapter's LoRA
settings, and which base model each agent and adapter runs on
(:mod:`llm_zoo_train.config.base_models`). Every mismatch is a ``ConfigError`` naming the key and the
valid choices. No model is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llm_zoo_train.config.agent_sampling import plan_agent_sampling
from llm_zoo_train.config.base_models import plan_base_models
from llm_zoo_train.config.typed import ConfigError, config_from_dict, config_to_dict

if TYPE_CHECKING:  # config.py re-exports this module; the classes are read off the config at runtime
    from llm_zoo_train.config.sections import Config, LoraSettings, ModelConfig

__all__ = ["AgentPlan", "plan_agents"]

_ADAPTER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,63}$")


@dataclass(frozen=True)
class AgentPlan:
    """The resolved agent -> adapter assignment.

    Attributes:
        agent_adapters: Each env agent -> the adapter acting for it (None: the base model).
        adapters: Adapter names, in first-use order.
        trainable: Adapters that get an optimizer (those of non-frozen agents).
        lora: LoRA settings of every adapter (overrides applied).
        agent_models: Each env agent -> the name of its base model (``model``: the model section).
        adapter_models: Each adapter -> the name of the base model it sits on.
        models: Base model name -> its settings, ``model`` first; one entry unless
            ``agents.base_models`` puts agents on other base models.
    """

    agent_adapters: dict[str, str | None]
    adapters: list[str]
    trainable: list[str]
    lora: dict[str, LoraSettings]
    agent_models: dict[str, str]
    adapter_models: dict[str, str]
    models: dict[str, ModelConfig]

    def agents_of(self, adapter: str) -> list[str]:
        return [a for a, name in self.agent_adapters.items() if name == adapter]

    def adapters_on(self, model: str) -> list[str]:
        """The adapters on base model ``model``, in plan order."""
        return [a for a in self.adapters if self.adapter_models[a] == model]

    def model_of(self, adapter: str) -> ModelConfig:
        """The settings of the base model adapter ``adapter`` sits on."""
        return self.models[self.adapter_models[adapter]]


def plan_agents(config: Config, possible_agents: Sequence[str]) -> AgentPlan:
    """Resolve ``config.agents`` against the env's agents; ConfigError on any mismatch."""
    agents_cfg = config.agents
    possible = list(possible_agents)
    spec = agents_cfg.adapters
    if isinstance(spec, str):
        if spec == "per_agent":
            mapping: dict[str, str | None] = {a: a for a in possible}
        elif spec == "shared":
            mapping = dict.fromkeys(possible, "shared")
        else:
            raise ConfigError(
                f"agents.adapters: {spec!r} is not 'per_agent', 'shared' or a map {{agent: adapter}}"
            )
    else:
        missing = [a for a in possible if a not in spec]
        extra = [a for a in spec if a not in possible]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {missing}")
            if extra:
                parts.append(f"not agents of {config.env.id} {extra}")
            raise ConfigError(
                f"agents.adapters must name every agent of {config.env.id} exactly once: "
                f"{'; '.join(parts)}. The env's agents: {possible}"
            )
        mapping = {a: spec[a] for a in possible}

    unknown_frozen = [a for a in agents_cfg.frozen if a not in possible]
    if unknown_frozen:
        raise ConfigError(
            f"agents.frozen: {unknown_frozen} are not agents of {config.env.id}; its agents: {possible}"
        )
    frozen = set(agents_cfg.frozen)
    for agent, adapter in mapping.items():
        if adapter is None and agent not in frozen:
            raise ConfigError(
                f"agents.adapters.{agent} is null (the base model), which cannot be trained: "
                f"give {agent!r} an adapter or add it to agents.frozen"
            )
        if adapter is not None and not _ADAPTER_NAME.match(adapter):
            raise ConfigError(
                f"agents.adapters.{agent}: adapter name {adapter!r} must be letters, digits, '_' or '-' "
                "and start with a letter or '_'"
            )

    adapters = list(dict.fromkeys(a for a in mapping.values() if a is not None))
    trainable = []
    for adapter in adapters:
        users = [a for a, name in mapping.items() if name == adapter]
        frozen_users = [a for a in users if a in frozen]
        if frozen_users and len(frozen_users) != len(users):
            raise ConfigError(
                f"adapter {adapter!r} is shared by frozen agent(s) {frozen_users} and trained agent(s) "
                f"{[a for a in users if a not in frozen]}; training would change the frozen agents' "
                "policy. Give the frozen agents their own adapter, or freeze all of them."
            )
        if not frozen_users:
            trainable.append(adapter)

    for where, names in (
        ("agents.adapter_lora", agents_cfg.adapter_lora),
        ("agents.init_adapters", agents_cfg.init_adapters),
    ):
        unknown = [n for n in names if n not in adapters]
        if unknown:
            raise ConfigError(f"{where}: {unknown} are not adapters of this config; adapters: {adapters}")
    lora = {}
    base = config_to_dict(config.lora)
    for adapter in adapters:
        override = agents_cfg.adapter_lora.get(adapter, {})
        # type(config.lora): the schema's own class, without importing config.py (which imports us)
        lora[adapter] = config_from_dict(
            {**base, **override}, type(config.lora), f"agents.adapter_lora.{adapter}."
        )
    models = plan_base_models(config, mapping, possible)
    plan_agent_sampling(config, possible)  # checked here, read where each stage samples
    return AgentPlan(
        agent_adapters=mapping,
        adapters=adapters,
        trainable=trainable,
        lora=lora,
        agent_models=models.agent_models,
        adapter_models=models.adapter_models,
        models=models.models,
    )
