"""Do two agents trained together beat one? SmolLM2-135M-Instruct on Math-v0 arithmetic, on a CPU.

Trains SmolLM2-135M-Instruct (alias ``smollm2-135m-instruct``) with LoRA on generated difficulty-1
Math-v0 problems (``examples/math_smollm2_cpu.yaml``: the tool agent writes one printing line of
Python first, the reasoner sees what it printed and answers) and measures greedy success on the
held-out test problems (``eval.env_kwargs.split: test``, never drawn for training) before and after
training, with 95% Wilson intervals, for, all with the same model, steps and evaluation tasks:

(a) ``single_agent``: GRPO on the reasoner alone (``env.kwargs.agents: [reasoner]``), the same
    compact prompt without a tool result;
(b) ``per_agent``: AT-GRPO, one LoRA adapter per agent (the config as is);
(c) ``shared``: AT-GRPO, one adapter for both agents (``agents.adapters: shared``);
(d) ``role_swap``: (b)'s trained adapters with the roles swapped, evaluated only.

Untrained LoRA adapters equal the base model (B starts at zero), so (b) and (c) share one "before".
Besides success, each evaluation records per agent the share of answers the env could read
(format rate), the mean role reward and the share of correct answers: the greedy completions are
recorded and replayed through fresh envs (the envs are deterministic, so each replay sees the
evaluation's prompts). Writes ``OUTPUT_DIR/learning_math.json`` and a PNG (learning curves: the
training success and each adapter's trained samples per step; the before/after bars).

    python benchmarks/learning_math.py                                 # the published run
    python benchmarks/learning_math.py --quick --output-dir /tmp/bench  # smoke run, tiny model
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from _common import finish, parse_learning_args, quick_overrides, run_facts

from llm_zoo_train.config import Config, config_to_dict, eval_env_kwargs, load_config
from llm_zoo_train.engines.base import SamplingParams
from llm_zoo_train.env_play import is_done, make_env
from llm_zoo_train.evaluate import evaluate
from llm_zoo_train.trainer import Trainer

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "examples" / "math_smollm2_cpu.yaml"
NAME = "learning_math"

#: Config overrides of each trained variant, on top of CONFIG and the command line's.
VARIANTS: dict[str, list[str]] = {
    "per_agent": ["--agents.adapters", "per_agent"],
    "single_agent": ["--env.kwargs.agents", "[reasoner]"],
    "shared": ["--agents.adapters", "shared"],
}
SWAP = {"tool_agent": "reasoner", "reasoner": "tool_agent"}
LABELS = {
    "single_agent": "(a) single agent (reasoner alone, GRPO)",
    "per_agent": "(b) AT-GRPO, per-agent adapters",
    "shared": "(c) AT-GRPO, one shared adapter",
    "role_swap": "(d) (b) with roles swapped",
}


class RecordingEngine:
    """Passes generation through to ``engine`` and keeps each ``(prompt, adapter) -> text`` (n=1)."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.texts: dict[tuple[str, str | None], str] = {}

    def generate(self, prompts: Sequence[str], adapters: Sequence[str | None], n: int, sampling: Any) -> Any:
        outputs = self.engine.generate(prompts, adapters, n, sampling)
        for prompt, adapter, group in zip(prompts, adapters, outputs, strict=True):
            self.texts[(prompt, adapter)] = group[0].text
        return outputs


def agent_stats(
    env_id: str,
    env_kwargs: Mapping[str, Any],
    seeds: Sequence[int],
    agent_adapters: Mapping[str, str | None],
    texts: Mapping[tuple[str, str | None], str],
) -> dict[str, dict[str, float]]:
    """Per agent: format rate, mean role reward and share of correct answers, replaying ``texts``."""
    totals: dict[str, dict[str, float]] = {}
    for seed in seeds:
        env = make_env(env_id, env_kwargs, seed, agent_adapters)
        while not is_done(env):
            agent = env.agent_selection
            env.step(texts[(env.observe(agent)["prompt"], agent_adapters[agent])])
            info = env.infos[agent]
            total = totals.setdefault(
                agent, {"actions": 0.0, "format_ok": 0.0, "role_reward": 0.0, "correct": 0.0}
            )
            total["actions"] += 1
            total["format_ok"] += bool(info.get("format_ok"))
            total["role_reward"] += float(info.get("role_reward", 0.0))
            total["correct"] += bool(info.get("correct"))
        env.close()
    return {
        agent: {
            "format_rate": t["format_ok"] / t["actions"],
            "role_reward": t["role_reward"] / t["actions"],
            "correct_rate": t["correct"] / t["actions"],
            "actions": t["actions"],
        }
        for agent, t in totals.items()
    }


def evaluation(trainer: Trainer, config: Config, agent_adapters: Mapping[str, str | None]) -> dict[str, Any]:
    """Greedy success on the evaluation tasks (Wilson 95%) and per-agent figures."""
    settings = config.eval
    sampling = SamplingParams(
        max_tokens=settings.max_completion_length or config.rollout.max_completion_length,
        temperature=0.0 if settings.temperature is None else settings.temperature,
        seed=config.training.seed,
    )
    seeds = [settings.seed + i for i in range(settings.num_episodes)]
    recorder = RecordingEngine(trainer.engine)
    kwargs = eval_env_kwargs(config)
    result, _ = evaluate(recorder, config.env.id, kwargs, seeds, dict(agent_adapters), sampling)
    return {
        "success_rate": result.success_rate,
        "successes": result.successes,
        "num_episodes": result.num_episodes,
        "ci_low": result.ci_low,
        "ci_high": result.ci_high,
        "format_ok_rate": result.format_ok_rate,
        "agents": agent_stats(config.env.id, kwargs, seeds, agent_adapters, recorder.texts),
        "agent_adapters": dict(agent_adapters),
    }


def describe(record: Mapping[str, Any] | None) -> str:
    if record is None:
        return "-"
    agents = "; ".join(
        f"{agent} format {100 * s['format_rate']:.0f}% role {s['role_reward']:+.2f} correct {100 * s['correct_rate']:.0f}%"
        for agent, s in record["agents"].items()
    )
    return (
        f"{100 * record['success_rate']:.1f}% ({100 * record['ci_low']:.1f}-{100 * record['ci_high']:.1f}, "
        f"{record['successes']}/{record['num_episodes']}) [{agents}]"
    )


def run_variant(name: str, overrides: list[str], workdir: Path, *, evaluate_before: bool) -> dict[str, Any]:
    """Train one variant; returns its settings, evaluations, per-step history and wall time."""
    config = load_config(CONFIG, [*overrides, *VARIANTS[name], "--training.output_dir", str(workdir / name)])
    quiet = ["--eval.num_episodes", "0", "--logging.progress_bar", "false", "--logging.plot", "false"]
    train_config = load_config(
        CONFIG, [*overrides, *VARIANTS[name], "--training.output_dir", str(workdir / name), *quiet]
    )
    print(
        f"\n=== {LABELS[name]}: {config.env.id} {config.env.kwargs}, adapters {config.agents.adapters}",
        flush=True,
    )
    start = time.perf_counter()
    trainer = Trainer(train_config)
    adapters = dict(trainer.plan.agent_adapters)
    before = evaluation(trainer, config, adapters) if evaluate_before else None
    print(f"{LABELS[name]} before: {describe(before)}", flush=True)
    trainer.train()
    after = evaluation(trainer, config, adapters)
    print(f"{LABELS[name]} after: {describe(after)}", flush=True)
    result: dict[str, Any] = {
        "config": config_to_dict(config),
        "agent_adapters": adapters,
        "before": before,
        "after": after,
        "history": trainer.history,
    }
    if name == "per_agent":  # (d): the trained adapters, roles swapped, same tasks and sampling
        swapped = {agent: adapters[other] for agent, other in SWAP.items()}
        result["role_swap"] = {"after": evaluation(trainer, config, swapped)}
        print(f"{LABELS['role_swap']}: {describe(result['role_swap']['after'])}", flush=True)
    result["wall_seconds"] = time.perf_counter() - start
    trainer.close()
    del trainer
    gc.collect()
    return result


def rows(results: Mapping[str, Any]) -> list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]]:
    """(variant, before, after) for every evaluated row, (c)'s before taken from (b)."""
    variants = results["variants"]
    shared_before = variants.get("per_agent", {}).get("before")
    table = []
    for name, run in variants.items():
        table.append((name, run["before"] or (shared_before if name == "shared" else None), run["after"]))
        if run.get("role_swap"):
            table.append(("role_swap", run["before"], run["role_swap"]["after"]))
    return table


def plot(results: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (curve, trained, bars) = plt.subplots(1, 3, figsize=(16, 4.5))
    for name, run in results["variants"].items():
        history = [r for r in run["history"] if "train/success_rate" in r]
        curve.plot([r["step"] for r in history], [r["train/success_rate"] for r in history], marker=".",
                   label=LABELS[name])  # fmt: skip
        for adapter in sorted(set(run["agent_adapters"].values())):
            key = f"update/{adapter}/samples"
            trained.plot([r["step"] for r in history], [r.get(key, 0.0) for r in history], marker=".",
                         label=f"{LABELS[name][:3]} {adapter}")  # fmt: skip
    temperatures = sorted({run["config"]["rollout"]["temperature"] for run in results["variants"].values()})
    title = f"Training episodes (T={', '.join(map(str, temperatures))})"
    curve.set(xlabel="training step", ylabel="success rate", title=title, ylim=(-0.02, 1.02))
    curve.legend(fontsize=7)
    trained.set(
        xlabel="training step", ylabel="samples", title="Trained samples per adapter (0: nothing learned)"
    )
    trained.legend(fontsize=7)
    table = rows(results)
    width = 0.38
    for offset, which, colour, label in (
        (-width / 2, 1, "tab:gray", "before"),
        (width / 2, 2, "tab:blue", "after"),
    ):
        values = [row[which]["success_rate"] if row[which] else 0.0 for row in table]
        low = [v - row[which]["ci_low"] if row[which] else 0.0 for v, row in zip(values, table, strict=True)]
        high = [
            row[which]["ci_high"] - v if row[which] else 0.0 for v, row in zip(values, table, strict=True)
        ]
        bars.bar([i + offset for i in range(len(table))], values, width, yerr=[low, high], capsize=3,
                 color=colour, label=label)  # fmt: skip
    bars.set_xticks(range(len(table)), [LABELS[row[0]][:3] for row in table])
    bars.set(ylabel="greedy success (95% Wilson CI)", ylim=(0, 1), title="Held-out test problems")
    bars.legend(fontsize=8)
    figure.suptitle(
        f"SmolLM2-135M-Instruct on Math-v0 (tool agent + reasoner), CPU: {results['settings']['steps']} steps"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def verdict(results: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's target, computed from the figures: (b) after above its own before-interval and
    above (a)'s after-interval; (d) below (b)."""
    variants = results["variants"]
    b, a = variants.get("per_agent"), variants.get("single_agent")
    checks: dict[str, Any] = {}
    if b and b["before"] and b["after"]:
        checks["(b) after above its before-interval"] = b["after"]["success_rate"] > b["before"]["ci_high"]
    if b and a and b["after"] and a["after"]:
        checks["(b) after above (a)'s after-interval"] = b["after"]["success_rate"] > a["after"]["ci_high"]
    if b and b.get("role_swap"):
        checks["(d) below (b)"] = b["role_swap"]["after"]["success_rate"] < b["after"]["success_rate"]
    checks["met"] = len(checks) == 3 and all(checks.values())
    return checks


def main(argv: list[str] | None = None) -> None:
    args, names, extra = parse_learning_args(__doc__ or "", list(VARIANTS), argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning)
    facts = run_facts(__file__, argv)

    with tempfile.TemporaryDirectory(prefix="learning_math-") as tmp:
        workdir = args.workdir or Path(tmp)
        overrides = list(extra)
        if args.quick:
            overrides = [*quick_overrides(Path(tmp)), *overrides]
        start = time.perf_counter()
        variants: dict[str, Any] = {}
        for name in names:
            before_known = name == "shared" and "per_agent" in variants
            variants[name] = run_variant(name, overrides, workdir, evaluate_before=not before_known)
            if name != names[-1]:  # a run cut short still leaves the variants it finished
                publish(facts, args, overrides, variants, time.perf_counter() - start, partial=True)
        publish(facts, args, overrides, variants, time.perf_counter() - start, partial=False)


def publish(
    facts: dict[str, Any], args: argparse.Namespace, overrides: list[str], variants: dict[str, Any],
    wall: float, *, partial: bool,
) -> None:  # fmt: skip
    """Write the JSON and PNG of the variants run so far (``partial``: more are to come)."""
    config = load_config(CONFIG, overrides)
    settings = {
        "config_file": str(CONFIG.relative_to(REPO)),
        "overrides": overrides,
        "threads": torch.get_num_threads(),
        "steps": config.training.max_steps,
        "description": (
            f"{config.model.name_or_path} ({config.model.dtype}), Math-v0 {config.env.kwargs}; LoRA r={config.lora.r};"
            f" K={config.rollout.num_generations}, {config.rollout.envs_per_step} envs/step,"
            f" {config.rollout.max_completion_length} tokens, T={config.rollout.temperature}; lr"
            f" {config.training.learning_rate}, {config.training.max_steps} steps; eval {config.eval.num_episodes}"
            f" test problems {config.eval.env_kwargs}, greedy"
        ),
    }
    results: dict[str, Any] = {**facts, "quick": args.quick, "settings": settings, "variants": variants,
                               "wall_seconds": wall, "partial": partial}  # fmt: skip
    results["verdict"] = verdict(results)
    for name, before, after in rows(results):
        print(f"{LABELS[name]}: before {describe(before)}\n    after {describe(after)}")
    print(f"target: {results['verdict']}; total {wall / 60:.1f} min")
    finish(results, args.output_dir / f"{NAME}.json", lambda png: plot(results, png))


if __name__ == "__main__":
    main()
