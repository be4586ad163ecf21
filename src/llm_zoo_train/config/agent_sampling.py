"""Per-agent sampling: the ``agents.sampling`` section, checked against an env's agents.

Agents of one team often want different generation settings: a holder that must copy a number
exactly wants a low temperature and a few tokens, a planner a higher temperature and room to
think. ``agents.sampling`` maps an agent to :class:`AgentSampling`; an agent it does not name, and
every field left null, uses the ``rollout`` section (training) or the ``eval`` section
(evaluation). For example::

    agents:
      sampling:
        holder: {temperature: 0.5, max_completion_length: 16}
        asker: {eval_temperature: 0.0}

Training rollouts, the team-credit look-ahead and evaluation all sample each agent's prompts with
its own settings (the rollout splits an engine call by agent only when the agents differ). The
loss divides each sample's logits by the temperature that sampled it, so the ratio and the KL stay
those of the sampling policy; ``dr_grpo``'s normaliser stays ``rollout.max_completion_length``.
A greedy team-credit teammate (``rollout.team_credit_teammate``) stays greedy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llm_zoo_train.config.typed import ConfigError, config_from_dict

if TYPE_CHECKING:
    from llm_zoo_train.config.sections import Config

__all__ = ["AgentSampling", "eval_overrides", "plan_agent_sampling", "rollout_overrides"]


@dataclass
class AgentSampling:
    """One agent's generation settings; null fields fall back to the run's."""

    temperature: float | None = None
    """Training rollouts' temperature for this agent (null: `rollout.temperature`)."""
    max_completion_length: int | None = None
    """Most new tokens per completion of this agent in training rollouts and the look-ahead (null:
    `rollout.max_completion_length`)."""
    eval_temperature: float | None = None
    """Evaluation temperature for this agent (null: the `eval` section's)."""
    eval_max_completion_length: int | None = None
    """Most new tokens per completion of this agent in evaluation (null: the `eval` section's)."""
    stop: list[str] | None = None
    """Texts that end this agent's completions, in training and evaluation: a completion ends with
    the token that completes one of them, the text kept (e.g. ["</answer>"]; null: none)."""


def plan_agent_sampling(config: Config, possible_agents: Sequence[str]) -> dict[str, AgentSampling]:
    """``config.agents.sampling`` as :class:`AgentSampling` per agent; ConfigError naming the key
    for an agent the env does not have, an unknown field, or a value out of range."""
    sections = config.agents.sampling
    if not isinstance(sections, dict):
        raise ConfigError(f"agents.sampling must be a map {{agent: {{field: value}}}}, got {sections!r}")
    unknown = [agent for agent in sections if agent not in possible_agents]
    if unknown:
        raise ConfigError(
            f"agents.sampling: {unknown} are not agents of {config.env.id}; its agents: {list(possible_agents)}"
        )
    planned = {}
    for agent, fields in sections.items():
        where = f"agents.sampling.{agent}"
        if not isinstance(fields, dict):
            raise ConfigError(f"{where} must be a map of sampling fields, got {fields!r}")
        settings = config_from_dict(fields, AgentSampling, f"{where}.")
        for name in ("temperature", "eval_temperature"):
            value = getattr(settings, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{where}.{name} must be a finite number >= 0 (0: greedy), got {value!r}")
        for name in ("max_completion_length", "eval_max_completion_length"):
            value = getattr(settings, name)
            if value is not None and value < 1:
                raise ConfigError(f"{where}.{name} must be at least 1, got {value!r}")
        if settings.stop is not None and not all(isinstance(text, str) and text for text in settings.stop):
            raise ConfigError(f"{where}.stop must be a list of non-empty texts, got {settings.stop!r}")
        planned[agent] = settings
    return planned


def rollout_overrides(config: Config) -> dict[str, dict[str, Any]]:
    """Per agent, the training rollout's ``temperature`` / ``max_tokens`` / ``stop`` overrides (only
    the fields set), in the shape of ``SamplingParams.per_agent``."""
    return _overrides(config, "temperature", "max_completion_length")


def eval_overrides(config: Config) -> dict[str, dict[str, Any]]:
    """Per agent, evaluation's ``temperature`` / ``max_tokens`` overrides, as :func:`rollout_overrides`."""
    return _overrides(config, "eval_temperature", "eval_max_completion_length")


def _overrides(config: Config, temperature: str, length: str) -> dict[str, dict[str, Any]]:
    overrides: dict[str, dict[str, Any]] = {}
    for agent, fields in config.agents.sampling.items():
        chosen: dict[str, Any] = {}
        if fields.get(temperature) is not None:
            chosen["temperature"] = float(fields[temperature])
        if fields.get(length) is not None:
            chosen["max_tokens"] = int(fields[length])
        if fields.get("stop"):
            chosen["stop"] = tuple(fields["stop"])
        if chosen:
            overrides[agent] = chosen
    return overrides
