"""What a :class:`~llm_zoo_train.trainer.Trainer` builds before its first step, as plain functions.

The trainer's constructor calls them in this order, between claiming the run directory and
restoring a checkpoint:

1. :func:`make_accelerator` (unless one is given) and :func:`check_strategy`: fsdp2 needs
   several processes;
2. :func:`load_policy`: the base models and adapters, on the process's device, or loaded on the
   host and sharded (fsdp2);
3. :func:`base_fingerprints` and :func:`check_resumed_base`: a resumed run refuses a base model
   replaced under the same path;
4. :func:`make_engine`: the generation engine ``rollout.engine`` names;
5. :func:`make_optimizers`: one AdamW optimizer and learning-rate schedule per trainable adapter.

They take the config and what the earlier ones built, and keep nothing themselves: the trainer
holds the results.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from llm_zoo_train.config import AgentPlan, Config, ConfigError
from llm_zoo_train.config.sections import TrainingConfig
from llm_zoo_train.models.policy import resolve_model_path
from llm_zoo_train.models.sharding import policy_models, shard_model
from llm_zoo_train.rollout.replay import ReplayEngine
from llm_zoo_train.runs.base_fingerprint import base_model_problem, fingerprint
from llm_zoo_train.runs.checkpoint import read_trainer_state
from llm_zoo_train.training.model_pools import build_policy, live_engine

__all__ = [
    "base_fingerprints",
    "check_resumed_base",
    "check_strategy",
    "load_policy",
    "make_accelerator",
    "make_engine",
    "make_optimizers",
]


def make_accelerator(config: Config, output_dir: Path) -> Any:
    """The run's ``accelerate.Accelerator``: its mixed precision, trackers and project directory."""
    from accelerate import Accelerator

    return Accelerator(
        mixed_precision=config.training.mixed_precision,
        log_with=list(config.logging.log_with) or None,
        project_dir=str(output_dir),
    )


def check_strategy(training: TrainingConfig, accelerator: Any) -> None:
    """Refuse ``training.strategy: fsdp2`` in a single process (there is nothing to shard across)."""
    if training.strategy == "fsdp2" and accelerator.num_processes == 1:
        raise ConfigError(
            "training.strategy 'fsdp2' shards the model across trainer processes and this run has one: "
            "launch with `torchrun --nproc_per_node N` (CPU: with ACCELERATE_USE_CPU=1) or "
            "`accelerate launch --num_processes N`, or use strategy 'ddp'"
        )


def load_policy(config: Config, plan: AgentPlan, accelerator: Any, *, sharded: bool) -> Any:
    """The run's policy (a ``Policy``, or a ``PolicyGroup`` when ``agents.base_models`` puts agents
    on several base models), on the process's device, or sharded with FSDP2 when ``sharded``."""
    policy = build_policy(
        config,
        plan,
        gradient_checkpointing=config.training.gradient_checkpointing,
        # fsdp2 loads on the host and fully_shard moves each process's slices to its device
        device="cpu" if sharded else accelerator.device,
    )
    if sharded:
        for model in policy_models(policy):
            shard_model(model, config.training.fsdp_sharding, accelerator.device)
    return policy


def base_fingerprints(plan: AgentPlan) -> tuple[dict[str, Any], dict[str, str]]:
    """Each base model's files as a checkpoint records them
    (:mod:`llm_zoo_train.runs.base_fingerprint`), and the paths they were read from."""
    paths = {name: resolve_model_path(m.name_or_path, m.cache_dir) for name, m in plan.models.items()}
    return {name: fingerprint(path) for name, path in paths.items()}, paths


def check_resumed_base(checkpoint: Path, fingerprints: dict[str, Any], paths: dict[str, str]) -> None:
    """Refuse to resume from ``checkpoint`` with other base model files than it was trained on."""
    recorded = read_trainer_state(checkpoint).get("base_models")
    problem = base_model_problem(recorded, fingerprints, paths)
    if problem:
        raise ConfigError(
            f"cannot resume from {checkpoint}: {problem}. Resume with the base it was trained on, "
            "or start a new run in another training.output_dir"
        )


def make_engine(config: Config, plan: AgentPlan, policy: Any, *, sharded: bool) -> Any:
    """The engine ``rollout.engine`` names: the live model (``hf``), a recording (``replay``), vLLM
    servers (``vllm_server``) or vLLM in this process (``vllm``)."""
    rollout = config.rollout
    if rollout.engine == "hf":
        return live_engine(config, plan, policy, sharded=sharded)
    if rollout.engine == "replay":
        assert rollout.replay_path is not None  # validate() checked it
        return ReplayEngine(rollout.replay_path)
    if rollout.engine == "vllm_server":
        from llm_zoo_train.engines.vllm.server import engine_from_config

        return engine_from_config(config, policy)
    from llm_zoo_train.engines.vllm import engine as vllm_engine

    factory = getattr(vllm_engine, "engine_from_config", None)
    if factory is None:
        raise ConfigError(
            "rollout.engine 'vllm': llm_zoo_train.engines.vllm.engine has no engine_from_config(config, policy)"
        )
    return factory(config, policy)


def make_optimizers(
    policy: Any, trainable: Iterable[str], training: TrainingConfig, accelerator: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One AdamW optimizer (prepared by ``accelerator``) and one learning-rate schedule per
    trainable adapter, by adapter name."""
    from transformers import get_scheduler

    optimizers: dict[str, Any] = {}
    schedulers: dict[str, Any] = {}
    for name in trainable:
        optimizer = torch.optim.AdamW(
            policy.adapter_parameters(name),
            lr=training.learning_rate,
            betas=(training.adam_beta1, training.adam_beta2),
            eps=training.adam_epsilon,
            weight_decay=training.weight_decay,
        )
        schedulers[name] = get_scheduler(
            training.lr_scheduler_type,
            optimizer,
            num_warmup_steps=training.warmup_steps,
            num_training_steps=max(training.max_steps, 1),
        )
        optimizers[name] = accelerator.prepare_optimizer(optimizer)
    return optimizers, schedulers
