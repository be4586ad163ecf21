"""What the rollout speed benchmarks share (``rollout_speed.py``, ``rollout_speed_vllm.py``,
``vllm_server_speed.py``): their common command-line options and ``--quick`` sizes, the prompts
they generate from, the adapter name and token count of a generation, an engine that records its
calls for a raw replay, and the chart of tokens per second.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import bar_chart

#: The name of the LoRA adapter every rollout benchmark generates with.
ADAPTER = "policy"


def add_rollout_arguments(
    parser: argparse.ArgumentParser,
    *,
    model_help: str = "alias or local directory",
    env_help: str = "env whose prompts are used",
    envs_help: str = "E: prompts (live envs) per step",
    repeats: int = 2,
) -> None:
    """``--quick``, ``--model``, ``--dtype``, ``--env``, ``--envs``, ``--k``, ``--max-tokens``,
    ``--repeats`` and ``--turns``, in that order (the help texts and the default repeats are each
    script's own)."""
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 envs x K=2, 8 tokens, 1 repeat")
    parser.add_argument("--model", default="smollm2-135m-instruct", help=model_help)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--env", default="PlanPath-v0", help=env_help)
    parser.add_argument("--envs", type=int, default=4, help=envs_help)
    parser.add_argument("--k", type=int, default=4, help="K: candidates per prompt")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--turns", type=int, default=1, help="max_turns of the timed tree rollouts")


def parse_rollout_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The parsed arguments, shrunk to the ``--quick`` sizes when it is given."""
    args = parser.parse_args(argv)
    if args.quick:
        args.envs, args.k, args.max_tokens, args.repeats = 2, 2, 8, 1
    return args


def env_prompts(env_id: str, count: int) -> list[str]:
    """The first agent's first prompt of ``count`` episodes of ``env_id`` (task seeds 0..count-1)."""
    import llm_zoo

    prompts = []
    for seed in range(count):
        env = llm_zoo.make(env_id)
        env.reset(seed=seed)
        prompts.append(env.observe(env.agent_selection)["prompt"])
    return prompts


def count_tokens(results) -> int:
    """The tokens generated in an engine's ``generate`` results (rows of completions)."""
    return sum(len(c.token_ids) for row in results for c in row)


def plot_rollout_speed(result: dict[str, Any], png: Path, engine: str) -> None:
    """The rollout benchmarks' chart: best tokens/s of every generation path, the whole tree
    rollouts and their raw replay."""
    rates = dict(result["tokens_per_s_best"])
    rates["tree_rollout"] = result["tree_rollout"]["tokens_per_s_best"]
    rates["raw_replay"] = result["tree_rollout"]["raw_replay_tokens_per_s_best"]
    title = (
        f"{engine}, {result['model']}: {result['envs']} envs x K={result['k']}, {result['max_tokens']} tokens"
    )
    bar_chart(
        png,
        title,
        list(rates),
        {"tokens/s (best repeat)": list(rates.values())},
        "generated tokens per second",
    )


class RecordingEngine:
    """Wraps an engine and records every ``generate`` call, so the same requests can be replayed
    on a raw generation path and the rollout's own overhead measured against it."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.calls: list[tuple[list[str], list[str | None], int, Any]] = []

    def generate(self, prompts: Sequence[str], adapters: Sequence[str | None], n: int, sampling: Any) -> Any:
        self.calls.append((list(prompts), list(adapters), n, sampling))
        return self.engine.generate(prompts, adapters, n, sampling)

    def load_adapters(self, paths: Any, version: int) -> None:
        self.engine.load_adapters(paths, version)
