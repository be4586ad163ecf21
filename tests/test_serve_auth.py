"""Issue 52: ``llm-zoo serve`` with a bearer token serves only clients that send it, and a server
reachable from other machines needs one."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

pytest.importorskip("starlette")
pytest.importorskip("websockets")

from llm_zoo import remote
from llm_zoo.cli import main
from llm_zoo.serve import ServerThread
from llm_zoo.serve.auth import TOKEN_ENV, bind_problem, read_token

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
    short.write_text(f"{TOKEN}\nignored second line\n")
    assert read_token(short) == TOKEN
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert read_token(None) == TOKEN
