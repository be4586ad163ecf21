"""How often does team credit disagree with what a candidate itself caused? SmolLM2-135M, CPU.

On Math-v0 (``examples/math_smollm2_cpu.yaml``: the tool agent acts first, the reasoner sees its
printed answer) the tool agent's candidates are credited with the reasoner's correctness after
the look-ahead. What the candidate itself caused is its program's own correctness
(``info["correct"]``). This script samples the tool agent's K candidates for the training tasks of
the first ``--steps`` steps (the trainer's task seeds and sampling seeds), applies each to its own
clone, and credits the *same* branches under every rule of ``--credits``:

* ``immediate`` - look-ahead 0 (the tool acts first, so every candidate's global is 0: no signal);
* ``sampled:M`` - the reasoner's next answer sampled ``M`` times per branch, averaged (``sampled:1``
  was the default team credit until the default became greedy teammates);
* ``greedy`` - the reasoner's greedy answer.

It counts, per rule (:func:`llm_zoo_train.rollout.team_credit.credit_disagreements`): failed programs
credited (credited >= 0.5), correct programs not credited, sibling pairs (one right, one wrong
program) ordered wrongly or tied, and groups where an advantage's global part has the wrong sign;
and the look-ahead's generation time. Untrained adapters equal the base model, so the base model
plays (``--adapters DIR`` loads a run's saved adapters instead). No training happens.

``--config`` measures another env's tool agent the same way. On Plan-Path
(``examples/plan_path_smollm2_learning.yaml``) the tool agent's program prints moves that run on a
copy of the grid; what it caused is whether those moves solve the grid (``info["moves_solve"]``),
and its credit is whether the plan agent's next moves solve the real one. There a credited failed
program is a plan agent that solved the grid without the program's help.

    python benchmarks/team_credit_disagreement.py --steps 2 --threads 1
    python benchmarks/team_credit_disagreement.py --config examples/plan_path_smollm2_learning.yaml --steps 8
    python benchmarks/team_credit_disagreement.py --quick --output /tmp/disagree.json  # tiny model
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import bar_chart, measurement_main

import llm_zoo
from llm_zoo_train.config import load_config, train_env_kwargs
from llm_zoo_train.engines.base import SamplingParams
from llm_zoo_train.evaluation.plan import local_engine, saved_adapters
from llm_zoo_train.rollout.env_play import generate_checked, seeded_sampling
from llm_zoo_train.rollout.team_credit import LOOKAHEAD_ROUND, credit_disagreements, run_lookahead
from llm_zoo_train.runs.seeding import Stream, derive_seed

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "examples" / "math_smollm2_cpu.yaml"
NAME = "team_credit_disagreement"
#: The first agent's ``info`` key saying whether its candidate itself solved the task, per env.
OWN_KEYS = {"Math-v0": "correct", "PlanPath-v0": "moves_solve", "Sokoban-v0": "moves_solve"}


def parse_credit(rule: str) -> tuple[str, int, str]:
    """``immediate`` / ``greedy`` / ``sampled:M`` -> ``(rule, samples, teammate)``."""
    name, _, count = rule.partition(":")
    if name == "immediate" and not count:
        return rule, 0, "sampled"
    if name == "greedy" and not count:
        return rule, 1, "greedy"
    if name == "sampled" and count.isdigit() and int(count) >= 1:
        return rule, int(count), "sampled"
    raise SystemExit(f"unknown credit rule {rule!r}; rules: immediate, greedy, sampled:M (M >= 1)")


def measure(args: argparse.Namespace, overrides: list[str]) -> dict[str, Any]:
    config = load_config(args.config, overrides)
    own_key = args.own_key or OWN_KEYS.get(config.env.id)
    if own_key is None:
        raise SystemExit(
            f"no known own-correctness key for {config.env.id}; give --own-key (known: {OWN_KEYS})"
        )
    rules = [parse_credit(rule) for rule in args.credits.split(",") if rule]
    rollout = config.rollout
    adapters = saved_adapters(Path(args.adapters)) if args.adapters else {}
    engine = local_engine(config, adapters)
    kwargs = train_env_kwargs(config)
    groups: dict[str, list[list[tuple[float, float]]]] = {rule: [] for rule, _, _ in rules}
    seconds = dict.fromkeys(groups, 0.0)
    tokens = dict.fromkeys(groups, 0)
    candidate_seconds, own_correct, candidates = 0.0, 0, 0
    for step in range(1, args.steps + 1):
        task_rng = np.random.default_rng(derive_seed(config.training.seed, step, 0, Stream.TASKS))
        seeds = task_rng.integers(0, 2**30, size=rollout.envs_per_step).tolist()
        envs = [llm_zoo.make(config.env.id, **kwargs) for _ in seeds]
        for env, seed in zip(envs, seeds, strict=True):
            env.reset(seed=int(seed))
        agent_adapters = {a: (a if a in adapters else None) for a in envs[0].possible_agents}
        agent = envs[0].agent_selection
        sampling = SamplingParams(
            max_tokens=rollout.max_completion_length, temperature=rollout.temperature,
            top_p=rollout.top_p, top_k=rollout.top_k,
            seed=derive_seed(config.training.seed, step, 0, Stream.SAMPLING),
        )  # fmt: skip
        prompts = [env.observe(agent)["prompt"] for env in envs]
        start = time.perf_counter()
        outputs = generate_checked(
            engine, prompts, [agent_adapters[agent]] * len(envs), rollout.num_generations,
            seeded_sampling(sampling, 0),
        )  # fmt: skip
        candidate_seconds += time.perf_counter() - start
        branches, own = [], []
        for env, completions in zip(envs, outputs, strict=True):
            clones = [env.clone() for _ in completions]
            for clone, completion in zip(clones, completions, strict=True):
                clone.step(completion.text)
                info = clone.infos[agent]
                branches.append((clone, agent, float(info.get("global_reward", 0.0))))
                own.append(float(bool(info.get(own_key))))
        own_correct += int(sum(own))
        candidates += len(own)
        k = rollout.num_generations
        for rule, samples, teammate in rules:
            start = time.perf_counter()
            if samples == 0:
                credited = [immediate for _, _, immediate in branches]
            else:
                looks = run_lookahead(
                    branches, engine, agent_adapters, sampling, 0, LOOKAHEAD_ROUND,
                    samples=samples, teammate=teammate,
                )  # fmt: skip
                credited = [look.credited_global for look in looks]
                tokens[rule] += sum(look.tokens for look in looks)
            seconds[rule] += time.perf_counter() - start
            print(f"  step {step} {rule}: {time.perf_counter() - start:.1f} s", flush=True)
            pairs = list(zip(own, credited, strict=True))
            groups[rule] += [pairs[i : i + k] for i in range(0, len(pairs), k)]
        for env in envs:
            env.close()
        print(f"step {step}: {len(own)} {agent} candidates, {int(sum(own))} correct", flush=True)
    table = {
        rule: {**credit_disagreements(groups[rule]), "lookahead_seconds": seconds[rule],
               "lookahead_tokens": tokens[rule]}
        for rule in groups
    }  # fmt: skip
    for rule, row in table.items():
        print(
            f"{rule:>12}: disagree {row['disagreements']}/{row['candidates']} (failed credited "
            f"{row['credited_failed']}, correct withheld {row['withheld_correct']}); pairs misordered "
            f"{row['pairs_misordered']}, tied {row['pairs_tied']} of {row['pairs']}; groups flipped "
            f"{row['groups_flipped']}/{row['groups']}, spurious {row['groups_spurious']}; look-ahead {row['lookahead_seconds']:.1f} s",
            flush=True,
        )
    return {
        "settings": {
            "config_file": str(args.config.resolve().relative_to(REPO))
            if args.config.resolve().is_relative_to(REPO)
            else str(args.config),
            "env_id": config.env.id,
            "overrides": overrides,
            "steps": args.steps,
            "threads": torch.get_num_threads(),
            "agent": agent,
            "own_key": own_key,
            "adapters": sorted(adapters),
            "adapters_dir": args.adapters,
            "env_kwargs": kwargs,
            "k": rollout.num_generations,
            "envs_per_step": rollout.envs_per_step,
            "temperature": rollout.temperature,
        },
        "candidates": candidates,
        "own_correct": own_correct,
        "candidate_seconds": candidate_seconds,
        "rules": table,
    }


def plot(result: dict[str, Any], png: Path) -> None:
    """Per credit rule: candidates whose credit disagrees with what they caused, and groups flipped."""
    rules = result["rules"]
    bar_chart(
        png, f"Team credit against the candidate's own outcome, {result['settings'].get('env_id', 'Math-v0')}",
        list(rules), {"failed credited": [r["credited_failed"] for r in rules.values()],
                      "correct withheld": [r["withheld_correct"] for r in rules.values()],
                      "groups with the wrong sign": [r["groups_flipped"] for r in rules.values()]},
        f"count (of {result['candidates']} candidates, {next(iter(rules.values()))['groups']} groups)",
    )  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=2, help="training steps whose tasks are played")
    parser.add_argument("--credits", default="immediate,sampled:1,sampled:4,greedy",
                        help="comma list of immediate, greedy, sampled:M")  # fmt: skip
    parser.add_argument(
        "--config", type=Path, default=CONFIG, help="training config (default: the Math-v0 one)"
    )
    parser.add_argument("--own-key", default=None,
                        help=f"info key of the candidate's own correctness (default per env: {OWN_KEYS})")  # fmt: skip
    parser.add_argument("--adapters", default=None, help="a run's adapters/ dir (default: the base model)")


def one_step(args: argparse.Namespace) -> None:
    args.steps = 1


def main(argv: list[str] | None = None) -> None:
    measurement_main(argv, __file__, __doc__ or "", NAME, add_arguments, measure, plot, one_step)


if __name__ == "__main__":
    main()
