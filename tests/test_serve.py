"""``llm-zoo serve``: OpenEnv's client plays every built-in env; bad input gets a protocol error
naming the problem and leaves no session behind."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
websockets_client = pytest.importorskip("websockets.sync.client")

import llm_zoo  # noqa: E402
from llm_zoo import remote  # noqa: E402
from llm_zoo.serve import ServerProcess, ServerThread  # noqa: E402
from toy_envs import KeywordEnv  # noqa: E402

llm_zoo.register(
    "test/ServeKeyword-v0", KeywordEnv, description="toy env for the server tests", override=True
)

BUILTIN = ("PlanPath-v0", "Sokoban-v0", "Code-v0", "Math-v0")


@pytest.fixture(scope="module")
def thread_server():
    thread = ServerThread(session_ttl_s=60, max_sessions=16, max_message_bytes=1 << 20)
    with thread as url:
        yield thread, url


def wait_for_no_sessions(thread, timeout_s: float = 10.0) -> int:
    deadline = time.monotonic() + timeout_s
    while len(thread.app.state.sessions) and time.monotonic() < deadline:
        time.sleep(0.02)
    return len(thread.app.state.sessions)


def ws(url: str, path: str = "/ws"):
    connection = websockets_client.connect(
        url.replace("http://", "ws://") + path, open_timeout=10, max_size=None
    )
    return connection.__enter__()  # the same with websockets' current and future connect()


def ask(conn, kind: str, data: dict | None = None) -> dict:
    conn.send(json.dumps({"type": kind, "data": data or {}}))
    return json.loads(conn.recv(timeout=60))


def scripted(agent: str, turn: int) -> str:
    return f"{agent} answer {turn}: #### [1, 2]"


def in_process_rewards(env_id: str, seed: int) -> list:
    env = llm_zoo.make(env_id)
    env.reset(seed=seed)
    rewards = []
    for turn, agent in enumerate(env.agent_iter()):
        _, _, termination, truncation, _ = env.last()
        if termination or truncation:
            env.step(None)
            continue
        env.step(scripted(agent, turn))
        rewards.append((agent, env.rewards[agent]))
    return rewards


def play_with_openenv(url: str, env_id: str, seed: int = 3) -> tuple[list, dict]:
    """One episode of ``env_id`` played by OpenEnv's own client: ``[(agent, reward)]`` and the state."""
    generic = pytest.importorskip("openenv.core.generic_client")
    played = []
    with generic.GenericEnvClient(base_url=f"{url}/envs/{env_id}").sync() as client:
        result = client.reset(seed=seed)
        turn = 0
        while not result.done:
            agent = result.observation["agent"]
            assert result.observation["prompt"]
            result = client.step({"text": scripted(agent, turn)})
            played.append((agent, result.reward))
            turn += 1
        state = client.state()
    return played, state


@pytest.mark.parametrize("env_id", BUILTIN)
def test_openenv_client_plays_each_builtin_env(thread_server, env_id):
    thread, url = thread_server
    played, state = play_with_openenv(url, env_id)
    assert played == in_process_rewards(env_id, 3)
    assert state["step_count"] == len(played) and state["env_id"] == env_id
    assert wait_for_no_sessions(thread) == 0


def test_unknown_env_and_bad_kwargs_name_the_problem_and_leave_no_session(thread_server):
    thread, url = thread_server
    with ws(url) as conn:
        reply = ask(conn, "make", {"env_id": "Nope-v0"})
        assert reply["type"] == "error" and reply["data"]["code"] == "FACTORY_ERROR"
        assert "Nope-v0" in reply["data"]["message"] and "PlanPath-v0" in reply["data"]["message"]
        reply = ask(conn, "make", {"env_id": "PlanPath-v0", "kwargs": {"bogus": 1}})
        assert reply["data"]["code"] == "FACTORY_ERROR" and "bogus" in reply["data"]["message"]
        reply = ask(conn, "make", {"env_id": "PlanPath-v0", "kwargs": {"rows": "many"}})
        assert reply["type"] == "error" and "rows" in reply["data"]["message"]
        assert len(thread.app.state.sessions) == 0
        reply = ask(conn, "reset", {"seed": 0})  # nothing made: say so
        assert reply["data"]["code"] == "SESSION_ERROR" and "make" in reply["data"]["message"]
        # an OpenEnv client on the root URL is told where the envs are (issue 52)
        assert "/envs/ENV_ID" in reply["data"]["message"] and "PlanPath-v0" in reply["data"]["message"]
    with ws(url, "/envs/Nope-v0/ws") as conn:
        reply = ask(conn, "reset", {"seed": 0})
        assert reply["data"]["code"] == "FACTORY_ERROR" and "Nope-v0" in reply["data"]["message"]
    assert wait_for_no_sessions(thread) == 0


def test_malformed_frames_get_errors_and_the_session_goes_on(thread_server):
    _, url = thread_server
    with ws(url, "/envs/test/ServeKeyword-v0/ws") as conn:
        assert ask(conn, "reset", {"seed": 1})["type"] == "observation"
        conn.send("{not json")
        assert json.loads(conn.recv(timeout=10))["data"]["code"] == "INVALID_JSON"
        conn.send("[1, 2]")
        assert json.loads(conn.recv(timeout=10))["data"]["code"] == "INVALID_JSON"
        conn.send(b"\xff\xfe binary")
        assert json.loads(conn.recv(timeout=10))["data"]["code"] == "INVALID_JSON"
        reply = ask(conn, "jump")
        assert reply["data"]["code"] == "UNKNOWN_TYPE" and "step" in reply["data"]["message"]
        for bad in ({}, {"text": 3}, {"action": "x"}, {"text": "apple", "agent": "bob"}):
            reply = ask(conn, "step", bad)
            assert reply["data"]["code"] == "VALIDATION_ERROR", bad
        assert ask(conn, "reset", {"seed": "zero"})["data"]["code"] == "VALIDATION_ERROR"
        assert ask(conn, "observe", {"agent": "carol"})["data"]["code"] == "VALIDATION_ERROR"
        reply = ask(conn, "step", {"text": "apple"})  # the session still works
        assert reply["type"] == "observation" and reply["data"]["reward"] == 1.0


def test_deeply_nested_json_gets_an_error_frame_and_a_4xx(thread_server):
    """Issue 52: deeply nested JSON closed the WebSocket with no error frame, and HTTP /reset
    answered 500 (the parser's RecursionError)."""
    _, url = thread_server
    deep = "[" * 100_000 + "]" * 100_000
    nested_kwargs = json.dumps(
        {
            "type": "make",
            "data": {"env_id": "PlanPath-v0", "kwargs": {"rows": json.loads("[" * 80 + "]" * 80)}},
        }
    )
    with ws(url, "/envs/test/ServeKeyword-v0/ws") as conn:
        for frame in (
            deep,
            json.dumps({"type": "reset", "data": {"seed": 0, "options": json.loads("[" * 200 + "]" * 200)}}),
            nested_kwargs,
        ):
            conn.send(frame)
            reply = json.loads(conn.recv(timeout=10))
            assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_JSON"
            assert "deeper than 64 levels" in reply["data"]["message"]
        assert ask(conn, "reset", {"seed": 1})["type"] == "observation"  # the session goes on
    host, port = url.rsplit("/", 1)[-1].split(":")
    conn_http = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn_http.request(
            "POST", "/envs/PlanPath-v0/reset", body=deep, headers={"Content-Type": "application/json"}
        )
        response = conn_http.getresponse()
        assert response.status == 400 and "deeper than 64" in json.loads(response.read())["detail"]
    finally:
        conn_http.close()


def test_step_after_the_end_is_refused(thread_server):
    _, url = thread_server
    with ws(url, "/envs/test/ServeKeyword-v0/ws") as conn:
        ask(conn, "reset", {"seed": 0})
        ask(conn, "step", {"text": "apple"})
        reply = ask(conn, "step", {"text": "banana"})
        assert reply["data"]["done"] is True
        reply = ask(conn, "step", {"text": "more"})
        assert reply["type"] == "error" and reply["data"]["code"] == "EXECUTION_ERROR"
        assert "step after the end" in reply["data"]["message"]
        while ask(conn, "state")["data"]["agents"]:  # PettingZoo's dead steps empty the agents
            assert ask(conn, "step", {"text": None})["type"] == "observation"
        reply = ask(conn, "step", {"text": None})
        assert reply["data"]["code"] == "EXECUTION_ERROR" and "step after the end" in reply["data"]["message"]
        assert ask(conn, "reset", {"seed": 0})["type"] == "observation"


def test_oversized_frame_and_body_are_refused_and_leave_no_session(thread_server):
    thread, url = thread_server
    huge = "x" * (100 << 20)  # 100 MB
    conn = ws(url)
    try:
        assert ask(conn, "make", {"env_id": "test/ServeKeyword-v0"})["type"] == "session"
        with pytest.raises(Exception) as caught:
            conn.send(json.dumps({"type": "step", "data": {"text": huge}}))
            conn.recv(timeout=30)
        assert (
            "1009" in str(caught.value)
            or "too big" in str(caught.value).lower()
            or isinstance(caught.value, OSError)
        )
    finally:
        conn.close()
    assert wait_for_no_sessions(thread) == 0
    # A 100 MB HTTP body: refused from its Content-Length, before the server reads it.
    host, port = url.rsplit("/", 1)[-1].split(":")
    conn_http = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn_http.putrequest("POST", "/envs/PlanPath-v0/reset")
        conn_http.putheader("Content-Type", "application/json")
        conn_http.putheader("Content-Length", str(len(huge)))
        conn_http.endheaders()
        conn_http.send(huge[: 1 << 16].encode())
        response = conn_http.getresponse()
        assert response.status == 413
        assert "exceeds" in json.loads(response.read())["detail"]
    finally:
        conn_http.close()
    assert wait_for_no_sessions(thread) == 0


def test_dropped_connection_leaves_no_session(thread_server):
    thread, url = thread_server
    conn = ws(url)
    assert ask(conn, "make", {"env_id": "test/ServeKeyword-v0"})["type"] == "session"
    assert ask(conn, "reset", {"seed": 0})["type"] == "observation"
    assert ask(conn, "clone")["type"] == "session"  # a detached clone, never attached
    assert len(thread.app.state.sessions) == 2
    conn.socket.shutdown(socket.SHUT_RDWR)  # no close frame: the client vanished
    conn.socket.close()
    # the clone nobody attached to ends with the connection that made it (issue 52: clones outlived
    # their connection for the whole TTL, so one client could hold every slot)
    assert wait_for_no_sessions(thread) == 0


def test_one_connection_cannot_fill_the_server_with_clones():
    """Issue 52: one connection made 963 clones in 0.6 s and filled all 1,024 slots for 600 s."""
    thread = ServerThread(max_sessions=200)
    with thread as url, ws(url) as conn:
        assert ask(conn, "make", {"env_id": "test/ServeKeyword-v0"})["type"] == "session"
        replies = [ask(conn, "clone") for _ in range(70)]
        made = [r["data"]["session_id"] for r in replies if r["type"] == "session"]
        refused = [r for r in replies if r["type"] == "error"]
        assert len(made) == 64 and refused and refused[0]["data"]["code"] == "CAPACITY_REACHED"
        with ws(url) as other:  # an attached clone belongs to its new connection: it is kept
            assert ask(other, "attach", {"session_id": made[0]})["type"] == "session"
            assert ask(conn, "clone")["type"] == "session"  # the attached one no longer counts
            conn.close()
            deadline = time.monotonic() + 10
            while len(thread.app.state.sessions) > 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(thread.app.state.sessions) == 1  # only the attached clone is left
            assert ask(other, "reset", {"seed": 0})["type"] == "observation"
        assert wait_for_no_sessions(thread) == 0


def test_sessions_expire_after_their_ttl():
    thread = ServerThread(session_ttl_s=0.3)
    with thread as url, ws(url) as conn:
        assert ask(conn, "make", {"env_id": "test/ServeKeyword-v0"})["type"] == "session"
        assert ask(conn, "clone")["type"] == "session"
        assert len(thread.app.state.sessions) == 2
        assert wait_for_no_sessions(thread, timeout_s=5) == 0
        reply = ask(conn, "reset", {"seed": 0})
        assert reply["data"]["code"] == "SESSION_ERROR" and "expired" in reply["data"]["message"]


def test_capacity_is_bounded():
    thread = ServerThread(max_sessions=1)
    with thread as url, ws(url) as first, ws(url) as second:
        assert ask(first, "make", {"env_id": "test/ServeKeyword-v0"})["type"] == "session"
        reply = ask(second, "make", {"env_id": "test/ServeKeyword-v0"})
        assert reply["data"]["code"] == "CAPACITY_REACHED"
        assert ask(first, "clone")["data"]["code"] == "CAPACITY_REACHED"


def test_http_endpoints(thread_server):
    _, url = thread_server
    with urllib.request.urlopen(f"{url}/health", timeout=10) as response:
        assert json.loads(response.read())["status"] == "healthy"
    body = json.dumps({"seed": 4}).encode()
    with urllib.request.urlopen(
        urllib.request.Request(f"{url}/envs/PlanPath-v0/reset", data=body), timeout=30
    ) as r:
        payload = json.loads(r.read())
    env = llm_zoo.make("PlanPath-v0")
    env.reset(seed=4)
    assert payload["observation"]["prompt"] == env.observe(env.agent_selection)["prompt"]
    assert payload["done"] is False and payload["reward"] is None
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(f"{url}/step", data=b'{"action": {}}'), timeout=10)
    assert refused.value.code == 400 and "/ws" in json.loads(refused.value.read())["detail"]
    with urllib.request.urlopen(f"{url}/schema", timeout=10) as response:
        assert "text" in json.loads(response.read())["action"]["properties"]


def test_cli_serve_in_a_child_process():
    """The issue's acceptance check as worded: `llm-zoo serve` in its own process, and OpenEnv's
    client plays an episode of each built-in env on it, with the in-process rewards."""
    with ServerProcess("--session-ttl", "30") as url:
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(f"{url}/envs", timeout=10) as response:
            assert "Code-v0" in json.loads(response.read())["envs"]
        for env_id in BUILTIN:
            played, _ = play_with_openenv(url, env_id, seed=5)
            assert played == in_process_rewards(env_id, 5), env_id


def test_openenv_reset_passes_constructor_arguments(thread_server):
    _, url = thread_server
    with ws(url, "/envs/PlanPath-v0/ws") as conn:
        steps = []
        for max_turns in (1, 2, 2):
            reply = ask(conn, "reset", {"seed": 0, "env_kwargs": {"max_turns": max_turns}})
            count = 0
            while not reply["data"]["done"]:
                reply = ask(conn, "step", {"text": "no move"})
                count += 1
            steps.append(count)
        assert steps == [2, 4, 4]  # one step per agent per turn
        reply = ask(conn, "reset", {"seed": 0, "env_kwargs": {"max_turns": 0}})
        assert reply["data"]["code"] == "FACTORY_ERROR" and "max_turns" in reply["data"]["message"]


def _python(code: str) -> subprocess.CompletedProcess:
    src = str(Path(__file__).resolve().parents[1] / "src")
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": src},
    )


def test_the_server_stack_is_imported_only_when_serving():
    done = _python(
        "import sys, llm_zoo, llm_zoo.remote, llm_zoo.serve, llm_zoo.cli\n"
        "heavy = [m for m in ('starlette', 'uvicorn', 'websockets') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    assert done.returncode == 0, done.stderr


def test_serve_without_the_extra_says_how_to_install_it():
    done = _python(
        "import sys; sys.modules['uvicorn'] = None\n"
        "from llm_zoo.cli import main\n"
        "sys.exit(main(['serve', '--port', '0']))\n"
    )
    assert done.returncode == 2
    assert "pip install 'llm-zoo[serve]'" in done.stderr


class SlowKeywordEnv(KeywordEnv):
    """KeywordEnv whose step sleeps 2 s when told "slow" (a Code-v0 step running programs)."""

    def _act(self, agent, action):
        if action == "slow":
            time.sleep(2.0)
        return super()._act(agent, action)


llm_zoo.register("test/ServeSlow-v0", SlowKeywordEnv, description="a slow toy env", override=True)


def test_slow_steps_of_others_do_not_delay_a_cheap_step():
    """Issue 52: all env calls shared asyncio's default pool (6 threads on 2 CPUs); six slow steps
    held a cheap step for 95 s."""
    import threading

    with ServerThread() as url:
        slow = [ws(url, "/envs/test/ServeSlow-v0/ws") for _ in range(12)]
        cheap = ws(url, "/envs/test/ServeKeyword-v0/ws")
        try:
            for conn in [*slow, cheap]:
                assert ask(conn, "reset", {"seed": 0})["type"] == "observation"
            threads = [threading.Thread(target=ask, args=(conn, "step", {"text": "slow"})) for conn in slow]
            for thread in threads:
                thread.start()
            time.sleep(0.3)  # the 12 slow steps are running
            start = time.monotonic()
            assert ask(cheap, "step", {"text": "apple"})["type"] == "observation"
            assert time.monotonic() - start < 1.8  # the pool of 6 made it wait for two rounds of 2-s steps
            for thread in threads:
                thread.join()
        finally:
            for conn in [*slow, cheap]:
                conn.close()


def test_one_clients_slow_steps_leave_threads_for_the_others():
    """Issue 52: one client with more slow steps than the server has env threads held another
    client's cheap step 14.7 s (outside load test). With several tokens a client runs at most half
    the threads at once: here 2 of 4, so its 4 slow steps take two rounds and the other's cheap step
    runs at once."""
    import threading

    tokens = ["client-a-token-0123456789abcdef", "client-b-token-0123456789abcdef"]

    def ws_as(url: str, path: str, token: str):
        connection = websockets_client.connect(
            url.replace("http://", "ws://") + path, open_timeout=10, max_size=None,
            additional_headers={"Authorization": f"Bearer {token}"},
        )  # fmt: skip
        return connection.__enter__()

    with ServerThread(token=tokens, env_threads=4) as url:
        slow = [ws_as(url, "/envs/test/ServeSlow-v0/ws", tokens[0]) for _ in range(4)]
        cheap = ws_as(url, "/envs/test/ServeKeyword-v0/ws", tokens[1])
        try:
            for conn in [*slow, cheap]:
                assert ask(conn, "reset", {"seed": 0})["type"] == "observation"
            started = time.monotonic()
            threads = [threading.Thread(target=ask, args=(conn, "step", {"text": "slow"})) for conn in slow]
            for thread in threads:
                thread.start()
            time.sleep(0.3)  # client A's first two slow steps run, two wait without a thread
            start = time.monotonic()
            assert ask(cheap, "step", {"text": "apple"})["type"] == "observation"
            assert time.monotonic() - start < 1.5  # all 4 threads held by A: about 1.7 s more
            for thread in threads:
                thread.join()
            assert time.monotonic() - started > 3.9  # A's steps ran two at a time (2 s each)
        finally:
            for conn in [*slow, cheap]:
                conn.close()


class ProgramsStepEnv(KeywordEnv):
    """KeywordEnv whose "programs" step runs 12 half-second sandboxed programs on 2 servers (a
    Code-v0 step running a program once per test), recording their results in RAN."""

    RAN: list = []

    def _act(self, agent, action):
        if action == "programs":
            from llm_zoo import sandbox

            with sandbox.Sandbox(workers=2) as box:
                ProgramsStepEnv.RAN.extend(box.run_many([sandbox.Job("import time\ntime.sleep(0.5)")] * 12))
        if action == "long program":
            from llm_zoo import sandbox

            with sandbox.Sandbox(workers=1) as box:
                ProgramsStepEnv.RAN.append(box.run("import time\ntime.sleep(60)", timeout=120))
        return super()._act(agent, action)


llm_zoo.register(
    "test/ServePrograms-v0", ProgramsStepEnv, description="a step that runs programs", override=True
)


def test_a_client_gone_mid_step_starts_no_more_programs():
    """Issue 52: a client that disconnected mid-step left its step starting sandboxed programs for
    8 s. Here the step's 12 programs go to 2 servers in 4 chunks of 3; the client leaves while the
    first two chunks run, so the other two are never started."""
    from llm_zoo.sandbox import CANCELLED

    ProgramsStepEnv.RAN.clear()
    with ServerThread() as url:
        conn = ws(url, "/envs/test/ServePrograms-v0/ws")
        assert ask(conn, "reset", {"seed": 0})["type"] == "observation"
        conn.send(json.dumps({"type": "step", "data": {"text": "programs"}}))
        time.sleep(0.3)
        conn.close()
        deadline = time.monotonic() + 30
        while len(ProgramsStepEnv.RAN) < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
    errors = [result.error for result in ProgramsStepEnv.RAN]
    assert len(errors) == 12
    assert errors.count(CANCELLED) >= 3, errors  # at least one chunk never started
    assert all(error in (None, CANCELLED) for error in errors), errors


def test_a_remote_env_closed_mid_step_stops_its_running_program_and_its_session():
    """``RemoteEnv.close()`` says "close" before it disconnects; the server took that frame for one
    to answer after the step, never noticed the client had left, and let the step's programs run to
    their limits (an abandoned client's next make waited 157 s). Now the running program is killed
    and the session ends within seconds."""
    from llm_zoo.sandbox import CANCELLED

    ProgramsStepEnv.RAN.clear()
    thread = ServerThread()
    with thread as url:
        env = remote.make(url, "test/ServePrograms-v0")
        env.reset(seed=0)

        def step() -> None:
            with contextlib.suppress(remote.RemoteEnvError):  # its connection was closed under it
                env.step("long program")

        stepping = threading.Thread(target=step)
        stepping.start()
        time.sleep(1.0)  # the program runs
        closed_at = time.monotonic()
        env.close()
        deadline = closed_at + 10
        while not ProgramsStepEnv.RAN and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ProgramsStepEnv.RAN and ProgramsStepEnv.RAN[0].error == CANCELLED, ProgramsStepEnv.RAN
        assert time.monotonic() - closed_at < 5
        assert wait_for_no_sessions(thread) == 0
        stepping.join(timeout=10)


def test_frames_sent_while_a_step_runs_are_answered_after_it_in_order():
    """The server reads the next frame while a step runs (to notice a client that leaves); a frame
    that comes meanwhile is answered after the step, none is lost, a failing step included."""
    with ServerThread() as url:
        conn = ws(url, "/envs/test/ServeSlow-v0/ws")
        try:
            assert ask(conn, "reset", {"seed": 0})["type"] == "observation"
            conn.send(json.dumps({"type": "step", "data": {"text": "slow"}}))
            conn.send(json.dumps({"type": "state", "data": {}}))
            conn.send(json.dumps({"type": "step", "data": {"text": 7}}))  # not a string: an error frame
            conn.send(json.dumps({"type": "state", "data": {}}))
            replies = [json.loads(conn.recv(timeout=30)) for _ in range(4)]
            assert [r["type"] for r in replies] == ["observation", "state", "error", "state"], replies
            assert replies[1]["data"]["step_count"] == 1 == replies[3]["data"]["step_count"]
        finally:
            conn.close()


def test_a_retried_reset_with_the_same_episode_id_is_the_same_episode(thread_server):
    """OpenEnv's reset(seed, episode_id): a client that lost a reset's answer and sends it again gets
    the same episode (no second reset); a new episode id, or a reset after a step, starts anew."""
    _, url = thread_server
    conn = ws(url, "/envs/test/ServeKeyword-v0/ws")
    try:
        first = ask(conn, "reset", {"seed": 1, "episode_id": "ep-1"})
        made = ask(conn, "state")["data"]
        again = ask(conn, "reset", {"seed": 1, "episode_id": "ep-1"})
        assert again == first and ask(conn, "state")["data"] == made
        assert made["episode_id"] == "ep-1" and made["step_count"] == 0
        ask(conn, "step", {"text": "apple"})
        after_step = ask(conn, "reset", {"seed": 1, "episode_id": "ep-1"})  # a new episode, same seed
        assert ask(conn, "state")["data"]["step_count"] == 0 and after_step["data"] == first["data"]
        other = ask(conn, "reset", {"seed": 2, "episode_id": "ep-2"})
        assert ask(conn, "state")["data"]["episode_id"] == "ep-2" and other["data"] != first["data"]
        unseeded = [ask(conn, "reset", {"episode_id": "ep-3"}) for _ in range(3)]  # no seed: one episode
        assert unseeded[0] == unseeded[1] == unseeded[2]
        bad = ask(conn, "reset", {"seed": 1, "episode_id": ["not", "a", "string"]})
        assert bad["type"] == "error" and "episode_id" in bad["data"]["message"]
    finally:
        conn.close()
