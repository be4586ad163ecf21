"""``llm-zoo serve`` under load and faults: many clients, one client's slow steps beside others'
cheap ones, and a server killed under its clients.

    python benchmarks/env_server_load.py                     # 64 clients, 120 slow steps, a kill
    python benchmarks/env_server_load.py --quick --output /tmp/x.json   # smoke run, seconds

Every phase runs ``llm-zoo serve`` child processes started with two tokens, so each token is a
client of its own for the server's per-client limits (``llm_zoo.serve.limits``), and plays
through ``llm_zoo.remote``, as a trainer's ``env.servers`` do.

* **Many clients.** ``--clients`` sessions (half per token), each on its own thread, step
  PlanPath-v0 for ``--seconds``: steps per second, each step's latency (p50, p99, max), errors,
  the server's resident memory before and after, and the sessions left once all closed.
* **Slow-env mix.** Client A holds ``--slow-steps`` Code-v0 sessions whose coder answers a program
  that busy-loops until the sandbox's timeout; meanwhile client B steps PlanPath-v0 on
  ``--cheap-clients`` sessions. Reported: B's step latencies (the target: none over 2 s) and A's
  slow steps finished.
* **A server killed.** ``--clients`` sessions spread over two servers; one server is SIGKILLed in
  the middle. Each client whose server died must get a ``RemoteEnvError`` (never a hang), then
  makes its env again on the server left and plays on: the time from the kill to each client's
  error, and the steps played after the kill.

Figures depend on the machine's free cores; the load average is recorded at the start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from _common import RESULTS_DIR, bar_chart, finish, run_facts

from llm_zoo import remote
from llm_zoo.serve import ServerProcess

CHEAP_ACTION = '#### ["R", "D"]'
#: A coder's answer that spins until the sandbox's timeout, whatever function the problem asks for.
BUSY_LOOP = "```python\n# {tag}\nwhile True:\n    pass\n```"


def _latencies(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    if not ordered:
        return {"steps": 0}
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "steps": len(ordered),
        "p50_ms": round(1000 * at(0.50), 2),
        "p99_ms": round(1000 * at(0.99), 2),
        "max_ms": round(1000 * ordered[-1], 2),
        "over_2_s": sum(v > 2.0 for v in ordered),
    }


def _resident_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _health(url: str, token: str) -> dict[str, Any]:
    request = urllib.request.Request(f"{url}/health", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def _server_pid(server: ServerProcess) -> int:
    assert server.process is not None
    return server.process.pid


def _play_cheap(url: str, token: str, until: float, latencies: list[float], errors: list[str]) -> None:
    """Step PlanPath-v0 until ``until``, resetting when an episode ends."""
    try:
        with remote.make(url, "PlanPath-v0", token=token) as env:
            episode = 0
            env.reset(seed=episode)
            while time.monotonic() < until:
                start = time.monotonic()
                env.step(CHEAP_ACTION)
                latencies.append(time.monotonic() - start)
                if not env.agents or all(env.terminations.values()) or all(env.truncations.values()):
                    episode += 1
                    env.reset(seed=episode)
    except Exception as err:  # a figure of this benchmark, never a crash of it
        errors.append(f"{type(err).__name__}: {str(err)[:160]}")


def many_clients(url: str, pid: int, tokens: list[str], clients: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors: list[str] = []
    memory_before = _resident_mib(pid)
    until = time.monotonic() + seconds
    start = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        for index in range(clients):
            pool.submit(_play_cheap, url, tokens[index % 2], until, latencies, errors)
    wall = time.monotonic() - start
    health = _health(url, tokens[0])
    return {
        "clients": clients,
        "seconds": round(wall, 2),
        "steps_per_s": round(len(latencies) / wall, 1),
        "latency": _latencies(latencies),
        "errors": len(errors),
        "error_examples": errors[:3],
        "server_mib_before": memory_before,
        "server_mib_after": _resident_mib(pid),
        "sessions_left": health.get("sessions"),
    }


def _play_slow(url: str, token: str, seed: int, until: float, held: list[Any], done: list[float],
               errors: list[str]) -> None:  # fmt: skip
    """Step Code-v0 with a spinning program until ``until``; ``held`` gets the env, so the caller
    can close it under a running step (the server then starts no more of its programs)."""
    try:
        env = remote.make(url, "Code-v0", token=token, timeout_s=600)
        held.append(env)
        while time.monotonic() < until:
            env.reset(seed=seed)
            start = time.monotonic()
            env.step(BUSY_LOOP.format(tag=secrets.token_hex(4)))
            done.append(time.monotonic() - start)
    except remote.RemoteEnvError as err:
        if time.monotonic() < until:  # after it, the caller closed the connection on purpose
            errors.append(f"{type(err).__name__}: {str(err)[:160]}")


def slow_mix(
    url: str, tokens: list[str], slow_steps: int, cheap_clients: int, seconds: float
) -> dict[str, Any]:
    slow_done: list[float] = []
    slow_errors: list[str] = []
    held: list[Any] = []
    latencies: list[float] = []
    errors: list[str] = []
    until = time.monotonic() + seconds
    with ThreadPoolExecutor(slow_steps) as slow_pool:
        for seed in range(slow_steps):
            slow_pool.submit(_play_slow, url, tokens[0], seed, until, held, slow_done, slow_errors)
        time.sleep(min(2.0, seconds / 4))  # the slow steps are running before B's first step
        with ThreadPoolExecutor(cheap_clients) as cheap_pool:
            for _ in range(cheap_clients):
                cheap_pool.submit(_play_cheap, url, tokens[1], until, latencies, errors)
        for env in list(held):  # steps still running: their client leaves
            env.close()
    return {
        "slow_sessions": slow_steps,
        "slow_steps_done": len(slow_done),
        "slow_step_mean_s": round(statistics.mean(slow_done), 1) if slow_done else None,
        "slow_errors": len(slow_errors),
        "cheap_clients": cheap_clients,
        "cheap": _latencies(latencies),
        "cheap_errors": len(errors),
        "error_examples": (errors + slow_errors)[:3],
    }


def _play_through_a_kill(
    urls: list[str], home: int, token: str, until: float, killed_at: list[float], record: dict[str, Any]
) -> None:
    """Play on ``urls[home]``; when it fails, note when, then play on the other server."""
    current = home
    while time.monotonic() < until:
        try:
            with remote.make(urls[current], "PlanPath-v0", token=token) as env:
                env.reset(seed=0)
                while time.monotonic() < until:
                    env.step(CHEAP_ACTION)
                    if killed_at and current != home:
                        record["steps_after_kill"] += 1
                    if not env.agents or all(env.terminations.values()) or all(env.truncations.values()):
                        env.reset(seed=0)
            return
        except remote.RemoteEnvError as err:
            if current != home or not killed_at:
                record["unexpected"].append(str(err)[:160])
                return
            record["seconds_to_error"].append(time.monotonic() - killed_at[0])
            current = 1 - home


def server_killed(servers: list[ServerProcess], urls: list[str], tokens: list[str], clients: int,
                  seconds: float) -> dict[str, Any]:  # fmt: skip
    killed_at: list[float] = []
    record: dict[str, Any] = {"seconds_to_error": [], "steps_after_kill": 0, "unexpected": []}
    until = time.monotonic() + seconds
    with ThreadPoolExecutor(clients) as pool:
        futures = [
            pool.submit(
                _play_through_a_kill, urls, index % 2, tokens[index // 2 % 2], until, killed_at, record
            )
            for index in range(clients)
        ]
        time.sleep(seconds / 3)
        killed_at.append(time.monotonic())
        os.kill(_server_pid(servers[0]), signal.SIGKILL)
        hung = [f for f in futures if not _finished_within(f, until + 60 - time.monotonic())]
    waits = sorted(record["seconds_to_error"])
    return {
        "clients": clients,
        "clients_on_the_killed_server": (clients + 1) // 2,
        "clients_that_got_an_error": len(waits),
        "seconds_to_error_max": round(waits[-1], 2) if waits else None,
        "seconds_to_error_median": round(statistics.median(waits), 2) if waits else None,
        "steps_after_kill_on_the_other_server": record["steps_after_kill"],
        "unexpected_errors": len(record["unexpected"]),
        "error_examples": record["unexpected"][:3],
        "clients_hung": len(hung),
    }


def _finished_within(future: Any, timeout_s: float) -> bool:
    try:
        future.result(timeout=max(0.0, timeout_s))
        return True
    except Exception:
        return future.done()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--slow-steps", type=int, default=120)
    parser.add_argument("--cheap-clients", type=int, default=4)
    parser.add_argument("--slow-seconds", type=float, default=40.0)
    parser.add_argument("--quick", action="store_true", help="smoke run: 8 clients, 8 slow steps, 4 s each")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "env_server_load.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.seconds, args.slow_steps, args.cheap_clients, args.slow_seconds = 8, 4.0, 8, 2, 6.0
    facts = run_facts(__file__, argv)
    tokens = [secrets.token_hex(16), secrets.token_hex(16)]
    results: dict[str, Any] = {**facts, "quick": args.quick}
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        token_file = Path(folder) / "tokens"
        token_file.write_text("\n".join(tokens) + "\n")
        servers = [ServerProcess("--token-file", str(token_file)) for _ in range(2)]
        urls = [stack.enter_context(server) for server in servers]
        results["many_clients"] = many_clients(
            urls[1], _server_pid(servers[1]), tokens, args.clients, args.seconds
        )
        print(f"many clients: {results['many_clients']}")
        results["slow_mix"] = slow_mix(
            urls[1], tokens, args.slow_steps, args.cheap_clients, args.slow_seconds
        )
        print(f"slow mix: {results['slow_mix']}")
        results["server_killed"] = server_killed(servers, urls, tokens, args.clients, args.seconds)
        print(f"server killed: {results['server_killed']}")
    finish(results, args.output, lambda png: plot(results, png))
    return 0


def plot(results: dict[str, Any], png: Path) -> None:
    """Step latencies of the many-clients phase and of the cheap client beside the slow steps."""
    many, cheap = results["many_clients"]["latency"], results["slow_mix"]["cheap"]
    labels = ["p50", "p99", "max"]
    series = {
        f"{results['many_clients']['clients']} clients, PlanPath-v0": [
            many.get(f"{k}_ms", 0) for k in labels
        ],
        f"cheap steps beside {results['slow_mix']['slow_sessions']} slow Code-v0 steps": [
            cheap.get(f"{k}_ms", 0) for k in labels
        ],
    }
    bar_chart(png, "llm-zoo serve: step latency under load", labels, series, "ms", target=2000, log=True)


if __name__ == "__main__":
    sys.exit(main())
