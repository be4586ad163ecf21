"""Rollout envs on ``llm-zoo serve`` servers (config ``env.servers``), or in this process.

:func:`make` is how every rollout and evaluation makes its envs. With no servers configured it is
:func:`llm_zoo.make`; with servers (``configure(["http://host1:8000", "http://host2:8000"])``,
done by :func:`llm_zoo_train.config.validate` in every process of a run) each env is made on the
next server in turn, so a step's envs spread evenly over them, and a server that cannot make an
env (down, full, unreachable) is skipped for the next one, up to ``retries`` rounds over all of
them. Envs play exactly as in-process (``llm_zoo.remote``: same prompts and rewards for the same
seeds and actions), so a run gives the same samples either way. A server that dies mid-episode
has its episodes replayed on the others (rollouts reset with a seed, so the replay is exact) and
they go on there; when none of them can take it, :class:`llm_zoo.remote.RemoteEnvError` names
the dead server and the others' failures.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import llm_zoo
from llm_zoo_train.config.checks import check_env_servers, url_problem

__all__ = [
    "EnvServers",
    "EnvServersUnavailableError",
    "check_envs_answer",
    "configure",
    "configure_env_servers",
    "make",
    "map_envs",
]

T = TypeVar("T")
R = TypeVar("R")


class EnvServers:
    """Makes envs on several servers in turn, skipping those that fail.

    Args:
        urls: The servers.
        retries: Extra rounds over all servers before giving up on making an env.
        timeout_s: Longest wait for one answer of a server (a Code-v0 step runs programs).
        backoff_s: Pause between two rounds.
        connect_timeout_s: Longest wait for a server to open a connection.
        silent_pause_s: A server that did not open a connection is tried last for this long (one
            warning line names it), so the envs of a rollout do not each wait on it in turn: with
            one of two servers stopped, a step of 8 envs waited 4 x 30 s without a word.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        retries: int = 2,
        timeout_s: float = 600.0,
        backoff_s: float = 0.5,
        in_flight_per_server: int = 8,
        connect_timeout_s: float = 10.0,
        silent_pause_s: float = 60.0,
    ):
        if not urls:
            raise ValueError("EnvServers needs at least one server URL")
        for url in urls:
            problem = url_problem(url)
            if problem:
                raise ValueError(problem)
        self.urls = list(urls)
        self.retries = int(retries)
        self.timeout_s = float(timeout_s)
        self.backoff_s = float(backoff_s)
        #: Env calls a rollout keeps waiting on at once, over all servers (see map_envs).
        self.max_in_flight = max(1, int(in_flight_per_server)) * len(self.urls)
        self.connect_timeout_s = float(connect_timeout_s)
        self.silent_pause_s = float(silent_pause_s)
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._silent_until: dict[str, float] = {}

    def _in_turn(self, start: int) -> list[str]:
        """The servers from ``start`` on, those that recently failed to connect last."""
        turn = [self.urls[(start + offset) % len(self.urls)] for offset in range(len(self.urls))]
        now = time.monotonic()
        with self._lock:
            silent = {url for url, until in self._silent_until.items() if until > now}
        return [u for u in turn if u not in silent] + [u for u in turn if u in silent]

    def _connection_failed(self, url: str, err: Exception) -> None:
        with self._lock:
            already = self._silent_until.get(url, 0.0) > time.monotonic()
            self._silent_until[url] = time.monotonic() + self.silent_pause_s
        if not already:
            print(
                f"llm-zoo-train: warning: env server {url} did not open a connection ({err}); "
                f"the others go first for {self.silent_pause_s:g} s",
                file=sys.stderr,
                flush=True,
            )

    def make(self, env_id: str, **kwargs: Any) -> Any:
        from llm_zoo import remote

        with self._lock:
            start = next(self._turn)
        failures: list[str] = []
        for round_index in range(self.retries + 1):
            if round_index:
                time.sleep(self.backoff_s * round_index)
            for url in self._in_turn(start):
                try:
                    others = [u for u in self.urls if u != url]
                    env = remote.make(
                        url,
                        env_id,
                        timeout_s=self.timeout_s,
                        connect_timeout_s=self.connect_timeout_s,
                        failover=others,
                        **kwargs,
                    )
                except remote.RemoteEnvError as err:  # the server, not the env: try the next one
                    failures.append(str(err))
                    if err.connection_lost:
                        self._connection_failed(url, err)
                    continue
                with self._lock:
                    self._silent_until.pop(url, None)
                return env
        raise remote.RemoteEnvError(
            f"no env server could make {env_id} after {self.retries + 1} round(s) over {self.urls}: "
            + " | ".join(failures[-len(self.urls) :])
        )


_servers: EnvServers | None = None


def configure(urls: Sequence[str]) -> None:
    """Make this process's rollout envs on ``urls`` (an empty list: in this process)."""
    global _servers
    _servers = EnvServers(urls) if urls else None


def configure_env_servers(servers: Sequence[str]) -> None:
    """Check ``env.servers`` (a :class:`ConfigError` names what is wrong) and make this process's
    rollout envs there."""
    check_env_servers(servers)
    configure(list(servers))


def make(env_id: str, **kwargs: Any) -> Any:
    """An env for a rollout: on the configured servers, else ``llm_zoo.make``."""
    if _servers is None:
        return llm_zoo.make(env_id, **kwargs)
    return _servers.make(env_id, **kwargs)


def map_envs(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[fn(x) for x in items]``, where each call steps its own envs: in order in this process
    when envs are in-process, in threads when they are on servers (each call then mostly waits
    on its server, so the servers work at once). Results keep the order of ``items``, and the
    first exception is raised, as in the loop."""
    if _servers is None or len(items) < 2:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(len(items), _servers.max_in_flight)) as pool:
        return list(pool.map(fn, items))


class EnvServersUnavailableError(RuntimeError):
    """Configured env servers did not make or reset the run's env (one line, naming them)."""


#: How long the start-up check waits for each server's answer: a server that stops answering is
#: named within this, not after a rollout's 600 s timeout.
STARTUP_CHECK_TIMEOUT_S = 30.0


def check_envs_answer(
    env_id: str, kwargs_list: Sequence[Mapping[str, Any]], *, timeout_s: float = STARTUP_CHECK_TIMEOUT_S
) -> None:
    """Make and reset the run's env with each of ``kwargs_list`` (training and evaluation
    arguments) on every configured server, each within ``timeout_s``, before a run may delete an
    earlier one; with no servers configured, nothing to check (in-process envs were made by the
    config's validation). Raises :class:`EnvServersUnavailableError` naming every server that did
    not answer, and why."""
    if _servers is None:
        return
    from llm_zoo import remote

    failures: list[str] = []
    for url in _servers.urls:
        for kwargs in kwargs_list:
            env = None
            try:
                env = remote.make(
                    url, env_id, timeout_s=timeout_s, connect_timeout_s=timeout_s, **dict(kwargs)
                )
                env.reset(seed=0)
            except Exception as err:  # unreachable, refused (token, arguments, env id), or the env failed
                failures.append(
                    f"{url}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                )
                break
            finally:
                if env is not None:
                    with contextlib.suppress(Exception):
                        env.close()
    if failures:
        raise EnvServersUnavailableError(
            f"{len(failures)} of {len(_servers.urls)} env server(s) in env.servers did not make and reset "
            f"{env_id} within {timeout_s:g} s, so nothing was started or deleted: " + "; ".join(failures)
        )
