"""Issue 52: ``llm-zoo serve`` with a bearer token serves only clients that send it, and a server
reachable from other machines needs one."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("starlette")
pytest.importorskip("websockets")

from llm_zoo import remote
from llm_zoo.cli import main
from llm_zoo.serve import ServerThread
from llm_zoo.serve.auth import TOKEN_ENV, bind_problem, read_token, read_tokens
from llm_zoo.serve.limits import CONNECTIONS_BEYOND_SESSIONS

TOKEN = "s3cret-token-for-tests-0123456789"


@pytest.fixture(scope="module")
def guarded():
    with ServerThread(token=TOKEN) as url:
        yield url


def test_a_client_without_the_token_is_refused(guarded, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(
        remote.RemoteEnvError, match=r"wants a bearer token \(HTTP 403\)|wants a bearer token \(HTTP 401\)"
    ):
        remote.make(guarded, "PlanPath-v0")
    with pytest.raises(remote.RemoteEnvError, match="refused the bearer token sent"):
        remote.make(guarded, "PlanPath-v0", token="wrong-token-wrong-token")


def test_a_client_with_the_token_plays(guarded, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with remote.make(guarded, "PlanPath-v0", token=TOKEN) as env:
        env.reset(seed=0)
        env.step("#### []")
        copy = env.clone()  # a new connection: it carries the token too
        copy.close()
    monkeypatch.setenv(TOKEN_ENV, TOKEN)  # the environment's token, as env.servers runs use it
    with remote.make(guarded, "Math-v0") as env:
        env.reset(seed=0)


def test_http_endpoints_answer_401_without_the_token(guarded):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{guarded}/health", timeout=10)
    assert refused.value.code == 401
    request = urllib.request.Request(f"{guarded}/health", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200 and json.loads(answer.read())


def test_a_server_others_can_reach_needs_a_token():
    assert bind_problem("127.0.0.1", None, False) is None
    assert bind_problem("localhost", None, False) is None
    assert "has no token" in bind_problem("0.0.0.0", None, False)
    assert bind_problem("0.0.0.0", TOKEN, False) is None
    assert bind_problem("0.0.0.0", None, True) is None


def test_the_command_line_refuses_an_open_server_and_a_short_token(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "--allow-no-token" in capsys.readouterr().err
    short = tmp_path / "token"
    short.write_text("abc\n")
    assert main(["serve", "--token-file", str(short), "--port", "0"]) == 2
    assert "at least 16 characters" in capsys.readouterr().err
    short.write_text(f"# the team's tokens\n{TOKEN}\n")
    assert read_token(short) == TOKEN and read_tokens(short) == (TOKEN,)
    short.write_text(f"{TOKEN}\nshort second\n")  # every line is a token: each must be long enough
    assert main(["serve", "--token-file", str(short), "--port", "0"]) == 2
    assert "token on line 2 must have at least 16 characters" in capsys.readouterr().err
    short.write_text(f"{TOKEN}\n{TOKEN}\n")
    assert main(["serve", "--token-file", str(short), "--port", "0"]) == 2
    assert "each client needs a token of its own" in capsys.readouterr().err
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert read_token(None) == TOKEN


# --------------------------------------------------------------------------- operator-chosen arguments


def test_arguments_naming_a_file_or_raising_a_bound_are_refused_unless_allowed(tmp_path):
    """Issue 52: ``Math-v0 dataset=<server path>`` showed a planted file in the prompt, and Code-v0's
    ``timeout`` could be raised to 600 s by any client."""
    planted = tmp_path / "secret.jsonl"
    planted.write_text(json.dumps({"problem": "the operator's secret", "answer": "1"}) + "\n")
    with ServerThread() as url:
        with pytest.raises(remote.RemoteEnvError, match=r"names a file on the server.*--allow-arg dataset"):
            remote.make(url, "Math-v0", dataset=str(planted))
        with pytest.raises(remote.RemoteEnvError, match=r"raises a resource bound above the server's 3\.0"):
            remote.make(url, "Code-v0", timeout=600)
        with remote.make(url, "Code-v0", timeout=1.0) as env:  # lowering a bound is fine
            env.reset(seed=0)
        with remote.make(url, "Math-v0", dataset="generated") as env:  # a built-in set is not a file
            env.reset(seed=0)
    with ServerThread(allowed_arguments=["dataset"], env_ids=["Math-v0"]) as url:
        with remote.make(url, "Math-v0", dataset=str(planted), split="train") as env:
            env.reset(seed=0)
            assert "the operator's secret" in env.observe(env.agent_selection)["prompt"]
        with pytest.raises(Exception, match="'PlanPath-v0' is not served here; served: Math-v0"):
            remote.make(url, "PlanPath-v0")


def test_the_command_line_names_an_unknown_served_env(capsys):
    assert main(["serve", "--env", "Nope-v0", "--port", "0"]) == 2
    assert "--env Nope-v0: unknown env; registered:" in capsys.readouterr().err


# --------------------------------------------------------------------------- per-client limits


def test_one_client_cannot_take_every_session_from_the_others(monkeypatch):
    """With one token per client, each client holds at most its share (half the server by default):
    a client that fills its share is refused, and another client still gets sessions."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    other = "another-clients-token-0123456789"
    with ServerThread(token=[TOKEN, other], max_sessions=8) as url:
        held = [remote.make(url, "PlanPath-v0", token=TOKEN) for _ in range(4)]
        try:
            with pytest.raises(
                remote.RemoteEnvError, match=r"holds its maximum of 4 sessions, the server's limit per client"
            ):
                remote.make(url, "PlanPath-v0", token=TOKEN)
            with pytest.raises(remote.RemoteEnvError, match="holds its maximum of 4 sessions"):
                held[0].clone()  # clones count against the client that made them
            with remote.make(url, "PlanPath-v0", token=other) as env:
                env.reset(seed=0)
            request = urllib.request.Request(f"{url}/health", headers={"Authorization": f"Bearer {TOKEN}"})
            with urllib.request.urlopen(request, timeout=10) as answer:
                health = json.loads(answer.read())
            assert health["max_sessions"] == 8 and health["max_sessions_per_client"] == 4
            assert health["sessions_of_this_client"] == 4
        finally:
            for env in held:
                env.close()


def test_one_client_cannot_hold_more_connections_than_its_sessions(monkeypatch):
    """Connections that hold no session count too: a client with its sessions' share of connections
    open, plus the room for connections being made or closed, is refused the next handshake with
    HTTP 429 (an outside test held 3,000 idle connections, 160 MB of the server's memory); another
    client still connects, and closing frees the share."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    other = "another-clients-token-0123456789"

    def open_connection(url: str, token: str):
        ws_url = url.replace("http://", "ws://") + "/envs/PlanPath-v0/ws"
        return connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=10)

    def reset(connection) -> dict:
        connection.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        return json.loads(connection.recv(timeout=10))

    with ServerThread(token=[TOKEN, other], max_sessions=8) as url, contextlib.ExitStack() as idle:
        allowed = 4 + CONNECTIONS_BEYOND_SESSIONS  # its share of the 8 sessions, plus the room
        for _ in range(allowed):
            idle.enter_context(open_connection(url, TOKEN))
        with pytest.raises(InvalidStatus) as refused, open_connection(url, TOKEN):
            pass
        assert refused.value.response.status_code == 429
        detail = json.loads(refused.value.response.body)
        assert detail["code"] == "CAPACITY_REACHED", detail
        assert f"maximum of {allowed} connections open" in detail["detail"]
        with pytest.raises(remote.RemoteEnvError, match=r"refused the connection \(HTTP 429\): this client"):
            remote.make(url, "PlanPath-v0", token=TOKEN)
        with open_connection(url, other) as theirs:
            assert reset(theirs)["type"] == "observation"
        idle.close()  # every idle connection: the count falls back below the cap
        deadline = time.monotonic() + 10
        while True:  # the server counts a connection out once it has seen it close
            try:
                with open_connection(url, TOKEN) as again:
                    assert reset(again)["type"] == "observation"
                break
            except InvalidStatus:
                assert time.monotonic() < deadline, "closed connections were never counted out"
                time.sleep(0.05)


def test_the_stock_openenv_client_plays_with_the_token_as_the_url_s_password(guarded, monkeypatch):
    """OpenEnv's GenericEnvClient sends no headers; a URL's credentials travel as HTTP Basic, whose
    password the server takes as the token. A wrong password is refused like a wrong token."""
    generic = pytest.importorskip("openenv.core.generic_client")
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    host = guarded.removeprefix("http://")
    with generic.GenericEnvClient(base_url=f"http://llm-zoo:{TOKEN}@{host}/envs/PlanPath-v0").sync() as env:
        result = env.reset(seed=0)
        assert result.observation["agent"] == "tool_agent" and result.observation["prompt"]
        result = env.step({"text": "#### []"})
        assert result.observation["agent"] == "plan_agent"
    wrong = f"http://llm-zoo:not-the-token-0123456789@{host}/envs/PlanPath-v0"
    with (
        pytest.raises(ConnectionError, match="HTTP 403"),
        generic.GenericEnvClient(base_url=wrong).sync() as env,
    ):
        env.reset(seed=0)


def test_http_basic_credentials_carry_the_token_and_nothing_else_passes(guarded):
    import base64

    def health(authorization: str) -> int:
        request = urllib.request.Request(f"{guarded}/health", headers={"Authorization": authorization})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status
        except urllib.error.HTTPError as refused:
            return refused.code

    def basic(credentials: bytes) -> str:
        return "Basic " + base64.b64encode(credentials).decode()

    assert health(basic(b"anyone:" + TOKEN.encode())) == 200
    assert health(basic(b":" + TOKEN.encode())) == 200
    assert health(basic(TOKEN.encode())) == 401  # no colon: no password
    assert health(basic(TOKEN.encode() + b":x")) == 401  # the token as the user name is not the password
    assert health("Basic %%%not-base64") == 401
    assert health(f"Basic {TOKEN}") == 401
