"""What ``llm-zoo-train eval`` evaluates: the run and its adapters, the policies, the splits, the engine.

Kept apart from the command line (:mod:`llm_zoo_train.evaluation.cli`) so each piece can be used and
tested on its own. Every function raises :class:`UsageError` (or the config's ``ConfigError``) with
a message naming the problem and the valid choices; none loads a model except :func:`local_engine`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_zoo_train.config import AgentPlan, Config, eval_env_kwargs, load_config, train_env_kwargs
from llm_zoo_train.config.agent_sampling import eval_overrides
from llm_zoo_train.config.base_models import base_model_label
from llm_zoo_train.engines.base import Engine, SamplingParams
from llm_zoo_train.evaluation.tasks import EvalTasks, eval_tasks
from llm_zoo_train.runs.seeding import Stream, derive_seed

__all__ = [
    "POLICIES",
    "SPLITS",
    "Source",
    "Split",
    "UsageError",
    "agent_models",
    "choose_policies",
    "eval_sampling",
    "local_engine",
    "plan_splits",
    "policy_maps",
    "resolve_source",
    "saved_adapters",
]

POLICIES = ("base", "adapters", "swap")
SPLITS = ("eval", "train", "test", "impossible")


class UsageError(Exception):
    """A bad command line, input path or option (exit code 2)."""


# --------------------------------------------------------------------------- the run to evaluate


@dataclass
class Source:
    """What the input path points at.

    Attributes:
        kind: ``output_dir``, ``checkpoint``, ``config`` or ``defaults`` (no input, with --endpoint).
        path: The input as given (``None`` for ``defaults``).
        config: The loaded config (overrides applied).
        adapters: Saved adapter name -> directory (empty when there are none).
        results_dir: Where ``eval/eval_results.json`` goes by default.
        adapters_dir: Where the adapters were looked for (``None``: nowhere).
    """

    kind: str
    path: Path | None
    config: Config
    adapters: dict[str, Path]
    results_dir: Path
    adapters_dir: Path | None = None


def saved_adapters(directory: Path) -> dict[str, Path]:
    """Adapter name -> directory for every PEFT adapter (``adapter_config.json``) in ``directory``."""
    if not directory.is_dir():
        return {}
    return {p.name: p for p in sorted(directory.iterdir()) if (p / "adapter_config.json").is_file()}


def resolve_source(path: str | None, overrides: Sequence[str], *, endpoint: bool) -> Source:
    """Load the config and find the adapters of the input; UsageError/ConfigError when impossible."""
    from llm_zoo_train.runs.checkpoint import TRAINER_STATE, list_checkpoints

    if path is None:
        if not endpoint:
            raise UsageError("give a run's output dir, a checkpoint dir or a config YAML (or --endpoint URL)")
        config = load_config(None, overrides)
        return Source("defaults", None, config, {}, Path(config.training.output_dir), None)
    given = Path(path)
    if not given.exists():
        raise UsageError(
            f"{path}: no such file or directory (expected a run's output dir, a checkpoint dir or a config YAML)"
        )
    if given.is_file():
        config = load_config(given, overrides)
        output_dir = Path(config.training.output_dir)
        adapters_dir = output_dir / "adapters"
        return Source("config", given, config, saved_adapters(adapters_dir), output_dir, adapters_dir)
    if (given / TRAINER_STATE).is_file():
        config = load_config(given / "config.yaml", overrides)
        return Source(
            "checkpoint", given, config, saved_adapters(given / "adapters"), given, given / "adapters"
        )
    checkpoints = list_checkpoints(given)
    config_file = given / "config.yaml"
    if not config_file.is_file() and checkpoints:
        config_file = checkpoints[-1] / "config.yaml"
    if not config_file.is_file():
        raise UsageError(
            f"{path} holds no config.yaml and no checkpoint-N/config.yaml, so it is not a training output dir; "
            "give the run's CONFIG.yaml instead (its adapters are read from training.output_dir/adapters)"
        )
    config = load_config(config_file, overrides)
    adapters_dir = given / "adapters"
    if not saved_adapters(adapters_dir) and checkpoints:  # a run stopped before its end
        adapters_dir = checkpoints[-1] / "adapters"
    return Source("output_dir", given, config, saved_adapters(adapters_dir), given, adapters_dir)


# --------------------------------------------------------------------------- policies and splits


def _swap(mapping: Mapping[str, str | None], what: str) -> dict[str, str | None]:
    names = [name for name in mapping.values() if name is not None]
    if len(mapping) != 2 or len(set(names)) != 2:
        pairs = ", ".join(f"{agent} -> {name}" for agent, name in mapping.items())
        raise UsageError(f"the role swap needs two agents played by two distinct {what}; here: {pairs}")
    first, second = mapping
    return {first: mapping[second], second: mapping[first]}


def choose_policies(
    names: Sequence[str], source: Source, plan: AgentPlan, *, endpoint: bool, served: Mapping[str, str]
) -> dict[str, dict[str, str | None]]:
    """Policy name -> {agent: adapter (locally) or served model name (endpoint); None: the base model}.

    ``names`` empty: ``adapters`` when there are saved adapters (locally) or ``served`` agent models
    (endpoint), else ``base``. Saved adapters must include every adapter of the config's plan.
    """
    agents = list(plan.agent_adapters)
    if endpoint:
        trained: dict[str, str | None] = {agent: served.get(agent) for agent in agents}
        available = bool(served)
    else:
        trained, available = dict(plan.agent_adapters), bool(source.adapters)
    policies = list(names) or (["adapters"] if available else ["base"])
    if endpoint and "adapters" in policies and not served:
        raise UsageError("--policies adapters with --endpoint needs --agent-model AGENT=NAME for the agents")
    if not endpoint and any(p != "base" for p in policies):
        missing = [a for a in plan.adapters if a not in source.adapters]
        if missing:
            found = sorted(source.adapters) or "none"
            raise UsageError(
                f"policies {policies} need the saved adapters {plan.adapters}; {source.adapters_dir} has "
                f"{found} (missing {missing})"
            )
    maps = policy_maps(policies, agents, trained)
    return maps if endpoint or len(plan.models) == 1 else _on_base_models(maps, plan)


def _on_base_models(
    maps: Mapping[str, Mapping[str, str | None]], plan: AgentPlan
) -> dict[str, dict[str, str | None]]:
    """Policy maps for a run on several base models: ``base`` names each agent's own bare base
    model (:func:`~llm_zoo_train.config.base_models.base_model_label`); ``swap`` is refused across models."""
    out: dict[str, dict[str, str | None]] = {}
    for policy, mapping in maps.items():
        if policy == "swap" and len({plan.agent_models[a] for a in mapping}) > 1:
            on = ", ".join(f"{agent} on {plan.agent_models[agent]}" for agent in mapping)
            raise UsageError(
                f"the role swap trades adapters between agents on different base models ({on}); an "
                "adapter runs only on the base model it was trained on. Evaluate base and adapters instead"
            )
        out[policy] = {
            agent: base_model_label(plan.agent_models[agent]) if adapter is None else adapter
            for agent, adapter in mapping.items()
        }
    return out


def policy_maps(
    policies: Sequence[str], agents: Sequence[str], trained: Mapping[str, str | None]
) -> dict[str, dict[str, str | None]]:
    """Policy name -> {agent: adapter or served model (None: the base model)}."""
    maps: dict[str, dict[str, str | None]] = {}
    for policy in policies:
        if policy == "base":
            maps[policy] = dict.fromkeys(agents)
        elif policy == "adapters":
            maps[policy] = {agent: trained[agent] for agent in agents}
        else:
            maps[policy] = _swap({agent: trained[agent] for agent in agents}, "adapters (or served models)")
    return maps


@dataclass
class Split:
    """One set of evaluation tasks: env kwargs and seeds; ``trainer_eval`` if the trainer evaluates
    on it; ``problem_ids`` the problem of each seed with ``eval.distinct_problems`` (None: drawn
    from the seed)."""

    name: str
    env_kwargs: dict[str, Any]
    seeds: list[int]
    trainer_eval: bool
    problem_ids: list[str] | None = None


def _split_argument(env_id: str) -> tuple[bool, Any]:
    """(whether the env's constructor takes ``split``, its default: the spec's, else the signature's)."""
    import llm_zoo

    spec = llm_zoo.spec(env_id)
    try:
        parameter = inspect.signature(spec.load()).parameters.get("split")
    except (TypeError, ValueError):  # no signature to read: treat it as an env without splits
        return False, None
    if parameter is None:
        return False, None
    return True, spec.kwargs.get("split", parameter.default)


def plan_splits(config: Config, names: Sequence[str] | None) -> list[Split]:
    """The splits to play; ``names`` None: train and test if the env has a split argument, else eval."""

    has_splits, default_split = _split_argument(config.env.id)
    chosen = list(names) if names else (["train", "test"] if has_splits else ["eval"])
    n = config.eval.num_episodes
    eval_kwargs = eval_env_kwargs(config)
    splits = []
    for name in chosen:
        if name == "eval":
            tasks = _tasks(config, eval_kwargs, required=True)
            splits.append(Split("eval", eval_kwargs, tasks.seeds, True, tasks.problem_ids))
        elif has_splits and name in ("train", "test", "impossible"):
            kwargs = {**eval_kwargs, "split": name}
            tasks = _tasks(config, kwargs, required=name == "test")
            trainer_eval = eval_kwargs.get("split", default_split) == name
            splits.append(Split(name, kwargs, tasks.seeds, trainer_eval, tasks.problem_ids))
        elif name == "train":  # the tasks the trainer drew at steps 1, 2, ... (process 0)
            import numpy as np

            seeds: list[int] = []
            step = 1
            while len(seeds) < n:
                rng = np.random.default_rng(derive_seed(config.training.seed, step, 0, Stream.TASKS))
                seeds += rng.integers(0, 2**30, size=config.rollout.envs_per_step).tolist()
                step += 1
            splits.append(Split("train", train_env_kwargs(config), seeds[:n], False))
        elif name == "impossible":
            raise UsageError(
                f"{config.env.id} has no impossible split (Code-v0's: problems whose hidden tests "
                "contradict the statement, where success measures cheating)"
            )
        elif name == "test":
            raise UsageError(
                f"{config.env.id} generates its tasks from the seed and has no test split; use 'eval' "
                "(seeds from eval.seed, which training never draws) or 'train' (the tasks trained on)"
            )
        else:
            raise UsageError(f"unknown split {name!r}; splits: {', '.join(SPLITS)}")
    return splits


def _tasks(config: Config, env_kwargs: dict[str, Any], *, required: bool) -> EvalTasks:
    """The split's episodes; with ``eval.distinct_problems`` an unlimited split (``required``
    false: generated training problems) falls back to seeds, a split that must be finite raises."""
    settings = config.eval
    try:
        return eval_tasks(
            config.env.id,
            env_kwargs,
            settings.num_episodes,
            settings.seed,
            distinct=settings.distinct_problems,
            required=required,
        )
    except ValueError as err:
        raise UsageError(str(err)) from None


def eval_sampling(config: Config, process_index: int = 0) -> SamplingParams:
    """The sampling of the trainer's evaluation on process ``process_index`` (``eval`` section, each
    agent's ``agents.sampling`` evaluation overrides)."""
    from llm_zoo_train.evaluation.defaults import eval_temperature

    settings, rollout = config.eval, config.rollout
    temperature = eval_temperature(config.env.id, settings.temperature)
    return SamplingParams(
        max_tokens=settings.max_completion_length or rollout.max_completion_length,
        temperature=temperature,
        top_p=rollout.top_p if temperature > 0 else 1.0,
        top_k=rollout.top_k if temperature > 0 else 0,
        seed=derive_seed(config.training.seed, process_index, Stream.EVAL),
        per_agent=eval_overrides(config),
    )


# --------------------------------------------------------------------------- engines


def local_engine(config: Config, adapters: Mapping[str, Path]) -> Engine:
    """The base model (with ``adapters`` loaded, if any) behind the config's ``rollout.engine``."""
    import torch
    from transformers.utils import logging as transformers_logging

    from llm_zoo_train.config import LoraSettings
    from llm_zoo_train.engines.hf.engine import HFEngine
    from llm_zoo_train.models.policy import Policy, load_base_model

    if not adapters and config.rollout.engine == "vllm":
        raise UsageError(
            "rollout.engine vllm evaluates saved adapters; for the base model alone use "
            "--rollout.engine hf, or `vllm serve` with --endpoint"
        )
    transformers_logging.disable_progress_bar()  # weight-loading bars would bury the results
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base, tokenizer = load_base_model(config.model, device)
    if not adapters:
        return HFEngine(
            base,
            tokenizer,
            max_batch_size=config.rollout.max_rows_per_generate_call,
            system_prompt=config.model.system_prompt,
            pack_base_weights=config.rollout.pack_base_weights,
            decode_kernel=config.rollout.decode_kernel,
        )
    paths = {name: str(path) for name, path in adapters.items()}
    policy = Policy(base, tokenizer, dict.fromkeys(paths, LoraSettings()), [], init_paths=paths)
    policy.model.to(device)
    if config.rollout.engine == "vllm":
        from llm_zoo_train.engines.vllm import engine as vllm_engine

        engine: Engine = vllm_engine.engine_from_config(config, policy)
        engine.load_adapters(paths, 0)
        return engine
    return HFEngine(
        policy.model,
        tokenizer,
        max_batch_size=config.rollout.max_rows_per_generate_call,
        system_prompt=config.model.system_prompt,
        pack_base_weights=config.rollout.pack_base_weights,
        decode_kernel=config.rollout.decode_kernel,
    )


def agent_models(pairs: Sequence[str], agents: Sequence[str]) -> dict[str, str]:
    models: dict[str, str] = {}
    for pair in pairs:
        agent, sep, name = pair.partition("=")
        if not sep or not agent or not name:
            raise UsageError(f"--agent-model {pair!r}: expected AGENT=SERVED_MODEL_NAME")
        if agent not in agents:
            raise UsageError(
                f"--agent-model {pair!r}: {agent!r} is not an agent of this env; agents: {list(agents)}"
            )
        models[agent] = name
    return models
