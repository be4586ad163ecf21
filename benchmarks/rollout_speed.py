"""Generation speed of the transformers engine in the shape tree rollouts use it.

A tree rollout step asks, for E live envs, K candidates per prompt. This script times that same
request (E real env prompts, K samples each, one LoRA adapter active, sampled at temperature 1,
the model's attention as the trainer chooses it: ``model.attn_implementation: auto``, whose
decode-step choice ``decode_attention_choices`` in the JSON records) five ways and reports
generated tokens per second:

* ``engine_n_k``: ``HFEngine.generate(prompts, n=K)``, one call; each prompt is prefilled once and
  its KV cache copied to its K rows (what the rollout does);
* ``engine_n_k_no_share``: the same call with ``share_prefill=False`` (each row prefills);
* ``engine_n_k_exact``: the same call with ``decode_kernel="exact"``: MKL's packed products with
  the bits of unpacked ones, where the default ``"auto"`` may take oneDNN's if it measures faster
  (``decode_kernel_choices`` in the JSON says what it took);
* ``engine_k_requests``: K separate ``HFEngine.generate(prompts, n=1)`` calls;
* ``raw_generate``: plain ``model.generate`` on the E x K left-padded rows, no logprob recording,
  no chat-template or bookkeeping: the ceiling the engine's own overhead is measured against.

Then whole ``tree_rollout`` calls (generation + env clones and steps + the tool agents' programs in
the sandbox, for every agent of ``--turns`` turns) are timed in tokens/s, and the generation calls
each one made are replayed as ``raw_generate`` calls (same prompts, K, lengths):
``tree_rollout / raw replay`` is the share of the raw generation rate a real rollout keeps.

Team credit: the tree rollouts are timed twice per repeat, alternated, with
``team_credit_lookahead`` 0 (immediate global, no look-ahead) and the default (a full round of
teammates, one extra ``n=1`` generation per branch and teammate): ``team_credit_cost`` is the
ratio of their best wall-clock seconds and of the tokens they generated. Token rates count every
generated token, look-ahead included.

Prefix cache: the engine of the first three methods and of the tree rollouts is the trainer's
default one (``rollout.prefix_cache_mb: null``: the per-adapter KV prefix cache on, for a CPU
model). Both tree rollouts are also timed on an engine without the cache (``prefix_cache_mb=0``,
the engine before it), alternated with the cached ones; same seeds,
so the same generation calls (their raw replay is shared). Every timed call starts with an empty
cache (as after an update). ``--skip-engine-methods`` times only the tree rollouts.

Methods alternate within each repeat; the best repeat of each is reported (least disturbed by
other load). Ratios are printed and written with everything else to
``benchmarks/results/rollout_speed.json`` (and a PNG).

    python benchmarks/rollout_speed.py            # SmolLM2-135M (embedded), 4 envs x K=4, 32 tokens
    python benchmarks/rollout_speed.py --quick    # smoke run: 2 envs x K=2, 8 tokens, 1 repeat
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

import numpy as np
import torch
from _common import finish, run_facts
from _rollouts import (
    ADAPTER,
    RecordingEngine,
    add_rollout_arguments,
    count_tokens,
    env_prompts,
    parse_rollout_args,
    plot_rollout_speed,
)
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

import llm_zoo
from llm_zoo_train.engines.base import SamplingParams
from llm_zoo_train.engines.hf.engine import HFEngine, prefix_cache_mb_for
from llm_zoo_train.kernels.attention import decode_attention_choices
from llm_zoo_train.kernels.precision import choose_attention
from llm_zoo_train.models.chat import encode_prompt
from llm_zoo_train.rollout.team_credit import LOOKAHEAD_ROUND, generated_tokens
from llm_zoo_train.rollout.tree import tree_rollout

RESULTS = Path(__file__).parent / "results" / "rollout_speed.json"


def load_model(name: str, dtype: str):
    if os.path.isdir(name):
        path = name
    else:
        from llm_zoo_train.models.policy import resolve_model_path

        path = resolve_model_path(name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    if torch.cuda.is_available():
        model = model.to("cuda")
    # The attention the trainer loads its model with (model.attn_implementation: auto).
    model.set_attn_implementation(choose_attention("auto", model))
    # A LoRA adapter is active during rollouts; its cost belongs in the measurement.
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = get_peft_model(model, lora, adapter_name=ADAPTER).eval()
    return model, tokenizer


def time_engine(engine: HFEngine, prompts, k: int, sampling: SamplingParams) -> tuple[float, int]:
    start = time.perf_counter()
    results = engine.generate(prompts, [ADAPTER] * len(prompts), k, sampling)
    return time.perf_counter() - start, count_tokens(results)


def time_k_requests(engine: HFEngine, prompts, k: int, sampling: SamplingParams) -> tuple[float, int]:
    start, tokens = time.perf_counter(), 0
    for request in range(k):
        seeded = SamplingParams(
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            seed=(sampling.seed or 0) + request,
        )
        tokens += count_tokens(engine.generate(prompts, [ADAPTER] * len(prompts), 1, seeded))
    return time.perf_counter() - start, tokens


def time_raw_generate(model, tokenizer, prompts, k: int, sampling: SamplingParams) -> tuple[float, int]:
    encoded = [encode_prompt(tokenizer, p) for p in prompts for _ in range(k)]
    width = max(len(e) for e in encoded)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    input_ids = torch.full((len(encoded), width), pad, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(encoded):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        mask[row, width - len(ids) :] = 1
    torch.manual_seed(sampling.seed or 0)
    # Greedy calls (the look-ahead's teammates, by default) replay greedily: transformers refuses
    # temperature 0 with sampling.
    randomness = (
        {"do_sample": True, "temperature": sampling.temperature, "top_k": 0, "top_p": 1.0}
        if sampling.temperature > 0
        else {"do_sample": False}
    )
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids.to(device), attention_mask=mask.to(device), **randomness,
            max_new_tokens=sampling.max_tokens, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id,
        )  # fmt: skip
    elapsed = time.perf_counter() - start
    new = out[:, width:].cpu()
    tokens = 0
    for row in new.tolist():
        tokens += row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
    return elapsed, tokens


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_rollout_arguments(parser, model_help="alias, local path or hub id")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--skip-engine-methods", action="store_true", help="time only the tree rollouts")
    args = parse_rollout_args(parser, argv)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    facts = run_facts(__file__, argv)
    model, tokenizer = load_model(args.model, args.dtype)
    prompts = env_prompts(args.env, args.envs)
    prompt_tokens = [len(encode_prompt(tokenizer, p)) for p in prompts]
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=0)
    # The trainer's default engine: the prefix cache on for a CPU model (prefix_cache_mb: null).
    shared = HFEngine(
        model, tokenizer, max_batch_size=args.envs * args.k, prefix_cache_mb=prefix_cache_mb_for(None, model)
    )
    unshared = HFEngine(model, tokenizer, max_batch_size=args.envs * args.k, share_prefill=False)
    exact = HFEngine(
        model,
        tokenizer,
        max_batch_size=args.envs * args.k,
        prefix_cache_mb=prefix_cache_mb_for(None, model),
        decode_kernel="exact",
    )
    uncached = HFEngine(model, tokenizer, max_batch_size=args.envs * args.k, prefix_cache_mb=0)

    def cold(method, engine=shared):
        def timed():
            engine.clear_prefix_cache()  # as after an update: nothing from earlier calls
            return method()

        return timed

    methods = {
        "engine_n_k": cold(lambda: time_engine(shared, prompts, args.k, sampling)),
        "engine_n_k_no_share": lambda: time_engine(unshared, prompts, args.k, sampling),
        "engine_n_k_exact": cold(lambda: time_engine(exact, prompts, args.k, sampling), exact),
        "engine_k_requests": cold(lambda: time_k_requests(shared, prompts, args.k, sampling)),
        "raw_generate": lambda: time_raw_generate(model, tokenizer, prompts, args.k, sampling),
    }
    if args.skip_engine_methods:
        methods = {}
    for engine in (shared, exact):  # warm-up, at the timed row count: "auto" measures its kernels once
        time_engine(engine, prompts, args.k, SamplingParams(max_tokens=2, seed=0))
    runs: dict[str, list[dict]] = {name: [] for name in methods}
    for repeat in range(args.repeats if methods else 0):
        for name, method in methods.items():
            seconds, tokens = method()
            runs[name].append({"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds})
            print(
                f"repeat {repeat} {name:22s} {tokens:6d} tokens {seconds:7.2f} s {tokens / seconds:8.1f} tok/s"
            )
    best = {name: max(r["tokens_per_s"] for r in rs) for name, rs in runs.items()}

    agents = llm_zoo.make(args.env).possible_agents
    lookaheads = {
        "lookahead_0": (0, shared),
        "lookahead_default": (LOOKAHEAD_ROUND, shared),
        "lookahead_0_no_prefix_cache": (0, uncached),
        "lookahead_default_no_prefix_cache": (LOOKAHEAD_ROUND, uncached),
    }
    tree_runs: dict[str, list[dict]] = {name: [] for name in lookaheads}
    replay_runs: dict[str, list[dict]] = {name: [] for name in lookaheads}
    for repeat in range(args.repeats):
        for name, (lookahead, engine) in lookaheads.items():
            shared.clear_prefix_cache()
            hits_before = shared.prefix_cache.hit_tokens if shared.prefix_cache else 0
            prefilled_before = shared.prefix_cache.prefilled_tokens if shared.prefix_cache else 0
            recorder = RecordingEngine(engine)
            cpu_start = time.process_time()
            start = time.perf_counter()
            samples = tree_rollout(
                args.env, {"max_turns": args.turns}, [1000 * repeat + i for i in range(args.envs)], recorder,
                dict.fromkeys(agents, ADAPTER), args.k, sampling, np.random.default_rng(repeat),
                team_credit_lookahead=lookahead,
            )  # fmt: skip
            seconds = time.perf_counter() - start
            cpu_seconds = time.process_time() - cpu_start
            tokens = generated_tokens(samples)
            lookahead_tokens = sum(s.lookahead_tokens for s in samples)
            tree_runs[name].append(
                {
                    "seconds": seconds,
                    "cpu_seconds": cpu_seconds,
                    "tokens": tokens,
                    "lookahead_tokens": lookahead_tokens,
                    "engine_calls": len(recorder.calls),
                    "tokens_per_s": tokens / seconds,
                }
            )
            if engine is shared and shared.prefix_cache is not None:
                hits = shared.prefix_cache.hit_tokens - hits_before
                prefilled = shared.prefix_cache.prefilled_tokens - prefilled_before
                tree_runs[name][-1]["prefix_cache_hit_share"] = hits / max(hits + prefilled, 1)
            if name.endswith("_no_prefix_cache"):
                # Same seeds and prompts as the cached run: the same calls, replayed there.
                twin = replay_runs[name.removesuffix("_no_prefix_cache")][-1]
                replay_runs[name].append(twin)
                print(
                    f"repeat {repeat} tree_rollout {name:33s} {tokens:6d} tokens ({lookahead_tokens} look-ahead) "
                    f"{seconds:7.2f} s ({cpu_seconds:.2f} s CPU) {tokens / seconds:8.1f} tok/s; {len(recorder.calls)} calls"
                )
                continue
            replay_seconds, replay_tokens = 0.0, 0
            for call_prompts, _, n, call_sampling in recorder.calls:
                call_seconds, call_tokens = time_raw_generate(
                    model, tokenizer, call_prompts, n, call_sampling
                )
                replay_seconds, replay_tokens = replay_seconds + call_seconds, replay_tokens + call_tokens
            replay_runs[name].append(
                {
                    "seconds": replay_seconds,
                    "tokens": replay_tokens,
                    "tokens_per_s": replay_tokens / replay_seconds,
                }
            )
            print(
                f"repeat {repeat} tree_rollout {name:17s} {tokens:6d} tokens ({lookahead_tokens} look-ahead) "
                f"{seconds:7.2f} s ({cpu_seconds:.2f} s CPU) {tokens / seconds:8.1f} tok/s; raw replay of its {len(recorder.calls)} calls "
                f"{replay_tokens / replay_seconds:8.1f} tok/s"
            )

    def tree_summary(name: str) -> dict:
        best_rate = max(r["tokens_per_s"] for r in tree_runs[name])
        replay_rate = max(r["tokens_per_s"] for r in replay_runs[name])
        return {
            "max_turns": args.turns,
            "team_credit_lookahead": lookaheads[name][0],
            "runs": tree_runs[name],
            "raw_replay_runs": replay_runs[name],
            "seconds_best": min(r["seconds"] for r in tree_runs[name]),
            "cpu_seconds_best": min(r["cpu_seconds"] for r in tree_runs[name]),
            "tokens_per_s_best": best_rate,
            "raw_replay_tokens_per_s_best": replay_rate,
            "tokens_per_s_over_raw": best_rate / replay_rate,
        }

    tree_default, tree_immediate = tree_summary("lookahead_default"), tree_summary("lookahead_0")
    tree_best, replay_best = tree_default["tokens_per_s_best"], tree_default["raw_replay_tokens_per_s_best"]

    def credit_cost(suffix: str) -> dict:
        default, immediate = f"lookahead_default{suffix}", f"lookahead_0{suffix}"
        return {
            "seconds_ratio": tree_summary(default)["seconds_best"] / tree_summary(immediate)["seconds_best"],
            "cpu_seconds_ratio": tree_summary(default)["cpu_seconds_best"]
            / tree_summary(immediate)["cpu_seconds_best"],
            "generated_tokens_ratio": float(
                np.mean([r["tokens"] for r in tree_runs[default]])
                / np.mean([r["tokens"] for r in tree_runs[immediate]])
            ),
        }

    team_credit_cost = {
        **credit_cost(""),
        "engine_calls": {name: runs[0]["engine_calls"] for name, runs in tree_runs.items()},
    }
    prefix_cache = {
        "mb": shared.prefix_cache.max_bytes / 2**20 if shared.prefix_cache is not None else 0.0,
        "block": shared.prefix_block,
        "team_credit_cost_without": credit_cost("_no_prefix_cache"),
        "tree_rollout_without": tree_summary("lookahead_default_no_prefix_cache"),
        "tree_rollout_lookahead_0_without": tree_summary("lookahead_0_no_prefix_cache"),
        "seconds_with_over_without": {
            name: tree_summary(name)["seconds_best"] / tree_summary(f"{name}_no_prefix_cache")["seconds_best"]
            for name in ("lookahead_default", "lookahead_0")
        },
        "cpu_seconds_with_over_without": {
            name: tree_summary(name)["cpu_seconds_best"]
            / tree_summary(f"{name}_no_prefix_cache")["cpu_seconds_best"]
            for name in ("lookahead_default", "lookahead_0")
        },
    }

    ratios = {f"engine_n_k/{name}": best["engine_n_k"] / best[name] for name in best if name != "engine_n_k"}
    result = {
        "benchmark": "rollout_speed",
        **facts,
        "model": args.model,
        "dtype": args.dtype,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "threads": torch.get_num_threads(),
        "env": args.env,
        "envs": args.envs,
        "k": args.k,
        "max_tokens": args.max_tokens,
        "prompt_tokens_mean": float(np.mean(prompt_tokens)),
        "repeats": args.repeats,
        "tokens_per_s_best": best,
        "ratios": ratios,
        "runs": runs,
        "tree_rollout": tree_default,
        "tree_rollout_lookahead_0": tree_immediate,
        "team_credit_cost": team_credit_cost,
        "prefix_cache": prefix_cache,
        "decode_kernel_choices": [
            dataclasses.asdict(c)
            for c in (shared.packed_weights.choices.values() if shared.packed_weights is not None else ())
        ],
        "decode_attention_choices": decode_attention_choices(),
        "torch": torch.__version__,
        "quick": args.quick,
    }
    print(f"prompts: {args.envs} x K={args.k}, {np.mean(prompt_tokens):.0f} prompt tokens on average")
    for name, value in best.items():
        print(f"best {name:22s} {value:8.1f} tok/s")
    for name, value in ratios.items():
        print(f"ratio {name:40s} {value:5.2f}")
    print(
        f"tree_rollout ({args.turns} turn(s)): {tree_best:.1f} tok/s = {tree_best / replay_best:.2f} x the raw "
        f"replay of the same generation calls ({replay_best:.1f} tok/s)"
    )
    print(
        f"team credit: tree_rollout with the default look-ahead takes {team_credit_cost['seconds_ratio']:.2f} x "
        f"the time of look-ahead 0 ({tree_default['seconds_best']:.2f} s vs {tree_immediate['seconds_best']:.2f} s, "
        f"best repeat) and generates {team_credit_cost['generated_tokens_ratio']:.2f} x the tokens"
    )
    without = prefix_cache["tree_rollout_without"]
    print(
        f"without the prefix cache: tree_rollout {without['tokens_per_s_best']:.1f} tok/s = "
        f"{without['tokens_per_s_over_raw']:.2f} x the raw replay; look-ahead takes "
        f"{prefix_cache['team_credit_cost_without']['seconds_ratio']:.2f} x the time for "
        f"{prefix_cache['team_credit_cost_without']['generated_tokens_ratio']:.2f} x the tokens; "
        "seconds with/without the cache: "
        + ", ".join(f"{k} {v:.2f}" for k, v in prefix_cache["seconds_with_over_without"].items())
    )
    print(
        "CPU seconds of this process (torch on one thread; the machine's load does not inflate them): "
        f"look-ahead costs {team_credit_cost['cpu_seconds_ratio']:.2f} x with the prefix cache, "
        f"{prefix_cache['team_credit_cost_without']['cpu_seconds_ratio']:.2f} x without; with/without the cache: "
        + ", ".join(f"{k} {v:.2f}" for k, v in prefix_cache["cpu_seconds_with_over_without"].items())
    )
    finish(result, args.output, lambda png: plot_rollout_speed(result, png, "transformers engine"))
    return result


if __name__ == "__main__":
    main()
