"""The vllm_server engine against real vLLM servers on 127.0.0.1 (vLLM's CPU backend).

Run in the vLLM environment (nox session ``tests_vllm``)::

    python -m pytest -m vllm tests/test_vllm_server.py

Two servers serve the module (each starts in ~30 s on 2 cores) with the tiny model of
tests/test_vllm_engine.py; the colocated engine built from the same directory is the reference.
The last test kills the second server. Tests without a vLLM mark need no vLLM: they check the
config, URLs and the errors for servers that are down or do not answer.
"""

from __future__ import annotations

import math
import re
import socket
import threading
import time

import pytest

from llm_zoo_train.engines.base import SamplingParams

# Same adapters, same seeds, same kernels: the server and the colocated engine should agree to
# float32 rounding. Sampled tokens get the tolerances the colocated engine needs against the
# trainer (test_vllm_engine.py): its kernels' rounding differs most on unlikely tokens.
LOGPROB_TOLERANCE = 1e-4
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}


def server_settings(model_dir, tmp_path, name):
    return dict(
        dtype="float32",
        max_model_len=2048,  # Plan-Path prompts are ~1200 tokens with the tiny byte-level tokenizer
        max_lora_rank=8,
        max_loras=4,
        max_cpu_loras=16,  # several engines (run tags) load adapters on one server in this module
        kv_cache_memory_bytes=64 << 20,
        extra_args=["--enforce-eager", "--seed", "0"],
        env=SERVER_ENV,
        log_path=tmp_path / f"{name}.log",
        startup_timeout_s=300,
    )


# --------------------------------------------------------------------------- no vLLM needed


def test_server_urls_are_normalised_and_checked():
    from llm_zoo_train.engines.vllm.server import server_root

    assert server_root("http://host:8000") == "http://host:8000"
    assert server_root("http://host:8000/v1/") == "http://host:8000"
    with pytest.raises(ValueError, match="http://"):
        server_root("host:8000")


def test_config_refuses_a_server_engine_without_servers():
    from llm_zoo_train.config import ConfigError, load_config, validate

    with pytest.raises(ConfigError, match=r"vllm\.server_urls"):
        validate(load_config(None, ["--rollout.engine", "vllm_server"]))
    with pytest.raises(ConfigError, match="not an http"):
        validate(load_config(None, ["--rollout.engine", "vllm_server", "--vllm.server_urls", "[gpu1:8000]"]))
    bad_timeout = ["--rollout.engine", "vllm_server", "--vllm.server_urls", "[http://gpu1:8000]"]
    with pytest.raises(ConfigError, match="request_timeout_s"):
        validate(load_config(None, [*bad_timeout, "--vllm.request_timeout_s", "0"]))


def test_a_server_that_is_down_gives_an_error_naming_it(tiny_model_dir):
    from transformers import AutoTokenizer

    from llm_zoo_train.engines.openai_compat import EndpointError
    from llm_zoo_train.engines.vllm.server import VLLMServerEngine
    from llm_zoo_train.engines.vllm.server_launch import free_port

    url = f"http://127.0.0.1:{free_port()}"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    start = time.monotonic()
    with pytest.raises(EndpointError, match=rf"cannot reach vLLM server {url} \(GET /health\)"):
        VLLMServerEngine([url], tokenizer, "unused", max_retries=2, retry_backoff_s=0.05)
    assert time.monotonic() - start < 10


def test_a_server_that_never_answers_times_out(tiny_model_dir):
    """A server that accepts the connection and then says nothing: the request times out (and is
    retried), it does not hang."""
    from transformers import AutoTokenizer

    from llm_zoo_train.engines.openai_compat import EndpointError
    from llm_zoo_train.engines.vllm.server import VLLMServerEngine

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    start = time.monotonic()
    try:
        with pytest.raises(EndpointError, match=rf"{url}.*(Timeout|timed out)"):
            VLLMServerEngine(
                [url], tokenizer, "unused", request_timeout_s=0.5, max_retries=1, retry_backoff_s=0.05
            )
    finally:
        silent.close()
    assert time.monotonic() - start < 10


def test_the_launcher_turns_chunked_prefill_off_where_vllm_runs_on_the_cpu(monkeypatch):
    """vLLM 0.32 on CPU dies when it splits a seeded prompt's prefill; the engine seeds every request."""
    from llm_zoo_train.engines.vllm import server_launch as vllm_server_launch
    from llm_zoo_train.engines.vllm.server_launch import LocalVLLMServer

    flag = "--no-enable-chunked-prefill"
    assert flag in LocalVLLMServer("model", port=1, chunked_prefill=False).command
    assert flag not in LocalVLLMServer("model", port=1, chunked_prefill=True).command
    monkeypatch.setattr(vllm_server_launch, "vllm_runs_on_cpu", lambda: True)
    assert flag in LocalVLLMServer("model", port=1).command
    monkeypatch.setattr(vllm_server_launch, "vllm_runs_on_cpu", lambda: False)
    assert flag not in LocalVLLMServer("model", port=1).command


# --------------------------------------------------------------------------- real servers


@pytest.fixture(scope="module")
def vllm_modules():
    pytest.importorskip("vllm")
    pytest.importorskip("torch")
    import test_vllm_engine

    return test_vllm_engine


@pytest.fixture(scope="module")
def prompts(vllm_modules):
    return vllm_modules.PROMPTS


@pytest.fixture(scope="module")
def model_dir(vllm_modules, tmp_path_factory):
    return vllm_modules.build_vllm_tiny_model_dir(tmp_path_factory.mktemp("vllm_tiny_model"))


@pytest.fixture(scope="module")
def policy(vllm_modules, model_dir):
    return vllm_modules.make_policy(model_dir)


@pytest.fixture(scope="module")
def adapter_dirs(policy, tmp_path_factory):
    return policy.save_adapters(tmp_path_factory.mktemp("adapters_v0"))


@pytest.fixture(scope="module")
def servers(model_dir, tmp_path_factory):
    """Two running servers (started one after the other: two cores), stopped at the end."""
    from llm_zoo_train.engines.vllm.server_launch import LocalVLLMServer

    logs = tmp_path_factory.mktemp("server_logs")
    started = []
    try:
        for name in ("a", "b"):
            started.append(LocalVLLMServer(model_dir, **server_settings(model_dir, logs, name)).start())
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture(autouse=True)
def servers_stay_up(request):
    """After a test that used the servers, each one still runs (unless the test killed it); else
    the error carries the end of its log, where vLLM wrote why it died."""
    yield
    if "servers" not in request.fixturenames or request.node.get_closest_marker("kills_a_server"):
        return
    dead = [
        s
        for s in request.getfixturevalue("servers")
        if s.process is not None and s.process.poll() is not None
    ]
    assert not dead, "\n\n".join(
        f"the vLLM server {s.url} died (exit code {s.process.returncode}); its errors:\n"
        + "\n".join(sorted(set(re.findall(r"\w+Error: .*", s.log_tail(200_000)))))
        + f"\nits log ends:\n{s.log_tail(4000)}"
        for s in dead
    )


@pytest.fixture(scope="module")
def engine(servers, policy, adapter_dirs, tmp_path_factory):
    from llm_zoo_train.engines.vllm.server import VLLMServerEngine

    engine = VLLMServerEngine(
        [servers[0].url], policy.tokenizer, tmp_path_factory.mktemp("served"), expected_models=[]
    )
    engine.load_adapters(adapter_dirs, version=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def colocated(vllm_modules, model_dir, adapter_dirs, policy):
    engine = vllm_modules.build_engine(model_dir, adapter_dirs, policy)
    yield engine
    engine.close()


def differences(rows_a, rows_b):
    return [
        abs(a - b)
        for row_a, row_b in zip(rows_a, rows_b, strict=True)
        for ca, cb in zip(row_a, row_b, strict=True)
        for a, b in zip(ca.logprobs, cb.logprobs, strict=True)
    ]


def request_count(server) -> float:
    """Requests the server has finished, from its Prometheus metrics."""
    import requests

    text = requests.get(f"{server.url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total{")
    )


@pytest.mark.vllm
def test_the_server_checks_pass_and_adapters_are_loaded_under_versioned_names(engine, servers):
    from llm_zoo_train.engines.base import Engine

    assert isinstance(engine, Engine)
    tag = engine.run_tag
    assert engine.served_adapters == {"alpha": f"{tag}-alpha-v0", "beta": f"{tag}-beta-v0"}
    listed = engine.loaded_models(servers[0].url)
    assert {f"{tag}-alpha-v0", f"{tag}-beta-v0", f"{tag}-base-zero"} <= set(listed)
    assert engine.max_model_len == 2048


@pytest.mark.vllm
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_tokens_and_logprobs_match_the_colocated_engine(engine, colocated, temperature, prompts):
    adapters = [None, "alpha", "beta", "alpha", None, "beta"]
    sampling = SamplingParams(max_tokens=12, temperature=temperature, seed=123)
    n = 1 if temperature == 0 else 3
    got = engine.generate(prompts, adapters, n, sampling)
    want = colocated.generate(prompts, adapters, n, sampling)
    assert [[c.token_ids for c in row] for row in got] == [[c.token_ids for c in row] for row in want]
    assert [[c.prompt_token_ids for c in row] for row in got] == [
        [c.prompt_token_ids for c in row] for row in want
    ]
    assert [[c.text for c in row] for row in got] == [[c.text for c in row] for row in want]
    assert [[c.finish_reason for c in row] for row in got] == [[c.finish_reason for c in row] for row in want]
    diffs = differences(got, want)
    print(
        f"T={temperature}: server vs colocated logprobs over {len(diffs)} tokens: max |diff| = {max(diffs):.2e}, "
        f"mean = {sum(diffs) / len(diffs):.2e}"
    )
    assert max(diffs) < LOGPROB_TOLERANCE
    assert all(math.isfinite(c.logprobs[0]) for row in got for c in row)
    # The comparison means something only if the candidates and adapters differ.
    if n > 1:
        assert len({tuple(c.token_ids) for c in got[1]}) > 1
    assert (
        len(
            {
                tuple(row[0].token_ids)
                for row in engine.generate([prompts[0]] * 3, [None, "alpha", "beta"], 1, sampling)
            }
        )
        == 3
    )


@pytest.mark.vllm
def test_bad_requests_give_clear_errors(engine):
    sampling = SamplingParams(max_tokens=4, temperature=0.0)
    with pytest.raises(ValueError, match=r"unknown adapter\(s\) \['gamma'\].*alpha"):
        engine.generate(["hi"], ["gamma"], 1, sampling)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate(["apple " * 2100], [None], 1, sampling)
    with pytest.raises(ValueError, match="higher version"):
        engine.load_adapters({"alpha": engine.adapter_dir / engine.served_adapters["alpha"]}, version=0)
    assert engine.generate([], [], 2, sampling) == []


@pytest.mark.vllm
def test_seeded_prompts_beyond_one_steps_token_budget_are_sampled(engine, servers, vllm_modules):
    """The CI failure of 2026-12-02: concurrent seeded requests whose prompts exceed one step's
    token budget (2048 here) made vLLM split a prefill, and the CPU server died (``CPU Generator
    does not use offset``). The launcher starts CPU servers without chunked prefill."""
    prompts = vllm_modules.distinct_prompts(6, 400)
    sampling = SamplingParams(max_tokens=4, temperature=1.0, seed=5)
    rows = engine.generate(prompts, ["alpha"] * len(prompts), 2, sampling)
    assert sum(len(row[0].prompt_token_ids) for row in rows) > 2 * 2048
    assert all(len(c.token_ids) >= 1 for row in rows for c in row)
    assert servers[0].process.poll() is None


@pytest.mark.vllm
def test_a_server_with_another_base_model_is_refused(servers, policy, tmp_path):
    from llm_zoo_train.engines.openai_compat import EndpointError
    from llm_zoo_train.engines.vllm.server import VLLMServerEngine

    url = servers[0].url
    with pytest.raises(
        EndpointError, match=rf"{url} serves base model .* trainer's model is 'org/other-model'"
    ):
        VLLMServerEngine([url], policy.tokenizer, tmp_path, expected_models=["org/other-model"])
    with pytest.raises(EndpointError, match=r"none is named 'other' \(vllm\.served_model_name\)"):
        VLLMServerEngine([url], policy.tokenizer, tmp_path, served_model_name="other")


@pytest.mark.vllm
def test_after_a_sync_the_updated_adapter_is_served(engine, servers, vllm_modules, model_dir, tmp_path):
    """New weights for alpha, loaded as version 1: the server answers like the transformers engine
    on the new weights, the old version is unloaded and its copy deleted, beta is unchanged."""
    import torch

    from llm_zoo_train.engines.hf.engine import HFEngine

    updated = vllm_modules.make_policy(model_dir)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in updated.adapter_parameters("alpha"):
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    prompts = [vllm_modules.PROMPTS[i] for i in (0, 0, 3)]
    adapters = ["alpha", "beta", None]
    before = engine.generate(prompts, adapters, 1, greedy)
    old_name = engine.served_adapters["alpha"]

    engine.load_adapters({"alpha": updated.save_adapter("alpha", tmp_path / "alpha")}, version=1)
    new_name = engine.served_adapters["alpha"]
    assert new_name == f"{engine.run_tag}-alpha-v1"
    listed = engine.loaded_models(servers[0].url)
    assert new_name in listed and old_name not in listed
    assert not (engine.adapter_dir / old_name).exists() and (engine.adapter_dir / new_name).is_dir()

    after = engine.generate(prompts, adapters, 1, greedy)
    want = HFEngine(updated.model, updated.tokenizer).generate(prompts, adapters, 1, greedy)
    assert [r[0].token_ids for r in after] == [r[0].token_ids for r in want]
    assert max(differences(after, want)) < LOGPROB_TOLERANCE
    assert after[0][0].token_ids != before[0][0].token_ids  # alpha changed
    assert after[1][0].token_ids == before[1][0].token_ids  # beta did not
    assert after[2][0].token_ids == before[2][0].token_ids  # nor the base model


@pytest.mark.vllm
def test_adapters_a_server_lost_are_loaded_again(engine, servers, prompts, caplog):
    """A restarted server has lost the runtime-loaded adapters (simulated: unloaded behind the
    engine's back): the next request for one gets HTTP 404, the engine loads its adapters there
    again from its copies, and the request succeeds with the same answer."""
    import requests

    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    before = engine.generate([prompts[0], prompts[1]], ["alpha", None], 1, greedy)
    lost = [engine.served_adapters["alpha"], engine.served_adapters["beta"], engine.served_name(None)]
    for name in lost:
        answer = requests.post(
            f"{servers[0].url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=30
        )
        assert answer.status_code == 200, answer.text
    assert not set(lost) & set(engine.loaded_models(servers[0].url))
    with caplog.at_level("WARNING", logger="llm_zoo_train.engines.vllm.server"):
        after = engine.generate([prompts[0], prompts[1]], ["alpha", None], 1, greedy)
    assert [r[0].token_ids for r in after] == [r[0].token_ids for r in before]
    assert set(lost) <= set(engine.loaded_models(servers[0].url))
    assert "no longer served" in caplog.text and "loaded them again" in caplog.text


@pytest.mark.vllm
def test_two_servers_share_the_load_and_agree(servers, policy, adapter_dirs, engine, tmp_path, prompts):
    from llm_zoo_train.engines.vllm.server import VLLMServerEngine

    pair = VLLMServerEngine([s.url for s in servers], policy.tokenizer, tmp_path, expected_models=[])
    try:
        pair.load_adapters(adapter_dirs, version=0)
        single = VLLMServerEngine([servers[0].url], policy.tokenizer, tmp_path, expected_models=[])
        single.load_adapters(adapter_dirs, version=0)
        counts = [request_count(s) for s in servers]
        sampling = SamplingParams(max_tokens=10, temperature=1.0, seed=5)
        adapters = ["alpha", "beta"] * 3
        got = pair.generate(prompts, adapters, 2, sampling)
        served = [request_count(s) - c for s, c in zip(servers, counts, strict=True)]
        assert served[0] == served[1] > 0, served  # 6 prompts, round robin: 3 on each server
        want = single.generate(prompts, adapters, 2, sampling)
        assert [[c.token_ids for c in row] for row in got] == [[c.token_ids for c in row] for row in want]
        assert max(differences(got, want)) < LOGPROB_TOLERANCE
        single.close()
    finally:
        pair.close()


@pytest.mark.vllm
def test_two_step_at_grpo_run_with_the_server_engine(servers, model_dir, vllm_modules, tmp_path):
    """The trainer builds the server engine from the config, rolls out AT-GRPO trees on Plan-Path
    over both servers, updates both agents and syncs them as versions 1 and 2."""
    from llm_zoo_train.engines.vllm.server import VLLMServerEngine
    from llm_zoo_train.trainer import Trainer

    urls = f"[{servers[0].url}, {servers[1].url}]"
    config = vllm_modules.two_step_plan_path_config(
        model_dir, tmp_path / "run", "vllm_server", {"vllm.server_urls": urls}
    )
    trainer = Trainer(config)
    try:
        engine = trainer.engine
        assert isinstance(engine, VLLMServerEngine)
        result = trainer.train()
        tag = engine.run_tag
        assert engine.served_adapters == {
            "tool_agent": f"{tag}-tool_agent-v2",
            "plan_agent": f"{tag}-plan_agent-v2",
        }
        vllm_modules.assert_serves_the_live_policy(engine, trainer.policy)
    finally:
        trainer.close()
    assert not engine.adapter_dir.exists()  # close() unloaded the adapters and removed the copies
    vllm_modules.assert_two_trained_steps(result)


@pytest.mark.vllm
def test_async_rollouts_on_the_servers(servers, model_dir, vllm_modules, tmp_path):
    """rollout.async_steps 1 with the server engine: the generation process sends the next step's
    requests (its own adapter names) while the trainer updates; step t's samples are what version
    max(t-2, 0) samples on the servers, and its adapters are unloaded when the run ends."""
    import requests

    from llm_zoo_train.rollout.samples import read_jsonl
    from llm_zoo_train.rollout.step import play_step
    from llm_zoo_train.trainer import Trainer

    extra = {
        "vllm.server_urls": f"[{servers[0].url}, {servers[1].url}]",
        "rollout.async_steps": 1,
        "rollout.save_rollouts": "true",
        "training.max_steps": 3,
        "training.save_steps": 1,
        "eval.num_episodes": 0,
    }
    config = vllm_modules.two_step_plan_path_config(model_dir, tmp_path / "run", "vllm_server", extra)
    trainer = Trainer(config)
    try:
        result = trainer.train()
        trainer_tag = trainer.engine.run_tag
    finally:
        trainer.close()
    steps = [r for r in result["history"] if r["step"] > 0]
    assert [r["rollout/policy_version"] for r in steps] == [0, 0, 1]
    assert [r["rollout/staleness"] for r in steps] == [0, 1, 1]
    for server in servers:  # neither engine left an adapter behind
        names = [m["id"] for m in requests.get(f"{server.url}/v1/models", timeout=10).json()["data"]]
        assert not [n for n in names if "tool_agent" in n or "plan_agent" in n], names

    # A fresh trainer of the same seed serves the initial adapters (version 0) under its own tag.
    fresh_config = vllm_modules.two_step_plan_path_config(
        model_dir, tmp_path / "fresh", "vllm_server", {**extra, "rollout.async_steps": 0}
    )
    fresh = Trainer(fresh_config)
    try:
        assert fresh.engine.run_tag != trainer_tag
        for step in (1, 2, 3):
            version = max(step - 2, 0)
            if version == 1:
                checkpoint = tmp_path / "run" / "checkpoint-1" / "adapters"
                fresh.engine.load_adapters({n: str(checkpoint / n) for n in ("tool_agent", "plan_agent")}, 1)
            recorded = list(read_jsonl(tmp_path / "run" / "rollouts" / f"step_{step:06d}.jsonl"))
            assert {s.policy_version for s in recorded} == {version}, step
            again = play_step(config, trainer.plan.agent_adapters, fresh.engine, step, 0, version).samples
            assert [s.task_id for s in again] == [s.task_id for s in recorded], step
            assert [s.completion_token_ids for s in again] == [s.completion_token_ids for s in recorded], step
    finally:
        fresh.close()


@pytest.mark.vllm
@pytest.mark.slow
def test_two_trainer_processes_share_the_servers(servers, model_dir, vllm_modules, tmp_path):
    """Two data-parallel trainer processes (torchrun on CPU) use both servers: rank 0 loads each
    version, the other rank waits for it, and both sample from what the trainer holds."""
    urls = f"server_urls: [{servers[0].url}, {servers[1].url}]"
    vllm_modules.train_with_two_processes(model_dir, tmp_path, "vllm_server", urls)
    import requests

    for server in servers:  # the run unloaded its adapters at the end
        models = requests.get(f"{server.url}/v1/models", timeout=10).json()["data"]
        assert not [m["id"] for m in models if "tool_agent" in m["id"] or "plan_agent" in m["id"]]


@pytest.mark.vllm
@pytest.mark.kills_a_server
def test_a_killed_server_is_retried_elsewhere_or_named_in_the_error(
    servers, policy, adapter_dirs, tmp_path, prompts
):
    """Runs last: it kills server b. Requests to it go to server a; with only b, a clear error."""
    from llm_zoo_train.engines.openai_compat import EndpointError
    from llm_zoo_train.engines.vllm.server import VLLMServerEngine

    pair = VLLMServerEngine(
        [s.url for s in servers],
        policy.tokenizer,
        tmp_path,
        expected_models=[],
        max_retries=2,
        retry_backoff_s=0.1,
    )
    alone = VLLMServerEngine(
        [servers[1].url], policy.tokenizer, tmp_path, expected_models=[], max_retries=1, retry_backoff_s=0.1
    )
    pair.load_adapters(adapter_dirs, version=0)
    alone.load_adapters(adapter_dirs, version=0)
    sampling = SamplingParams(max_tokens=200, temperature=1.0, seed=1)
    # Kill b while a long generation is in flight on it.
    killer = threading.Timer(1.0, servers[1].kill)
    killer.start()
    start = time.monotonic()
    try:
        rows = pair.generate(prompts, ["alpha"] * len(prompts), 8, sampling)
    finally:
        killer.join()
    assert len(rows) == len(prompts) and all(len(row) == 8 for row in rows)
    with pytest.raises(EndpointError, match=rf"cannot reach vLLM server {servers[1].url}"):
        alone.generate(prompts[:2], ["alpha", None], 1, SamplingParams(max_tokens=4))
    with pytest.raises(EndpointError, match=rf"{servers[1].url}"):
        alone.load_adapters(adapter_dirs, version=1)
    assert time.monotonic() - start < 120
    pair.close()
