"""Generation speed of the vLLM engine in the shape tree rollouts use it.

The vLLM counterpart of ``rollout_speed.py``. A tree rollout step asks, for E live envs, K
candidates per prompt from one LoRA adapter, sampled at temperature 1. This script times that
request three ways and reports generated tokens per second:

* ``engine_n_k``: ``VLLMEngine.generate(prompts, n=K)``, one call; vLLM prefills each prompt once
  and the K samples share its KV-cache blocks (what the rollout does);
* ``engine_k_requests``: K separate ``VLLMEngine.generate(prompts, n=1)`` calls (with prefix
  caching on, later calls still reuse the first call's prefill: ``--no-prefix-caching`` shows the
  cost without it); the prefix cache is emptied before every timed method, so none profits from
  the one before it;
* ``raw_generate``: ``vllm.LLM.generate`` on the E x K prompts as separate requests, no logprobs,
  no chat template or bookkeeping: the engine's raw generation rate for the same tokens.

Then whole ``tree_rollout`` calls (generation + env clones and steps + the tool agents' programs in
the sandbox, for every agent of ``--turns`` turns) are timed in tokens/s, and the generation
calls each one made are replayed straight through ``vllm.LLM.generate`` (same prompts, same ``n``,
same lengths, no logprobs, no rollout around them): ``tree_rollout / raw replay`` is the share of
the engine's raw generation rate that a real rollout keeps (issue 6's target: >= 0.9).

Methods alternate within each repeat; the best repeat of each is reported. Ratios are printed and
written with everything else to ``benchmarks/results/rollout_speed_vllm.json`` (and a PNG). Run it
in the vLLM environment (docs/vllm.md)::

    python benchmarks/rollout_speed_vllm.py            # SmolLM2-135M (embedded), 4 envs x K=4, 32 tokens
    python benchmarks/rollout_speed_vllm.py --quick    # smoke run: 2 envs x K=2, 8 tokens, 1 repeat
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
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

RESULTS = Path(__file__).parent / "results" / "rollout_speed_vllm.json"


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


def cold_cache(engine) -> None:
    """Forget cached prompt prefixes, so no timed method profits from the prefill of the one
    before it (every method and the replay see the same prompts)."""
    engine.llm.reset_prefix_cache()


def time_engine(engine, prompts, k, sampling) -> tuple[float, int]:
    cold_cache(engine)
    start = time.perf_counter()
    results = engine.generate(prompts, [ADAPTER] * len(prompts), k, sampling)
    return time.perf_counter() - start, count_tokens(results)


def time_k_requests(engine, prompts, k, sampling) -> tuple[float, int]:
    from llm_zoo_train.engines.base import SamplingParams

    cold_cache(engine)
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

    from llm_zoo_train.models.chat import encode_prompt

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
    cold_cache(engine)
    start = time.perf_counter()
    outputs = engine.llm.generate(requests, params, lora_request=lora, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outputs)


def time_tree_rollout(engine, env_id, turns, envs, agents, k, sampling, repeat) -> tuple[float, int, list]:
    """One whole tree rollout (generation, env clones and steps, sandbox runs), timed; returns the
    generation calls it made so they can be replayed."""
    from llm_zoo_train.rollout.team_credit import generated_tokens
    from llm_zoo_train.rollout.tree import tree_rollout

    recorder = RecordingEngine(engine)
    cold_cache(engine)
    start = time.perf_counter()
    samples = tree_rollout(
        env_id, {"max_turns": turns}, [1000 * repeat + i for i in range(envs)], recorder,
        dict.fromkeys(agents, ADAPTER), k, sampling, np.random.default_rng(repeat),
    )  # fmt: skip
    seconds = time.perf_counter() - start
    # Every generated token, the team-credit look-ahead's included (the replay replays those calls too).
    return seconds, generated_tokens(samples), recorder.calls


def time_replay(engine, calls) -> tuple[float, int]:
    """The same generation requests straight through ``vllm.LLM.generate``: token-id prompts, one
    request per prompt with ``n`` samples, no logprobs, no detokenizing, no rollout around them."""
    import vllm
    from vllm.inputs import TokensPrompt

    from llm_zoo_train.models.chat import encode_prompt

    prepared = []
    for prompts, adapters, n, sampling in calls:
        requests = [TokensPrompt(prompt_token_ids=encode_prompt(engine.tokenizer, p)) for p in prompts]
        loras = [engine.lora_request(a) for a in adapters]
        params = [
            vllm.SamplingParams(
                n=n,
                max_tokens=sampling.max_tokens,
                temperature=sampling.temperature,
                seed=i,
                detokenize=False,
            )
            for i in range(len(requests))
        ]
        prepared.append((requests, params, loras))
    cold_cache(engine)
    start, tokens = time.perf_counter(), 0
    for requests, params, loras in prepared:
        outputs = engine.llm.generate(requests, params, lora_request=loras, use_tqdm=False)
        tokens += sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return time.perf_counter() - start, tokens


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_rollout_arguments(parser)
    parser.add_argument("--no-prefix-caching", action="store_true", help="turn off vLLM's prefix cache")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV-cache size (GiB)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parse_rollout_args(parser, argv)

    import llm_zoo
    from llm_zoo_train.engines.base import SamplingParams
    from llm_zoo_train.engines.vllm.engine import VLLMEngine
    from llm_zoo_train.models.policy import resolve_model_path

    facts = run_facts(__file__, argv)
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

    agents = llm_zoo.make(args.env).possible_agents
    tree_runs, replay_runs = [], []
    for repeat in range(args.repeats):
        seconds, tokens, calls = time_tree_rollout(
            engine, args.env, args.turns, args.envs, agents, args.k, sampling, repeat
        )
        tree_runs.append(
            {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, "calls": len(calls)}
        )
        replay_seconds, replay_tokens = time_replay(engine, calls)
        replay_runs.append(
            {
                "seconds": replay_seconds,
                "tokens": replay_tokens,
                "tokens_per_s": replay_tokens / replay_seconds,
            }
        )
        print(
            f"repeat {repeat} tree_rollout {tokens:6d} tokens {seconds:7.2f} s {tokens / seconds:8.1f} tok/s; "
            f"raw replay of its {len(calls)} calls {replay_tokens / replay_seconds:8.1f} tok/s"
        )
    tree_best = max(r["tokens_per_s"] for r in tree_runs)
    replay_best = max(r["tokens_per_s"] for r in replay_runs)
    engine.close()
    scratch.cleanup()

    ratios = {f"engine_n_k/{name}": best["engine_n_k"] / best[name] for name in best if name != "engine_n_k"}
    result = {
        "benchmark": "rollout_speed_vllm",
        **facts,
        "model": args.model,
        "dtype": args.dtype,
        "prefix_caching": not args.no_prefix_caching,
        "engine_startup_s": startup_seconds,
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
            "max_turns": args.turns,
            "runs": tree_runs,
            "raw_replay_runs": replay_runs,
            "tokens_per_s_best": tree_best,
            "raw_replay_tokens_per_s_best": replay_best,
            "tokens_per_s_over_raw": tree_best / replay_best,
        },
        "vllm": __import__("vllm").__version__,
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
    finish(result, args.output, lambda png: plot_rollout_speed(result, png, "vLLM engine"))
    return result


if __name__ == "__main__":
    main()
