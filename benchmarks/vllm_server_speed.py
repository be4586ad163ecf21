"""Rollout speed through a vLLM server (the ``vllm_server`` engine) against the colocated vLLM engine.

The same job runs on both engines, which serve the same base model and the same LoRA adapter with
the same vLLM settings: the server engine talks to one ``python -m vllm.entrypoints.openai.api_server``
child process on 127.0.0.1 (HTTP + JSON, token-id prompts, logprobs), the colocated engine calls
``vllm.LLM`` in this process. Two jobs are timed, in generated tokens per second:

* ``generate``: one ``Engine.generate`` call, E prompts x K candidates (``n=K``), as one tree-rollout
  turn asks;
* ``tree_rollout``: whole AT-GRPO tree rollouts (generation + env clones and steps + the tool
  agents' programs in the sandbox, every agent of ``--turns`` turns) with that engine.

Both engines get the same seeds, so they generate the same tokens (checked and recorded). Methods
alternate within each repeat, the prefix caches are emptied before every timed method (the
server's through its dev-mode ``/reset_prefix_cache``), and the best repeat of each is reported.
The ratio ``server / colocated`` is printed (issue 16's target: >= 0.85) and written with
everything else to ``benchmarks/results/vllm_server_speed.json``. Run it in the vLLM environment
(docs/vllm.md)::

    python benchmarks/vllm_server_speed.py            # SmolLM2-135M (embedded), 4 envs x K=4, 32 tokens
    python benchmarks/vllm_server_speed.py --quick    # smoke run: 2 envs x K=2, 8 tokens, 1 repeat
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import bar_chart, finish, run_facts
from _rollouts import ADAPTER, add_rollout_arguments, count_tokens, env_prompts, parse_rollout_args
from rollout_speed_vllm import save_random_adapter

RESULTS = Path(__file__).parent / "results" / "vllm_server_speed.json"


def reset_prefix_cache(engine) -> None:
    """Forget cached prompt prefixes, so no timed method profits from the prefill of the one before."""
    import requests

    from llm_zoo_train.engines.vllm.server import VLLMServerEngine

    if isinstance(engine, VLLMServerEngine):
        for server in engine.servers:
            requests.post(f"{server}/reset_prefix_cache", timeout=60).raise_for_status()
    else:
        engine.llm.reset_prefix_cache()


def time_generate(engine, prompts, k, sampling) -> tuple[float, int, list]:
    reset_prefix_cache(engine)
    start = time.perf_counter()
    rows = engine.generate(prompts, [ADAPTER] * len(prompts), k, sampling)
    return time.perf_counter() - start, count_tokens(rows), [[c.token_ids for c in row] for row in rows]


def time_tree_rollout(engine, env_id, turns, envs, agents, k, sampling, repeat) -> tuple[float, int, list]:
    from llm_zoo_train.rollout.team_credit import generated_tokens
    from llm_zoo_train.rollout.tree import tree_rollout

    reset_prefix_cache(engine)
    start = time.perf_counter()
    samples = tree_rollout(
        env_id, {"max_turns": turns}, [1000 * repeat + i for i in range(envs)], engine,
        dict.fromkeys(agents, ADAPTER), k, sampling, np.random.default_rng(repeat),
    )  # fmt: skip
    seconds = time.perf_counter() - start
    return seconds, generated_tokens(samples), [list(s.completion_token_ids) for s in samples]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_rollout_arguments(
        parser,
        env_help="env of the rollouts and prompts",
        envs_help="E: prompts (live envs) per call",
        repeats=3,
    )
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV-cache size of each engine (GiB)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parse_rollout_args(parser, argv)

    import llm_zoo
    from llm_zoo_train.engines.base import SamplingParams
    from llm_zoo_train.engines.vllm.engine import VLLMEngine
    from llm_zoo_train.engines.vllm.server import VLLMServerEngine
    from llm_zoo_train.engines.vllm.server_launch import LocalVLLMServer
    from llm_zoo_train.models.policy import resolve_model_path

    facts = run_facts(__file__, argv)
    model_path = resolve_model_path(args.model)
    scratch = Path(tempfile.mkdtemp(prefix="vllm_server_speed_"))
    adapter_path = save_random_adapter(model_path, scratch)
    kv_bytes = int(args.kv_cache_gib * 2**30)
    server = LocalVLLMServer(
        model_path,
        dtype=args.dtype,
        max_model_len=4096,
        kv_cache_memory_bytes=kv_bytes,
        max_loras=2,
        env={"VLLM_SERVER_DEV_MODE": "1"},  # for /reset_prefix_cache
        log_path=scratch / "server.log",
    )
    colocated = server_engine = None
    try:
        start = time.perf_counter()
        server.start()
        server_startup = time.perf_counter() - start
        start = time.perf_counter()
        colocated = VLLMEngine(
            model_path,
            {ADAPTER: adapter_path},
            dtype=args.dtype,
            max_model_len=4096,
            kv_cache_memory_bytes=kv_bytes,
        )
        colocated_startup = time.perf_counter() - start
        server_engine = VLLMServerEngine([server.url], colocated.tokenizer, scratch / "served")
        server_engine.load_adapters({ADAPTER: adapter_path}, version=0)
        engines = {"server": server_engine, "colocated": colocated}

        prompts = env_prompts(args.env, args.envs)
        prompt_tokens = [len(colocated.encode(p)) for p in prompts]
        sampling = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=0)
        agents = llm_zoo.make(args.env).possible_agents
        for engine in engines.values():  # warm-up
            engine.generate(prompts[:1], [ADAPTER], 1, SamplingParams(max_tokens=2, seed=0))
        runs: dict[str, dict[str, list[dict]]] = {
            job: {name: [] for name in engines} for job in ("generate", "tree_rollout")
        }
        same_tokens = True
        for repeat in range(args.repeats):
            outputs = {}
            for name, engine in engines.items():
                seconds, tokens, ids = time_generate(engine, prompts, args.k, sampling)
                runs["generate"][name].append(
                    {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}
                )
                outputs[("generate", name)] = ids
                seconds, tokens, ids = time_tree_rollout(
                    engine, args.env, args.turns, args.envs, agents, args.k, sampling, repeat
                )
                runs["tree_rollout"][name].append(
                    {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}
                )
                outputs[("tree_rollout", name)] = ids
            for job in runs:
                same_tokens &= outputs[(job, "server")] == outputs[(job, "colocated")]
                line = ", ".join(
                    f"{name} {runs[job][name][-1]['tokens']} tokens {runs[job][name][-1]['tokens_per_s']:.1f} tok/s"
                    for name in engines
                )
                print(f"repeat {repeat} {job:12s} {line}")
    finally:
        if server_engine is not None:
            server_engine.close()
        server.stop()
        if colocated is not None:
            colocated.close()

    best = {
        job: {name: max(r["tokens_per_s"] for r in rs) for name, rs in by_engine.items()}
        for job, by_engine in runs.items()
    }
    ratios = {job: rates["server"] / rates["colocated"] for job, rates in best.items()}
    result = {
        "benchmark": "vllm_server_speed",
        **facts,
        "model": args.model,
        "dtype": args.dtype,
        "env": args.env,
        "envs": args.envs,
        "k": args.k,
        "max_tokens": args.max_tokens,
        "max_turns": args.turns,
        "prompt_tokens_mean": float(np.mean(prompt_tokens)),
        "repeats": args.repeats,
        "startup_s": {"server": server_startup, "colocated": colocated_startup},
        "same_tokens": same_tokens,
        "tokens_per_s_best": best,
        "server_over_colocated": ratios,
        "target": 0.85,
        "runs": runs,
        "vllm": __import__("vllm").__version__,
        "quick": args.quick,
    }
    print(f"prompts: {args.envs} x K={args.k}, {np.mean(prompt_tokens):.0f} prompt tokens on average")
    for job, rates in best.items():
        print(
            f"{job:12s} server {rates['server']:8.1f} tok/s, colocated {rates['colocated']:8.1f} tok/s: "
            f"ratio server/colocated {ratios[job]:.2f} (target >= 0.85)"
        )
    print(f"both engines generated the same tokens: {same_tokens}")
    finish(
        result,
        args.output,
        lambda png: bar_chart(
            png,
            f"vLLM server vs colocated, {args.model}: {args.envs} envs x K={args.k}, {args.max_tokens} tokens",
            list(best),
            {name: [best[job][name] for job in best] for name in ("server", "colocated")},
            "generated tokens per second (best repeat)",
        ),
    )
    return result


if __name__ == "__main__":
    main()
