"""Command line: ``llm-zoo-train CONFIG.yaml [--section.field VALUE ...] [--resume [DIR]]``.

``llm-zoo-train eval RUN_DIR [options]`` evaluates a run instead (:mod:`llm_zoo_train.evaluation.cli`).

Also ``accelerate launch -m llm_zoo_train CONFIG.yaml ...`` (multi-process, mixed precision as
configured by ``accelerate config``/``launch`` flags). The configuration is checked completely -
names, types, values, the env id and the agents - before any model is loaded.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

USAGE = """\
usage: llm-zoo-train [CONFIG.yaml] [--section.field VALUE ...] [--resume [DIR]] [--print-config]
       accelerate launch [launch options] -m llm_zoo_train [same arguments]
       llm-zoo-train eval RUN_DIR|CHECKPOINT_DIR|CONFIG.yaml [options]   (see `llm-zoo-train eval --help`)

Train one LoRA adapter per agent (or a shared one) on an llm-zoo environment with AT-GRPO.

  CONFIG.yaml        the run's configuration (YAML, sections below); optional with --resume DIR
  --section.field V  override one field; V is read as YAML (8, 1.0e-5, true, [a, b], {k: v}, null)
  --resume [DIR]     continue a run from checkpoint DIR, or from the newest checkpoint in DIR or,
                     without DIR, in training.output_dir; the checkpoint's config is used when no
                     CONFIG.yaml is given; a run resumed from DIR writes into DIR's run (a moved
                     or copied run continues where it is, whatever output_dir it recorded)
  --print-config     check the configuration, print it as YAML and exit (loads no model)
  -h, --help         show this help with every configuration field

Configuration fields (section.field (type, default) and what it does). A field's "alias" is its
TRL GRPOConfig name, accepted as a top-level YAML key or as --NAME VALUE (e.g. report_to, bf16):
"""


class UsageError(Exception):
    pass


#: Top-level modules of the `train` extra; without them the trainer cannot start.
TRAIN_EXTRA_MODULES = (
    "yaml",
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "safetensors",
    "gguf",
    "rich",
    "matplotlib",
)


def resume_in_place(config: Any, run_dir: Path) -> str | None:
    """``--resume DIR`` writes into DIR's run: a moved or copied run continues where it is, never
    in the ``training.output_dir`` its config recorded (another run may be there). Sets
    ``config.training.output_dir`` to ``run_dir`` and returns the line that says so, or ``None``
    when they already agree."""
    recorded = Path(config.training.output_dir).expanduser()
    if recorded.resolve() == run_dir.resolve():
        return None
    config.training.output_dir = str(run_dir)
    return (
        f"resuming in {run_dir}, where the checkpoint is (its config recorded training.output_dir "
        f"{recorded}; that directory is left alone)"
    )


def parse_args(argv: Sequence[str]) -> tuple[str | None, bool, str | None, bool, list[str]]:
    """-> (config path, resume?, resume dir, print config?, overrides)."""
    args = list(argv)
    config_path = None
    if args and not args[0].startswith("-"):
        config_path = args.pop(0)
    resume, resume_dir, print_config, overrides = False, None, False, []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--resume" or arg.startswith("--resume="):
            resume = True
            if arg.startswith("--resume="):
                resume_dir = arg.partition("=")[2] or None
            elif index + 1 < len(args) and not args[index + 1].startswith("--"):
                index += 1
                resume_dir = args[index]
        elif arg == "--print-config":
            print_config = True
        elif arg.startswith("--"):
            overrides.append(arg)
            if "=" not in arg:
                if index + 1 >= len(args):
                    raise UsageError(f"option {arg} needs a value (e.g. {arg} VALUE or {arg}=VALUE)")
                if args[index + 1].startswith("--"):
                    raise UsageError(f"option {arg} needs a value, got the option {args[index + 1]} instead")
                index += 1
                overrides.append(args[index])
        else:
            raise UsageError(
                f"unexpected argument {arg!r}: the config file comes first, options are --section.field VALUE"
            )
        index += 1
    return config_path, resume, resume_dir, print_config, overrides


class Terminated(KeyboardInterrupt):
    """SIGTERM outside a training loop (model load, final save, ``eval``): handled where Ctrl-C is."""

    signal_name = "SIGTERM"
    exit_code = 128 + signal.SIGTERM


def _terminated(number: int, frame: object) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    """The console script; returns the exit status (2: bad input, with a one-line message).

    SIGTERM is handled as Ctrl-C is, wherever it comes (a job scheduler's stop during the model
    load, the final save or ``eval`` killed the process with no line: issue 53 D11): one line, and
    exit status 143. The training loop's own handler (:mod:`llm_zoo_train.runs.interrupts`) takes
    over while it runs and saves a checkpoint. Run as the command (``argv`` None), Ctrl-C is
    ignored once the work is done: one that came as ``eval`` exited, its results written, printed a
    traceback (from torch's atexit hook, or from restoring the signal handlers)."""
    try:
        return _main_with_handlers(argv)
    except KeyboardInterrupt as interrupted:
        if argv is not None:  # a caller of its own (a test, a script) decides
            raise
        print(f"llm-zoo-train: {getattr(interrupted, 'signal_name', 'interrupted')}", file=sys.stderr)
        return getattr(interrupted, "exit_code", 130)


def _main_with_handlers(argv: Sequence[str] | None) -> int:
    previous = (
        signal.signal(signal.SIGTERM, _terminated)
        if threading.current_thread() is threading.main_thread()
        else None
    )
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except ModuleNotFoundError as err:
        missing = (err.name or "").partition(".")[0]
        if missing not in TRAIN_EXTRA_MODULES:
            raise
        print(
            f"llm-zoo-train: error: the trainer needs the training extra (missing module {missing!r}): "
            'pip install "llm-zoo[train]"',
            file=sys.stderr,
        )
        return 2
    finally:
        if previous is not None:
            if argv is None:  # the command itself: nothing is left to interrupt but the exit
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str]) -> int:
    if argv and argv[0] == "eval":
        from llm_zoo_train.evaluation.cli import main as eval_main

        try:
            return eval_main(argv[1:])
        except KeyboardInterrupt as interrupted:
            name = getattr(interrupted, "signal_name", "interrupted")
            print(f"llm-zoo-train eval: {name}; nothing was written", file=sys.stderr)
            return getattr(interrupted, "exit_code", 130)
    if "-h" in argv or "--help" in argv:
        from llm_zoo_train.config import format_help

        print(USAGE + "\n" + format_help())
        return 0

    import yaml

    from llm_zoo_train.config import ConfigError, config_to_dict, load_config, validate
    from llm_zoo_train.runs.checkpoint import CheckpointDamagedError, find_checkpoint
    from llm_zoo_train.runs.lock import RunLockedError
    from llm_zoo_train.runs.run_dir import check_resume, complete_finished_run

    try:
        config_path, resume, resume_dir, print_config, overrides = parse_args(argv)
        checkpoint = None
        if resume and resume_dir is not None:
            checkpoint = find_checkpoint(resume_dir)
        if config_path is None:
            if checkpoint is None:
                raise UsageError("give a CONFIG.yaml (or --resume DIR to continue a run with its own config)")
            config_path = str(checkpoint / "config.yaml")
        config = load_config(config_path, overrides)
        if resume and checkpoint is None:
            checkpoint = find_checkpoint(config.training.output_dir)
        elif checkpoint is not None:
            moved = resume_in_place(config, checkpoint.parent)
            if moved:
                print(moved)
        validate(config)
        resume_point = check_resume(checkpoint, config) if checkpoint is not None else None
    except (UsageError, ConfigError, FileNotFoundError, CheckpointDamagedError) as err:
        print(f"llm-zoo-train: error: {err}", file=sys.stderr)
        print("llm-zoo-train: see `llm-zoo-train --help` for every option", file=sys.stderr)
        return 2

    if print_config:
        print(yaml.safe_dump(config_to_dict(config), sort_keys=False), end="")
        return 0
    if (
        resume_point is not None
        and resume_point.finished(config.training.max_steps)
        and not resume_point.final_evaluation_missing(config.eval.num_episodes)
    ):
        print(resume_point.describe(config.training.max_steps))  # before any model loads
        try:
            notes = complete_finished_run(resume_point)  # killed during the final save
        except (OSError, RunLockedError) as err:
            print(f"llm-zoo-train: error: {err}", file=sys.stderr)
            return 2
        for note in notes:
            print(note)
        return 0

    if os.environ.get("RANK", "0") == "0":  # the first output, before torch is even imported
        from llm_zoo_train.reporting.progress import run_summary

        print(run_summary(config), flush=True)

    from transformers.utils import logging as transformers_logging

    from llm_zoo.remote import RemoteEnvError
    from llm_zoo_train.models.policy import ModelNotAvailableError
    from llm_zoo_train.rollout.env_servers import EnvServersUnavailableError
    from llm_zoo_train.rollout.replay import ReplayMismatchError
    from llm_zoo_train.runs.checkpoint import CheckpointWriteError
    from llm_zoo_train.runs.finite import NonFiniteError
    from llm_zoo_train.runs.lock import RunLockedError
    from llm_zoo_train.trainer import Trainer

    transformers_logging.disable_progress_bar()  # weight-loading bars would bury the training log
    from llm_zoo_train.runs.threads import configure_torch_threads

    threads = configure_torch_threads()  # every process sets its own; the first one says it
    if os.environ.get("RANK", "0") == "0":
        print(threads, flush=True)

    try:
        trainer = Trainer(config, resume_from=Path(checkpoint) if checkpoint is not None else None)
    except (
        ConfigError,
        ModelNotAvailableError,
        RunLockedError,
        CheckpointDamagedError,
        FileNotFoundError,
        EnvServersUnavailableError,
    ) as err:
        print(f"llm-zoo-train: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupted:
        name = getattr(interrupted, "signal_name", "interrupted")
        print(f"llm-zoo-train: {name} while loading; nothing was trained", file=sys.stderr)
        return getattr(interrupted, "exit_code", 130)
    except OSError as err:
        return _write_failed(err, config.training.output_dir)
    try:
        trainer.train()
    except (CheckpointWriteError, ReplayMismatchError) as err:
        print(f"llm-zoo-train: error: {err}", file=sys.stderr)
        return 2
    except RemoteEnvError as err:  # every configured env server lost (failover found none left)
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(
            f"llm-zoo-train: error: stopped after step {trainer.step}, no env server left to play on: {first}; "
            + _how_to_continue(config.training.output_dir, "once a server in env.servers answers"),
            file=sys.stderr,
        )
        return 2
    except NonFiniteError as err:
        print(f"llm-zoo-train: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as interrupted:
        print(f"llm-zoo-train: {interrupted_line(interrupted, trainer.step)}", file=sys.stderr)
        return getattr(interrupted, "exit_code", 130)
    except OSError as err:
        return _write_failed(err, config.training.output_dir)
    finally:
        trainer.close()
        # Free the run now, not while the interpreter shuts down: a model sharded under fsdp2 holds
        # gloo work whose release during shutdown aborted a process (1 run in 20 under load).
        del trainer
        gc.collect()
    return 0


def _how_to_continue(output_dir: str, when: str) -> str:
    """How a stopped run goes on: from its last checkpoint, or, with none written yet (an async
    run's first checkpoint waits for rollouts a lost server never sent), from the start."""
    from llm_zoo_train.runs.checkpoint import list_checkpoints

    try:
        checkpoints = list_checkpoints(Path(output_dir))
    except OSError:
        checkpoints = []
    if checkpoints:
        return f"{checkpoints[-1].name} is kept: continue with --resume {when}"
    return f"no checkpoint was written yet: start again {when}, with --training.overwrite_output_dir true"


def interrupted_line(interrupted: BaseException, step: int) -> str:
    """The one line for a run stopped by Ctrl-C or SIGTERM: what was saved, how to continue."""
    name = getattr(interrupted, "signal_name", "SIGINT")
    saved = getattr(interrupted, "checkpoint", None)
    if saved is not None:
        return f"{name}: stopped after step {step}; saved {saved}: continue with --resume"
    if step == 0:
        return f"{name}: stopped before the first step completed; nothing to resume"
    return f"{name}: stopped after step {step}; no checkpoint of it was saved (the last checkpoint is kept)"


def _write_failed(err: OSError, output_dir: str) -> int:
    """One line for a write that failed outside a checkpoint (a full disk); re-raises others."""
    import errno

    if err.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
        raise err
    where = err.filename or _path_being_written(err, output_dir) or f"a file in {output_dir}"
    print(f"llm-zoo-train: error: cannot write {where}: {err.strerror or err}", file=sys.stderr)
    return 2


def _path_being_written(err: OSError, output_dir: str) -> str | None:
    """The file a failed write was writing, when the error does not say (a write or close of an
    open file raises ENOSPC without a file name): the innermost frame of the traceback holding a
    path under ``output_dir`` (``Path.write_text``'s own path, a writer's ``path``)."""
    root = os.path.abspath(output_dir)
    frames = []
    trace = err.__traceback__
    while trace is not None:
        frames.append(trace.tb_frame)
        trace = trace.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            if isinstance(value, os.PathLike) or (isinstance(value, str) and 0 < len(value) < 4096):
                text = os.fspath(value)
                if (
                    isinstance(text, str)
                    and "\n" not in text
                    and (os.sep in text or isinstance(value, os.PathLike))
                ):
                    candidate = os.path.abspath(text)
                    if candidate.startswith(root + os.sep):
                        return candidate
    return None


if __name__ == "__main__":
    sys.exit(main())
