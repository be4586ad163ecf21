"""Independent model pools: one base model per group of agents, each with its own adapters.

When ``agents.base_models`` puts agents on several base models (:mod:`llm_zoo_train.config.base_models`),
the trainer holds one :class:`~llm_zoo_train.models.policy.Policy` per base model - its own weights,
tokenizer, chat template and adapters - and these pieces make them look like one:

* :class:`PolicyGroup` has the adapter-level interface of a ``Policy`` (parameters, activate,
  save, load), dispatching each adapter to the policy it lives on; checkpoints therefore keep
  their layout (``adapters/<name>/``, optimizer and scheduler states by adapter name);
* :class:`ModelRouter` is an engine that sends each prompt to the engine of its adapter's base
  model, so rollouts and evaluation run unchanged;
* :class:`UpdaterByModel` gives each adapter's update to the
  :class:`~llm_zoo_train.training.update.AdapterUpdater` of its base model (its tokenizer's padding).

With one base model :func:`build_policy`, :func:`make_updater` and :func:`live_engine` return the
plain ``Policy``, ``AdapterUpdater`` and ``HFEngine`` exactly as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from llm_zoo_train.config import Config, LoraSettings
from llm_zoo_train.config.agent_plan import AgentPlan
from llm_zoo_train.config.base_models import base_model_label, label_model
from llm_zoo_train.engines.base import Completion, Engine, SamplingParams, check_generate_args
from llm_zoo_train.engines.hf.engine import HFEngine, prefix_cache_mb_for
from llm_zoo_train.kernels.rollout_activations import RolloutActivations, attach
from llm_zoo_train.models.policy import Policy, load_base_model, save_each_adapter
from llm_zoo_train.rollout.samples import Sample
from llm_zoo_train.runs.seeding import derive_seed
from llm_zoo_train.training.update import AdapterUpdater

__all__ = [
    "ModelRouter",
    "PolicyGroup",
    "UpdaterByModel",
    "build_policy",
    "live_engine",
    "local_engine_by_model",
    "make_updater",
]


class PolicyGroup:
    """One :class:`~llm_zoo_train.models.policy.Policy` per base model, addressed by adapter name.

    Args:
        policies: Base model name -> the policy holding that model's adapters. Adapter names are
            unique across the policies.

    Attributes:
        policies: As given.
        adapter_names: Every adapter, policy by policy.
        trainable: Every trainable adapter, policy by policy.
    """

    def __init__(self, policies: Mapping[str, Policy]):
        self.policies = dict(policies)
        self.adapter_names = [name for p in self.policies.values() for name in p.adapter_names]
        self.trainable = [name for p in self.policies.values() for name in p.trainable]
        self._owner = {name: model for model, p in self.policies.items() for name in p.adapter_names}
        if len(self._owner) != len(self.adapter_names):
            raise ValueError(f"adapter names must be unique across base models: {self.adapter_names}")

    def policy_of(self, adapter: str) -> Policy:
        """The policy holding ``adapter``; KeyError naming the adapters."""
        if adapter not in self._owner:
            raise KeyError(f"no adapter {adapter!r}; adapters: {self.adapter_names}")
        return self.policies[self._owner[adapter]]

    def adapter_parameters(self, name: str) -> list[torch.nn.Parameter]:
        return self.policy_of(name).adapter_parameters(name)

    def activate(self, name: str) -> None:
        self.policy_of(name).activate(name)

    def adapter_state_dict(self, name: str) -> dict[str, torch.Tensor]:
        return self.policy_of(name).adapter_state_dict(name)

    def whole_adapter_weights(self, name: str) -> dict[str, torch.Tensor]:
        return self.policy_of(name).whole_adapter_weights(name)

    def save_adapter(
        self, name: str, directory: str | Path, weights: Mapping[str, torch.Tensor] | None = None
    ) -> Path:
        return self.policy_of(name).save_adapter(name, directory, weights)

    def save_adapters(
        self,
        directory: str | Path,
        names: Sequence[str] | None = None,
        weights: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
    ) -> dict[str, str]:
        """Save adapters (all by default) as ``directory/<name>/``; returns name -> path."""
        return save_each_adapter(self, directory, names, weights)

    def load_adapter_weights(self, name: str, directory: str | Path) -> None:
        self.policy_of(name).load_adapter_weights(name, directory)


class ModelRouter:
    """An engine over one engine per base model: each prompt goes to its adapter's base model.

    Args:
        engines: Base model name -> its engine.
        adapter_models: Adapter name -> base model name. A prompt's adapter may also be
            :func:`~llm_zoo_train.config.base_models.base_model_label` of a model (its bare base model,
            given to that engine as ``None``); ``None`` itself is refused, since it names no model.

    Each engine's share of a call is sampled with a seed derived from the call's seed and the
    engine's position, so the result depends on neither the other engines nor their prompts.
    """

    def __init__(self, engines: Mapping[str, Engine], adapter_models: Mapping[str, str]):
        self.engines = dict(engines)
        self.adapter_models = dict(adapter_models)
        unknown = sorted({m for m in self.adapter_models.values() if m not in self.engines})
        if unknown:
            raise ValueError(
                f"adapters on base models {unknown} that have no engine; engines: {list(engines)}"
            )

    def generate(
        self, prompts: Sequence[str], adapters: Sequence[str | None], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per prompt, each from the engine of its adapter's base model."""
        check_generate_args(prompts, adapters, n, sampling)
        rows: dict[str, list[int]] = {}
        for index, adapter in enumerate(adapters):
            rows.setdefault(self._model_of(adapter), []).append(index)
        results: list[list[Completion]] = [[] for _ in prompts]
        for position, (model, engine) in enumerate(self.engines.items()):
            if model not in rows:
                continue
            seed = None if sampling.seed is None else derive_seed(sampling.seed, position)
            share = engine.generate(
                [prompts[i] for i in rows[model]],
                [None if label_model(adapters[i]) is not None else adapters[i] for i in rows[model]],
                n,
                dataclasses.replace(sampling, seed=seed),
            )
            for index, completions in zip(rows[model], share, strict=True):
                results[index] = completions
        return results

    def load_adapters(self, paths: Mapping[str, str], version: int) -> None:
        """Give each engine the adapters of its base model."""
        unknown = sorted(name for name in paths if name not in self.adapter_models)
        if unknown:
            raise ValueError(
                f"adapters {unknown} are on no base model; adapters: {sorted(self.adapter_models)}"
            )
        for model, engine in self.engines.items():
            mine = {name: path for name, path in paths.items() if self.adapter_models[name] == model}
            if mine:
                engine.load_adapters(mine, version)

    def without_prefix_cache(self) -> ModelRouter:
        """The same router over each engine's :meth:`HFEngine.without_prefix_cache` view (engines
        without one are kept as they are)."""
        engines = {
            model: engine.without_prefix_cache() if isinstance(engine, HFEngine) else engine
            for model, engine in self.engines.items()
        }
        return ModelRouter(engines, self.adapter_models)

    def _model_of(self, adapter: str | None) -> str:
        labelled = label_model(adapter)
        if labelled is not None and labelled in self.engines:
            return labelled
        if adapter is not None and adapter in self.adapter_models:
            return self.adapter_models[adapter]
        choices = sorted(self.adapter_models) + [base_model_label(m) for m in self.engines]
        raise ValueError(
            f"adapter {adapter!r} is on none of the base models {list(self.engines)}; with several base "
            f"models name an adapter or a bare base model: {choices}"
        )


class UpdaterByModel:
    """One :class:`~llm_zoo_train.training.update.AdapterUpdater` per base model; :meth:`update` picks the
    one holding the adapter. All share one generator, so the micro-batch order is that of one
    updater called in the same sequence."""

    def __init__(self, updaters: Mapping[str, AdapterUpdater], adapter_models: Mapping[str, str]):
        self.updaters = dict(updaters)
        self.adapter_models = dict(adapter_models)

    def update(
        self, adapter: str, samples: list[Sample], progress: Callable[[int, int], None] | None = None
    ) -> dict[str, float]:
        """Train ``adapter`` on ``samples`` (see :meth:`AdapterUpdater.update`)."""
        return self.updaters[self.adapter_models[adapter]].update(adapter, samples, progress)


def build_policy(
    config: Config,
    plan: AgentPlan,
    *,
    gradient_checkpointing: bool = False,
    device: torch.device | str | None = None,
) -> Policy | PolicyGroup:
    """Load every base model of ``plan`` with its adapters: a ``Policy`` for one base model, else
    a :class:`PolicyGroup` (models loaded in plan order, ``model`` first)."""
    policies = {}
    for model, settings in plan.models.items():
        names = plan.adapters_on(model) if len(plan.models) > 1 else plan.adapters
        policies[model] = Policy.from_config(
            settings,
            {name: plan.lora[name] for name in names},
            [name for name in plan.trainable if name in names],
            init_paths={n: p for n, p in config.agents.init_adapters.items() if n in names},
            gradient_checkpointing=gradient_checkpointing,
            device=device,
        )
    if len(policies) == 1:
        return next(iter(policies.values()))
    return PolicyGroup(policies)


def make_updater(
    policy: Policy | PolicyGroup, optimizers: Mapping[str, Any], *args: Any, **kwargs: Any
) -> AdapterUpdater | UpdaterByModel:
    """``AdapterUpdater(policy, optimizers, *args, **kwargs)``, or one per base model of a group."""
    if isinstance(policy, Policy):
        return AdapterUpdater(policy, optimizers, *args, **kwargs)
    updaters, owners = {}, {}
    for model, member in policy.policies.items():
        mine = {name: optimizer for name, optimizer in optimizers.items() if name in member.adapter_names}
        updaters[model] = AdapterUpdater(member, mine, *args, **kwargs)
        owners.update(dict.fromkeys(member.adapter_names, model))
    return UpdaterByModel(updaters, owners)


#: MiB of rollout activations that ``training.rollout_activations_mb: null`` gives a float32 model
#: on a CPU.
CPU_ROLLOUT_ACTIVATIONS_MB = 2048.0


def rollout_activations_mb_for(setting: float | None, model: Any) -> float:
    """The store of rollout activations for ``model``: ``setting`` when given, else
    :data:`CPU_ROLLOUT_ACTIVATIONS_MB` for a float32 base on a CPU and 0 (off) elsewhere.

    Not by default in bfloat16: there the decode's outputs differ from the update's own by
    bfloat16 rounding, and the main job's first update's gradient with them differed from the
    computed one by 7.7% (relative norm; 7.0% between two computed ones, sdpa against grouped
    attention), while its steps took as long either way (AMD EPYC, seeds 0-2: 4.6, 4.5, 4.8
    minutes with, 4.5, 5.1, 4.7 without) and its seeds reached 48, 35, 39% with against 49, 42,
    52% without: no time to gain and a learning difference not ruled out."""
    if setting is not None:
        return float(setting)
    frozen = next((p for p in model.parameters() if not p.requires_grad), None)
    weight = frozen if frozen is not None else next(model.parameters())
    return (
        CPU_ROLLOUT_ACTIVATIONS_MB if weight.device.type == "cpu" and weight.dtype == torch.float32 else 0.0
    )


def live_engine(
    config: Config, plan: AgentPlan, policy: Policy | PolicyGroup, *, sharded: bool = False
) -> HFEngine | ModelRouter:
    """The transformers engine on the live (training) model(s): one ``HFEngine`` per base model,
    each with its model's tokenizer and system prompt; routed by adapter when there are several.
    ``sharded`` (``training.strategy: fsdp2``): no packed copies of the base, which would keep the
    whole base in every process between rollouts."""
    max_rows = config.rollout.max_rows_per_generate_call
    pack_base_weights = config.rollout.pack_base_weights and not sharded

    def activations(model: Any) -> RolloutActivations | None:
        # fsdp2's update runs one forward over every row (lockstep): no completion pass to replay.
        megabytes = (
            0.0 if sharded else rollout_activations_mb_for(config.training.rollout_activations_mb, model)
        )
        return attach(model, int(megabytes * 2**20)) if megabytes > 0 else None

    if isinstance(policy, Policy):
        settings = next(iter(plan.models.values()))
        return HFEngine(
            policy.model,
            policy.tokenizer,
            max_batch_size=max_rows,
            system_prompt=settings.system_prompt,
            pack_base_weights=pack_base_weights,
            decode_kernel=config.rollout.decode_kernel,
            prefix_cache_mb=prefix_cache_mb_for(config.rollout.prefix_cache_mb, policy.model),
            activations=activations(policy.model),
        )
    engines: dict[str, Engine] = {
        model: HFEngine(
            member.model,
            member.tokenizer,
            max_batch_size=max_rows,
            system_prompt=plan.models[model].system_prompt,
            pack_base_weights=pack_base_weights,
            decode_kernel=config.rollout.decode_kernel,
            prefix_cache_mb=prefix_cache_mb_for(config.rollout.prefix_cache_mb, member.model),
            activations=activations(member.model),
        )
        for model, member in policy.policies.items()
    }
    return ModelRouter(engines, plan.adapter_models)


def local_engine_by_model(config: Config, plan: AgentPlan, adapters: Mapping[str, Path]) -> ModelRouter:
    """For ``llm-zoo-train eval`` of a run on several base models: each base model (on the GPU
    when there is one) with its saved ``adapters`` loaded, frozen, or bare when none are given,
    behind one router."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # weight-loading bars would bury the results
    device = "cuda" if torch.cuda.is_available() else "cpu"
    engines: dict[str, Engine] = {}
    for model, settings in plan.models.items():
        base, tokenizer = load_base_model(settings, device)
        paths = {n: str(adapters[n]) for n in plan.adapters_on(model) if n in adapters}
        if paths:
            member = Policy(base, tokenizer, dict.fromkeys(paths, LoraSettings()), [], init_paths=paths)
            member.model.to(device)
            base = member.model
        engines[model] = HFEngine(
            base,
            tokenizer,
            max_batch_size=config.rollout.max_rows_per_generate_call,
            system_prompt=settings.system_prompt,
            pack_base_weights=config.rollout.pack_base_weights,
            decode_kernel=config.rollout.decode_kernel,
        )
    return ModelRouter(engines, plan.adapter_models)
