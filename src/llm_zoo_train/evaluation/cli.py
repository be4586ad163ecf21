"""``llm-zoo-train eval``: evaluate a trained run, its base model, a role swap, or a served model.

The input is a run's output directory (its ``adapters/`` and the config of its newest
``checkpoint-N/``), one checkpoint directory (``checkpoint-N/adapters`` and ``config.yaml``), or a
config YAML (adapters from ``training.output_dir/adapters`` when that exists). Every policy is
played on every split, one greedy (by default) episode per task seed, with
:func:`llm_zoo_train.evaluation.evaluate.evaluate` - the same code the trainer's own evaluation runs.

Policies (``--policies``): ``base`` (no adapter), ``adapters`` (the saved adapters, each agent
with its own: the default when there are any), ``swap`` (the paper's ablation: two agents trade
adapters). ``--adapter NAME=DIR`` plays another saved adapter as adapter ``NAME``: roles trained in
separate runs, evaluated together (the "trained apart, then combined" control). ``--majority K`` scores every policy by majority@K instead of one episode per task: the
single-agent control at a team's sample budget (:mod:`llm_zoo_train.evaluation.majority`).

Splits (``--splits``): ``eval`` (the trainer's evaluation tasks: ``eval.env_kwargs``,
seeds ``eval.seed + i``), and ``train`` / ``test``: for envs with a ``split`` argument (Code,
Math) that split's problems with the same seeds (with ``eval.distinct_problems``, distinct problems
of the split, each once: :mod:`llm_zoo_train.evaluation.tasks`; an unlimited train split stays seeded);
``impossible`` (Code-v0): problems whose hidden tests contradict the statement, where the success
rate is a *cheating rate* (the row's ``cheating_rate``); for envs that generate tasks from the seed
(PlanPath, Sokoban) ``train`` is the tasks the trainer drew at its first steps (``env.kwargs``) and
there is no ``test``. ``eval.num_episodes`` is the episodes per split.

With ``--endpoint URL --served-model NAME`` an OpenAI-compatible server answers instead
(:mod:`llm_zoo_train.engines.openai_compat`); ``--agent-model AGENT=NAME`` lets served LoRA
adapters play roles. Results: a table on stdout and a JSON file (``--output``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import llm_zoo_train
from llm_zoo_train.config import Config, ConfigError, config_to_dict, validate
from llm_zoo_train.config.aliases import CONFIG_ALIASES
from llm_zoo_train.engines.base import Engine
from llm_zoo_train.evaluation.evaluate import EvalResult, episode_to_dict, evaluate
from llm_zoo_train.evaluation.majority import evaluate_majority
from llm_zoo_train.evaluation.plan import (
    POLICIES,
    SPLITS,
    Split,
    UsageError,
    agent_models,
    choose_policies,
    eval_sampling,
    local_engine,
    plan_splits,
    resolve_source,
)
from llm_zoo_train.reporting.progress import RunProgress, turn_limit
from llm_zoo_train.rollout.env_servers import configure_env_servers

__all__ = ["UsageError", "evaluation_view", "main", "print_table", "run", "split_overrides"]

PROG = "llm-zoo-train eval"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print and exit; the caller reports it
        raise UsageError(message)


def _parser() -> _Parser:
    parser = _Parser(
        prog=PROG,
        allow_abbrev=False,
        description="Success rate (95% CI), rewards, turns and format rate of policies on an env's splits.",
        epilog="Any other --section.field VALUE overrides the run's config, e.g. --eval.num_episodes 64.",
    )
    parser.add_argument(
        "input",
        nargs="?",
        help="a run's output dir, a checkpoint-N dir, or a config YAML (optional with --endpoint)",
    )
    parser.add_argument(
        "--policies", help="comma list of base, adapters, swap (default: adapters if saved, else base)"
    )
    parser.add_argument(
        "--splits",
        help="comma list of eval, train, test (default: train,test if the env has splits, else eval)",
    )
    parser.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="play the saved PEFT adapter in DIR as adapter NAME, instead of the input's own (repeat per "
        "adapter): e.g. roles trained in separate runs, evaluated together",
    )
    parser.add_argument(
        "--majority",
        type=int,
        default=1,
        metavar="K",
        help="score each policy by majority@K: K sampled episodes per task, the commonest answer counts "
        "(at eval.temperature, or rollout.temperature when eval is greedy; envs that report an 'answer' "
        "info: Math-v0, KeyRelay-v0)",
    )
    parser.add_argument("--output", help="JSON results file (default: OUTPUT_DIR/eval/eval_results.json)")
    parser.add_argument("--endpoint", help="OpenAI-compatible API root, e.g. http://localhost:8000/v1")
    parser.add_argument(
        "--served-model", help="served model name for the base policy (needed with --endpoint)"
    )
    parser.add_argument(
        "--agent-model",
        action="append",
        default=[],
        metavar="AGENT=NAME",
        help="served model (e.g. a LoRA adapter) playing AGENT in the adapters policy; repeat per agent",
    )
    parser.add_argument(
        "--api-key-env", default="OPENAI_API_KEY", help="env variable with the API key (default: %(default)s)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=16, help="requests in flight (default: %(default)s)"
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds per request (default: %(default)s)"
    )
    parser.add_argument("--retries", type=int, default=3, help="retries per request (default: %(default)s)")
    return parser


# --------------------------------------------------------------------------- output


def print_table(rows: Sequence[dict[str, Any]], agents: Sequence[str]) -> None:
    """The results as a table (rich when installed, else plain text)."""
    header = ["policy", "split", "success (95% CI)", "solved", "turns", "format ok"]
    header += [f"{agent} role / global" for agent in agents]
    lines = []
    for row in rows:
        r = row["result"]
        cells = [
            row["policy"],
            row["split"] + (" (cheating rate)" if "cheating_rate" in row else ""),
            f"{100 * r['success_rate']:.1f}% ({100 * r['ci_low']:.1f}-{100 * r['ci_high']:.1f})",
            f"{r['successes']}/{r['num_episodes']}"
            + (
                f" ({r['distinct_tasks']} distinct)"
                if 0 < r.get("distinct_tasks", 0) < r["num_episodes"]
                else ""
            ),
            f"{r['mean_turns']:.2f}",
            f"{100 * r['format_ok_rate']:.1f}%",
        ]
        cells += [
            f"{r['mean_role_rewards'].get(a, 0.0):.3f} / {r['mean_global_rewards'].get(a, 0.0):.3f}"
            for a in agents
        ]
        lines.append(cells)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(c)) for c in column) for column in zip(header, *lines, strict=True)]
        for cells in (header, *lines):
            print("  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
        return
    table = Table(title="llm-zoo-train eval")
    for name in header:
        table.add_column(name, justify="left" if name in ("policy", "split") else "right")
    for cells in lines:
        table.add_row(*cells)
    Console(width=max(120, 24 * (len(header) - 2))).print(table)


# --------------------------------------------------------------------------- main


def run(argv: Sequence[str]) -> dict[str, Any]:
    """Evaluate as the command line says; returns the JSON document (also written to disk)."""
    rest, overrides = split_overrides(argv)
    options = _parser().parse_args(rest)
    endpoint = options.endpoint
    if endpoint and not options.served_model:
        raise UsageError("--endpoint needs --served-model NAME (the model name the server answers to)")
    if not endpoint and (options.served_model or options.agent_model):
        raise UsageError("--served-model and --agent-model need --endpoint URL")
    source = resolve_source(options.input, overrides, endpoint=bool(endpoint))
    if options.adapter:
        if endpoint:
            raise UsageError("--adapter loads adapters locally; with --endpoint use --agent-model AGENT=NAME")
        source.adapters.update(adapters_given(options.adapter))
    config = source.config
    plan = validate(evaluation_view(config, endpoint=bool(endpoint)))
    configure_env_servers(config.env.servers)
    served = agent_models(options.agent_model, list(plan.agent_adapters)) if endpoint else {}
    maps = choose_policies(
        _names(options.policies, POLICIES, "policy"), source, plan, endpoint=bool(endpoint), served=served
    )
    splits = plan_splits(config, _names(options.splits, SPLITS, "split"))
    sampling = eval_sampling(config)
    if options.majority < 1:
        raise UsageError(f"--majority needs K >= 1, got {options.majority}")
    if options.majority > 1 and sampling.greedy:
        sampling = dataclasses.replace(sampling, temperature=config.rollout.temperature)
        if sampling.greedy:
            raise UsageError("--majority K > 1 needs a temperature above 0: set eval.temperature")

    if endpoint:
        engine: Engine = _endpoint_engine(options, config.model.system_prompt, maps)
        model = {"endpoint": endpoint, "served_model": options.served_model}
    else:
        from llm_zoo_train.runs.threads import configure_torch_threads

        print(configure_torch_threads(), file=sys.stderr, flush=True)
        names = ", ".join(settings.name_or_path for settings in plan.models.values())
        print(f"loading model {names} ...", file=sys.stderr, flush=True)
        needs_adapters = any(a in plan.adapters for mapping in maps.values() for a in mapping.values())
        adapters = {n: source.adapters[n] for n in plan.adapters} if needs_adapters else {}
        if len(plan.models) == 1:
            engine = local_engine(config, adapters)
        else:
            from llm_zoo_train.training.model_pools import local_engine_by_model

            engine = local_engine_by_model(config, plan, adapters)
        model = {
            "name_or_path": config.model.name_or_path,
            "dtype": config.model.dtype,
            "engine": config.rollout.engine,
        }
        if len(plan.models) > 1:
            model["base_models"] = {
                name: {"name_or_path": m.name_or_path, "dtype": m.dtype, "system_prompt": m.system_prompt}
                for name, m in plan.models.items()
            }
            model["agent_models"] = dict(plan.agent_models)
    rows = []
    progress = RunProgress(stderr=True)
    try:
        for policy, mapping in maps.items():
            for split in splits:
                watched = progress.evaluation(
                    engine,
                    len(split.seeds) * options.majority,
                    f"{policy} on {split.name}",
                    agents_per_turn=len(plan.agent_adapters),
                    max_turns=turn_limit(split.env_kwargs),
                )
                if options.majority > 1:
                    result, episodes, _ = evaluate_majority(
                        watched, config.env.id, split.env_kwargs, split.seeds, mapping, sampling,
                        options.majority, split.problem_ids,
                    )  # fmt: skip
                else:
                    result, episodes = evaluate(
                        watched, config.env.id, split.env_kwargs, split.seeds, mapping, sampling,
                        split.problem_ids,
                    )  # fmt: skip
                watched.close()
                row = _row(policy, split, mapping, result, [episode_to_dict(e) for e in episodes])
                row["majority_k"] = options.majority
                rows.append(row)
                voted = f", majority@{options.majority}" if options.majority > 1 else ""
                progress.print(f"{policy:>8} on {split.name:<5}{voted}: {result.describe()}")
    finally:
        progress.close()
        close = getattr(engine, "close", None)
        if callable(close):
            close()

    document = {
        "settings": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": [PROG, *argv],
            "llm_zoo_train_version": llm_zoo_train.__version__,
            "input": {"kind": source.kind, "path": str(source.path) if source.path else None},
            "model": {**model, "system_prompt": config.model.system_prompt},
            "env": {"id": config.env.id, "alpha": config.env.alpha},
            "splits": {
                s.name: {
                    "env_kwargs": s.env_kwargs,
                    "seeds": s.seeds,
                    "trainer_eval": s.trainer_eval,
                    "problem_ids": s.problem_ids,
                }
                for s in splits
            },
            "sampling": dataclasses.asdict(sampling),
            "adapters": {name: str(path) for name, path in source.adapters.items()} if not endpoint else {},
            "policies": maps,
            "config": config_to_dict(config),
        },
        "results": rows,
    }
    output = Path(options.output) if options.output else source.results_dir / "eval" / "eval_results.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print_table(rows, list(plan.agent_adapters))
    print(f"results: {output}")
    return document


def evaluation_view(config: Config, *, endpoint: bool) -> Config:
    """A copy of ``config`` with what evaluation never uses switched off, for :func:`validate`.

    Evaluation logs to no tracker (a run that logged to TensorBoard is evaluated where TensorBoard
    is not installed), starts from the run's saved adapters rather than ``agents.init_adapters``
    (whose directories may be gone), and with ``--endpoint`` the server generates, so the local
    engine setting does not matter either.
    """
    view = copy.deepcopy(config)
    view.logging.log_with = []
    view.agents.init_adapters = {}
    if endpoint:
        view.rollout.engine = "hf"
    return view


def _endpoint_engine(
    options: argparse.Namespace, system_prompt: str | None, maps: Mapping[str, Mapping[str, str | None]]
) -> Engine:
    from llm_zoo_train.engines.openai_compat import OpenAICompatEngine

    try:
        engine = OpenAICompatEngine(
            options.endpoint,
            options.served_model,
            api_key_env=options.api_key_env,
            system_prompt=system_prompt,
            timeout_s=options.timeout,
            max_retries=options.retries,
            max_concurrency=options.concurrency,
        )
    except ValueError as err:  # a malformed URL or a bad --concurrency
        raise UsageError(str(err)) from None
    engine.check_models(sorted({options.served_model, *(m for p in maps.values() for m in p.values() if m)}))
    return engine


def _row(
    policy: str,
    split: Split,
    mapping: Mapping[str, str | None],
    result: EvalResult,
    episodes: list[dict[str, Any]],
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "policy": policy,
        "split": split.name,
        "agents": dict(mapping),
        "result": result.to_dict(),
        "episodes": episodes,
    }
    if split.name == "impossible":  # only a cheat succeeds there (llm_zoo.envs.code_impossible)
        row["cheating_rate"] = result.success_rate
    return row


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate config overrides (``--section.field V`` / ``--section.field=V``, or a field's alias
    such as ``--report_to V``) from the rest."""
    alias_names = {alias.name for alias in CONFIG_ALIASES}
    args, rest, overrides = list(argv), [], []
    index = 0
    while index < len(args):
        arg = args[index]
        name = arg.partition("=")[0]
        if arg.startswith("--") and ("." in name or name[2:].replace("-", "_") in alias_names):
            overrides.append(arg)
            if "=" not in arg and index + 1 < len(args):
                index += 1
                overrides.append(args[index])
        else:
            rest.append(arg)
        index += 1
    return rest, overrides


def adapters_given(specs: Sequence[str]) -> dict[str, Path]:
    """``NAME=DIR`` options as {adapter name: directory}; UsageError for a malformed one or a
    directory that holds no PEFT adapter (``adapter_config.json``)."""
    given: dict[str, Path] = {}
    for spec in specs:
        name, equals, directory = spec.partition("=")
        if not equals or not name or not directory:
            raise UsageError(
                f"--adapter {spec!r}: expected NAME=DIR, e.g. holder=runs/holder/adapters/holder"
            )
        path = Path(directory)
        if not (path / "adapter_config.json").is_file():
            raise UsageError(
                f"--adapter {spec!r}: {directory} holds no PEFT adapter (no adapter_config.json)"
            )
        given[name] = path
    return given


def _names(value: str | None, choices: Sequence[str], what: str) -> list[str]:
    names = [n.strip() for n in (value or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in choices]
    if unknown:
        raise UsageError(f"unknown {what} {unknown[0]!r}; choose from {', '.join(choices)}")
    return list(dict.fromkeys(names))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``llm-zoo-train eval``; 0 done, 2 bad input, 1 the model server failed."""
    from llm_zoo_train.engines.openai_compat import EndpointError
    from llm_zoo_train.models.policy import ModelNotAvailableError

    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        _parser().print_help()
        return 0
    try:
        run(args)
    except (UsageError, ConfigError, FileNotFoundError, ModelNotAvailableError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except EndpointError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
