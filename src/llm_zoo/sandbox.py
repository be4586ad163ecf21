"""Running untrusted, model-written Python programs.

:func:`run_python` runs one program in a fresh process with:

* resource limits (CPU seconds, address space, number of processes, file size, open files) set by
  a small launcher program before it ``exec``s the interpreter - never by ``preexec_fn``, which can
  deadlock a threaded parent;
* its own session and process group, killed as a whole on timeout and after it exits, so no child
  it started outlives it;
* a fresh temporary working directory, removed afterwards, and an empty environment;
* stdout and stderr written to files capped by the file-size limit, so a flood cannot fill memory.

Model text is never evaluated in the host process.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

__all__ = ["RunResult", "run_python", "DEFAULT_TIMEOUT_S", "DEFAULT_MEMORY_MB"]

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MEMORY_MB = 512
DEFAULT_MAX_OUTPUT_BYTES = 1 << 20
DEFAULT_MAX_PROCESSES = 64

# Runs in the child before the program: set limits, then exec the interpreter on the program.
_LAUNCHER = """
import os, resource, sys
cpu, mem, nproc, fsize = (int(v) for v in sys.argv[1:5])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
os.execv(sys.executable, [sys.executable, "-I", "-B", sys.argv[5]])
"""


@dataclass
class RunResult:
    """The outcome of one sandboxed run.

    Attributes:
        stdout: What the program printed (decoded UTF-8, undecodable bytes replaced), at most
            the output cap.
        stderr: Its standard error, same cap.
        exit_code: The process exit status; negative for a signal (``-9`` for SIGKILL); ``None``
            if it never ran.
        timed_out: Killed because the wall-clock timeout passed.
        duration_s: Wall-clock seconds from start to exit.
        output_truncated: stdout or stderr reached the cap.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    duration_s: float
    output_truncated: bool = False

    @property
    def ok(self) -> bool:
        """Exited normally with status 0 within the time limit."""
        return self.exit_code == 0 and not self.timed_out


def run_python(
    code: str,
    *,
    stdin: str = "",
    timeout: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    max_processes: int = DEFAULT_MAX_PROCESSES,
) -> RunResult:
    """Run ``code`` as a Python program with ``stdin`` as its standard input.

    Args:
        code: Program source (untrusted).
        stdin: Text fed to its standard input.
        timeout: Wall-clock seconds before the whole process group is killed. CPU time is limited
            to the same number of seconds (rounded up).
        memory_mb: Address-space limit in MiB.
        max_output_bytes: Cap on each of stdout and stderr (also the limit on any file written).
        max_processes: Limit on processes for the user (RLIMIT_NPROC), containing fork bombs.
    """
    workdir = tempfile.mkdtemp(prefix="llm_zoo_run_")
    start = time.monotonic()
    try:
        program = os.path.join(workdir, "main.py")
        with open(program, "w", encoding="utf-8", errors="surrogatepass") as handle:
            handle.write(code)
        stdin_path = os.path.join(workdir, ".stdin")
        with open(stdin_path, "w", encoding="utf-8", errors="replace") as handle:
            handle.write(stdin)
        out_path, err_path = os.path.join(workdir, ".stdout"), os.path.join(workdir, ".stderr")
        argv = [
            sys.executable, "-I", "-S", "-c", _LAUNCHER,
            str(max(1, int(timeout + 0.999))), str(int(memory_mb) << 20),
            str(int(max_processes)), str(int(max_output_bytes)), program,
        ]  # fmt: skip
        with (
            open(stdin_path, "rb") as fin,
            open(out_path, "wb") as fout,
            open(err_path, "wb") as ferr,
        ):
            process = subprocess.Popen(
                argv,
                stdin=fin,
                stdout=fout,
                stderr=ferr,
                cwd=workdir,
                env={"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8"},
                start_new_session=True,
                close_fds=True,
            )
            timed_out = False
            try:
                exit_code: int | None = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(process.pid)
                exit_code = process.wait()
            _kill_group(process.pid)  # children it left behind
        duration = time.monotonic() - start
        stdout, out_cut = _read_capped(out_path, max_output_bytes)
        stderr, err_cut = _read_capped(err_path, max_output_bytes)
        return RunResult(stdout, stderr, exit_code, timed_out, duration, out_cut or err_cut)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_capped(path: str, cap: int) -> tuple[str, bool]:
    with open(path, "rb") as handle:
        data = handle.read(cap + 1)
    return data[:cap].decode("utf-8", errors="replace"), len(data) >= cap
