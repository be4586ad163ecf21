"""Eager against sdpa attention for each phase of a training step, in float32 and bfloat16.

``model.attn_implementation: auto`` (:func:`llm_zoo_train.models.policy.load_base_model`) picks the
attention by device and dtype from these figures. One model per dtype is loaded and switched
between ``eager`` and ``sdpa`` (``set_attn_implementation``); every (dtype, attention) case runs
each phase once per repeat, cases interleaved, so all see the same machine load:

* ``prefill``: one forward over ``--prefill-batch`` rows x ``--prefill-tokens`` tokens (no cache
  kept), as the engine's prompt pass;
* ``decode_short`` / ``decode_long``: ``--decode-steps`` one-token steps of ``--decode-batch`` rows
  on top of a KV cache of ``--short-context`` / ``--long-context`` tokens (random keys and values
  of the model's shapes; the cache is cropped back after each measurement), as ``generate``'s loop;
  every other row is left-padded by ``--pad-fraction`` of the context (masked), as a batch of
  prompts of different lengths is (an all-ones mask lets sdpa skip the mask altogether);
* ``update``: LoRA (r=8, all linear layers) forward + backward of
  :func:`~llm_zoo_train.training.loss.completion_logprobs` over ``--update-groups`` prompts x
  ``--update-rows`` rows each (``--update-prompt`` + ``--update-completion`` tokens), as the
  update's grouped micro-batch.

Reported: seconds per phase (best and mean of the repeats), sdpa / eager per phase, and
``logp_gap``: the largest difference of the update's completion log-probs between the two
attentions (why the engine and the update must use the same one).

    python benchmarks/attention_speed.py --threads 1           # published run (~5 min on 1 core)
    python benchmarks/attention_speed.py --quick --output-dir /tmp/bench   # smoke run, tiny model
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _common import RESULTS_DIR, bar_chart, finish, run_facts

IMPLEMENTATIONS = ("eager", "sdpa")
PHASES = ("prefill", "decode_short", "decode_long", "update")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model alias, hub id or local dir")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prefill-batch", type=int, default=4)
    parser.add_argument("--prefill-tokens", type=int, default=256)
    parser.add_argument("--decode-batch", type=int, default=16)
    parser.add_argument("--decode-steps", type=int, default=4)
    parser.add_argument("--short-context", type=int, default=64)
    parser.add_argument("--long-context", type=int, default=556)
    parser.add_argument("--update-groups", type=int, default=2)
    parser.add_argument("--update-rows", type=int, default=4)
    parser.add_argument("--update-prompt", type=int, default=96)
    parser.add_argument("--update-completion", type=int, default=32)
    parser.add_argument("--pad-fraction", type=float, default=0.25)
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {PHASES}")
    parser.add_argument("--quick", action="store_true", help="tiny random model, small shapes: a smoke run")
    parser.add_argument("--output-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.prefill_tokens, args.long_context, args.update_prompt = 1, 16, 32, 8
        args.decode_steps, args.update_completion = 2, 4
        if args.output_dir is None:
            args.output_dir = Path(tempfile.mkdtemp(prefix="attention_speed-quick-"))
    args.output_dir = args.output_dir or RESULTS_DIR
    return args


def _model_path(args: argparse.Namespace) -> str:
    if args.quick:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from tiny_model import build_tiny_model_dir

        return str(build_tiny_model_dir(Path(tempfile.mkdtemp(prefix="attention-tiny-")) / "model"))
    from llm_zoo_train.models.policy import resolve_model_path

    return resolve_model_path(args.model)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@torch.no_grad()
def _prefill(model: Any, args: argparse.Namespace, vocab: int) -> None:
    ids = torch.randint(3, vocab, (args.prefill_batch, args.prefill_tokens))
    model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, logits_to_keep=1)


def _random_cache(model: Any, batch: int, context: int) -> Any:
    from transformers import DynamicCache

    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache = DynamicCache(config=config)
    for layer in range(config.num_hidden_layers):
        shape = (batch, heads, context, head_dim)
        cache.update(torch.randn(shape, dtype=model.dtype), torch.randn(shape, dtype=model.dtype), layer)
    return cache


@torch.no_grad()
def _decode(model: Any, cache: Any, args: argparse.Namespace, context: int, vocab: int) -> None:
    batch = args.decode_batch
    for step in range(args.decode_steps):
        ids = torch.randint(3, vocab, (batch, 1))
        mask = torch.ones((batch, context + step + 1), dtype=torch.long)
        mask[::2, : int(context * args.pad_fraction)] = 0  # left padding of every other row
        positions = torch.full((batch, 1), context + step, dtype=torch.long)
        model(
            input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
        )
    cache.crop(context)


def _update_batch(args: argparse.Namespace, vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    generator = torch.Generator().manual_seed(0)
    prompts, completions = [], []
    for _ in range(args.update_groups):
        prompt = torch.randint(3, vocab, (args.update_prompt,), generator=generator).tolist()
        for _ in range(args.update_rows):
            prompts.append(prompt)
            completions.append(
                torch.randint(3, vocab, (args.update_completion,), generator=generator).tolist()
            )
    return prompts, completions


def _update(model: Any, prompts: list[list[int]], completions: list[list[int]]) -> torch.Tensor:
    from llm_zoo_train.training.loss import completion_logprobs

    model.zero_grad(set_to_none=True)
    logprobs, mask, _ = completion_logprobs(model, prompts, completions, pad_token_id=0)
    (-(logprobs * mask).sum() / mask.sum()).backward()
    return logprobs.detach()


def run(args: argparse.Namespace) -> dict[str, Any]:
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from llm_zoo_train.config import LoraSettings
    from llm_zoo_train.models.policy import lora_config

    torch.set_num_threads(args.threads)
    path = _model_path(args)
    dtypes = [d for d in args.dtypes.split(",") if d]
    phases = [p for p in PHASES if p in args.phases.split(",")]
    models, caches = {}, {}
    for dtype in dtypes:
        base = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype), attn_implementation="eager"
        )
        base.requires_grad_(False)
        models[dtype] = get_peft_model(base, lora_config(LoraSettings(r=8, lora_alpha=16, lora_dropout=0.0)))
        models[dtype].train()
        caches[dtype] = {
            "decode_short": _random_cache(base, args.decode_batch, args.short_context),
            "decode_long": _random_cache(base, args.decode_batch, args.long_context),
        }
    vocab = int(models[dtypes[0]].config.vocab_size)
    prompts, completions = _update_batch(args, vocab)
    times: dict[str, dict[str, dict[str, list[float]]]] = {
        d: {i: {p: [] for p in phases} for i in IMPLEMENTATIONS} for d in dtypes
    }
    logprobs: dict[str, dict[str, torch.Tensor]] = {d: {} for d in dtypes}
    loads = []
    for repeat in range(args.repeats + 1):  # repeat 0 warms up every case and is not kept
        for dtype in dtypes:
            model = models[dtype]
            for implementation in IMPLEMENTATIONS:
                model.get_base_model().set_attn_implementation(implementation)
                short, long = caches[dtype]["decode_short"], caches[dtype]["decode_long"]
                runs = {
                    "prefill": functools.partial(_prefill, model, args, vocab),
                    "decode_short": functools.partial(_decode, model, short, args, args.short_context, vocab),
                    "decode_long": functools.partial(_decode, model, long, args, args.long_context, vocab),
                }
                figures = {phase: _timed(run) for phase, run in runs.items() if phase in phases}
                if "update" in phases:
                    start = time.perf_counter()
                    logprobs[dtype][implementation] = _update(model, prompts, completions)
                    figures["update"] = time.perf_counter() - start
                loads.append(os.getloadavg()[0])
                line = ", ".join(f"{p} {s:.3f} s" for p, s in figures.items())
                print(f"repeat {repeat} {dtype} {implementation}: {line} (load {loads[-1]:.2f})", flush=True)
                if repeat > 0:
                    for phase, seconds in figures.items():
                        times[dtype][implementation][phase].append(seconds)
    summary: dict[str, Any] = {}
    for dtype in dtypes:
        rows = {}
        for phase in phases:
            best = {i: min(times[dtype][i][phase]) for i in IMPLEMENTATIONS}
            rows[phase] = {
                "eager_best_s": best["eager"],
                "sdpa_best_s": best["sdpa"],
                "eager_mean_s": statistics.fmean(times[dtype]["eager"][phase]),
                "sdpa_mean_s": statistics.fmean(times[dtype]["sdpa"][phase]),
                "sdpa_over_eager": best["sdpa"] / best["eager"],
            }
        gap = (
            float((logprobs[dtype]["eager"] - logprobs[dtype]["sdpa"]).abs().max())
            if logprobs[dtype]
            else None
        )
        summary[dtype] = {"phases": rows, "logp_gap": gap}
    return {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "quick": args.quick,
        "model_path": path if not args.quick else "tiny random Llama (tests/tiny_model.py)",
        "device": "cpu",
        "load_average_during": {"min": min(loads), "max": max(loads)},
        "times_s": times,
        "summary": summary,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parse(argv)
    result = {"benchmark": "attention_speed", **run_facts(__file__, argv), **run(args)}
    for dtype, figures in result["summary"].items():
        for phase, row in figures["phases"].items():
            print(
                f"{dtype:9s} {phase:12s} eager {row['eager_best_s']:.3f} s  sdpa {row['sdpa_best_s']:.3f} s"
                f"  sdpa/eager {row['sdpa_over_eager']:.2f}"
            )
        if figures["logp_gap"] is not None:
            print(f"{dtype:9s} logp gap eager vs sdpa: {figures['logp_gap']:.2e}")

    def plot(png: Path) -> None:
        cases = [(d, p) for d, figures in result["summary"].items() for p in figures["phases"]]
        labels = [f"{d}\n{p}" for d, p in cases]
        ratios = [result["summary"][d]["phases"][p]["sdpa_over_eager"] for d, p in cases]
        bar_chart(png, "sdpa / eager time per phase (below 1: sdpa faster)", labels, {"sdpa/eager": ratios},
                  "time ratio", target=1.0)  # fmt: skip

    finish(result, Path(args.output_dir) / "attention_speed.json", plot)
    return result


if __name__ == "__main__":
    main()
