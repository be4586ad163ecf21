"""Other names of training config fields: TRL's ``GRPOConfig`` names, and renamed fields.

TRL's ``GRPOConfig`` is flat (``learning_rate``, ``use_vllm``, ``report_to``, ...); ours has
sections (``training.learning_rate``, ``rollout.engine``, ``logging.log_with``). A TRL name whose
meaning is the same as one of our fields is accepted as a **top-level key** of the YAML file or as
``--name VALUE`` on the command line, and sets that field; ``llm-zoo-train --help`` lists each
field's alias. Where the two differ in form the value is converted (``use_vllm: true`` ->
``rollout.engine: vllm``, ``bf16: true`` -> ``training.mixed_precision: bf16``, ``disable_tqdm:
true`` -> ``logging.progress_bar: false``). A TRL name that looks equivalent but is not
(``generation_batch_size``) is refused with an explanation, never mapped silently.

Names that TRL has and we do not (``vllm_mode``, ``max_prompt_length``, ``num_train_epochs``,
``importance_sampling_level``, ...) are unknown keys, reported with the close names that exist.
"""

from __future__ import annotations

from typing import Any

from llm_zoo_train.config.typed import SKIP, Alias, ConfigError

__all__ = ["CONFIG_ALIASES", "RENAMED", "TRL_ALIASES", "TRL_REFUSED"]


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    return value


def _use_vllm(value: Any) -> str:
    return "vllm" if _flag("use_vllm", value) else "hf"


def _precision(name: str) -> Any:
    def convert(value: Any) -> Any:
        return name if _flag(name, value) else SKIP  # false: not this precision (the default: no)

    return convert


def _not(name: str) -> Any:
    def convert(value: Any) -> bool:
        return not _flag(name, value)

    return convert


_TRACKERS = ("tensorboard", "wandb")


def _report_to(value: Any) -> list[str]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"report_to: expected a tracker name or a list of them, got {value!r}")
    unknown = [n for n in names if n not in (*_TRACKERS, "none")]
    if unknown:
        raise ConfigError(
            f"report_to: {unknown[0]!r} is not supported; name trackers among {', '.join(_TRACKERS)}, or none"
        )
    return [n for n in names if n != "none"]


def _top_k(value: Any) -> Any:
    return 0 if value is None else value  # TRL: None disables top-k; here 0 does


def _scale_rewards(value: Any) -> Any:
    if isinstance(value, bool):  # TRL's older boolean form
        return "group" if value else "none"
    return value


#: TRL ``GRPOConfig`` name -> our field, same meaning. Identity aliases first, by section.
TRL_ALIASES: tuple[Alias, ...] = (
    *(
        Alias(name, f"rollout.{name}")
        for name in ("num_generations", "max_completion_length", "temperature", "top_p")
    ),
    Alias("top_k", "rollout.top_k", _top_k, "null -> 0 (off)"),
    Alias("use_vllm", "rollout.engine", _use_vllm, "true -> vllm, false -> hf"),
    Alias("vllm_gpu_memory_utilization", "vllm.gpu_memory_utilization"),
    Alias("vllm_enable_sleep_mode", "vllm.enable_sleep_mode"),
    Alias("vllm_max_model_length", "vllm.max_model_len"),
    *(
        Alias(name, f"algorithm.{name}")
        for name in ("loss_type", "epsilon", "epsilon_high", "beta", "num_iterations")
    ),
    Alias("scale_rewards", "algorithm.scale_rewards", _scale_rewards, "also true -> group, false -> none"),
    Alias("vllm_importance_sampling_correction", "algorithm.importance_sampling"),
    Alias("vllm_importance_sampling_cap", "algorithm.importance_sampling_cap"),
    *(
        Alias(name, f"training.{name}")
        for name in (
            "output_dir",
            "max_steps",
            "learning_rate",
            "lr_scheduler_type",
            "warmup_steps",
            "weight_decay",
            "adam_beta1",
            "adam_beta2",
            "adam_epsilon",
            "max_grad_norm",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "gradient_checkpointing",
            "seed",
            "save_steps",
            "save_total_limit",
        )
    ),
    Alias("bf16", "training.mixed_precision", _precision("bf16"), "true -> bf16"),
    Alias("fp16", "training.mixed_precision", _precision("fp16"), "true -> fp16"),
    Alias("eval_steps", "eval.eval_steps"),
    Alias("eval_on_start", "eval.eval_on_start"),
    Alias("logging_steps", "logging.logging_steps", note="console period; trackers get every step"),
    Alias("run_name", "logging.run_name"),
    Alias("report_to", "logging.log_with", _report_to, "a name or a list; none -> []"),
    Alias("disable_tqdm", "logging.progress_bar", _not("disable_tqdm"), "true -> false"),
)

#: TRL names that look like ours but mean something else: refused with the equivalent.
TRL_REFUSED: tuple[Alias, ...] = (
    Alias(
        "generation_batch_size",
        None,
        note=(
            "TRL's generation_batch_size (completions generated per round) is not an option here: a "
            "step generates rollout.envs_per_step x rollout.num_generations completions per agent "
            "turn. The most rows one transformers generate call takes is "
            "rollout.max_rows_per_generate_call."
        ),
    ),
)

#: Renamed fields: the old dotted name still works, with a FutureWarning.
RENAMED: tuple[Alias, ...] = (
    Alias("rollout.generation_batch_size", "rollout.max_rows_per_generate_call", deprecated=True),
)

#: Every other name the training config accepts (pass to ``load_dataclass`` / ``format_fields``).
CONFIG_ALIASES: tuple[Alias, ...] = TRL_ALIASES + TRL_REFUSED + RENAMED
