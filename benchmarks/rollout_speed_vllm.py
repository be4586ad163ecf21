"""Generation speed of the vLLM engine in the shape tree rollouts use it.

The vLLM counterpart of ``rollout_speed.py``. A tree rollout step asks, for E live envs, K
candidates per prompt from one LoRA adapter, sampled at temperature 1. This script times that
request three ways and reports generated tokens per second:

* ``engine_n_k``: ``VLLMEngine.generate(prompts, n=K)``, one call; vLLM prefills each prompt once
  and the K samples share its KV-cache blocks (what the rollout does);
* ``engine_k_requests``: K separate ``VLLMEngine.generate(prompts, n=1)`` calls (with prefix
  caching on, later calls still reuse the first call's prefill: ``--no-prefix-caching`` shows the
  cost without it);
* ``raw_generate``: ``vllm.LLM.generate`` on the E x K prompts as separate requests, no logprobs,
  no chat template or bookkeeping: the engine's raw generation rate for the same tokens.

Then one whole ``tree_rollout`` (engine calls + env clones and steps) is timed in tokens/s.
Methods alternate within each repeat; the best repeat of each is reported. Ratios
``engine_n_k / other`` are printed and written with everything else to
``benchmarks/results/rollout_speed_vllm.json``. Run it in the vLLM environment (docs/vllm.md)::

    python benchmarks/rollout_speed_vllm.py            # SmolLM2-135M (embedded), 4 envs x K=4, 32 tokens
    python benchmarks/rollout_speed_vllm.py --quick    # smoke run: 2 envs x K=2, 8 tokens, 1 repeat
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results" / "rollout_speed_vllm.json"
ADAPTER = "policy"


def save_random_adapter(model_path: str, directory: Path) -> str:
    """A rank-8 LoRA on the attention projections with small random weights (a fresh LoRA is the
    identity; random weights make the adapter's cost and its effect on the text real)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = get_peft_model(model, lora, adapter_name=ADAPTER)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.01)
    model.save_pretrained(directory)
    return str(directory / ADAPTER)


def env_prompts(env_id: str, count: int) -> list[str]:
    import llm_zoo

    prompts = []
    for seed in range(count):
        env = llm_zoo.make(env_id)
        env.reset(seed=seed)
        prompts.append(env.observe(env.agent_selection)["prompt"])
    return prompts


def count_tokens(results) -> int:
    return sum(len(c.token_ids) for row in results for c in row)


def time_engine(engine, prompts, k, sampling) -> tuple[float, int]:
    start = time.perf_counter()
    results = engine.generate(prompts, [ADAPTER] * len(prompts), k, sampling)
    return time.perf_counter() - start, count_tokens(results)


def time_k_requests(engine, prompts, k, sampling) -> tuple[float, int]:
    from llm_zoo_train.engines.base import SamplingParams

    start, tokens = time.perf_counter(), 0
    for request in range(k):
        seeded = SamplingParams(
            max_tokens=sampling.max_tokens, temperature=sampling.temperature, seed=request
        )
        tokens += count_tokens(engine.generate(prompts, [ADAPTER] * len(prompts), 1, seeded))
    return time.perf_counter() - start, tokens


def time_raw_generate(engine, prompts, k, sampling) -> tuple[float, int]:
    import vllm
    from vllm.inputs import TokensPrompt

    from llm_zoo_train.chat import encode_prompt

    requests = [
        TokensPrompt(prompt_token_ids=encode_prompt(engine.tokenizer, p)) for p in prompts for _ in range(k)
    ]
    lora = engine.lora_request(ADAPTER)
    params = [
        vllm.SamplingParams(
            max_tokens=sampling.max_tokens, temperature=sampling.temperature, seed=i, detokenize=False
        )
        for i in range(len(requests))
    ]
    start = time.perf_counter()
    outputs = engine.llm.generate(requests, params, lora_request=lora, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outputs)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 envs x K=2, 8 tokens, 1 repeat")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="alias or local directory")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--env", default="PlanPath-v0", help="env whose prompts are used")
    parser.add_argument("--envs", type=int, default=4, help="E: prompts (live envs) per step")
    parser.add_argument("--k", type=int, default=4, help="K: candidates per prompt")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-prefix-caching", action="store_true", help="turn off vLLM's prefix cache")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV-cache size (GiB)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.envs, args.k, args.max_tokens, args.repeats = 2, 2, 8, 1

    import llm_zoo
    from llm_zoo_train.engines.base import SamplingParams
    from llm_zoo_train.engines.vllm import VLLMEngine
    from llm_zoo_train.policy import resolve_model_path
    from llm_zoo_train.rollout import tree_rollout

    load_before = os.getloadavg()[0]
    model_path = resolve_model_path(args.model)
    scratch = tempfile.TemporaryDirectory(prefix="rollout_speed_vllm_")
    adapter_path = save_random_adapter(model_path, Path(scratch.name))
    start = time.perf_counter()
    engine = VLLMEngine(
        model_path,
        {ADAPTER: adapter_path},
        dtype=args.dtype,
        max_model_len=4096,
        kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30),
        enable_prefix_caching=not args.no_prefix_caching,
    )
    startup_seconds = time.perf_counter() - start
    prompts = env_prompts(args.env, args.envs)
    prompt_tokens = [len(engine.encode(p)) for p in prompts]
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=0)

    methods = {
        "engine_n_k": lambda: time_engine(engine, prompts, args.k, sampling),
        "engine_k_requests": lambda: time_k_requests(engine, prompts, args.k, sampling),
        "raw_generate": lambda: time_raw_generate(engine, prompts, args.k, sampling),
    }
    time_engine(engine, prompts[:1], 1, SamplingParams(max_tokens=2, seed=0))  # warm-up
    runs: dict[str, list[dict]] = {name: [] for name in methods}
    for repeat in range(args.repeats):
        for name, method in methods.items():
            seconds, tokens = method()
            runs[name].append({"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds})
            print(
                f"repeat {repeat} {name:22s} {tokens:6d} tokens {seconds:7.2f} s {tokens / seconds:8.1f} tok/s"
            )
    best = {name: max(r["tokens_per_s"] for r in rs) for name, rs in runs.items()}

    start = time.perf_counter()
    agents = llm_zoo.make(args.env).possible_agents
    samples = tree_rollout(
        args.env, {"max_turns": 1}, list(range(args.envs)), engine, dict.fromkeys(agents, ADAPTER),
        args.k, sampling, np.random.default_rng(0),
    )  # fmt: skip
    rollout_seconds = time.perf_counter() - start
    rollout_tokens = sum(len(s.completion_token_ids) for s in samples)
    engine.close()
    scratch.cleanup()

    ratios = {f"engine_n_k/{name}": best["engine_n_k"] / best[name] for name in best if name != "engine_n_k"}
    result = {
        "benchmark": "rollout_speed_vllm",
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "model": args.model,
        "dtype": args.dtype,
        "prefix_caching": not args.no_prefix_caching,
        "engine_startup_s": startup_seconds,
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
        "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs".strip(),
        "env": args.env,
        "envs": args.envs,
        "k": args.k,
        "max_tokens": args.max_tokens,
        "prompt_tokens_mean": float(np.mean(prompt_tokens)),
        "repeats": args.repeats,
        "tokens_per_s_best": best,
        "ratios": ratios,
        "runs": runs,
        "tree_rollout": {
            "max_turns": 1,
            "samples": len(samples),
            "tokens": rollout_tokens,
            "seconds": rollout_seconds,
            "tokens_per_s": rollout_tokens / rollout_seconds,
            "tokens_per_s_over_raw": rollout_tokens / rollout_seconds / best["raw_generate"],
        },
        "vllm": __import__("vllm").__version__,
        "quick": args.quick,
    }
    print(f"prompts: {args.envs} x K={args.k}, {np.mean(prompt_tokens):.0f} prompt tokens on average")
    for name, value in best.items():
        print(f"best {name:22s} {value:8.1f} tok/s")
    for name, value in ratios.items():
        print(f"ratio {name:40s} {value:5.2f}")
    tree = result["tree_rollout"]
    print(
        f"tree_rollout (1 turn, {len(samples)} samples): {tree['tokens_per_s']:.1f} tok/s "
        f"= {tree['tokens_per_s_over_raw']:.2f} x raw"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    main()
