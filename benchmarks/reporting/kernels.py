"""The sentences that name the kernels a run chose on its machine (decode products, prefills,
decode attention, the update's frozen layers and LoRA products): the rollout and trainer
sections both quote them.
"""

from __future__ import annotations

from typing import Any


def prefill_choice(choice: dict[str, Any]) -> str:
    """How a recorded decode-kernel choice ran prefills (absent from runs before it was recorded)."""
    if choice.get("prefill_onednn_s") is None:
        return ""
    return (
        f", prefills on {'oneDNN' if choice.get('any_rows') else 'F.linear'} (128 rows:"
        f" {1e3 * choice['prefill_onednn_s']:.1f} ms oneDNN, {1e3 * choice['prefill_exact_s']:.1f} ms F.linear)"
    )


def decode_kernel_line(result: dict[str, Any]) -> str:
    choices = result.get("decode_kernel_choices")
    if not choices:
        return ""
    # bfloat16's exact side is F.linear (results before it was packed hold float32 choices only)
    dtype = choices[0].get("dtype", "float32")
    exact = "MKL (exact)" if dtype == "float32" else "F.linear"
    same_bits = "" if dtype == "float32" else ", oneDNN's copies probed to F.linear's bits"
    return (
        f" Our engine's {dtype} decode products (`rollout.decode_kernel: auto`, measured on this machine"
        f"{same_bits}): "
        + "; ".join(
            f"{c['rows']} rows "
            + (
                "oneDNN"
                if c["kernel"] == "onednn"
                else "MKL, LoRA layers merged"
                if c.get("mkl_merged")
                else exact
            )
            + (
                f" ({1e3 * c['onednn_s']:.1f} ms a pass oneDNN, {1e3 * c['exact_s']:.1f} ms"
                f" {('MKL' if c.get('mkl_merged') else 'exact') if dtype == 'float32' else exact})"
                if c.get("exact_s")
                else ""
            )
            + prefill_choice(c)
            for c in choices
        )
        + "."
    )


def _attention_line(choices: dict[str, Any] | None, what: str, timed: str) -> str:
    if not choices:
        return ""
    return (
        f" {what} (measured on this machine): "
        + "; ".join(
            f"{where.split('/')[-1]} {'grouped products' if c['kernel'] == 'grouped' else 'sdpa'}"
            f" ({1e6 * c['sdpa_s']:.0f} us {timed} sdpa, {1e6 * c['grouped_s']:.0f} us grouped)"
            for where, c in choices.items()
        )
        + "."
    )


def decode_attention_line(result: dict[str, Any]) -> str:
    return _attention_line(result.get("decode_attention_choices"), "A decode step's attention", "a layer")


def update_attention_line(result: dict[str, Any]) -> str:
    return _attention_line(
        result.get("update_attention_choices"), "The update's attention", "a layer's forward and backward by"
    )


def rollout_activations_line(result: dict[str, Any]) -> str:
    record = result.get("rollout_activations")
    if not record:
        return ""
    if not record.get("on"):
        return " The update computed every pass (`training.rollout_activations_mb: 0`)."
    replayed, missed = record.get("replayed_rows", 0), record.get("missed_rows", 0)
    prompts = record.get("replayed_prompts")  # absent from runs before prompt passes were replayed
    return (
        f" The update's completion passes took the rollout's recorded linear-layer outputs"
        f" (`training.rollout_activations_mb`, {record.get('max_mb', 0):.0f} MiB) for {replayed} rows"
        f" ({missed} looked for in vain, computed)"
        + (f"; its prompt passes the prefill's, for {prompts} prompts" if prompts is not None else "")
        + (f" ({record['missed_prompts']} looked for in vain)." if "missed_prompts" in record else ".")
    )


def update_kernel_line(result: dict[str, Any]) -> str:
    choices = result.get("update_kernel_choices")
    if not choices:
        return ""
    return (
        " The update's frozen layers (`training.update_kernel: auto`, measured on this machine): "
        + "; ".join(
            ("oneDNN's packed copies" if c["kernel"] == "onednn" else "F.linear")
            + (
                f" ({1e3 * c['onednn_s']:.0f} ms a pass oneDNN, {1e3 * c['f_linear_s']:.0f} ms F.linear)"
                if c.get("f_linear_s")
                else ""
            )
            for c in choices
        )
        + "."
        + update_lora_line(result)
    )


def update_lora_line(result: dict[str, Any]) -> str:
    choices = result.get("update_lora_choices")
    if not choices:
        return ""
    return (
        " Its LoRA products: "
        + "; ".join(
            ("the rank as the rows" if c["rank_rows"] else "peft's")
            + (
                f" ({1e3 * c['rank_rows_s']:.0f} ms a pass, peft's {1e3 * c['peft_s']:.0f} ms)"
                if c.get("peft_s")
                else ""
            )
            for c in choices
        )
        + "."
    )
