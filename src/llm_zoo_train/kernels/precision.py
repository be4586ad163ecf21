"""Which attention kernel a base model runs, and whether this CPU computes bfloat16 in hardware.

Both choices were measured, not assumed (``benchmarks/attention_speed.py``, SmolLM2-135M, one
thread), and they depend on the CPU:

* On an AMD EPYC with AVX2 only, bfloat16 is emulated: float32 was 6.8x faster at prefill and
  9-12x faster at the update, and in bfloat16 sdpa decoded left-padded batches on a 556-token cache
  1.10-1.21x slower than eager (load 11-12).
* On an Intel Xeon with AMX-BF16 and AVX512-BF16 (quiet), bfloat16 was on a par with float32 for
  prefill and update, and bfloat16 *sdpa* was the fastest decode of all: 0.81 s against eager's
  1.79 s on the long context and 0.45 against 0.62 s on the short one; eager's bfloat16 update was
  0.88x sdpa's. Decoding is most of a step, so sdpa wins there.

So ``model.attn_implementation: auto`` picks eager for bfloat16/float16 on a CPU without bfloat16
instructions and sdpa everywhere else, and a bfloat16/float16 model on such a CPU is warned about
once: float32 is the faster choice there. Where ``auto`` picks sdpa on a CPU, it is the variant of
:mod:`llm_zoo_train.kernels.attention` that reads grouped key/value heads in place while
generating (the same numbers; a left-padded decode step 2.3x faster in float32,
``benchmarks/decode_step.py``); an explicit ``sdpa`` is transformers' own.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any

import torch

from llm_zoo_train.kernels.attention import register as register_shared_kv_attention

__all__ = ["NATIVE_BF16_FLAGS", "choose_attention", "cpu_computes_bf16", "warn_if_emulated"]

#: CPU flags (Linux ``/proc/cpuinfo``) of instructions that compute bfloat16 matrix products.
NATIVE_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
_HALF = (torch.bfloat16, torch.float16)


@functools.cache
def cpu_computes_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU has bfloat16 matrix instructions (:data:`NATIVE_BF16_FLAGS`).

    False where the flags cannot be read (not Linux): the safe side, as float32 is never the slow
    choice by much where bfloat16 is native, and bfloat16 is by 7-12x where it is emulated.
    """
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return bool(NATIVE_BF16_FLAGS & set(line.partition(":")[2].split()))
    return False


def _native(given: bool | None) -> bool:
    return cpu_computes_bf16() if given is None else given


def choose_attention(setting: str, model: Any, native_bf16: bool | None = None) -> str:
    """The attention implementation for ``model`` (loaded, on its device): ``setting`` itself, or
    for ``auto`` eager for a bfloat16/float16 model on a CPU without bfloat16 instructions and sdpa
    otherwise (transformers' default; on a CPU its variant that reads grouped key/value heads in
    place while generating, registered here). ``native_bf16``: :func:`cpu_computes_bf16` unless
    given."""
    if setting != "auto":
        return setting
    if model.device.type != "cpu":
        return "sdpa"
    if model.dtype in _HALF and not _native(native_bf16):
        return "eager"
    return register_shared_kv_attention()


def warn_if_emulated(model: Any, native_bf16: bool | None = None) -> str | None:
    """Warn (and return the message) when a bfloat16/float16 model runs on a CPU that emulates it."""
    if model.device.type != "cpu" or model.dtype not in _HALF:
        return None
    if _native(native_bf16):
        return None
    name = str(model.dtype).removeprefix("torch.")
    message = (
        f"model.dtype {name} on a CPU without bfloat16 instructions (no {' or '.join(sorted(NATIVE_BF16_FLAGS))}"
        " in /proc/cpuinfo): it is emulated there, and float32 measured 7-12x faster for prefill and the"
        " update (benchmarks/attention_speed.py). Set model.dtype: float32 unless memory forbids it."
    )
    warnings.warn(message, stacklevel=2)
    return message
