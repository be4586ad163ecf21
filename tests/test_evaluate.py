"""Evaluation summaries and the OpenAI-compatible engine, against a fake server started in the test.

The fake server (``http.server`` in a thread) answers ``/v1/chat/completions`` from a script and
lists its models at ``/v1/models``. For PlanPath it plays the oracle of ``tests/oracles.py`` (BFS on
the board in the prompt), so success rates through ``llm-zoo-train eval --endpoint`` are known
exactly: 100% for the right agent -> model map, 0% for the role swap and for a model that answers
nonsense.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

import oracles
from llm_zoo_train.engines.base import Engine, SamplingParams
from llm_zoo_train.engines.openai_compat import EndpointError, OpenAICompatEngine
from llm_zoo_train.evaluation.cli import main
from llm_zoo_train.evaluation.evaluate import summarize, wilson_interval
from llm_zoo_train.rollout.tree import EpisodeResult

# --------------------------------------------------------------------------- the fake server


class FakeOpenAI:
    """An OpenAI-compatible server in a thread.

    ``answer(model, prompt, system)`` gives the reply text; ``failures`` is a queue of
    ``(status, body)`` answered before any success; ``delay_s`` is slept per completion request.
    ``requests`` records ``(path, headers, json body)``; ``max_in_flight`` the most concurrent ones.
    """

    def __init__(self, answer: Callable[[str, str, str | None], str], models=("oracle",), delay_s=0.0):
        self.answer, self.models, self.delay_s = answer, list(models), delay_s
        self.failures: list[tuple[int, str]] = []
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def _send(self, status: int, payload: Any) -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                fake.requests.append((self.path, dict(self.headers), None))
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": m} for m in fake.models]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.requests.append((self.path, dict(self.headers), body))
                    failure = fake.failures.pop(0) if fake.failures else None
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                try:
                    time.sleep(fake.delay_s)
                    if failure is not None:
                        self._send(failure[0], failure[1].encode())
                        return
                    messages = body["messages"]
                    system = messages[0]["content"] if messages[0]["role"] == "system" else None
                    text = fake.answer(body["model"], messages[-1]["content"], system)
                    choices = [
                        {
                            "index": i,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                        }
                        for i in range(body.get("n", 1))
                    ]
                    self._send(200, {"id": "x", "object": "chat.completion", "choices": choices})
                finally:
                    with fake.lock:
                        fake.in_flight -= 1

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def completions(self) -> list[dict[str, Any]]:
        return [body for path, _, body in self.requests if path == "/v1/chat/completions"]


ORACLE = oracles.plan_path_policy()
LORA_AGENT = {"tool-lora": "tool_agent", "plan-lora": "plan_agent"}


def plan_path_server_answer(model: str, prompt: str, system: str | None) -> str:
    """``oracle`` reads the role from the prompt; ``tool-lora``/``plan-lora`` always answer as their role."""
    if model in LORA_AGENT:
        return ORACLE(LORA_AGENT[model], prompt)
    if model == "oracle":
        return ORACLE("tool_agent" if "You are the tool agent" in prompt else "plan_agent", prompt)
    return "I do not know."


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


# --------------------------------------------------------------------------- summaries


def test_summarize_means_role_and_global_rewards_per_agent():
    episodes = [
        EpisodeResult(
            0, "t0", True, 2, {"a": 3.0, "b": 1.0}, {"a": 1.0, "b": 0.0}, {"a": 2.0, "b": 1.0}, 1.0
        ),
        EpisodeResult(
            1, "t1", False, 3, {"a": 1.0, "b": 0.0}, {"a": 0.0, "b": -1.0}, {"a": 1.0, "b": 1.0}, 0.5
        ),
    ]
    result = summarize(episodes)
    assert (result.successes, result.num_episodes, result.success_rate) == (1, 2, 0.5)
    assert result.mean_turns == 2.5 and result.format_ok_rate == 0.75
    assert result.mean_rewards == {"a": 2.0, "b": 0.5}
    assert result.mean_role_rewards == {"a": 0.5, "b": -0.5}
    assert result.mean_global_rewards == {"a": 1.5, "b": 1.0}
    assert (result.ci_low, result.ci_high) == pytest.approx(wilson_interval(1, 2))
    as_dict = result.to_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict and as_dict["mean_role_rewards"]["b"] == -0.5
    # the trainer's logged metrics keep their names
    assert set(result.metrics()) >= {"eval/success_rate", "eval/a/reward", "eval/format_ok_rate"}


def test_wilson_interval_known_values():
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_splits_follow_the_env():
    from llm_zoo_train.config import load_config
    from llm_zoo_train.evaluation.plan import UsageError, plan_splits

    math = load_config(
        None, ["--env.id", "Math-v0", "--eval.env_kwargs", "{split: test}", "--eval.num_episodes", "2"]
    )
    splits = {s.name: s for s in plan_splits(math, None)}  # an env with a split argument: train and test
    assert list(splits) == ["train", "test"]
    assert splits["test"].env_kwargs["split"] == "test" and splits["test"].trainer_eval
    assert splits["train"].env_kwargs["split"] == "train" and not splits["train"].trainer_eval
    assert splits["train"].seeds == splits["test"].seeds == [1073741824, 1073741825]
    math_default = load_config(None, ["--env.id", "Math-v0"])  # Math-v0's own default split is train
    assert [s.trainer_eval for s in plan_splits(math_default, None)] == [True, False]
    grid = load_config(None, ["--env.id", "PlanPath-v0", "--eval.num_episodes", "3"])
    (only,) = plan_splits(grid, None)  # a seed-generated env: the trainer's evaluation tasks
    assert (only.name, only.trainer_eval, only.seeds) == ("eval", True, [1073741824, 1073741825, 1073741826])
    with pytest.raises(
        UsageError, match="PlanPath-v0 generates its tasks from the seed and has no test split"
    ):
        plan_splits(grid, ["test"])


# --------------------------------------------------------------------------- the engine


GREEDY = SamplingParams(max_tokens=32, temperature=0.0, seed=7)


def test_engine_sends_chat_requests_and_returns_text():
    with FakeOpenAI(lambda model, prompt, system: f"{model}|{system}|{prompt.upper()}") as server:
        engine = OpenAICompatEngine(
            server.url,
            "base-model",
            model_names={"tool": "tool-lora"},
            api_key="sk-test",
            system_prompt="Be brief.",
        )
        assert isinstance(engine, Engine)
        out = engine.generate(["hi", "yo", "ok"], [None, "tool", "other"], 2, GREEDY)
        assert [[c.text for c in group] for group in out] == [
            ["base-model|Be brief.|HI"] * 2,
            ["tool-lora|Be brief.|YO"] * 2,
            ["other|Be brief.|OK"] * 2,
        ]
        first = out[0][0]
        assert (first.token_ids, first.logprobs, first.prompt_token_ids, first.finish_reason) == (
            [],
            [],
            [],
            "stop",
        )
        body = next(b for b in server.completions() if b["messages"][-1]["content"] == "hi")
        assert (
            body["temperature"] == 0.0 and body["max_tokens"] == 32 and body["seed"] == 7 and body["n"] == 2
        )
        assert "top_p" not in body and "top_k" not in body  # greedy: no truncation sent
        assert body["messages"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        ]
        assert all(headers["Authorization"] == "Bearer sk-test" for _, headers, _ in server.requests)


def test_engine_reads_the_api_key_from_the_environment(monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-env")
    with FakeOpenAI(lambda *a: "x") as server:
        OpenAICompatEngine(server.url, "m", api_key_env="MY_KEY").generate(["p"], [None], 1, GREEDY)
        monkeypatch.delenv("MY_KEY")
        OpenAICompatEngine(server.url, "m", api_key_env="MY_KEY").generate(["p"], [None], 1, GREEDY)
        assert server.requests[0][1]["Authorization"] == "Bearer sk-env"
        assert "Authorization" not in server.requests[1][1]


def test_engine_sends_requests_concurrently():
    with FakeOpenAI(lambda model, prompt, system: prompt, delay_s=0.2) as server:
        engine = OpenAICompatEngine(server.url, "m", max_concurrency=8)
        start = time.perf_counter()
        out = engine.generate([f"p{i}" for i in range(8)], [None] * 8, 1, GREEDY)
        elapsed = time.perf_counter() - start
    assert [group[0].text for group in out] == [f"p{i}" for i in range(8)]  # prompt order kept
    assert server.max_in_flight >= 4 and elapsed < 8 * 0.2


def test_engine_retries_server_errors_then_gives_a_clear_error():
    with FakeOpenAI(lambda *a: "fine") as server:
        server.failures = [(503, "overloaded"), (500, "oops")]
        engine = OpenAICompatEngine(server.url, "m", max_retries=2, backoff_s=0.01)
        assert engine.generate(["p"], [None], 1, GREEDY)[0][0].text == "fine"
        assert len(server.completions()) == 3

        server.failures = [(503, "overloaded")] * 3
        with pytest.raises(
            EndpointError, match=r"/v1/chat/completions answered HTTP 503 .*overloaded"
        ) as err:
            OpenAICompatEngine(server.url, "m", max_retries=1, backoff_s=0.01).generate(
                ["p"], [None], 1, GREEDY
            )
        assert err.value.status == 503

        before = len(server.completions())
        server.failures = [(400, '{"error": "max_tokens is too large"}')]
        with pytest.raises(EndpointError, match=r"HTTP 400 .*max_tokens is too large"):
            engine.generate(["p"], [None], 1, GREEDY)
        assert len(server.completions()) == before + 1  # a client error is not retried


def test_engine_errors_for_unreachable_and_malformed_servers():
    url = closed_port_url()
    with pytest.raises(EndpointError, match=rf"cannot reach {url}/chat/completions after 2 attempt"):
        OpenAICompatEngine(url, "m", max_retries=1, backoff_s=0.01).generate(["p"], [None], 1, GREEDY)
    with FakeOpenAI(lambda *a: "x") as server:
        server.failures = [(200, "<html>not json</html>")]
        with pytest.raises(EndpointError, match="not JSON"):
            OpenAICompatEngine(server.url, "m").generate(["p"], [None], 1, GREEDY)
        server.failures = [(200, '{"choices": []}')]
        with pytest.raises(EndpointError, match="returned 0 choices for n=1"):
            OpenAICompatEngine(server.url, "m").generate(["p"], [None], 1, GREEDY)
        engine = OpenAICompatEngine(server.url, "oracle")
        engine.check_models(["oracle"])
        with pytest.raises(
            EndpointError, match=r"does not serve model\(s\) \['nope'\]; it serves \['oracle'\]"
        ):
            engine.check_models(["oracle", "nope"])
        with pytest.raises(NotImplementedError, match="cannot load adapters"):
            engine.load_adapters({"a": "/x"}, 1)
    with pytest.raises(ValueError, match="must be an http"):
        OpenAICompatEngine("localhost:8000", "m")


# --------------------------------------------------------------------------- `eval --endpoint` on PlanPath


def write_plan_path_config(path: Path, output_dir: Path, episodes: int = 4) -> Path:
    config = {
        "model": {"system_prompt": "You are a careful planner."},
        "env": {"id": "PlanPath-v0", "kwargs": {"rows": 5, "cols": 5}},
        "eval": {"num_episodes": episodes},
        "training": {"output_dir": str(output_dir)},
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def test_eval_endpoint_plan_path_success_rates_are_exact(tmp_path, capsys):
    config = write_plan_path_config(tmp_path / "pp.yaml", tmp_path / "run")
    output = tmp_path / "out.json"
    with FakeOpenAI(plan_path_server_answer, models=["oracle", "tool-lora", "plan-lora", "dummy"]) as server:
        code = main(
            [
                str(config),
                "--endpoint", server.url,
                "--served-model", "dummy",
                "--agent-model", "tool_agent=tool-lora",
                "--agent-model", "plan_agent=plan-lora",
                "--policies", "base,adapters,swap",
                "--output", str(output),
            ]
        )  # fmt: skip
        assert code == 0, capsys.readouterr().err
        bodies = server.completions()
    document = json.loads(output.read_text())
    rates = {(r["policy"], r["split"]): r["result"]["success_rate"] for r in document["results"]}
    assert rates == {("base", "eval"): 0.0, ("adapters", "eval"): 1.0, ("swap", "eval"): 0.0}
    by_policy = {r["policy"]: r for r in document["results"]}
    assert by_policy["swap"]["agents"] == {"tool_agent": "plan-lora", "plan_agent": "tool-lora"}
    adapters = by_policy["adapters"]["result"]
    assert (
        adapters["num_episodes"] == 4 and adapters["format_ok_rate"] == 1.0 and adapters["mean_turns"] == 1.0
    )
    assert adapters["mean_role_rewards"]["plan_agent"] > 1.0  # reached the goal (+1) on every task
    assert by_policy["swap"]["result"]["format_ok_rate"] < 1.0
    settings = document["settings"]
    assert settings["model"] == {
        "endpoint": server.url,
        "served_model": "dummy",
        "system_prompt": "You are a careful planner.",
    }
    assert settings["splits"]["eval"]["seeds"] == [1073741824 + i for i in range(4)]
    assert settings["splits"]["eval"]["env_kwargs"] == {"rows": 5, "cols": 5, "alpha": 1.0}
    assert settings["sampling"]["temperature"] == 0.0 and settings["env"]["id"] == "PlanPath-v0"
    assert {b["model"] for b in bodies} == {"dummy", "tool-lora", "plan-lora"}
    assert all(
        b["messages"][0] == {"role": "system", "content": "You are a careful planner."} for b in bodies
    )
    out = capsys.readouterr().out
    assert "adapters" in out and "100.0%" in out and "tool_agent role / global" in out


def test_eval_endpoint_bad_input_and_dead_server(tmp_path, capsys):
    config = str(write_plan_path_config(tmp_path / "pp.yaml", tmp_path / "run", episodes=1))
    with FakeOpenAI(plan_path_server_answer, models=["oracle"]) as server:
        cases = [
            (["--endpoint", server.url, "--served-model", "oracle", "--agent-model", "coder=x"], "'coder' is not an agent"),
            (["--endpoint", server.url, "--served-model", "oracle", "--policies", "swap"], "role swap needs two agents"),
            (["--endpoint", server.url], "--endpoint needs --served-model"),
            (["--endpoint", "localhost:8000", "--served-model", "oracle"], "must be an http:// or https:// URL"),
            (["--endpoint", server.url, "--served-model", "oracle", "--concurrency", "0"], "max_concurrency must be >= 1"),
            (["--endpoint", server.url, "--served-model", "oracle", "--splits", "test"], "has no test split"),
            (["--endpoint", server.url, "--served-model", "oracle", "--policies", "best"], "unknown policy 'best'"),
        ]  # fmt: skip
        for args, message in cases:
            assert main([config, *args]) == 2, args
            err = capsys.readouterr().err
            assert message in err and "Traceback" not in err, err
        assert main([config, "--endpoint", server.url, "--served-model", "gpt-9"]) == 1
        assert "does not serve model(s) ['gpt-9']; it serves ['oracle']" in capsys.readouterr().err
        assert (
            main([config, "--endpoint", server.url, "--served-model", "oracle", "--splits", "eval,train"])
            == 0
        )
        capsys.readouterr()
        assert (tmp_path / "run" / "eval" / "eval_results.json").is_file()  # default output place
    url = closed_port_url()
    assert main([config, "--endpoint", url, "--served-model", "oracle", "--retries", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"llm-zoo-train eval: error: cannot reach {url}/models"), err


@pytest.fixture
def trackers_not_installed(monkeypatch):
    """Make TensorBoard and W&B look uninstalled to the config's checks (whatever is installed)."""
    import importlib.util

    real_find_spec = importlib.util.find_spec
    trackers = {"tensorboard", "tensorboardX", "wandb"}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in trackers else real_find_spec(name, *a)
    )


def test_eval_never_needs_the_runs_trackers(tmp_path, capsys, trackers_not_installed):
    """A run that logged to TensorBoard is evaluated where TensorBoard is not installed (issue 18.3)."""
    from llm_zoo_train.config import ConfigError, load_config, validate

    path = write_plan_path_config(tmp_path / "pp.yaml", tmp_path / "run", episodes=1)
    config = yaml.safe_load(path.read_text())
    config["logging"] = {"log_with": ["tensorboard"]}
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match="'tensorboard' is not installed"):
        validate(load_config(path))  # training still checks its trackers
    with FakeOpenAI(plan_path_server_answer, models=["oracle"]) as server:
        code = main([str(path), "--endpoint", server.url, "--served-model", "oracle", "--report_to", "wandb"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "not installed" not in err
    assert (
        "base on eval: 1/1 episodes, turn 1 (move 2 of 2), 2 completions" in err
    )  # the evaluation's progress line
    document = json.loads((tmp_path / "run" / "eval" / "eval_results.json").read_text())
    assert document["results"][0]["result"]["success_rate"] == 1.0  # the oracle plays both roles
    assert document["settings"]["config"]["logging"]["log_with"] == ["wandb"]  # the run's config, as given


# --------------------------------------------------------------------------- `eval --majority K`


def test_eval_majority_scores_the_commonest_answer_of_k_episodes(tmp_path, capsys):
    """KeyRelay-v0's oracle single agent, served: the first time a task is asked the server answers
    wrong, then right twice on even tasks and a second wrong answer twice on odd ones. One episode per
    task solves none; majority@3 solves the even half, as the env scores them."""
    asked: dict[str, int] = {}
    lock = threading.Lock()

    def answer(model: str, prompt: str, system: str | None) -> str:
        table = dict(re.findall(r"^([a-z]+): (\d+)$", prompt, re.MULTILINE))
        query = re.search(r"under the key ([a-z]+)\?", prompt).group(1)
        with lock:
            repetition = asked.get(prompt, 0)
            asked[prompt] = repetition + 1
        even = int(table[query]) % 2 == 0
        if repetition == 0:
            return "It is 1."
        return f"It is {table[query]}." if even else "It is 3."

    path = tmp_path / "kr.yaml"
    path.write_text(yaml.safe_dump({
        "env": {"id": "KeyRelay-v0", "kwargs": {"agents": ["oracle"]}},
        "eval": {"num_episodes": 12},
        "rollout": {"temperature": 0.7},
        "training": {"output_dir": str(tmp_path / "run")},
    }), encoding="utf-8")  # fmt: skip
    with FakeOpenAI(answer, models=["oracle"]) as server:
        endpoint = [str(path), "--endpoint", server.url, "--served-model", "oracle"]
        assert main([*endpoint, "--output", str(tmp_path / "one.json")]) == 0
        asked.clear()
        assert main([*endpoint, "--majority", "3", "--output", str(tmp_path / "vote.json")]) == 0
        for bad in ("0", "-2"):
            assert main([*endpoint, "--majority", bad]) == 2
    err = capsys.readouterr().err
    assert "--majority needs K >= 1" in err
    single = json.loads((tmp_path / "one.json").read_text())["results"][0]
    voted = json.loads((tmp_path / "vote.json").read_text())
    row = voted["results"][0]
    assert single["result"]["successes"] == 0
    even = sum(int(e["answer"]) % 2 == 0 and e["success"] for e in row["episodes"])
    assert row["majority_k"] == 3 and row["result"]["successes"] == even > 0
    assert all(e["answer"] in (None, "3") or e["success"] for e in row["episodes"])
    assert voted["settings"]["sampling"]["temperature"] == 0.7  # eval is greedy: the rollout's
    assert sum(asked.values()) == 3 * 12
