"""Noticing a launcher that started fewer processes than it was asked for.

``accelerate launch --cpu --num_processes 2`` (also with a ``MULTI_CPU`` config file) starts ONE
process, and that process cannot tell from its environment: Accelerate sets neither ``WORLD_SIZE``
nor any variable with the requested count (only ``ACCELERATE_USE_CPU``). What it can see is its
parent, the ``accelerate launch`` command, in ``/proc/PPID/cmdline`` on Linux. :func:`requested_processes`
reads the count from there (``--num_processes N``, or ``num_processes`` of the ``--config_file``
or of Accelerate's default config file), and :func:`process_count_warning` turns a mismatch into a
message that shows the form that works on CPU: ``ACCELERATE_USE_CPU=1 torchrun --nproc_per_node N``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["process_count_warning", "requested_processes"]


def _parent_command_line() -> list[str]:
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:  # not Linux, or no permission: nothing to compare with
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _option(arguments: Sequence[str], *names: str) -> str | None:
    for index, argument in enumerate(arguments):
        for name in names:
            if argument == name and index + 1 < len(arguments):
                return arguments[index + 1]
            if argument.startswith(name + "="):
                return argument.partition("=")[2]
    return None


def _num_processes_in(config_file: Path) -> int | None:
    try:
        import yaml

        data = yaml.safe_load(config_file.read_text(encoding="utf-8")) or {}
        return int(data["num_processes"]) if "num_processes" in data else None
    except Exception:  # unreadable or malformed: this check is only advisory
        return None


def _default_accelerate_config() -> Path | None:
    try:
        from accelerate.commands.config import default_config_file
    except ImportError:
        return None
    return Path(default_config_file)


def requested_processes(command_line: Sequence[str] | None = None) -> int | None:
    """Processes an ``accelerate launch`` command line asked for (``None``: not such a command,
    or it did not say). ``command_line`` defaults to this process's parent's."""
    arguments = list(_parent_command_line() if command_line is None else command_line)
    launch = next((i for i, a in enumerate(arguments) if a == "launch"), None)
    if launch is None or not any("accelerate" in a for a in arguments[: launch + 1]):
        return None
    options = arguments[launch + 1 :]
    # Options after the script or module belong to the training script, not to the launcher.
    for index, argument in enumerate(options):
        if argument in ("-m", "--module") or (not argument.startswith("-") and argument.endswith(".py")):
            options = options[:index]
            break
    value = _option(options, "--num_processes", "--num-processes")
    if value is not None:
        try:
            return int(value)
        except ValueError:
            return None
    config_file = _option(options, "--config_file", "--config-file")
    path = Path(config_file) if config_file else _default_accelerate_config()
    return _num_processes_in(path) if path is not None and path.is_file() else None


def process_count_warning(num_processes: int, command_line: Sequence[str] | None = None) -> str | None:
    """A warning when the launcher asked for more processes than ``num_processes`` were started."""
    requested = requested_processes(command_line)
    if requested is None or requested <= num_processes:
        return None
    return (
        f"warning: accelerate launch was asked for {requested} processes but this run has {num_processes} "
        f"(`accelerate launch --cpu` starts one process); it continues single-process. For {requested} "
        f"processes on CPU use: ACCELERATE_USE_CPU=1 torchrun --nproc_per_node {requested} -m llm_zoo_train ..."
    )
