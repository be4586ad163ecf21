"""Do two agents trained together beat the best single agent? SmolLM2-135M-Instruct on Math-v0, CPU.

Trains SmolLM2-135M-Instruct (alias ``smollm2-135m-instruct``) with LoRA on generated difficulty-1
Math-v0 problems (``examples/math_smollm2_cpu.yaml``: the tool agent writes one printing line of
Python first, the reasoner sees what it printed and answers) and measures greedy success on
**distinct** held-out test problems (``eval.distinct_problems``: all 100 level-1 test problems,
each once, deduplicated by content and never drawn for training) before and after training, for
every variant and every training seed of ``--seeds``, with the same model, steps and problems:

* ``per_agent``: AT-GRPO, one LoRA adapter per agent, default team credit (the config as is);
* ``shared``: AT-GRPO, one adapter for both agents;
* ``lookahead_0``: ``per_agent`` without team credit (``rollout.team_credit_lookahead 0``);
* ``tool_alone``: GRPO on the tool agent alone (``env.kwargs.agents [tool_agent]``): its program's
  printed answer is scored - the strongest single agent with the same tools, the fair baseline;
* ``reasoner_alone``: GRPO on the reasoner alone, without a tool (the old baseline: Python against
  no Python, kept for reference);
* ``role_swap``: ``per_agent``'s trained adapters with the roles swapped, evaluated only.

Untrained LoRA adapters equal the base model (B starts at zero), so the "before" of each env
(team, tool alone, reasoner alone) is evaluated once. Every evaluation records which problems were
solved, so variants are compared **paired**, problem by problem, pooled over the seeds: the exact
McNemar test (:mod:`llm_zoo_train.evaluation.paired`). Other team-credit choices run as overrides, e.g.
``--variants per_agent --rollout.team_credit_samples 4``. Writes ``OUTPUT_DIR/learning_math.json``
and a PNG.

``--task plan_path`` and ``--task sokoban`` run it on the grid puzzles
(``examples/plan_path_smollm2_learning.yaml``, ``examples/sokoban_smollm2_learning.yaml``), whose
single-agent variant is ``plan_alone``: the plan agent alone, the seed paper's GRPO baseline (the
tool agent cannot play alone). Their boards are seeded, so every variant plays the same
``eval.num_episodes`` boards and the pairs match board by board. Results go to
``learning_team_plan_path.json`` and ``learning_team_sokoban.json``.

``--task key_relay`` runs it on KeyRelay-v0 (``examples/key_relay_smollm2_cpu.yaml``), the split
task only a team can solve, with every fair control: ``separate`` (each role trained with its
partner frozen at the base model, then the two adapters evaluated together: the roles trained
apart), ``independent`` (the team trained by independent GRPO: no tree, no team credit),
``asker_alone`` / ``holder_alone`` (the partner silent), ``oracle`` (one agent that sees both the
table and the key) and the role swap. Every run records the tokens it generated and the samples
it trained (``history``), so budgets compare.

``--task relay`` runs the same comparison on MathRelay-v0 (``examples/math_relay_smollm2_cpu.yaml``),
where the team must cooperate: the tool agent sees the problem but not the reasoner's key, the
reasoner the key but not the problem, so each agent alone is at chance (1 in 9, and the commonest
answer's 4%). Its results go to ``learning_math_relay.json``. On either task the single-agent bar
is the better of the two agents alone.

    python benchmarks/learning_math.py --threads 1 --seeds 0,1          # the full comparison
    python benchmarks/learning_math.py --task relay --threads 1 --seeds 0,1
    python benchmarks/learning_math.py --task plan_path --variants per_agent,plan_alone --seeds 0,1,2
    python benchmarks/learning_math.py --quick --output-dir /tmp/bench   # smoke run, tiny model

Seeds can run apart (two processes, two machines) and be pooled afterwards: ``--merge`` reads their
JSON files, checks that they ran the same task, settings and "before" evaluations, and writes the
pooled comparison as if one run had trained every seed.

    python benchmarks/learning_math.py --threads 1 --seeds 0 --output-dir /tmp/s0 &
    python benchmarks/learning_math.py --threads 1 --seeds 1 --output-dir /tmp/s1
    python benchmarks/learning_math.py --merge /tmp/s0/learning_math.json /tmp/s1/learning_math.json

``PATH:VARIANT,VARIANT`` takes only those variants of a file, e.g. to rerun one variant after a
change that cannot touch the others (``per_agent`` brings its ``role_swap``, a single agent its
majority@K row). Every seed of a
variant must have run the same config; the merged file records which variants came from which
run and commit.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from _common import finish
from _learning import QUIET_LOGGING, parse_learning_args, start_run, with_trainer, workspace

from llm_zoo_train.config import Config, config_to_dict, eval_env_kwargs, load_config
from llm_zoo_train.engines.base import Engine
from llm_zoo_train.evaluation.evaluate import evaluate, wilson_interval
from llm_zoo_train.evaluation.majority import evaluate_majority
from llm_zoo_train.evaluation.paired import paired_comparison
from llm_zoo_train.evaluation.plan import eval_sampling, local_engine
from llm_zoo_train.evaluation.tasks import eval_tasks
from llm_zoo_train.trainer import Trainer

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "examples" / "math_smollm2_cpu.yaml"
NAME = "learning_math"


@dataclass(frozen=True)
class Task:
    """One ``--task``: what it trains and how its variants are made.

    Attributes:
        config: The team's config (variant ``per_agent`` as is).
        result_name: The results' file name (``OUTPUT_DIR/{result_name}.json``).
        swap: The role swap: which agent's trained adapter plays each agent.
        singles: The single-agent variants this task has (each an env that seats one agent).
        eval_overrides: How every variant is evaluated (the same tasks for all, so pairs match).
        controls: Team controls this task offers besides the role swap: ``separate`` (each role
            trained with its partner frozen at the base model, the two adapters then evaluated
            together), ``independent`` (the team with independent GRPO episodes: no tree, no
            look-ahead credit).
        majority: Single-agent variants also scored by majority@K at the team's sample budget: K
            the team's model calls per episode over the single agent's
            (:mod:`llm_zoo_train.evaluation.majority`); the row is ``{variant}_majority``.
    """

    config: Path
    result_name: str
    swap: dict[str, str]
    singles: tuple[str, ...]
    eval_overrides: tuple[str, ...]
    controls: tuple[str, ...] = ()
    majority: Mapping[str, int] = field(default_factory=dict)

    @property
    def variants(self) -> list[str]:
        return ["per_agent", "shared", "lookahead_0", *self.controls, *self.singles]


#: Math tasks evaluate all level-1 test problems once (100, fewer than 1000: all of them).
_DISTINCT_PROBLEMS = ("--eval.distinct_problems", "true", "--eval.num_episodes", "1000")
_MATH_SWAP = {"tool_agent": "reasoner", "reasoner": "tool_agent"}
_GRID_SWAP = {"tool_agent": "plan_agent", "plan_agent": "tool_agent"}
#: ``--task``: the config and the results' name. The grid tasks' boards are seeded (no finite
#: list): every variant plays the config's ``eval.num_episodes`` boards of seeds ``eval.seed + i``.
TASKS = {
    # The team makes two model calls a turn (tool agent, reasoner), one agent alone one.
    "math": Task(CONFIG, NAME, _MATH_SWAP, ("tool_alone", "reasoner_alone"), _DISTINCT_PROBLEMS,
                 controls=("separate",), majority={"tool_alone": 2}),
    "relay": Task(REPO / "examples" / "math_relay_smollm2_cpu.yaml", "learning_math_relay", _MATH_SWAP,
                  ("tool_alone", "reasoner_alone"), _DISTINCT_PROBLEMS),
    "plan_path": Task(REPO / "examples" / "plan_path_smollm2_learning.yaml", "learning_team_plan_path",
                      _GRID_SWAP, ("plan_alone",), ()),
    "sokoban": Task(REPO / "examples" / "sokoban_smollm2_learning.yaml", "learning_team_sokoban", _GRID_SWAP,
                    ("plan_alone",), ()),
    "key_relay": Task(REPO / "examples" / "key_relay_smollm2_cpu.yaml", "learning_team_key_relay",
                      {"asker": "holder", "holder": "asker"}, ("asker_alone", "holder_alone", "oracle"), (),
                      controls=("separate", "independent"),
                      majority={"oracle": 3, "holder_alone": 3}),  # team: ask, reply, answer; these: one call
}  # fmt: skip

#: Config overrides of each trained variant, on top of CONFIG and the command line's.
VARIANTS: dict[str, list[str]] = {
    "per_agent": ["--agents.adapters", "per_agent"],
    "shared": ["--agents.adapters", "shared"],
    "lookahead_0": ["--agents.adapters", "per_agent", "--rollout.team_credit_lookahead", "0"],
    "tool_alone": ["--env.kwargs.agents", "[tool_agent]"],
    "reasoner_alone": ["--env.kwargs.agents", "[reasoner]"],
    "plan_alone": ["--env.kwargs.agents", "[plan_agent]"],
    "asker_alone": ["--env.kwargs.agents", "[asker]"],
    "holder_alone": ["--env.kwargs.agents", "[holder]"],
    "oracle": ["--env.kwargs.agents", "[oracle]"],
    "separate": ["--agents.adapters", "per_agent"],  # trained twice, each time with the other role frozen
    "independent": ["--agents.adapters", "per_agent", "--rollout.mode", "independent",
                    "--rollout.team_credit_lookahead", "0"],
}  # fmt: skip
LABELS = {
    "per_agent": "team, per-agent adapters (AT-GRPO)",
    "shared": "team, one shared adapter",
    "lookahead_0": "team, per-agent, look-ahead 0",
    "tool_alone": "tool agent alone (GRPO, same tools)",
    "reasoner_alone": "reasoner alone, no tool (GRPO)",
    "plan_alone": "plan agent alone (GRPO, the paper's single-agent baseline)",
    "asker_alone": "asker alone, holder silent (GRPO)",
    "holder_alone": "holder alone, asker silent (GRPO)",
    "oracle": "oracle single agent: sees table and key (GRPO)",
    "separate": "roles trained apart (partner frozen), then combined",
    "independent": "team, independent GRPO (no tree, no team credit)",
    "role_swap": "per-agent adapters, roles swapped",
}
#: A single agent at the team's sample count: ``{single}_majority`` (:attr:`Task.majority`).
MAJORITY = {
    f"{single}_majority": (single, k) for task in TASKS.values() for single, k in task.majority.items()
}
LABELS.update({name: f"{LABELS[single].split(' (')[0]}, majority@{k} of its samples (the team's calls)"
               for name, (single, k) in MAJORITY.items()})  # fmt: skip
#: Bar labels of the plot: the table's labels without their parenthesis.
SHORT_LABELS = {variant: label.split(" (")[0].split(":")[0] for variant, label in LABELS.items()}
SHORT_LABELS.update(
    {name: f"{SHORT_LABELS[single].split(',')[0]}, majority@{k}" for name, (single, k) in MAJORITY.items()}
)
#: The env each variant plays, for its "before" (untrained adapters equal the base model).
BEFORE = {"per_agent": "team", "shared": "team", "lookahead_0": "team", "role_swap": "team",
          "tool_alone": "tool_alone", "reasoner_alone": "reasoner_alone", "plan_alone": "plan_alone",
          "asker_alone": "asker_alone", "holder_alone": "holder_alone", "oracle": "oracle", "separate": "team",
          "independent": "team", **{name: name for name in MAJORITY}}  # fmt: skip
# A majority@K row has no "before" of its own (its before is its single agent's, greedy).
#: Paired comparisons reported (A, B), when both ran.
COMPARISONS = [
    ("per_agent", "tool_alone"), ("per_agent", "lookahead_0"), ("per_agent", "shared"),
    ("per_agent", "role_swap"), ("role_swap", "tool_alone"), ("lookahead_0", "tool_alone"),
    ("shared", "tool_alone"), ("tool_alone", "reasoner_alone"), ("per_agent", "reasoner_alone"),
    ("role_swap", "reasoner_alone"), ("per_agent", "plan_alone"), ("shared", "plan_alone"),
    ("lookahead_0", "plan_alone"), ("role_swap", "plan_alone"), ("per_agent", "separate"),
    ("per_agent", "independent"), ("per_agent", "asker_alone"), ("per_agent", "holder_alone"),
    ("per_agent", "oracle"), ("separate", "oracle"), ("role_swap", "separate"),
    *(pair for name, (single, _) in MAJORITY.items() for pair in (("per_agent", name), (name, single))),
]  # fmt: skip
#: The single-agent variants, the strongest of which is the bar the team must clear.
SINGLES = ("tool_alone", "reasoner_alone", "plan_alone", "asker_alone", "holder_alone", "oracle")
#: Single agents that see every part of a split task (KeyRelay's table and key in one head): the
#: ceiling the team is read against, not a bar it must clear.
CEILINGS = ("oracle",)


def evaluation(
    trainer: Trainer | Engine, config: Config, agent_adapters: Mapping[str, str | None], majority: int = 1
) -> dict[str, Any]:
    """Greedy success on the evaluation tasks (a trainer's engine, or an engine), per task and in
    all (Wilson 95%); with ``majority`` K > 1, majority@K at the rollout's temperature instead."""
    engine = trainer.engine if isinstance(trainer, Trainer) else trainer
    settings = config.eval
    kwargs = eval_env_kwargs(config)
    tasks = eval_tasks(config.env.id, kwargs, settings.num_episodes, settings.seed,
                       distinct=settings.distinct_problems)  # fmt: skip
    sampling = eval_sampling(config)
    if majority > 1:
        sampling = replace(sampling, temperature=config.rollout.temperature)
        result, episodes, _ = evaluate_majority(engine, config.env.id, kwargs, tasks.seeds, dict(agent_adapters),
                                                sampling, majority, tasks.problem_ids)  # fmt: skip
    else:
        result, episodes = evaluate(engine, config.env.id, kwargs, tasks.seeds, dict(agent_adapters), sampling,
                                    tasks.problem_ids)  # fmt: skip
    return {
        "success_rate": result.success_rate,
        "successes": result.successes,
        "num_episodes": result.num_episodes,
        "distinct_problems": result.distinct_tasks,
        "ci_low": result.ci_low,
        "ci_high": result.ci_high,
        "format_ok_rate": result.format_ok_rate,
        "mean_role_rewards": result.mean_role_rewards,
        "solved": {e.task_id: bool(e.success) for e in episodes},
        "agent_adapters": dict(agent_adapters),
    }


def describe(record: Mapping[str, Any] | None) -> str:
    if record is None:
        return "-"
    return (
        f"{100 * record['success_rate']:.1f}% ({100 * record['ci_low']:.1f}-{100 * record['ci_high']:.1f}, "
        f"{record['successes']}/{record['num_episodes']}, {record['distinct_problems']} distinct)"
    )


def run_variant(
    name: str,
    seed: int,
    overrides: list[str],
    workdir: Path,
    befores: dict[str, Any],
    task: Task = TASKS["math"],
) -> dict[str, dict[str, Any]]:
    """Train one variant with one seed; returns its run (and the role swap's, for per_agent)."""
    if name == "separate":
        return {name: run_separate(seed, overrides, workdir, task)}
    run_dir = workdir / f"{name}-seed{seed}"
    common = [
        *overrides,
        *VARIANTS[name],
        "--training.seed",
        str(seed),
        "--training.output_dir",
        str(run_dir),
    ]
    config_file = task.config
    config = load_config(config_file, common)
    quiet = ["--eval.num_episodes", "0", *QUIET_LOGGING]  # evaluated here, on the pairs' tasks
    print(
        f"\n=== {LABELS[name]}, seed {seed}: {config.env.kwargs}, adapters {config.agents.adapters}",
        flush=True,
    )
    start = time.perf_counter()
    return with_trainer(
        load_config(config_file, [*common, *quiet]),
        lambda trainer: train_variant(name, seed, config, trainer, befores, task, start),
    )


def train_variant(
    name: str, seed: int, config: Config, trainer: Trainer, befores: dict[str, Any], task: Task, start: float
) -> dict[str, dict[str, Any]]:
    """Evaluate the untrained adapters (once per env), train, evaluate; the role swap and
    majority@K rows of the same adapters where the variant has them."""
    adapters = dict(trainer.plan.agent_adapters)
    if BEFORE[name] not in befores:
        befores[BEFORE[name]] = evaluation(trainer, config, adapters)
        print(f"before ({BEFORE[name]}): {describe(befores[BEFORE[name]])}", flush=True)
    trainer.train()
    after = evaluation(trainer, config, adapters)
    print(f"{LABELS[name]}, seed {seed}, after: {describe(after)}", flush=True)
    runs = {name: {"seed": seed, "config": config_to_dict(config), "agent_adapters": adapters, "after": after,
                   "history": trainer.history}}  # fmt: skip
    if name in task.majority:  # the same adapters at the team's sample count
        k, label = task.majority[name], f"{name}_majority"
        runs[label] = {"seed": seed, "agent_adapters": adapters, "majority_k": k,
                       "after": evaluation(trainer, config, adapters, majority=k)}  # fmt: skip
        print(f"{LABELS[label]}, seed {seed}: {describe(runs[label]['after'])}", flush=True)
    if name == "per_agent":  # the trained adapters, roles swapped, same problems and sampling
        swapped = {agent: adapters[other] for agent, other in task.swap.items()}
        runs["role_swap"] = {
            "seed": seed,
            "agent_adapters": swapped,
            "after": evaluation(trainer, config, swapped),
        }
        print(f"{LABELS['role_swap']}, seed {seed}: {describe(runs['role_swap']['after'])}", flush=True)
    runs[name]["wall_seconds"] = time.perf_counter() - start
    return runs


def run_separate(seed: int, overrides: list[str], workdir: Path, task: Task) -> dict[str, Any]:
    """The roles trained apart, then combined: each agent's adapter trained with its partner frozen
    at the base model (``agents.frozen``), the two trained adapters then evaluated together on the
    team's tasks. Costs two training runs; each trains one adapter."""
    start = time.perf_counter()
    adapters: dict[str, Path] = {}
    histories: dict[str, Any] = {}
    config = None
    for agent, partner in task.swap.items():
        run_dir = workdir / f"separate-{agent}-seed{seed}"
        common = [*overrides, *VARIANTS["separate"], "--agents.frozen", f"[{partner}]", "--training.seed", str(seed),
                  "--training.output_dir", str(run_dir)]  # fmt: skip
        config = load_config(task.config, common)
        quiet = ["--eval.num_episodes", "0", *QUIET_LOGGING]
        print(f"\n=== {LABELS['separate']}, seed {seed}: training {agent}, {partner} frozen", flush=True)
        histories[agent] = with_trainer(load_config(task.config, [*common, *quiet]), train_history)
        adapters[agent] = run_dir / "adapters" / agent
    assert config is not None
    engine = local_engine(config, adapters)
    try:
        after = evaluation(engine, config, {agent: agent for agent in adapters})
    finally:
        close = getattr(engine, "close", None)
        if callable(close):
            close()
    print(f"{LABELS['separate']}, seed {seed}, after: {describe(after)}", flush=True)
    return {"seed": seed, "config": config_to_dict(config), "agent_adapters": {a: str(p) for a, p in adapters.items()},
            "after": after, "history": [], "histories": histories, "wall_seconds": time.perf_counter() - start}  # fmt: skip


def train_history(trainer: Trainer) -> list[dict[str, Any]]:
    """Train; the per-step history."""
    trainer.train()
    return trainer.history


def pooled(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Success over every run's problems (Wilson 95% over the pooled episodes) and per seed."""
    successes = sum(r["after"]["successes"] for r in runs)
    episodes = sum(r["after"]["num_episodes"] for r in runs)
    low, high = wilson_interval(successes, episodes)
    rates = [r["after"]["success_rate"] for r in runs]
    return {"successes": successes, "episodes": episodes, "success_rate": successes / episodes if episodes else 0.0,
            "ci_low": low, "ci_high": high, "per_seed": rates, "seeds": [r["seed"] for r in runs]}  # fmt: skip


def summarize(variants: Mapping[str, list[dict[str, Any]]], befores: Mapping[str, Any]) -> dict[str, Any]:
    """Pooled success per variant, paired comparisons (after vs after; after vs before) and the verdict."""
    table = {name: pooled(runs) for name, runs in variants.items() if runs}
    comparisons = {}
    for a, b in COMPARISONS:
        runs_a, runs_b = variants.get(a, []), variants.get(b, [])
        by_seed_a = {r["seed"]: r["after"]["solved"] for r in runs_a}
        by_seed_b = {r["seed"]: r["after"]["solved"] for r in runs_b}
        seeds = [seed for seed in by_seed_a if seed in by_seed_b]
        if seeds:
            result = paired_comparison([by_seed_a[s] for s in seeds], [by_seed_b[s] for s in seeds])
            comparisons[f"{a} vs {b}"] = result.to_dict()
            comparisons[f"{a} vs {b}"]["per_seed"] = [  # a seed where one side fails shows here
                {"seed": s, **paired_comparison([by_seed_a[s]], [by_seed_b[s]]).to_dict()} for s in seeds
            ]
    for name, runs in variants.items():
        before = befores.get(BEFORE[name])
        if runs and before:
            result = paired_comparison([r["after"]["solved"] for r in runs], [before["solved"]] * len(runs))
            comparisons[f"{name} after vs before"] = result.to_dict()
    return {"table": table, "comparisons": comparisons, "verdict": verdict(table, comparisons)}


def verdict(table: Mapping[str, Any], comparisons: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's targets from the figures: the per-agent team above the best single agent's
    interval (the best single agent that ran, :data:`CEILINGS` apart; and significantly so, paired,
    also against its majority@K at the team's samples when that ran), no seed's team significantly
    below that single agent and the pool not below it, the role swap below that single agent and
    below the team, the default team credit not below look-ahead 0, and the team above the roles
    trained apart."""
    checks: dict[str, Any] = {}
    singles = [name for name in SINGLES if table.get(name) and name not in CEILINGS]
    best = max(singles, key=lambda name: table[name]["success_rate"]) if singles else None
    team = table.get("per_agent")
    if team and best:
        single = table[best]
        checks["best single agent"] = best
        checks["team above the best single agent's interval"] = team["success_rate"] > single["ci_high"]
        paired = comparisons[f"per_agent vs {best}"]
        checks["team better than the best single agent, paired p < 0.05"] = (
            paired["only_a"] > paired["only_b"] and paired["p_value"] < 0.05
        )
        # Stability (issue #49): no training seed's team significantly worse, the pool not below.
        seeds = paired.get("per_seed", [])
        checks["no seed's team below the best single agent, paired p < 0.05"] = not any(
            s["only_b"] > s["only_a"] and s["p_value"] < 0.05 for s in seeds
        )
        checks["team pooled not below the best single agent"] = team["success_rate"] >= single["success_rate"]
    if team and best and table.get(f"{best}_majority"):
        paired = comparisons[f"per_agent vs {best}_majority"]
        checks[
            "team better than the best single agent at the team's samples (majority@K), paired p < 0.05"
        ] = paired["only_a"] > paired["only_b"] and paired["p_value"] < 0.05
    if table.get("role_swap") and best:
        checks["role swap below the best single agent"] = (
            table["role_swap"]["success_rate"] < table[best]["success_rate"]
        )
    if table.get("role_swap") and team:
        checks["role swap below the team"] = table["role_swap"]["success_rate"] < team["success_rate"]
    if team and table.get("lookahead_0"):
        checks["team credit not below look-ahead 0"] = (
            team["success_rate"] >= table["lookahead_0"]["success_rate"]
        )
    if team and table.get("separate"):
        paired = comparisons["per_agent vs separate"]
        checks["team better than the roles trained apart, paired p < 0.05"] = (
            paired["only_a"] > paired["only_b"] and paired["p_value"] < 0.05
        )
    targets = [value for key, value in checks.items() if key != "best single agent"]
    checks["met"] = bool(targets) and all(targets)
    return checks


def plot(results: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (curve, bars) = plt.subplots(1, 2, figsize=(14, 4.5))
    for name, runs in results["variants"].items():
        for run in runs:
            history = [r for r in run.get("history", []) if "train/success_rate" in r]
            if not history:  # evaluations of trained adapters (role swap, majority@K) and separate runs
                continue
            curve.plot([r["step"] for r in history], [r["train/success_rate"] for r in history], marker=".",
                       label=f"{LABELS[name]} s{run['seed']}")  # fmt: skip
    curve.set(
        xlabel="training step", ylabel="training success", title="Training episodes", ylim=(-0.02, 1.02)
    )
    curve.legend(fontsize=6)
    names = sorted(results["summary"]["table"], key=list(LABELS).index)
    for offset, colour, label in ((-0.2, "tab:gray", "before"), (0.2, "tab:blue", "after (pooled seeds)")):
        values, low, high = [], [], []
        for name in names:
            row = (
                results["befores"].get(BEFORE[name])
                if label == "before"
                else results["summary"]["table"][name]
            )
            value = row["success_rate"] if row else 0.0
            values.append(value)
            low.append(value - row["ci_low"] if row else 0.0)
            high.append(row["ci_high"] - value if row else 0.0)
        bars.bar([i + offset for i in range(len(names))], values, 0.4, yerr=[low, high], capsize=3, color=colour,
                 label=label)  # fmt: skip
    bars.set_xticks(range(len(names)), [SHORT_LABELS[n] for n in names], rotation=20, fontsize=7)
    tasks = results["settings"].get("eval_tasks", "distinct held-out test problems")
    bars.set(
        ylabel="greedy success (95% Wilson CI)",
        ylim=(0, 1),
        title=tasks[0].upper() + tasks[1:].split(" (")[0],
    )
    bars.legend(fontsize=8)
    env_id = results["settings"].get("env_id", "Math-v0")
    figure.suptitle(f"SmolLM2-135M-Instruct on {env_id}, CPU: {results['settings']['steps']} steps")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    tasks = argparse.ArgumentParser(add_help=False)
    tasks.add_argument("--task", choices=sorted(TASKS), default="math")
    tasks.add_argument("--merge", nargs="+", default=None)
    known, rest = tasks.parse_known_args(argv)
    task = TASKS[known.task]
    args, names, extra = parse_learning_args(__doc__ or "", task.variants, rest, seeds=True)
    if known.merge:
        try:
            sources = [merge_source(arg) for arg in known.merge]
            merged = merge_results([json.loads(path.read_text()) for path, _ in sources],
                                   [taken for _, taken in sources])  # fmt: skip
        except (OSError, ValueError) as error:
            raise SystemExit(f"learning_math.py --merge: {error}") from None
        merged["merged_from"] = list(known.merge)
        finish(merged, args.output_dir / f"{merged['result_name']}.json", lambda png: plot(merged, png))
        return
    facts = start_run(args, __file__, argv)
    with workspace(args, "learning_math-", extra, task.eval_overrides) as (workdir, overrides):
        start = time.perf_counter()
        variants: dict[str, list[dict[str, Any]]] = {}
        befores: dict[str, Any] = {}
        jobs = [(seed, name) for seed in args.seeds for name in names]  # seed-major: a cut run is balanced
        for index, (seed, variant) in enumerate(jobs):
            for label, run in run_variant(variant, seed, overrides, workdir, befores, task).items():
                variants.setdefault(label, []).append(run)
            partial = index < len(jobs) - 1
            publish(facts, args.quick, args.seeds, overrides, variants, befores, time.perf_counter() - start, partial,
                    args.output_dir, task.config, task.result_name)  # fmt: skip


def eval_wording(config: Mapping[str, Any]) -> tuple[str, str]:
    """How a run's evaluation tasks are described (``settings["eval_tasks"]``) and the end of its
    description, from its recorded config: distinct problems of a finite set, or seeded tasks."""
    evaluation = config.get("eval", {})
    if evaluation.get("distinct_problems"):
        return (
            "distinct held-out test problems (each once)",
            f" distinct test problems {evaluation.get('env_kwargs')}, greedy",
        )
    count, seed = evaluation.get("num_episodes"), evaluation.get("seed", 0)
    return (
        "the same seeded evaluation tasks for every variant (never training seeds)",
        f" the same {count} seeded tasks for every variant (seeds {seed}+i, never training seeds), greedy",
    )


def publish(
    facts: dict[str, Any], quick: bool, seeds: list[int], overrides: list[str], variants: dict[str, Any],
    befores: dict[str, Any], wall: float, partial: bool, output_dir: Path, config_file: Path = CONFIG,
    result_name: str = NAME,
) -> None:  # fmt: skip
    """Write the JSON and PNG of the runs so far (``partial``: more are to come)."""
    config = load_config(config_file, overrides)
    eval_tasks_text, eval_ending = eval_wording(config_to_dict(config))
    settings = {
        "config_file": str(config_file.relative_to(REPO)),
        "env_id": config.env.id,
        "overrides": overrides,
        "threads": torch.get_num_threads(),
        "steps": config.training.max_steps,
        "eval_tasks": eval_tasks_text,
        "seeds": seeds,
        "description": (
            f"{config.model.name_or_path} ({config.model.dtype}), {config.env.id} {config.env.kwargs}; LoRA r={config.lora.r};"
            f" K={config.rollout.num_generations}, {config.rollout.envs_per_step} envs/step,"
            f" {config.rollout.max_completion_length} tokens, T={config.rollout.temperature}; lr"
            f" {config.training.learning_rate}, {config.training.max_steps} steps; training seeds {seeds}; eval:"
            + eval_ending
        ),
    }
    summary = summarize(variants, befores)
    results: dict[str, Any] = {**facts, "quick": quick, "settings": settings, "labels": LABELS, "before_of": BEFORE,
                               "befores": befores, "result_name": result_name,
                               "variants": variants, "summary": summary, "wall_seconds": wall, "partial": partial}  # fmt: skip
    print_summary(summary, befores, wall)
    finish(results, output_dir / f"{result_name}.json", lambda png: plot(results, png))


def print_summary(summary: Mapping[str, Any], befores: Mapping[str, Any], wall: float) -> None:
    for name, row in summary["table"].items():
        before = befores.get(BEFORE[name])
        print(f"{LABELS[name]}: before {describe(before)}; after {100 * row['success_rate']:.1f}% "
              f"({100 * row['ci_low']:.1f}-{100 * row['ci_high']:.1f}, {row['successes']}/{row['episodes']}; "
              f"per seed {[round(100 * r, 1) for r in row['per_seed']]})")  # fmt: skip
    for pair, result in summary["comparisons"].items():
        print(
            f"  {pair}: only A {result['only_a']}, only B {result['only_b']}, McNemar p={result['p_value']:.3g}"
        )
    print(f"target: {summary['verdict']}; total {wall / 60:.1f} min")


#: What the variants are called and which "before" each has: where two results both name a
#: variant they must agree (a later version of this script names more variants).
NAMED_IN_EVERY_PART = ("labels", "before_of")


#: Run entries of a variant that may differ between its seeds: the seed and where the run was written.
PER_SEED_CONFIG = {"training": ("seed", "output_dir")}


def merge_source(arg: str) -> tuple[Path, set[str] | None]:
    """``PATH`` (every variant of the file) or ``PATH:VARIANT,VARIANT`` (only those)."""
    path, colon, names = arg.rpartition(":")
    if not colon or not names or "/" in names or not path:
        return Path(arg), None
    taken = {n.strip() for n in names.split(",") if n.strip()}
    unknown = sorted(taken - set(VARIANTS))
    if unknown:
        raise ValueError(f"{arg}: unknown variants {unknown}; variants: {', '.join(VARIANTS)}")
    return Path(path), taken


def run_config(run: Mapping[str, Any]) -> dict[str, Any] | None:
    """A run's recorded config without what differs between seeds (None: not recorded).

    A field a run's version did not have yet is filled in at today's default, so a run recorded
    before a field was added pools with later ones that left it at its default (and not with one
    that changed it)."""
    config = run.get("config")
    if config is None:
        return None
    config = {
        section: dict(values) if isinstance(values, dict) else values for section, values in config.items()
    }
    for section, defaults in default_config().items():
        if isinstance(defaults, dict) and isinstance(config.get(section), dict):
            for key, value in defaults.items():
                config[section].setdefault(key, value)
    for section, keys in PER_SEED_CONFIG.items():
        for key in keys:
            config.get(section, {}).pop(key, None)
    return config


def default_config() -> dict[str, Any]:
    """Every config field at its default, as runs record their configs."""
    from llm_zoo_train.config import Config

    return config_to_dict(Config())


def merge_results(
    parts: Sequence[Mapping[str, Any]], taken: Sequence[set[str] | None] | None = None
) -> dict[str, Any]:
    """Pool the results of runs that trained other seeds (or other variants) of the same comparison.

    The runs must agree on the task, settings apart from the seeds, and every "before" evaluation
    (the base model on the same problems: identical under the same settings), no seed may be
    trained twice for one variant, and every seed of a variant must have run the same config apart
    from its seed (this catches a default that changed between the runs' commits). ``taken[i]``
    keeps only those variants of ``parts[i]`` (``per_agent`` brings its ``role_swap``); ``None``
    keeps all. Raises ValueError naming the first disagreement.
    """
    if len(parts) < 2:
        raise ValueError("give at least two result files to merge")
    taken = list(taken) if taken is not None else [None] * len(parts)
    if len(taken) != len(parts):
        raise ValueError("give one variant selection per result")
    first = parts[0]
    for index, part in enumerate(parts[1:], start=2):
        if part.get("partial"):
            raise ValueError(f"result {index} is partial (its run was cut); rerun it or leave it out")
        if part.get("quick") != first.get("quick"):
            raise ValueError(f"result {index} differs from result 1 in 'quick'")
        for key in NAMED_IN_EVERY_PART:  # later versions name more variants; the shared names must agree
            ours, theirs = part.get(key) or {}, first.get(key) or {}
            if any(ours[name] != theirs[name] for name in ours.keys() & theirs.keys()):
                raise ValueError(f"result {index} differs from result 1 in {key!r}")
        ours = {k: v for k, v in part["settings"].items() if k not in ("seeds", "description", "eval_tasks")}
        theirs = {
            k: v for k, v in first["settings"].items() if k not in ("seeds", "description", "eval_tasks")
        }
        if ours != theirs:
            changed = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
            raise ValueError(f"result {index} has other settings than result 1: {changed}")
    if first.get("partial"):
        raise ValueError("result 1 is partial (its run was cut); rerun it or leave it out")
    variants: dict[str, list[dict[str, Any]]] = {}
    befores: dict[str, Any] = {}
    kept: list[list[str]] = []
    for index, (part, selection) in enumerate(zip(parts, taken, strict=True), start=1):
        for env_name, before in part["befores"].items():
            if env_name in befores and befores[env_name]["solved"] != before["solved"]:
                raise ValueError(f"result {index}'s 'before' of {env_name} differs: not the same evaluation")
            befores.setdefault(env_name, before)
        if selection is not None:
            missing = sorted(selection - set(part["variants"]))
            if missing:
                raise ValueError(f"result {index} has no {missing}; it has {sorted(part['variants'])}")
            selection = selection | ({"role_swap"} if "per_agent" in selection else set())
            selection = selection | {f"{name}_majority" for name in selection} & set(MAJORITY)
        kept.append(sorted(v for v in part["variants"] if selection is None or v in selection))
        for variant in kept[-1]:
            known = {run["seed"] for run in variants.get(variant, [])}
            for run in part["variants"][variant]:
                if run["seed"] in known:
                    raise ValueError(f"seed {run['seed']} of {variant} is in more than one result")
                recorded = (run_config(other) for other in variants.get(variant, []))
                earlier = next((config for config in recorded if config is not None), None)
                ours = run_config(run)
                if ours is not None and earlier is not None and earlier != ours:
                    changed = sorted(k for k in ours.keys() | earlier.keys() if ours.get(k) != earlier.get(k))
                    raise ValueError(
                        f"seed {run['seed']} of {variant} (result {index}) ran another config than its other "
                        f"seeds, in {changed}: not the same variant"
                    )
                variants.setdefault(variant, []).append(run)
    seeds = sorted({run["seed"] for runs in variants.values() for run in runs})
    names = {str(task.config.relative_to(REPO)): task.result_name for task in TASKS.values()}
    if first["settings"]["config_file"] not in names:
        raise ValueError(f"unknown config {first['settings']['config_file']!r}; known: {sorted(names)}")
    settings = dict(first["settings"], seeds=seeds)
    settings["description"] = settings["description"].replace(
        f"training seeds {first['settings']['seeds']}", f"training seeds {seeds}"
    )
    recorded = next((run["config"] for runs in variants.values() for run in runs if run.get("config")), None)
    if recorded is not None:  # parts written before the evaluation wording existed are described as run
        settings["eval_tasks"], ending = eval_wording(recorded)
        head, marker, _ = settings["description"].rpartition("; eval:")
        settings["description"] = f"{head}{marker}{ending}" if marker else settings["description"]
    wall = sum(part["wall_seconds"] for part in parts)
    summary = summarize(variants, befores)
    print_summary(summary, befores, wall)
    commands = " ; ".join(part.get("command", "?") for part in parts)
    names_of = {
        key: {k: v for part in parts for k, v in (part.get(key) or {}).items()} for key in NAMED_IN_EVERY_PART
    }
    return {**first, **names_of, "command": commands, "settings": settings, "befores": befores, "variants": variants,
            "summary": summary, "wall_seconds": wall, "partial": False,
            "result_name": names[first["settings"]["config_file"]],
            "parts": [{**{key: part.get(key) for key in ("command", "created", "machine", "git_commit", "wall_seconds")},
                       "variants": names_kept} for part, names_kept in zip(parts, kept, strict=True)]}  # fmt: skip


if __name__ == "__main__":
    main()
