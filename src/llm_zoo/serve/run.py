"""Running the server: in this process (blocking, or in a thread) or as a child process.

:class:`ServerThread` and :class:`ServerProcess` are what tests, benchmarks and the trainer's tests
use to get a server on ``127.0.0.1`` with a free port, always shut down on exit.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import uvicorn

from llm_zoo.serve.app import create_app
from llm_zoo.serve.auth import bind_problem

__all__ = ["ServerProcess", "ServerThread", "serve"]

#: The line ``llm-zoo serve`` prints (flushed) once it listens; ServerProcess waits for it.
READY_PREFIX = "llm-zoo serve: listening on "


def _config(app: Any, sock: socket.socket, max_message_bytes: int) -> uvicorn.Config:
    host, port = sock.getsockname()[:2]
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="on",
        ws_max_size=int(max_message_bytes),
        # Pings find a client that vanished without closing (a dropped connection) within ~40 s.
        ws_ping_interval=20.0,
        ws_ping_timeout=20.0,
    )


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    session_ttl_s: float = 600.0,
    max_sessions: int = 1024,
    max_message_bytes: int = 8 << 20,
    token: str | Sequence[str] | None = None,
    allow_no_token: bool = False,
    env_ids: Sequence[str] | None = None,
    allowed_arguments: Sequence[str] = (),
    max_sessions_per_client: int | None = None,
    max_calls_per_client: int | None = None,
    max_connections_per_client: int | None = None,
) -> None:
    """Serve until interrupted; print :data:`READY_PREFIX` and the URL once listening (port 0
    picks a free port). ``token``: serve only requests carrying it, or one of them, one per client
    (:mod:`llm_zoo.serve.auth`); a non-loopback ``host`` without one is refused (``ValueError``)
    unless ``allow_no_token``. The rest are :func:`llm_zoo.serve.app.create_app`'s."""
    tokens = (token,) if isinstance(token, str) else tuple(token or ())
    problem = bind_problem(host, tokens[0] if tokens else None, allow_no_token)
    if problem:
        raise ValueError(problem)
    app = create_app(
        session_ttl_s=session_ttl_s,
        max_sessions=max_sessions,
        max_message_bytes=max_message_bytes,
        token=tokens,
        env_ids=env_ids,
        allowed_arguments=allowed_arguments,
        max_sessions_per_client=max_sessions_per_client,
        max_calls_per_client=max_calls_per_client,
        max_connections_per_client=max_connections_per_client,
    )
    sock = _bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    print(f"{READY_PREFIX}http://{bound_host}:{bound_port}", flush=True)
    uvicorn.Server(_config(app, sock, max_message_bytes)).run(sockets=[sock])


class ServerThread:
    """A server in a daemon thread of this process, on ``127.0.0.1`` and a free port.

    ``with ServerThread(session_ttl_s=5) as url:`` - ``url`` is ``http://127.0.0.1:PORT``; the
    server stops (its sessions closed) when the block ends. ``app`` gives access to the sessions
    (``app.state.sessions``) for tests.
    """

    def __init__(self, *, startup_timeout_s: float = 30.0, **app_options: Any):
        self.app = create_app(**app_options)
        self._sock = _bind("127.0.0.1", 0)
        max_bytes = app_options.get("max_message_bytes", 8 << 20)
        self._server = uvicorn.Server(_config(self.app, self._sock, max_bytes))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._startup_timeout_s = startup_timeout_s
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the llm-zoo server at {self.url} did not start")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        with contextlib.suppress(OSError):
            self._sock.close()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class ServerProcess:
    """``llm-zoo serve`` in a child process on ``127.0.0.1`` and a free port, killed on exit.

    ``with ServerProcess() as url:``. Extra ``args`` are passed to ``llm-zoo serve``.
    """

    def __init__(self, *args: str, startup_timeout_s: float = 60.0, env: dict[str, str] | None = None):
        self._command = [
            sys.executable,
            "-m",
            "llm_zoo.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            *args,
        ]
        self._startup_timeout_s = startup_timeout_s
        self._env = env
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> str:
        env = dict(os.environ if self._env is None else self._env)
        src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen(
            self._command, stdout=subprocess.PIPE, stderr=None, text=True, env=env, start_new_session=True
        )
        ready = threading.Event()
        lines: list[str] = []

        def read() -> None:
            assert self.process is not None and self.process.stdout is not None
            for line in self.process.stdout:
                if line.startswith(READY_PREFIX) and not ready.is_set():
                    lines.append(line[len(READY_PREFIX) :].strip())
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(self._startup_timeout_s) or not self._wait_listening(lines[0]):
            self.stop()
            raise RuntimeError(
                f"llm-zoo serve did not start within {self._startup_timeout_s:g} s: {self._command}"
            )
        self.url = lines[0]
        return self.url

    def _wait_listening(self, url: str) -> bool:
        host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                return False
            with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=1):
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
