"""The driver the learning benchmarks share (``learning_math.py``, ``learning_plan_path.py``).

It holds what does not depend on the env: the command line (``--quick``, ``--output-dir``,
``--variants``, ``--threads``, ``--workdir``, ``--seeds`` and config overrides), the start of a run
(torch threads, warnings, the run's facts), where the runs go with their config overrides, the
logging a benchmark's training runs turn off, and a trainer's life from build to release. Each
script keeps what is its env's: the config, the variants, how they are evaluated, summarized and
plotted.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch
from _common import RESULTS_DIR, add_workdir_argument, parse_with_overrides, quick_overrides, run_facts

from llm_zoo_train.config import Config
from llm_zoo_train.trainer import Trainer

T = TypeVar("T")

#: Overrides of every training run: a benchmark prints its own lines and draws its own plot.
QUIET_LOGGING = ("--logging.progress_bar", "false", "--logging.plot", "false")


def parse_learning_args(
    description: str, variants: Sequence[str], argv: Sequence[str] | None, *, seeds: bool = False
) -> tuple[argparse.Namespace, list[str], list[str]]:
    """The command line of the learning benchmarks: ``(args, variant names, config overrides)``.

    Options: ``--quick``, ``--output-dir``, ``--variants`` (a comma-separated subset of
    ``variants``), ``--threads``, ``--workdir``, and with ``seeds`` ``--seeds`` (comma-separated
    training seeds, ``args.seeds`` a list of ints; default ``0,1``); any other ``--section.field
    VALUE`` is a config override. A stray positional argument, an unknown variant or a bad seed
    exits with a message naming the valid choices.
    """
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: tiny random model, 1 step, 4 eval tasks"
    )
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--variants", default=",".join(variants), help=f"comma-separated subset of {list(variants)}"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    add_workdir_argument(parser)
    if seeds:
        parser.add_argument(
            "--seeds",
            default="0,1",
            help="comma-separated training seeds, each variant trained once per seed",
        )
    parser.epilog = "Any other --section.field VALUE is a config override, e.g. --training.max_steps 5."
    args, overrides = parse_with_overrides(parser, argv)
    names = [name for name in args.variants.split(",") if name]
    unknown = [name for name in names if name not in variants]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(variants)}")
    if seeds:
        parts = [part.strip() for part in args.seeds.split(",") if part.strip()]
        if not parts or not all(part.isdigit() for part in parts) or len(set(parts)) != len(parts):
            parser.error(
                f"--seeds must be distinct integers >= 0 separated by commas, e.g. 0,1; got {args.seeds!r}"
            )
        args.seeds = [int(part) for part in parts]
    return args, names, overrides


def start_run(args: argparse.Namespace, script: str, argv: Sequence[str] | None) -> dict[str, Any]:
    """Apply ``--threads`` (0 keeps torch's default), silence the libraries' UserWarnings and
    return the run's facts (:func:`_common.run_facts`)."""
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning)
    return run_facts(script, argv)


@contextmanager
def workspace(
    args: argparse.Namespace, prefix: str, extra: Sequence[str], fixed: Sequence[str] = ()
) -> Iterator[tuple[Path, list[str]]]:
    """``(workdir, overrides)`` for the runs: ``--workdir`` or a temporary folder (removed at the
    end), and the config overrides in the order they apply: ``fixed`` (the task's own), with
    ``--quick`` the tiny model's, then the command line's (``extra``), which win."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        quick = quick_overrides(Path(tmp)) if args.quick else []
        yield args.workdir or Path(tmp), [*fixed, *quick, *extra]


def with_trainer(config: Config, work: Callable[[Trainer], T]) -> T:
    """Build a :class:`Trainer` for ``config``, return ``work(trainer)`` and release the trainer.

    The trainer is closed and collected before the next variant builds its own: two models in
    memory at once would crowd a small machine and slow the next run. ``work`` must not keep it.
    """
    trainer = Trainer(config)
    result = work(trainer)
    trainer.close()
    del trainer
    gc.collect()
    return result
