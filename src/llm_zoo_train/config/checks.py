"""Value checks of a training configuration: ranges, engine requirements, installed trackers.

:func:`check_values` is the first half of :func:`llm_zoo_train.config.validate` (the second builds
the env and resolves the agents). It reads the config's sections by name, so this module needs
nothing from :mod:`llm_zoo_train.config`; every failure is a :class:`ConfigError` naming the field,
the value and what would be accepted.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from llm_zoo_train.config.typed import ConfigError

__all__ = [
    "LOOKAHEAD_EPISODE",
    "LOOKAHEAD_ROUND",
    "TEAMMATES",
    "check_env_servers",
    "check_finite",
    "check_lookahead",
    "check_model_positions",
    "check_output_dir",
    "check_seeds",
    "check_team_credit",
    "check_values",
    "require_positive",
    "url_problem",
]

#: ``rollout.team_credit_teammate`` choices: ``auto`` (greedy with one look-ahead sample, sampled with
#: several), the teammates sample at the rollout temperature, or they answer greedily.
TEAMMATES = ("auto", "sampled", "greedy")
#: ``rollout.team_credit_lookahead`` value meaning a full round of teammates (until the acting agent would act again).
LOOKAHEAD_ROUND = -1
#: Look-ahead to the episode's end: every later action, the acting agent's own included.
LOOKAHEAD_EPISODE = -2
#: Most actions one episode look-ahead plays (a bound for envs whose episodes never end).
EPISODE_LOOKAHEAD_CAP = 64


def check_lookahead(value: Any) -> int:
    """``value`` as a look-ahead (an int >= -2); raises ``ValueError`` naming the valid choices."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < LOOKAHEAD_EPISODE:
        raise ValueError(
            f"team_credit_lookahead must be -2 (to the episode's end, the agent's own later actions "
            f"included), -1 (a full round of teammates), 0 (the immediate global) or a positive number "
            f"of teammate actions, got {value!r}"
        )
    return int(value)


def check_team_credit(samples: Any, teammate: Any) -> tuple[int, str]:
    """``(samples, teammate)`` checked, ``"auto"`` resolved; raises ``ValueError`` naming the valid choices.

    ``"auto"`` is ``"greedy"`` with one look-ahead sample and ``"sampled"`` with several (greedy
    replicates would all be the same). Greedy is the default because it credited the tool agent
    better on Math-v0 (docs/training/team-credit.md has the measurement).
    """
    if isinstance(samples, bool) or not isinstance(samples, int | np.integer) or int(samples) < 1:
        raise ValueError(f"team_credit_samples must be an int >= 1, got {samples!r}")
    if teammate not in TEAMMATES:
        raise ValueError(
            f"team_credit_teammate must be one of {', '.join(map(repr, TEAMMATES))}; got {teammate!r}"
        )
    if teammate == "greedy" and int(samples) > 1:
        raise ValueError(
            f"team_credit_samples={samples} with team_credit_teammate='greedy': greedy teammates answer the "
            "same every time; use samples 1 with 'greedy', or 'sampled' to average several samples"
        )
    if teammate == "auto":
        return int(samples), "greedy" if int(samples) == 1 else "sampled"
    return int(samples), str(teammate)


def url_problem(url: Any) -> str:
    """What is wrong with an env server URL, in one line; ``""`` when nothing is."""
    if not isinstance(url, str):
        return f"an env server must be a URL string such as 'http://127.0.0.1:8000', got {url!r}"
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https", "ws", "wss") or not parsed.hostname:
        return f"{url!r} is not an env server URL: use http://HOST:PORT (an `llm-zoo serve` server)"
    try:
        parsed.port  # noqa: B018  (raises on a malformed port)
    except ValueError as err:
        return f"{url!r}: {err}"
    return ""


def check_env_servers(servers: Any) -> None:
    """ConfigError unless ``env.servers`` is a list of env server URLs."""
    if not isinstance(servers, (list, tuple)):
        raise ConfigError(f"env.servers must be a list of URLs, got {servers!r}")
    for url in servers:
        problem = url_problem(url)
        if problem:
            raise ConfigError(f"env.servers: {problem}")


def require_positive(key: str, value: float, *, allow_zero: bool = False) -> None:
    """ConfigError unless ``value`` is finite and > 0 (>= 0 with ``allow_zero``), naming ``key``
    (written so that NaN, which fails every comparison, is refused too)."""
    if not (math.isfinite(value) and (value > 0 or (allow_zero and value == 0))):
        kind = "" if math.isfinite(value) else " (a finite number)"
        raise ConfigError(f"{key} must be {'>= 0' if allow_zero else '> 0'}{kind}, got {value!r}")


#: Seeds seed NumPy's legacy generator, which takes 0 <= seed < 2**32.
SEED_LIMIT = 2**32


def check_finite(tree: Any, key: str = "") -> None:
    """ConfigError naming the first NaN or infinite number anywhere in ``tree`` (nested dicts and
    lists, e.g. env.kwargs, whose values the schema does not type)."""
    if isinstance(tree, float) and not math.isfinite(tree):
        raise ConfigError(f"{key}: expected a finite number, got {tree!r}")
    if isinstance(tree, dict):
        for name, value in tree.items():
            check_finite(value, f"{key}.{name}" if key else str(name))
    elif isinstance(tree, list | tuple):
        for index, value in enumerate(tree):
            check_finite(value, f"{key}[{index}]")


def check_seeds(training_seed: int, eval_seed: int, eval_episodes: int) -> None:
    """ConfigError unless the run's seeds (and the evaluation's last task seed) are in [0, 2**32)."""
    if not 0 <= training_seed < SEED_LIMIT:
        raise ConfigError(f"training.seed must be in [0, 2**32 - 1], got {training_seed}")
    last = eval_seed + max(eval_episodes, 1) - 1
    if not (eval_seed >= 0 and last < SEED_LIMIT):
        raise ConfigError(
            f"eval.seed must be in [0, 2**32 - eval.num_episodes] (its tasks use seeds eval.seed, "
            f"eval.seed + 1, ...), got {eval_seed}"
        )


def check_output_dir(output_dir: str) -> None:
    """ConfigError when ``training.output_dir`` or a directory above it is an existing file."""
    path = Path(output_dir)
    for candidate in (path, *path.parents):
        if candidate.exists() and not candidate.is_dir():
            what = "is" if candidate == path else f"is inside {candidate}, which is"
            raise ConfigError(f"training.output_dir {output_dir} {what} a file, not a directory")
        if candidate.exists():
            return


def check_values(config: Any) -> None:
    """Check the values of ``config`` (a :class:`llm_zoo_train.config.Config`) that need no env
    and no model: ranges, the engine's requirements, the trackers' packages."""
    r, a, t, e, lg = config.rollout, config.algorithm, config.training, config.eval, config.logging
    check_finite(dataclasses.asdict(config))
    check_seeds(t.seed, e.seed, e.num_episodes)
    check_output_dir(t.output_dir)
    require_positive("rollout.num_generations", r.num_generations)
    require_positive("rollout.envs_per_step", r.envs_per_step)
    require_positive("rollout.max_completion_length", r.max_completion_length)
    require_positive("rollout.temperature", r.temperature, allow_zero=True)
    if not 0 < r.top_p <= 1:
        raise ConfigError(f"rollout.top_p must be in (0, 1], got {r.top_p}")
    try:
        check_lookahead(r.team_credit_lookahead)
        samples, _ = check_team_credit(r.team_credit_samples, r.team_credit_teammate)
        if r.mode != "tree" and (samples != 1 or r.team_credit_teammate == "greedy"):
            raise ValueError(
                "team_credit_samples / team_credit_teammate apply to rollout.mode tree only (independent "
                "episodes read the look-ahead from their own next actions); keep 1 / auto"
            )
    except ValueError as err:
        raise ConfigError(f"rollout.{err}") from None
    require_positive("rollout.max_rows_per_generate_call", r.max_rows_per_generate_call)
    if r.prefix_cache_mb is not None:
        require_positive("rollout.prefix_cache_mb", r.prefix_cache_mb, allow_zero=True)
    _check_async_rollout(r)
    if r.num_generations < 2:
        raise ConfigError("rollout.num_generations must be >= 2: a group of one has no relative advantage")
    if r.temperature == 0:
        raise ConfigError(
            "rollout.temperature 0 (greedy) makes the K candidates of a group identical; use > 0"
        )
    require_positive("algorithm.epsilon", a.epsilon, allow_zero=True)
    if a.epsilon_high is not None:
        require_positive("algorithm.epsilon_high", a.epsilon_high, allow_zero=True)
    require_positive("algorithm.beta", a.beta, allow_zero=True)
    require_positive("algorithm.num_iterations", a.num_iterations)
    require_positive("algorithm.importance_sampling_cap", a.importance_sampling_cap)
    require_positive("training.max_steps", t.max_steps, allow_zero=True)
    require_positive("training.learning_rate", t.learning_rate, allow_zero=True)
    require_positive("training.per_device_train_batch_size", t.per_device_train_batch_size)
    if t.gradient_accumulation_steps is not None:
        require_positive("training.gradient_accumulation_steps", t.gradient_accumulation_steps)
    require_positive("training.save_steps", t.save_steps, allow_zero=True)
    if t.rollout_activations_mb is not None:
        require_positive("training.rollout_activations_mb", t.rollout_activations_mb, allow_zero=True)
    _check_strategy(config)
    require_positive("training.warmup_steps", t.warmup_steps, allow_zero=True)
    if t.save_total_limit is not None:
        require_positive("training.save_total_limit", t.save_total_limit)
    require_positive("eval.eval_steps", e.eval_steps, allow_zero=True)
    require_positive("eval.num_episodes", e.num_episodes, allow_zero=True)
    if e.temperature is not None:
        require_positive("eval.temperature", e.temperature, allow_zero=True)
    if e.max_completion_length is not None:
        require_positive("eval.max_completion_length", e.max_completion_length)
    require_positive("logging.logging_steps", lg.logging_steps)
    for tracker in lg.log_with:  # the packages Accelerate's own availability checks look for
        if not any(importlib.util.find_spec(m) for m in _TRACKER_MODULES[tracker]):
            raise ConfigError(f"logging.log_with: {tracker!r} is not installed; `pip install {tracker}`")
    if r.engine == "replay" and (r.replay_path is None or not Path(r.replay_path).exists()):
        raise ConfigError(
            f"rollout.engine 'replay' needs rollout.replay_path: the rollouts/ directory of a run recorded "
            f"with rollout.save_rollouts true (got {r.replay_path!r}, which does not exist)"
        )
    require_positive("vllm.tensor_parallel_size", config.vllm.tensor_parallel_size)
    if r.engine == "vllm_server":
        _check_vllm_server(config.vllm)
    if r.engine == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                "rollout.engine: 'vllm' needs vLLM: `pip install \"llm-zoo[vllm]\"` (GPU), or use engine 'hf'"
            )
        if importlib.util.find_spec("llm_zoo_train.engines.vllm.engine") is None:
            raise ConfigError("rollout.engine: the vllm engine is not part of this llm-zoo version; use 'hf'")


def _check_strategy(config: Any) -> None:
    t = config.training
    if t.strategy == "ddp":
        if t.fsdp_sharding != "full":
            raise ConfigError(
                f"training.fsdp_sharding {t.fsdp_sharding!r} applies to training.strategy 'fsdp2'; "
                "remove it or set strategy 'fsdp2'"
            )
        return
    if config.rollout.async_steps:
        raise ConfigError(
            "training.strategy 'fsdp2' with rollout.async_steps > 0: the generation process would need "
            "the whole model, which fsdp2 shards; use async_steps 0 or strategy 'ddp'"
        )
    if t.update_kernel == "onednn":
        raise ConfigError(
            "training.update_kernel 'onednn' packs copies of whole base weights, which fsdp2 shards; "
            "use update_kernel 'exact' or 'auto' (exact under fsdp2)"
        )


def _check_async_rollout(r: Any) -> None:
    require_positive("rollout.async_steps", r.async_steps, allow_zero=True)
    if r.async_steps and r.engine not in ("hf", "vllm_server"):
        raise ConfigError(
            f"rollout.async_steps {r.async_steps} needs rollout.engine 'hf' or 'vllm_server' (its "
            f"generation process runs the transformers engine or sends requests to vLLM servers), got "
            f"{r.engine!r}; use async_steps 0 with {r.engine!r}"
        )
    if r.async_worker_threads is not None:
        require_positive("rollout.async_worker_threads", r.async_worker_threads)
    if r.async_trainer_envs and not r.async_steps:
        raise ConfigError(
            f"rollout.async_trainer_envs {r.async_trainer_envs} splits asynchronous rollouts: set "
            "rollout.async_steps >= 1, or async_trainer_envs 0"
        )
    if not 0 <= r.async_trainer_envs < r.envs_per_step:
        raise ConfigError(
            f"rollout.async_trainer_envs must be in [0, {r.envs_per_step - 1}] (the generation process "
            f"plays at least one of the envs_per_step {r.envs_per_step} tasks), got {r.async_trainer_envs}"
        )
    if r.async_trainer_envs and r.save_rollouts:
        raise ConfigError(
            "rollout.save_rollouts records a step's generations in one process; with "
            f"rollout.async_trainer_envs {r.async_trainer_envs} they are split between two: set one to 0"
        )
    cores = list(range(os.cpu_count() or 1))  # the machine's, not the trainer's own (it may be pinned)
    unknown = [core for core in r.async_worker_cores or [] if core not in cores]
    if r.async_worker_cores is not None and (unknown or not r.async_worker_cores):
        raise ConfigError(
            f"rollout.async_worker_cores {r.async_worker_cores}: not cores of this machine "
            f"{unknown or '(empty list)'}; choose from {cores} or null"
        )


_TRACKER_MODULES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",)}


def _check_vllm_server(section: Any) -> None:
    if not section.server_urls:
        raise ConfigError(
            "rollout.engine 'vllm_server' needs vllm.server_urls, e.g. --vllm.server_urls "
            "'[http://localhost:8000]' (docs/vllm.md shows how to start the servers)"
        )
    for url in section.server_urls:
        if not str(url).startswith(("http://", "https://")):
            raise ConfigError(f"vllm.server_urls: {url!r} is not an http:// or https:// URL")
    require_positive("vllm.request_timeout_s", section.request_timeout_s)
    require_positive("vllm.retry_backoff_s", section.retry_backoff_s)
    require_positive("vllm.max_retries", section.max_retries, allow_zero=True)
    require_positive("vllm.max_concurrent_requests", section.max_concurrent_requests)


def check_model_positions(models: dict[str, Any], lengths: dict[str, int | None]) -> None:
    """ConfigError when a completion length leaves no room for a prompt in a model's positions.

    Args:
        models: Model name -> its model section (``name_or_path``, ``cache_dir``); only models
            whose ``config.json`` is on this machine are checked (a local directory or the hub
            cache: nothing is downloaded, no weights are read, transformers is not imported).
        lengths: Config key -> the most new tokens it allows (None: not set).
    """
    for name, model in models.items():
        positions = _model_positions(str(model.name_or_path), getattr(model, "cache_dir", None))
        for key, length in lengths.items():
            if positions is not None and length is not None and length >= positions:
                raise ConfigError(
                    f"{key} {length} leaves no room for the prompt: {name} ({model.name_or_path}) has "
                    f"{positions} positions (prompt + completion); use well under {positions}"
                )


def _model_positions(name_or_path: str, cache_dir: str | None) -> int | None:
    """``max_position_embeddings`` (or ``n_positions``) of a model's config.json, if it is here."""
    path: Any = Path(name_or_path) / "config.json"
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            path = try_to_load_from_cache(name_or_path, "config.json", cache_dir=cache_dir)
        except Exception:  # not a repo id, or no hub client: loading the model will say why
            return None
        if not isinstance(path, str):
            return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    text_config = data.get("text_config")
    for section in (data, text_config if isinstance(text_config, dict) else {}):
        for key in ("max_position_embeddings", "n_positions"):
            if isinstance(section.get(key), int) and not isinstance(section.get(key), bool):
                return int(section[key])
    return None
