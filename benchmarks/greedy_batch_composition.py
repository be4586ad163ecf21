"""Does greedy evaluation depend on which prompts share a batch? SmolLM2-135M-Instruct on Math-v0, CPU.

The transformers engine (:class:`llm_zoo_train.engines.hf.engine.HFEngine`) sorts an evaluation's prompts
by length, cuts them into batches of ``rollout.max_rows_per_generate_call`` rows, left-pads each
batch and drops rows from it as they end. Greedy decoding has no randomness, but a row's logits are
computed by matrix kernels whose rounding can depend on the batch's shape (rows, padded width), so
the same prompt may be answered differently next to other prompts. This benchmark measures how
often that happens.

It evaluates the untrained base model (``examples/math_smollm2_cpu.yaml``: bf16, the team's
compact prompts, 48 tokens, greedy) on the same distinct held-out Math-v0 problems several times,
changing only the batch composition:

* ``natural``: the problems in ``eval_tasks``' order, the config's batch size (the reference);
* ``batch_N`` for every ``--batch-sizes N``: N rows per ``generate`` call (``batch_1``: every
  prompt alone, which no other prompt can influence);
* ``shuffled``: the problems in a shuffled order (ties between prompts of equal length batch
  differently);
* ``natural_again`` (``--repeat``): the reference once more (is one composition repeatable?).

For each composition against ``natural`` it counts the problems whose outcome (success) flips,
the prompts answered by both whose completions differ, and the wall time. Writes
``OUTPUT_DIR/greedy_batch_composition.json``.

    OMP_NUM_THREADS=1 python benchmarks/greedy_batch_composition.py --threads 1 --problems 48
    python benchmarks/greedy_batch_composition.py --quick --output-dir /tmp/bench   # tiny model
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import RESULTS_DIR, bar_chart, finish, parse_with_overrides, quick_overrides, run_facts

from llm_zoo_train.config import eval_env_kwargs, load_config
from llm_zoo_train.engines.hf.engine import HFEngine
from llm_zoo_train.evaluation.evaluate import evaluate
from llm_zoo_train.evaluation.plan import eval_sampling
from llm_zoo_train.evaluation.tasks import eval_tasks
from llm_zoo_train.models.policy import load_base_model

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "examples" / "math_smollm2_cpu.yaml"
NAME = "greedy_batch_composition"


class CompletionLog:
    """Wraps an engine and keeps every prompt's (first) completion text."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.texts: dict[str, str] = {}

    def generate(self, prompts: Sequence[str], adapters: Sequence[str | None], n: int, sampling: Any) -> Any:
        outputs = self.engine.generate(prompts, adapters, n, sampling)
        for prompt, completions in zip(prompts, outputs, strict=True):
            self.texts.setdefault(prompt, completions[0].text)
        return outputs

    def load_adapters(self, paths: Any, version: int) -> None:
        self.engine.load_adapters(paths, version)


def run_composition(
    engine: HFEngine, config: Any, problem_ids: Sequence[str], seeds: Sequence[int], batch_size: int
) -> dict[str, Any]:
    """One greedy evaluation of ``problem_ids`` in this order with ``batch_size`` rows per call."""
    engine.max_batch_size = batch_size
    log = CompletionLog(engine)
    agents = {agent: None for agent in config.env.kwargs.get("agents", ["reasoner", "tool_agent"])}
    start = time.perf_counter()
    result, episodes = evaluate(log, config.env.id, eval_env_kwargs(config), seeds, agents,
                                eval_sampling(config), problem_ids)  # fmt: skip
    return {
        "batch_size": batch_size,
        "wall_seconds": time.perf_counter() - start,
        "successes": result.successes,
        "num_episodes": result.num_episodes,
        "solved": {e.task_id: bool(e.success) for e in episodes},
        "texts": log.texts,
    }


def compare(run: Mapping[str, Any], reference: Mapping[str, Any]) -> dict[str, Any]:
    """Outcome flips and differing completions of ``run`` against ``reference``."""
    flips = sorted(p for p, solved in run["solved"].items() if reference["solved"].get(p) != solved)
    shared = [p for p in run["texts"] if p in reference["texts"]]
    differing = [p for p in shared if run["texts"][p] != reference["texts"][p]]
    return {
        "successes": run["successes"],
        "outcome_flips": len(flips),
        "flipped_problems": flips,
        "gained": sum(run["solved"][p] for p in flips),
        "lost": sum(not run["solved"][p] for p in flips),
        "prompts_compared": len(shared),
        "completions_differing": len(differing),
        "prompts_only_here": len(run["texts"]) - len(shared),
        "wall_seconds": round(run["wall_seconds"], 1),
        "time_ratio_to_reference": round(run["wall_seconds"] / reference["wall_seconds"], 2),
    }


def plot(results: Mapping[str, Any], png: Path) -> None:
    """Outcome flips and differing completions of each composition against the reference."""
    rows = results["comparisons"]
    settings = results["settings"]
    bar_chart(
        png,
        f"Greedy evaluation, {settings['model']}: {settings['problems']} problems, "
        f"reference {settings['reference_batch_size']} rows per call",
        list(rows),
        {
            "outcome flips": [row["outcome_flips"] for row in rows.values()],
            "completions differing": [row["completions_differing"] for row in rows.values()],
        },
        "against the reference composition",
    )


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny random model, 4 problems")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument(
        "--problems", type=int, default=100, help="distinct test problems (default: 100, all)"
    )
    parser.add_argument(
        "--batch-sizes", default="8,1", help="comma-separated rows per call besides the config's"
    )
    parser.add_argument("--shuffle-seed", type=int, default=1)
    parser.add_argument("--repeat", action="store_true", help="also repeat the reference composition")
    args, overrides = parse_with_overrides(parser, argv)
    try:
        args.batch_sizes = [int(part) for part in args.batch_sizes.split(",") if part.strip()]
    except ValueError:
        parser.error(
            f"--batch-sizes must be integers separated by commas, e.g. 8,1; got {args.batch_sizes!r}"
        )
    if any(size < 1 for size in args.batch_sizes) or args.problems < 1:
        parser.error("--batch-sizes and --problems must be >= 1")
    return args, list(overrides)


def main(argv: list[str] | None = None) -> None:
    args, extra = parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning)
    facts = run_facts(__file__, argv)
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"{NAME}-{os.getpid()}"
    problems = 4 if args.quick else args.problems
    overrides = [*(quick_overrides(workdir) if args.quick else []), "--eval.distinct_problems", "true",
                 "--eval.num_episodes", str(problems), *extra]  # fmt: skip
    config = load_config(CONFIG, overrides)
    tasks = eval_tasks(config.env.id, eval_env_kwargs(config), config.eval.num_episodes, config.eval.seed,
                       distinct=True)  # fmt: skip
    assert tasks.problem_ids is not None
    ids, seeds = list(tasks.problem_ids), list(tasks.seeds)
    order = np.random.default_rng(args.shuffle_seed).permutation(len(ids))
    model, tokenizer = load_base_model(config.model, "cpu")
    default = config.rollout.max_rows_per_generate_call
    engine = HFEngine(model, tokenizer, max_batch_size=default, system_prompt=config.model.system_prompt)
    plan: list[tuple[str, list[str], list[int], int]] = [
        ("natural", ids, seeds, default),
        *((f"batch_{size}", ids, seeds, size) for size in args.batch_sizes if size != default),
        ("shuffled", [ids[i] for i in order], [seeds[i] for i in order], default),
        *([("natural_again", ids, seeds, default)] if args.repeat else []),
    ]
    run_composition(engine, config, ids[:2], seeds[:2], default)  # warm-up: the first call is slower
    runs: dict[str, dict[str, Any]] = {}
    for index, (name, problem_ids, episode_seeds, batch_size) in enumerate(plan):
        runs[name] = run_composition(engine, config, problem_ids, episode_seeds, batch_size)
        print(f"{name}: {runs[name]['successes']}/{runs[name]['num_episodes']} solved, "
              f"{runs[name]['wall_seconds']:.1f} s, load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
        if name == "natural":
            continue
        row = compare(runs[name], runs["natural"])
        print(f"{name} vs natural: {row['outcome_flips']} outcome flips (+{row['gained']} -{row['lost']}), "
              f"{row['completions_differing']}/{row['prompts_compared']} shared prompts answered differently, "
              f"{row['prompts_only_here']} prompts only here; time x{row['time_ratio_to_reference']}", flush=True)  # fmt: skip
        settings = {
            "config_file": str(CONFIG.relative_to(REPO)),
            "overrides": overrides,
            "threads": torch.get_num_threads(),
            "model": f"{config.model.name_or_path} ({config.model.dtype})",
            "env_kwargs": eval_env_kwargs(config),
            "problems": len(ids),
            "max_tokens": eval_sampling(config).max_tokens,
            "reference_batch_size": default,
        }
        publish(facts, args, settings, runs, args.output_dir, partial=index < len(plan) - 1)


def publish(
    facts: dict[str, Any], args: argparse.Namespace, settings: dict[str, Any], runs: dict[str, dict[str, Any]],
    output_dir: Path, partial: bool,
) -> None:  # fmt: skip
    """Write the JSON and PNG of the compositions run so far (``partial``: more are to come)."""
    reference = runs["natural"]
    results = {
        **facts,
        "quick": args.quick,
        "partial": partial,
        "settings": settings,
        "reference": {
            "successes": reference["successes"],
            "num_episodes": reference["num_episodes"],
            "wall_seconds": round(reference["wall_seconds"], 1),
        },
        "comparisons": {name: compare(run, reference) for name, run in runs.items() if name != "natural"},
        "runs": {name: {k: v for k, v in run.items() if k != "texts"} for name, run in runs.items()},
    }
    finish(results, output_dir / f"{NAME}.json", lambda png: plot(results, png))


if __name__ == "__main__":
    main()
