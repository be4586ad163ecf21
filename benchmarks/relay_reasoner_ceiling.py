"""Can the base reasoner do its half of MathRelay-v0 at all? SmolLM2-135M-Instruct, CPU.

On MathRelay-v0 (``examples/math_relay_smollm2_cpu.yaml``) the team succeeds only when the
reasoner writes the tool agent's printed number with its key after it. GRPO learns from the
candidates that succeed; if the reasoner almost never succeeds even when the tool agent printed
the right number, the team has no signal to learn from, however the tool agent plays.

This script gives the reasoner the *right* intermediate (the tool agent plays
:func:`llm_zoo.envs.math_relay.oracle_action`) on ``--problems`` training problems and counts the
reasoner's correct answers, ``K`` samples at the config's temperature and one greedy answer per
problem, with the base model (untrained adapters equal it). ``env`` is the env's own prompt, scored
by the env; the other rules are prompts for possible redesigns of the reasoner's step, on the same
numbers, scored by the last integer of the reply (the env's lenient parser):

* ``append_no_example`` - the env's rule without its worked example (the model copies the
  example's ``352``);
* ``add`` - the answer is the printed number plus the key;
* ``times`` - the printed number times the key.

    python benchmarks/relay_reasoner_ceiling.py --threads 1
    python benchmarks/relay_reasoner_ceiling.py --quick --output /tmp/ceiling.json  # tiny model
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import bar_chart, measurement_main

import llm_zoo
from llm_zoo.envs.math_relay import oracle_action
from llm_zoo_train.config import load_config, train_env_kwargs
from llm_zoo_train.engines.base import SamplingParams
from llm_zoo_train.evaluation.plan import local_engine

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "examples" / "math_relay_smollm2_cpu.yaml"
NAME = "relay_reasoner_ceiling"
ASK = "What is the answer? Reply with the number only."
#: Redesigned reasoner steps: (rule text, team answer from (printed number, key)).
RULES: dict[str, tuple[str, Callable[[int, int], int]]] = {
    "append_no_example": ("The answer is the printed number with your key written right after it.",
                          lambda printed, key: int(f"{printed}{key}")),
    "add": ("The answer is the printed number plus your key.", lambda printed, key: printed + key),
    "times": ("The answer is the printed number times your key.", lambda printed, key: printed * key),
}  # fmt: skip


def last_integer(text: str) -> int | None:
    numbers = re.findall(r"-?\d+", text)
    return int(numbers[-1]) if numbers else None


def measure(args: argparse.Namespace, overrides: list[str]) -> dict[str, Any]:
    config = load_config(CONFIG, overrides)
    engine = local_engine(config, {})
    kwargs = train_env_kwargs(config)
    k, rollout = args.k, config.rollout
    sampled = SamplingParams(
        max_tokens=rollout.max_completion_length, temperature=rollout.temperature, seed=1
    )
    greedy = SamplingParams(max_tokens=rollout.max_completion_length, temperature=0.0)
    envs, cases = [], []
    for seed in range(args.problems):
        env = llm_zoo.make(config.env.id, **kwargs)
        env.reset(seed=seed)
        env.step(oracle_action(env, "tool_agent"))
        envs.append(env)
        cases.append((int(env.gold_answer("tool_agent")), int(env.key)))
    prompts: dict[str, list[str]] = {"env": [env.observe("reasoner")["prompt"] for env in envs]}
    for rule, (text, _) in RULES.items():
        prompts[rule] = [
            f"Your teammate's Python program printed: {printed}\nYour key: {key}\n{text}\n{ASK}"
            for printed, key in cases
        ]
    table: dict[str, Any] = {}
    for rule, rule_prompts in prompts.items():
        counts = {}
        for label, sampling, n in (("sampled", sampled, k), ("greedy", greedy, 1)):
            outputs = engine.generate(rule_prompts, [None] * len(rule_prompts), n, sampling)
            correct = 0
            for env, case, completions in zip(envs, cases, outputs, strict=True):
                for completion in completions:
                    if rule == "env":
                        clone = env.clone()
                        clone.step(completion.text)
                        correct += bool(clone.infos["reasoner"].get("correct"))
                    else:
                        correct += last_integer(completion.text) == RULES[rule][1](*case)
            counts[label] = {"correct": correct, "answers": len(envs) * n}
            counts[f"{label}_example"] = outputs[0][0].text
        table[rule] = counts
        print(f"{rule:>18}: sampled {counts['sampled']['correct']}/{counts['sampled']['answers']}, greedy "
              f"{counts['greedy']['correct']}/{counts['greedy']['answers']}; e.g. {counts['greedy_example']!r}",
              flush=True)  # fmt: skip
    return {
        "settings": {
            "config_file": str(CONFIG.relative_to(REPO)),
            "overrides": overrides,
            "problems": args.problems,
            "k": k,
            "temperature": rollout.temperature,
            "max_tokens": rollout.max_completion_length,
            "threads": torch.get_num_threads(),
        },
        "rules": table,
    }


def plot(result: dict[str, Any], png: Path) -> None:
    rules = result["rules"]
    bar_chart(
        png, "MathRelay-v0: the base reasoner given the right intermediate", list(rules),
        {kind: [100 * r[kind]["correct"] / max(1, r[kind]["answers"]) for r in rules.values()]
         for kind in ("sampled", "greedy")},
        "reasoner answers correct (%)",
    )  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--problems", type=int, default=48, help="training problems (env seeds 0..N-1)")
    parser.add_argument("-k", type=int, default=8, help="sampled answers per problem")


def few_problems(args: argparse.Namespace) -> None:
    args.problems, args.k = 4, 2


def main(argv: list[str] | None = None) -> None:
    measurement_main(argv, __file__, __doc__ or "", NAME, add_arguments, measure, plot, few_problems)


if __name__ == "__main__":
    main()
