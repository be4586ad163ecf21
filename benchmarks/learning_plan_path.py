"""Does AT-GRPO teach SmolLM2-135M-Instruct Plan-Path on a CPU? Before/after success, four ways.

Trains SmolLM2-135M-Instruct (the embedded alias ``smollm2-135m-instruct``) with LoRA on small
Plan-Path grids with :class:`llm_zoo_train.trainer.Trainer`, and measures greedy success on the
evaluation tasks (seeds ``eval.seed + i``, never training seeds) before and after training, with
95% Wilson intervals, for:

(a) ``per_agent``: AT-GRPO, tool agent and plan agent, one LoRA adapter each (the config
    ``examples/plan_path_smollm2_learning.yaml`` as is);
(b) ``shared``: the same with one adapter for both agents (``agents.adapters: shared``);
(c) ``single_agent``: the seed paper's baseline, GRPO on the plan agent alone
    (``env.kwargs.agents: [plan_agent]``; one turn, so a tree rollout is plain GRPO);
(d) ``role_swap``: (a)'s trained adapters with the roles swapped (the tool agent's adapter plays
    the plan agent and vice versa), evaluated on the same tasks.

The untrained adapters of (a) and (b) are both exactly the base model (LoRA's B matrices start at
zero), so (b) is not evaluated before training: its "before" is (a)'s.

The env options that make the task learnable by a 135M model (measured, see the issue notes):
``prompt_style: compact`` (short prompts) and ``move_parser: lenient`` (move words are read when
there is no ``#### [...]`` list; an answer without any move still earns the format penalty). The
rewards are the env's own. Everything is written with the settings, the per-step training metrics
and the machine facts to ``OUTPUT_DIR/learning_plan_path.json`` and a learning-curve plot to
``OUTPUT_DIR/learning_plan_path.png``.

    python benchmarks/learning_plan_path.py                                 # the published run
    python benchmarks/learning_plan_path.py --quick --output-dir /tmp/bench  # smoke run, ~1-2 min
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from _common import finish
from _learning import QUIET_LOGGING, parse_learning_args, start_run, with_trainer, workspace

from llm_zoo_train.config import Config, config_to_dict, eval_env_kwargs, load_config
from llm_zoo_train.engines.base import SamplingParams
from llm_zoo_train.evaluation.evaluate import EvalResult, evaluate
from llm_zoo_train.trainer import Trainer

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "examples" / "plan_path_smollm2_learning.yaml"
NAME = "learning_plan_path"

#: Config overrides of each trained variant, on top of CONFIG and the command line's.
VARIANTS: dict[str, list[str]] = {
    "per_agent": ["--agents.adapters", "per_agent"],
    "shared": ["--agents.adapters", "shared"],
    "single_agent": ["--agents.adapters", "per_agent", "--env.kwargs.agents", "[plan_agent]"],
}
SWAP = {"tool_agent": "plan_agent", "plan_agent": "tool_agent"}
LABELS = {
    "per_agent": "(a) per-agent adapters",
    "shared": "(b) shared adapter",
    "single_agent": "(c) single agent (GRPO)",
    "role_swap": "(d) (a) with roles swapped",
}


def eval_record(result: EvalResult | dict[str, float] | None) -> dict[str, Any] | None:
    """An evaluation as plain numbers (from an EvalResult or a trainer history record)."""
    if result is None:
        return None
    if isinstance(result, EvalResult):
        return {
            "success_rate": result.success_rate,
            "successes": result.successes,
            "num_episodes": result.num_episodes,
            "ci_low": result.ci_low,
            "ci_high": result.ci_high,
            "format_ok_rate": result.format_ok_rate,
            "mean_rewards": result.mean_rewards,
        }
    n = int(result["eval/num_episodes"])
    return {
        "success_rate": result["eval/success_rate"],
        "successes": round(result["eval/success_rate"] * n),
        "num_episodes": n,
        "ci_low": result["eval/success_ci_low"],
        "ci_high": result["eval/success_ci_high"],
        "format_ok_rate": result["eval/format_ok_rate"],
        "mean_rewards": {
            key.removeprefix("eval/").removesuffix("/reward"): value
            for key, value in result.items()
            if key.startswith("eval/") and key.endswith("/reward")
        },
    }


def describe(record: dict[str, Any] | None) -> str:
    if record is None:
        return "-"
    return (
        f"{100 * record['success_rate']:.1f}% ({100 * record['ci_low']:.1f}-{100 * record['ci_high']:.1f}, "
        f"{record['successes']}/{record['num_episodes']})"
    )


def run_variant(name: str, overrides: list[str], workdir: Path, *, evaluate_before: bool) -> dict[str, Any]:
    """Train one variant; returns its settings, evaluations, per-step history and wall time."""
    config = load_config(
        CONFIG,
        [
            *overrides,
            *VARIANTS[name],
            "--training.output_dir",
            str(workdir / name),
            "--eval.eval_on_start",
            str(evaluate_before).lower(),
            *QUIET_LOGGING,
        ],
    )
    print(
        f"\n=== {LABELS[name]}: {config.env.id} {config.env.kwargs}, adapters {config.agents.adapters}",
        flush=True,
    )
    start = time.perf_counter()
    return with_trainer(config, lambda trainer: train_variant(name, config, trainer, start))


def train_variant(name: str, config: Config, trainer: Trainer, start: float) -> dict[str, Any]:
    """Train ``trainer``; its evaluations, history and (for ``per_agent``) the role swap."""
    outcome = trainer.train()
    result: dict[str, Any] = {
        "config": config_to_dict(config),
        "agent_adapters": dict(trainer.plan.agent_adapters),
        "before": eval_record(outcome["before"]),
        "after": eval_record(outcome["after"]),
        "history": trainer.history,
    }
    if name == "per_agent":  # (d): the trained adapters, roles swapped, same tasks and sampling
        swapped = {agent: trainer.plan.agent_adapters[other] for agent, other in SWAP.items()}
        settings = config.eval
        sampling = SamplingParams(
            max_tokens=settings.max_completion_length or config.rollout.max_completion_length,
            temperature=settings.temperature,
            seed=config.training.seed,
        )
        seeds = [settings.seed + i for i in range(settings.num_episodes)]
        swap, _ = evaluate(trainer.engine, config.env.id, eval_env_kwargs(config), seeds, swapped, sampling)
        result["role_swap"] = {"agent_adapters": swapped, "after": eval_record(swap)}
        print(f"role swap {swapped}: {swap.describe()}", flush=True)
    result["wall_seconds"] = time.perf_counter() - start
    return result


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = results["variants"]
    figure, (curve, bars) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, run in variants.items():
        steps = [r["step"] for r in run["history"] if "plan_agent/success" in r]
        success = [r["plan_agent/success"] for r in run["history"] if "plan_agent/success" in r]
        (line,) = curve.plot(steps, success, marker=".", label=f"{LABELS[name]}: training samples")
        evals = [(r["step"], r["eval/success_rate"]) for r in run["history"] if "eval/success_rate" in r]
        if name == "shared" and variants.get("per_agent", {}).get("before"):
            evals.insert(0, (0, variants["per_agent"]["before"]["success_rate"]))
        if evals:
            curve.plot(*zip(*evals, strict=True), linestyle="--", marker="s", color=line.get_color(),
                       label=f"{LABELS[name]}: eval (greedy)")  # fmt: skip
    curve.set_xlabel("training step")
    curve.set_ylabel("success rate")
    curve.set_title("Plan agent success: training samples (T=1) and evaluation")
    curve.set_ylim(-0.02, 1.02)
    curve.legend(fontsize=7)

    rows = [(name, run["before"] or variants.get("per_agent", {}).get("before"), run["after"])
            for name, run in variants.items()]  # fmt: skip
    if "per_agent" in variants and variants["per_agent"].get("role_swap"):
        rows.append(
            ("role_swap", variants["per_agent"]["before"], variants["per_agent"]["role_swap"]["after"])
        )
    width = 0.38
    for offset, which, colour in ((-width / 2, 1, "tab:gray"), (width / 2, 2, "tab:blue")):
        values = [row[which]["success_rate"] if row[which] else 0.0 for row in rows]
        low = [v - row[which]["ci_low"] if row[which] else 0.0 for v, row in zip(values, rows, strict=True)]
        high = [row[which]["ci_high"] - v if row[which] else 0.0 for v, row in zip(values, rows, strict=True)]
        positions = [i + offset for i in range(len(rows))]
        label = "before training (untrained adapters)" if which == 1 else "after training"
        bars.bar(positions, values, width, yerr=[low, high], capsize=3, color=colour, label=label)
    bars.set_xticks(range(len(rows)), [LABELS[row[0]] for row in rows], rotation=12, fontsize=8)
    bars.set_ylabel("greedy success rate (95% Wilson CI)")
    bars.set_title(f"Evaluation on {rows[0][2]['num_episodes'] if rows and rows[0][2] else '?'} test tasks")
    bars.set_ylim(0, 1)
    bars.legend(fontsize=8)
    figure.suptitle(f"SmolLM2-135M-Instruct on Plan-Path ({results['settings']['grid']}), CPU")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """Scalar lines for RESULTS.md."""
    variants = results["variants"]
    lines: dict[str, Any] = {"settings": results["settings"]["description"]}
    for name, run in variants.items():
        before = run["before"] or variants.get("per_agent", {}).get("before")
        lines[f"{LABELS[name]}: before"] = describe(before)
        lines[f"{LABELS[name]}: after"] = describe(run["after"])
        if before and run["after"] and before["success_rate"] > 0:
            lines[f"{LABELS[name]}: after / before"] = round(
                run["after"]["success_rate"] / before["success_rate"], 2
            )
        lines[f"{LABELS[name]}: minutes"] = round(run["wall_seconds"] / 60, 1)
    swap = variants.get("per_agent", {}).get("role_swap")
    if swap:
        lines[f"{LABELS['role_swap']}: after"] = describe(swap["after"])
    lines["total minutes"] = round(results["wall_seconds"] / 60, 1)
    return lines


def main(argv: list[str] | None = None) -> None:
    args, names, extra = parse_learning_args(__doc__ or "", list(VARIANTS), argv)
    facts = start_run(args, __file__, argv)

    with workspace(args, "learning_plan_path-", extra) as (workdir, overrides):
        start = time.perf_counter()
        variants = {}
        for name in names:
            before_known = name == "shared" and "per_agent" in variants
            variants[name] = run_variant(name, overrides, workdir, evaluate_before=not before_known)
        wall = time.perf_counter() - start

    config = load_config(CONFIG, overrides)
    kwargs = config.env.kwargs
    grid = f"{kwargs.get('rows')}x{kwargs.get('cols')}, wall_ratio {kwargs.get('wall_ratio')}"
    settings = {
        "config_file": str(CONFIG.relative_to(REPO)),
        "overrides": overrides,
        "threads": torch.get_num_threads(),
        "grid": grid,
        "description": (
            f"{config.model.name_or_path} ({config.model.dtype}), Plan-Path {grid}, max_turns "
            f"{kwargs.get('max_turns')}, {kwargs.get('prompt_style', 'full')} prompts, "
            f"{kwargs.get('move_parser', 'strict')} parser; LoRA r={config.lora.r}; K="
            f"{config.rollout.num_generations}, {config.rollout.envs_per_step} envs/step, "
            f"{config.rollout.max_completion_length} tokens, T={config.rollout.temperature}; lr "
            f"{config.training.learning_rate}, {config.training.max_steps} steps; eval "
            f"{config.eval.num_episodes} tasks, greedy"
        ),
    }
    results = {**facts, "quick": args.quick, "settings": settings, "variants": variants, "wall_seconds": wall}
    results["summary"] = summary(results)
    for key, value in results["summary"].items():
        print(f"{key}: {value}")
    finish(results, args.output_dir / f"{NAME}.json", lambda png: plot(results, png))


if __name__ == "__main__":
    main()
