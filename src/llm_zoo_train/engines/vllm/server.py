"""The vLLM server engine: rollouts from one or more vLLM OpenAI-compatible servers, LoRA synced at run time.

:class:`VLLMServerEngine` sends generation requests to vLLM servers that the user starts (on this
machine or any other), so generation can run on other GPUs than training, and several trainer
processes can share the servers. Each server runs the base model with LoRA and runtime adapter
loading on, and records processed (temperature-scaled) logprobs::

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True python -m vllm.entrypoints.openai.api_server \\
        --model BASE --enable-lora --max-lora-rank 8 --max-loras 4 \\
        --logprobs-mode processed_logprobs --port 8000

How one :meth:`VLLMServerEngine.generate` call runs:

1. Each prompt gets the trainer's chat template (:func:`llm_zoo_train.models.chat.encode_prompt`) here,
   and the server is sent the token ids (``/v1/completions`` with a token-id ``prompt``), so the
   ``prompt_token_ids`` the trainer scores are exactly what was sampled from.
2. Prompt ``i`` is one request with ``n`` samples (the K candidates share one prefill), naming the
   served version of its adapter as ``model``, with the sampling fields and seed of the colocated
   engine (:func:`llm_zoo_train.engines.vllm.requests.request_sampling_fields`): the same seed gives the
   same samples on a server as in-process. ``logprobs=0`` and ``return_tokens_as_token_ids``
   return each sampled token's id and logprob; ``return_token_ids`` returns the ids as integers.
3. Prompts are spread round robin over the servers (the start rotates from call to call) and sent
   concurrently from a thread pool; a request that fails goes to the next server.

Adapter sync. :meth:`load_adapters` copies each adapter into ``adapter_dir`` (a directory the
servers can read) as ``<run>-<adapter>-v<version>``, loads it on every server with
``POST /v1/load_lora_adapter``, then unloads the previous version (``/v1/unload_lora_adapter``)
and deletes its copy. ``<run>`` is a random tag per engine, so two runs sharing a server never
clash. New names matter: vLLM caches adapters and prefix-cache blocks by name.

Data-parallel trainers (N processes): all processes hold identical adapters after each update,
so only rank 0 copies and loads them; the others wait for its result (a broadcast: an error on
rank 0 is raised on every rank, nobody waits forever) and then use the same names.

Base-model prompts (adapter ``None``) go to an all-zero LoRA by default, because vLLM's CPU LoRA
kernels give base-model requests in a mixed batch an adapter's weights (see
:mod:`llm_zoo_train.engines.vllm.engine`); on GPU servers ``zero_adapter_for_base=False`` saves a slot.

Checks at start (:mod:`llm_zoo_train.engines.vllm.server_checks`), on every server: ``GET /health``, ``/version`` and ``/v1/models`` (the served base
model must be the trainer's), ``POST /tokenize`` (the server's tokenizer must encode a probe text
like the trainer's), and one one-token request with ``top_k=1``: with processed logprobs its logprob
is exactly 0, with vLLM's default raw logprobs it is not, and the error says which flag is missing.

Errors (:mod:`llm_zoo_train.engines.vllm.server_client`): every request has a timeout; connection
errors, timeouts, HTTP 429 and 5xx are retried with exponential backoff (generation requests on
the next server). A server that answers 404 for one of this engine's adapter names has lost them
(it restarted): the engine loads its current adapters there again from their copies and retries
the request once. What still fails raises
:class:`~llm_zoo_train.engines.openai_compat.EndpointError` naming the server's URL.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import secrets
import shutil
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from llm_zoo_train.engines.base import Completion, SamplingParams, check_generate_args, report_generated
from llm_zoo_train.engines.openai_compat import EndpointError
from llm_zoo_train.engines.vllm.requests import (
    adapter_rank,
    check_served_adapters,
    request_sampling_fields,
    write_zero_adapter,
)
from llm_zoo_train.engines.vllm.server_checks import check_servers
from llm_zoo_train.engines.vllm.server_client import ServerClient
from llm_zoo_train.models.chat import encode_prompt

__all__ = ["VLLMServerEngine", "engine_from_config", "server_engine", "server_root"]

logger = logging.getLogger(__name__)

_BODY_CHARS = 500  # of an error body quoted in a message
_TOKEN_ID_PREFIX = "token_id:"


def server_root(url: str) -> str:
    """The server's root URL: ``http://host:8000`` from ``http://host:8000``, ``.../`` or ``.../v1``."""
    url = str(url).strip()
    if not url.startswith(("http://", "https://")):
        raise ValueError(
            f"vLLM server URL {url!r} must start with http:// or https://, e.g. http://localhost:8000"
        )
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _process_group() -> tuple[int, int]:
    """``(rank, world size)`` of the default torch process group, ``(0, 1)`` without one."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed
        return 0, 1
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _from_rank0(value: Any) -> Any:
    """Rank 0's ``value`` on every process (as it is without a process group)."""
    if _process_group()[1] == 1:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class VLLMServerEngine:
    """An :class:`~llm_zoo_train.engines.base.Engine` on running vLLM servers with runtime LoRA updating.

    Args:
        server_urls: Root URLs of the servers (``http://host:8000``; a trailing ``/v1`` is fine).
            They must serve the same base model with the same options.
        tokenizer: The trainer's tokenizer: its chat template makes the prompt token ids.
        adapter_dir: Directory, readable by every server, where adapters are copied for loading.
        served_model_name: The base model's name on the servers. ``None``: the one model the
            servers list that is not a LoRA.
        expected_models: Names the served base model may have (its id or its path on the server),
            e.g. the config's model and its resolved directory; empty: not checked.
        system_prompt: A system message put before every prompt (``None``: none).
        server_adapter_dir: ``adapter_dir`` as the servers see it, when they mount it at another path
            (``None``: the same path).
        zero_adapter_for_base: Serve ``None`` prompts with an all-zero LoRA (needed on CPU servers).
        request_timeout_s: Seconds one request may take (connecting: at most 10 of them).
        max_retries: Retries of a request after a connection error, timeout, 429 or 5xx.
        retry_backoff_s: First retry delay; it doubles with every retry (capped at 30 s).
        max_concurrent_requests: Requests in flight at once, over all servers.
    """

    def __init__(
        self,
        server_urls: Sequence[str],
        tokenizer: Any,
        adapter_dir: str | Path,
        *,
        served_model_name: str | None = None,
        expected_models: Sequence[str] = (),
        system_prompt: str | None = None,
        server_adapter_dir: str | Path | None = None,
        zero_adapter_for_base: bool = True,
        request_timeout_s: float = 600.0,
        max_retries: int = 3,
        retry_backoff_s: float = 1.0,
        max_concurrent_requests: int = 64,
    ):
        if isinstance(server_urls, str):
            server_urls = [server_urls]
        if not server_urls:
            raise ValueError("the vllm_server engine needs at least one server URL (vllm.server_urls)")
        if int(max_concurrent_requests) < 1:
            raise ValueError(f"max_concurrent_requests must be >= 1, got {max_concurrent_requests!r}")
        self.servers = list(dict.fromkeys(server_root(url) for url in server_urls))
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.zero_adapter_for_base = bool(zero_adapter_for_base)
        self.max_concurrent_requests = int(max_concurrent_requests)
        self.client = ServerClient(
            request_timeout_s=request_timeout_s, max_retries=max_retries, retry_backoff_s=retry_backoff_s
        )
        self.rank, self.world_size = _process_group()
        self._pool: ThreadPoolExecutor | None = None
        self._rotation = itertools.count()
        self._encode_cached = functools.lru_cache(maxsize=4096)(self._encode_uncached)
        #: Per-engine tag in served names: runs sharing a server never clash (the same on every rank).
        self.run_tag: str = _from_rank0(f"llmzoo{secrets.token_hex(3)}")
        self.adapter_dir = Path(adapter_dir).resolve() / self.run_tag
        self._server_adapter_dir = (
            Path(server_adapter_dir) / self.run_tag if server_adapter_dir is not None else self.adapter_dir
        )
        self._served: dict[str, tuple[int, str]] = {}  # adapter -> (version, served name)
        self._base_name: str | None = None  # the zero adapter's name once loaded
        self._restore_lock = threading.Lock()
        facts = check_servers(
            self.client, self.servers, tokenizer, self.encode("hi"), served_model_name, list(expected_models)
        )
        self.versions: dict[str, str] = facts.versions  # server -> vLLM version
        self.served_model = facts.served_model
        self.max_model_len = facts.max_model_len

    # ------------------------------------------------------------------ Engine interface

    def generate(
        self,
        prompts: Sequence[str],
        adapters: Sequence[str | None],
        n: int,
        sampling: SamplingParams,
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per prompt, ``adapters[i]`` answering ``prompts[i]``, on the servers."""
        check_generate_args(prompts, adapters, n, sampling)
        check_served_adapters(adapters, self._served)
        if not prompts:
            return []
        encoded = [self.encode(prompt) for prompt in prompts]
        for ids in encoded:
            if self.max_model_len is not None and len(ids) >= self.max_model_len:
                raise ValueError(
                    f"a templated prompt has {len(ids)} tokens, at least the servers' max_model_len="
                    f"{self.max_model_len}: shorten the env's prompt or start the servers with a larger "
                    "--max-model-len"
                )
        start = next(self._rotation)
        jobs = [
            (
                (start + index) % len(self.servers),
                {
                    "model": self.served_name(adapter),
                    "prompt": ids,
                    **request_sampling_fields(sampling, int(n), index),
                    "return_tokens_as_token_ids": True,
                    "return_token_ids": True,
                },
            )
            for index, (ids, adapter) in enumerate(zip(encoded, adapters, strict=True))
        ]
        if len(jobs) == 1:
            return [self._complete(jobs[0][0], jobs[0][1], int(n))]
        if self._pool is None:  # kept across calls: its threads keep their HTTP connections alive
            self._pool = ThreadPoolExecutor(self.max_concurrent_requests, thread_name_prefix="vllm-server")
        futures = [self._pool.submit(self._complete, server, body, int(n)) for server, body in jobs]
        # Reported from this thread as requests finish (the progress callback lives in its context).
        for future in as_completed(futures):
            group = future.result()
            report_generated(sum(len(c.token_ids) for c in group), len(group))
        return [future.result() for future in futures]

    def load_adapters(self, paths: Mapping[str, str | Path], version: int) -> None:
        """Serve the adapters saved at ``paths`` (adapter name -> PEFT dir) as version ``version``.

        Each adapter is copied to ``adapter_dir`` and loaded on every server under a new name, then
        its previous version is unloaded and its copy deleted. With several trainer processes only
        rank 0 does this (the processes hold identical adapters); every rank raises its error.
        """
        version = int(version)
        for adapter, path in paths.items():
            adapter_rank(path)  # a saved LoRA, not DoRA: the same checks as the colocated engine
            current = self._served.get(adapter)
            if current is not None and version <= current[0]:
                raise ValueError(
                    f"adapter {adapter!r} is already served as version {current[0]}; load new weights under "
                    "a higher version (vLLM caches adapters by name, reusing one would serve stale weights)"
                )
        error: Exception | None = None
        if self.rank == 0:
            try:
                self._load_on_servers(paths, version)
            except Exception as err:  # every rank learns of it below, then raises
                error = err
        failure = _from_rank0(None if error is None else f"{type(error).__name__}: {error}")
        if error is not None:
            raise error
        if failure is not None:
            raise EndpointError(f"rank 0 could not load the adapters on the vLLM servers: {failure}")
        for adapter in paths:
            self._served[adapter] = (version, self._versioned_name(adapter, version))
        if self.zero_adapter_for_base and paths:  # rank 0 loaded it with the first adapter
            self._base_name = f"{self.run_tag}-base-zero"

    # ------------------------------------------------------------------ public helpers

    @property
    def served_adapters(self) -> dict[str, str]:
        """Adapter -> the versioned name the servers serve it under."""
        return {adapter: name for adapter, (_, name) in self._served.items()}

    def served_name(self, adapter: str | None) -> str:
        """The ``model`` a request for ``adapter`` names (``None``: the base model, or its zero adapter)."""
        if adapter is None:
            return self._base_name or self.served_model
        return self._served[adapter][1]

    def encode(self, prompt: str) -> list[int]:
        """The templated token ids of ``prompt`` that the servers are sent (cached)."""
        return list(self._encode_cached(prompt))

    def loaded_models(self, server: str) -> list[str]:
        """Every model name ``server`` lists now (base model and loaded LoRAs)."""
        payload = self.client.send(server, "GET", "/v1/models", None)
        return [str(entry.get("id")) for entry in payload.get("data", []) if isinstance(entry, dict)]

    def close(self) -> None:
        """Unload this engine's adapters from the servers and delete their copies (rank 0; best effort:
        a server that is gone is logged, not raised). The servers keep running."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self.rank != 0:
            return
        names = [name for _, name in self._served.values()] + ([self._base_name] if self._base_name else [])
        for server in self.servers:
            for name in names:
                try:
                    self._unload(server, name, retries=0)
                except EndpointError as err:
                    logger.warning("could not unload %s from %s: %s", name, server, err)
        self._served.clear()
        self._base_name = None
        shutil.rmtree(self.adapter_dir, ignore_errors=True)

    # ------------------------------------------------------------------ start-up checks

    # ------------------------------------------------------------------ adapter sync

    def _versioned_name(self, adapter: str, version: int) -> str:
        return f"{self.run_tag}-{adapter}-v{version}"

    def _load_on_servers(self, paths: Mapping[str, str | Path], version: int) -> None:
        self.adapter_dir.mkdir(parents=True, exist_ok=True)
        for adapter, path in paths.items():
            name = self._versioned_name(adapter, version)
            target = self.adapter_dir / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(path, target)
            self._load_everywhere(name)
            if self.zero_adapter_for_base and self._base_name is None:
                zero = f"{self.run_tag}-base-zero"
                write_zero_adapter(path, self.adapter_dir / zero)
                self._load_everywhere(zero)
                self._base_name = zero
            current = self._served.get(adapter)
            if current is not None:
                for server in self.servers:
                    self._unload(server, current[1])
                shutil.rmtree(self.adapter_dir / current[1], ignore_errors=True)
            self._served[adapter] = (version, name)  # at once: a later adapter's failure leaves this true
            logger.debug("vLLM servers serve adapter %s from %s", name, target)

    def _restore_adapters(self, server: str, missing: str) -> bool:
        """Load this engine's adapters again on ``server`` when it lost them (a restart loses every
        runtime-loaded adapter), from the copies in ``adapter_dir``. ``False``: ``missing`` is not
        one of this engine's names (the 404 is someone else's problem)."""
        ours = [name for _, name in self._served.values()] + ([self._base_name] if self._base_name else [])
        if missing not in ours:
            return False
        with self._restore_lock:  # concurrent requests that failed alike restore once
            listed = set(self.loaded_models(server))
            lost = [name for name in ours if name not in listed]
            for name in lost:
                body = {"lora_name": name, "lora_path": str(self._server_adapter_dir / name)}
                try:
                    self.client.send(server, "POST", "/v1/load_lora_adapter", body, parse=False)
                except EndpointError:
                    if name not in self.loaded_models(server):  # another trainer process loaded it
                        raise
            if lost:
                logger.warning(
                    "vLLM server %s no longer served %s (restarted?): loaded them again", server, lost
                )
        return True

    def _unload(self, server: str, name: str, retries: int | None = None) -> None:
        self.client.send(
            server, "POST", "/v1/unload_lora_adapter", {"lora_name": name}, retries=retries, parse=False
        )

    def _load_everywhere(self, name: str) -> None:
        """Load adapter copy ``name`` on every server; on a failure, unload it where it was loaded."""
        done = []
        body = {"lora_name": name, "lora_path": str(self._server_adapter_dir / name)}
        try:
            for server in self.servers:
                self.client.send(server, "POST", "/v1/load_lora_adapter", body, parse=False)
                done.append(server)
        except EndpointError as err:
            for server in done:
                with contextlib.suppress(EndpointError):  # the load error below is what matters
                    self._unload(server, name, retries=0)
            hint = ""
            if err.status in (404, 405):
                hint = " (start the server with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora)"
            raise EndpointError(f"could not load adapter {name}: {err}{hint}", status=err.status) from None

    # ------------------------------------------------------------------ requests

    def _complete(self, first_server: int, body: dict[str, Any], n: int) -> list[Completion]:
        try:
            payload, server = self.client.send_to_any(self.servers, first_server, "/v1/completions", body)
        except EndpointError as err:
            if (
                err.status != 404
                or err.server is None
                or not self._restore_adapters(err.server, body["model"])
            ):
                raise
            retry_first = self.servers.index(err.server)  # the server that has them again
            payload, server = self.client.send_to_any(self.servers, retry_first, "/v1/completions", body)
        try:
            choices = sorted(payload["choices"], key=lambda c: int(c.get("index", 0)))
            completions = [self._completion(choice, body["prompt"]) for choice in choices]
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise EndpointError(
                f"{server}/v1/completions answered without token ids and logprobs ({err!r}): "
                f"{str(payload)[:_BODY_CHARS]}"
            ) from None
        if len(completions) != n:
            raise EndpointError(f"{server} returned {len(completions)} choices for n={n} ({body['model']})")
        return completions

    def _completion(self, choice: dict[str, Any], prompt_ids: list[int]) -> Completion:
        logprobs = choice["logprobs"]
        tokens = [int(str(t).removeprefix(_TOKEN_ID_PREFIX)) for t in logprobs["tokens"]]
        if choice.get("token_ids") is not None and list(choice["token_ids"]) != tokens:
            raise ValueError("token_ids and the logprobs' tokens differ")
        if choice.get("prompt_token_ids") is not None and list(choice["prompt_token_ids"]) != prompt_ids:
            raise ValueError("the server saw other prompt token ids than it was sent")
        values = [float(v) for v in logprobs["token_logprobs"]]
        if len(values) != len(tokens):
            raise ValueError(f"{len(values)} logprobs for {len(tokens)} tokens")
        reason = choice.get("finish_reason")
        if reason not in ("stop", "length"):
            raise ValueError(f"finish_reason {reason!r}")
        return Completion(
            text=self.tokenizer.decode(tokens, skip_special_tokens=True),
            prompt_token_ids=list(prompt_ids),
            token_ids=tokens,
            logprobs=values,
            finish_reason=reason,
        )

    def _encode_uncached(self, prompt: str) -> tuple[int, ...]:
        return tuple(encode_prompt(self.tokenizer, prompt, self.system_prompt))


def engine_from_config(config: Any, policy: Any) -> VLLMServerEngine:
    """The trainer's server engine for ``config`` (a :class:`llm_zoo_train.config.Config`) and
    ``policy`` (:func:`server_engine` with its tokenizer). The trainer loads its adapters as
    version 0 right after."""
    return server_engine(config, policy.tokenizer)


def server_engine(config: Any, tokenizer: Any) -> VLLMServerEngine:
    """A server engine for ``config`` that encodes prompts with ``tokenizer`` (the base model's).

    Servers, timeouts and retries come from the config's ``vllm`` section; adapters are copied to
    ``vllm.adapter_dir`` (default: ``<output_dir>/engine_adapters/served``, readable by servers on
    this machine), under the engine's own run tag: several engines of one run (the trainer's, an
    asynchronous generation process's) load their adapters side by side.
    """
    from llm_zoo_train.models.policy import public_model_id, resolve_model_path

    section = config.vllm
    model = config.model.name_or_path
    expected = [model, resolve_model_path(model, config.model.cache_dir)]
    if public_model_id(model):
        expected.insert(1, str(public_model_id(model)))
    adapter_dir = section.adapter_dir or Path(config.training.output_dir) / "engine_adapters" / "served"
    return VLLMServerEngine(
        section.server_urls,
        tokenizer,
        adapter_dir,
        served_model_name=section.served_model_name,
        expected_models=expected,
        system_prompt=config.model.system_prompt,
        server_adapter_dir=section.server_adapter_dir,
        zero_adapter_for_base=section.zero_adapter_for_base,
        request_timeout_s=section.request_timeout_s,
        max_retries=section.max_retries,
        retry_backoff_s=section.retry_backoff_s,
        max_concurrent_requests=section.max_concurrent_requests,
    )
