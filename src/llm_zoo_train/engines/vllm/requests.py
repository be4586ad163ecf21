"""What the colocated and the server vLLM engines share: LoRA ranks and adapters as vLLM takes
them, and one request's sampling fields.

:func:`request_sampling_fields` gives the same names as ``vllm.SamplingParams`` arguments and as
fields of the OpenAI-compatible server's ``/v1/completions`` request, so both engines sample alike
from the same seed. Nothing here imports vLLM.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from llm_zoo_train.engines.base import SamplingParams, report_generated

__all__ = [
    "VLLM_LORA_RANKS",
    "FinishedRequests",
    "adapter_rank",
    "check_served_adapters",
    "request_sampling_fields",
    "request_seed",
    "supported_lora_rank",
    "write_zero_adapter",
]

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``max_lora_rank``."""


class FinishedRequests(tqdm):  # type: ignore[misc]
    """The progress-bar class ``vllm.LLM.generate(use_tqdm=FinishedRequests)`` takes: it draws
    nothing and reports the completions of every finished request through
    :func:`~llm_zoo_train.engines.base.report_generated` (live progress of a long call)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs["file"] = io.StringIO()  # nothing reaches the console; display() draws nothing anyway
        super().__init__(*args, **kwargs)

    def display(self, *args: Any, **kwargs: Any) -> None:
        return None

    def update(self, n: float | None = 1) -> bool | None:
        if self.iterable is None:  # a count of finished completions, not the "Adding requests" loop
            report_generated(0, int(n or 0))
        return super().update(n)


def supported_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds adapters of rank ``rank``."""
    if int(rank) < 1:
        raise ValueError(f"a LoRA rank must be >= 1, got {rank!r}")
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(
        f"LoRA rank {rank} is larger than vLLM supports (max_lora_rank <= {VLLM_LORA_RANKS[-1]})"
    )


def adapter_rank(path: str | Path) -> int:
    """The largest LoRA rank of the PEFT adapter saved at ``path`` (``r`` and any ``rank_pattern``)."""
    config_file = Path(path) / "adapter_config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{path} is not a saved PEFT adapter (no adapter_config.json)")
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(
            f"{path}: the vLLM engine serves LoRA adapters, this one is {config.get('peft_type')!r}"
        )
    if config.get("use_dora"):
        raise ValueError(f"{path}: vLLM does not serve DoRA adapters (use_dora: true)")
    ranks = [int(config.get("r", 8)), *(int(r) for r in (config.get("rank_pattern") or {}).values())]
    return max(ranks)


def check_served_adapters(adapters: Sequence[str | None], served: Iterable[str]) -> None:
    """Raise ``ValueError`` naming the ``adapters`` (``None``: the base model) not among ``served``."""
    served = set(served)
    unknown = sorted({a for a in adapters if a is not None and a not in served})
    if unknown:
        raise ValueError(
            f"unknown adapter(s) {unknown}; this engine serves {sorted(served)} (or None for the base model)"
        )


def request_seed(seed: int, index: int) -> int:
    """The vLLM seed of prompt ``index`` of a call seeded with ``seed`` (vLLM seeds the ``n``
    samples of one request ``seed + j``, so each prompt gets its own base)."""
    return int(np.random.SeedSequence([int(seed) % 2**63, int(index)]).generate_state(1, np.uint32)[0])


def request_sampling_fields(sampling: SamplingParams, n: int, index: int) -> dict[str, Any]:
    """vLLM sampling fields of prompt ``index`` of a call: ``n`` samples, the seed from
    :func:`request_seed`, and the logprob of each sampled token (``logprobs=0``).

    The same names are ``vllm.SamplingParams`` arguments and fields of the OpenAI-compatible
    server's ``/v1/completions`` request, so the colocated and the server engine sample alike.
    Penalties and ``min_p`` are set to their neutral values: the recorded logprobs must describe
    the real sampling, and nothing else may reshape it.
    """
    greedy = sampling.greedy
    return {
        "n": int(n),
        "max_tokens": int(sampling.max_tokens),
        "temperature": 0.0 if greedy else float(sampling.temperature),
        "top_p": 1.0 if greedy else float(sampling.top_p),
        "top_k": int(sampling.top_k) if not greedy and sampling.top_k and sampling.top_k > 0 else 0,
        "seed": None if sampling.seed is None else request_seed(sampling.seed, index),
        "logprobs": 0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "min_p": 0.0,
        **({"stop": list(sampling.stop), "include_stop_str_in_output": True} if sampling.stop else {}),
    }


def write_zero_adapter(source: str | Path, target: Path) -> Path:
    """Write the LoRA weights of the PEFT adapter at ``source`` as zeros (its delta is exactly 0).

    Fully trained modules (``modules_to_save``) are left out: zeroing those would replace the base
    model's weights instead of adding nothing.
    """
    import torch

    source = Path(source)
    target.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "adapter_config.json").read_text(encoding="utf-8"))
    config["modules_to_save"] = None
    (target / "adapter_config.json").write_text(json.dumps(config), encoding="utf-8")
    if (source / "adapter_model.safetensors").is_file():
        from safetensors.torch import load_file

        weights = load_file(source / "adapter_model.safetensors")
    elif (source / "adapter_model.bin").is_file():
        weights = torch.load(source / "adapter_model.bin", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"{source} holds no adapter_model.safetensors or adapter_model.bin")
    zeros = {k: torch.zeros_like(v) for k, v in weights.items() if "lora_" in k}
    from safetensors.torch import save_file

    save_file(zeros, target / "adapter_model.safetensors")
    return target
