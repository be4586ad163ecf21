"""What the ``"auto"`` kernel choices measured, as one record a run keeps and passes on.

Five choices are timed on the machine rather than assumed, once per process: the decode's
packed products (``rollout.decode_kernel``, :mod:`llm_zoo_train.kernels.packed_linear`), the
update's frozen-layer products and its LoRA products (``training.update_kernel``,
:mod:`llm_zoo_train.kernels.frozen_linear`, :mod:`llm_zoo_train.kernels.lora_rank_rows`), a decode
step's attention (:mod:`llm_zoo_train.kernels.attention`) and the update's attention
(:mod:`llm_zoo_train.kernels.update_attention`). Each alternative rounds
differently, and where the two are close in time a timing can go either way. A process that
measured again could then choose otherwise, and its tokens, logprobs and gradients would differ
from the run it continues in the last float32 bits, so that a resumed run would not repeat the
uninterrupted one.

So a run measures each choice once and passes the record on: the trainer saves
:func:`measured_kernel_choices` in every checkpoint's ``trainer_state.json`` and adopts it
(:func:`adopt_kernel_choices`) on resume before anything runs. A rollout generation process
(``rollout.async_steps``) starts from the trainer's record, sends its own back with each
rollout, and the checkpoint keeps that too, for the process a resumed run starts. A record that
cannot be read is named in a one-line warning and the choices are measured again: the run goes
on, bit-identical only where the timings choose the same. Each adoption logs the choices it took
in one ``INFO`` line (:func:`describe_kernel_choices`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from llm_zoo_train.kernels.attention import adopt_decode_attention_choices, decode_attention_choices
from llm_zoo_train.kernels.frozen_linear import adopt_frozen_measurements, frozen_measurements
from llm_zoo_train.kernels.lora_rank_rows import adopt_rank_rows_measurements, rank_rows_measurements
from llm_zoo_train.kernels.packed_linear import adopt_measurements, measurements
from llm_zoo_train.kernels.update_attention import adopt_update_attention_choices, update_attention_choices

__all__ = ["KernelChoicesError", "adopt_kernel_choices", "describe_kernel_choices", "measured_kernel_choices"]

logger = logging.getLogger(__name__)


class KernelChoicesError(ValueError):
    """A kernel-choice record that cannot be read (one line: what is wrong)."""


def measured_kernel_choices() -> dict[str, Any]:
    """Every ``"auto"`` choice this process measured or adopted, JSON-ready: ``decode_products``,
    ``update_products``, ``update_lora_products`` (lists of the layer shapes with the choice and
    its timings),
    ``decode_attention`` and ``update_attention`` (by ``"device/dtype"``)."""
    return {
        "decode_products": measurements(),
        "update_products": frozen_measurements(),
        "update_lora_products": rank_rows_measurements(),
        "decode_attention": decode_attention_choices(),
        "update_attention": update_attention_choices(),
    }


def adopt_kernel_choices(record: Mapping[str, Any], *, replace: bool = True) -> None:
    """Take ``record`` (:func:`measured_kernel_choices` of another process or of the run being
    resumed) as this process's choices; ``replace=False`` keeps those measured here already.
    Missing parts are fine (a checkpoint from before this record); a malformed part raises
    :class:`KernelChoicesError` and adopts none of its entries."""
    if not isinstance(record, Mapping):
        raise KernelChoicesError(f"kernel choices must be a mapping, not {type(record).__name__}")
    adopters: dict[str, Callable[..., None]] = {
        "decode_products": adopt_measurements,
        "update_products": adopt_frozen_measurements,
        "update_lora_products": adopt_rank_rows_measurements,
        "decode_attention": adopt_decode_attention_choices,
        "update_attention": adopt_update_attention_choices,
    }
    unknown = sorted(set(record) - set(adopters))
    if unknown:
        raise KernelChoicesError(f"unknown kernel choices {unknown}; known: {sorted(adopters)}")
    for part, adopt in adopters.items():
        if part in record:
            try:
                adopt(record[part], replace=replace)
            except (AttributeError, KeyError, TypeError, ValueError) as err:
                raise KernelChoicesError(f"{part}: {type(err).__name__}: {err}") from None
    if any(record.get(part) for part in adopters):
        logger.info("kernel choices taken, not measured: %s", describe_kernel_choices(record))


def describe_kernel_choices(record: Mapping[str, Any]) -> str:
    """``record`` (:func:`measured_kernel_choices`) in one line, e.g. ``decode products at 16 rows:
    onednn; update products: onednn; decode attention cpu/float32: sdpa``."""
    parts = [
        f"{'' if entry.get('dtype', 'float32') == 'float32' else entry['dtype'] + ' '}decode products"
        f" at {entry.get('rows')} rows: {entry.get('kernel') or 'F.linear'}"
        for entry in record.get("decode_products") or ()
    ]
    parts += [
        f"update products: {entry.get('kernel') or 'F.linear'}"
        for entry in record.get("update_products") or ()
    ]
    parts += [
        f"update LoRA products: {'the rank as the rows' if entry.get('rank_rows') else 'peft'}"
        for entry in record.get("update_lora_products") or ()
    ]
    parts += [
        f"decode attention {where}: {choice.get('kernel')}"
        for where, choice in (record.get("decode_attention") or {}).items()
    ]
    parts += [
        f"update attention {where}: {choice.get('kernel')}"
        for where, choice in (record.get("update_attention") or {}).items()
    ]
    return "; ".join(parts) or "none"
