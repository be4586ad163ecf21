"""An engine that asks any OpenAI-compatible server (``vllm serve``, SGLang, llama.cpp, a hosted API).

:class:`OpenAICompatEngine` sends each prompt to ``POST {base_url}/chat/completions`` as one user
message (after the optional system message, exactly as :func:`llm_zoo_train.models.chat.chat_messages`
builds it for the local engines); the server applies the chat template. It serves evaluation
(:mod:`llm_zoo_train.evaluation.evaluate`): a served model, or LoRA adapters served under their own names
(``vllm serve BASE --enable-lora --lora-modules tool=DIR plan=DIR``), play the env's roles.

What comes back: the completion text and its finish reason. ``prompt_token_ids``, ``token_ids``
and ``logprobs`` are empty lists - the chat endpoint does not return token ids, so the result is
for evaluation, not for training updates. :meth:`OpenAICompatEngine.load_adapters` raises: the
server decides what it serves.

Adapters: ``adapters[i]`` is the *served model name* that answers prompt ``i`` (``None``: the
engine's default ``model``); ``model_names`` can map adapter names to served names.

Transport: the standard library (``urllib``), one request per prompt, ``max_concurrency`` requests
in flight (a thread pool), a timeout per request, and retries with exponential backoff on
connection errors, timeouts, HTTP 429 and 5xx. Every error names the URL and the HTTP status and
body, and is an :class:`EndpointError`.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from llm_zoo_train.engines.base import Completion, SamplingParams, check_generate_args
from llm_zoo_train.models.chat import chat_messages

__all__ = ["EndpointError", "OpenAICompatEngine"]

_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}
_BODY_CHARS = 500  # of an error body quoted in a message


class EndpointError(RuntimeError):
    """The server could not be reached or answered with an error; the message says which and why.

    Attributes:
        status: The HTTP status of an error answer (``None``: no answer, or a malformed one).
        server: The server that answered with ``status`` (``None``: not known).
    """

    def __init__(self, message: str, status: int | None = None, server: str | None = None):
        super().__init__(message)
        self.status = status
        self.server = server


class OpenAICompatEngine:
    """An :class:`~llm_zoo_train.engines.base.Engine` backed by an OpenAI-compatible chat endpoint.

    Args:
        base_url: The API root, e.g. ``http://localhost:8000/v1`` (``/chat/completions`` is added).
        model: Served model name answering prompts whose adapter is ``None``.
        model_names: Adapter name -> served model name (adapters not listed are sent as they are).
        api_key: Sent as ``Authorization: Bearer``; default: the environment variable ``api_key_env``.
        api_key_env: Environment variable holding the key (``OPENAI_API_KEY``); unset means no key.
        system_prompt: System message before every prompt (``None``: none).
        timeout_s: Seconds to wait for one response.
        max_retries: Retries of one request after a connection error, timeout, 429 or 5xx.
        backoff_s: First retry delay; it doubles with every retry (capped at 30 s).
        max_concurrency: Requests in flight at once.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        model_names: Mapping[str, str] | None = None,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        system_prompt: str | None = None,
        timeout_s: float = 300.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        max_concurrency: int = 16,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"endpoint {base_url!r} must be an http:// or https:// URL, e.g. http://localhost:8000/v1"
            )
        if int(max_concurrency) < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.model_names = dict(model_names or {})
        self.api_key = api_key if api_key is not None else os.environ.get(api_key_env) or None
        self.system_prompt = system_prompt
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_concurrency = int(max_concurrency)

    # ------------------------------------------------------------------ Engine interface

    def generate(
        self,
        prompts: Sequence[str],
        adapters: Sequence[str | None],
        n: int,
        sampling: SamplingParams,
    ) -> list[list[Completion]]:
        """``n`` completions per prompt (one request each, with the API's ``n``), concurrently."""
        check_generate_args(prompts, adapters, n, sampling)
        requests = [
            self._request_body(p, a, int(n), sampling) for p, a in zip(prompts, adapters, strict=True)
        ]
        if len(requests) <= 1 or self.max_concurrency == 1:
            return [self._complete(body, int(n)) for body in requests]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(requests))) as pool:
            return list(pool.map(lambda body: self._complete(body, int(n)), requests))

    def load_adapters(self, paths: Mapping[str, str], version: int) -> None:
        """Not possible: the server decides what it serves."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot load adapters {sorted(paths)}: serve them with the server "
            "(e.g. `vllm serve BASE --enable-lora --lora-modules NAME=DIR`) and name them as models"
        )

    # ------------------------------------------------------------------ server checks

    def served_models(self) -> list[str] | None:
        """Model names listed by ``GET {base_url}/models``; ``None`` if the server has no such route."""
        url = f"{self.base_url}/models"
        try:
            payload = self._send(url, None)
        except EndpointError as err:
            if err.status in (404, 405):
                return None
            raise
        return [str(entry.get("id")) for entry in payload.get("data", []) if isinstance(entry, dict)]

    def check_models(self, names: Sequence[str]) -> None:
        """Raise :class:`EndpointError` if the server lists its models and some of ``names`` are missing."""
        served = self.served_models()
        if served is None:
            return
        missing = [name for name in dict.fromkeys(names) if name not in served]
        if missing:
            raise EndpointError(f"{self.base_url} does not serve model(s) {missing}; it serves {served}")

    # ------------------------------------------------------------------ internals

    def _request_body(
        self, prompt: str, adapter: str | None, n: int, sampling: SamplingParams
    ) -> dict[str, Any]:
        model = self.model if adapter is None else self.model_names.get(adapter, adapter)
        body: dict[str, Any] = {
            "model": model,
            "messages": chat_messages(prompt, self.system_prompt),
            "n": n,
            "max_tokens": int(sampling.max_tokens),
            "temperature": float(sampling.temperature),
        }
        if not sampling.greedy and sampling.top_p < 1.0:
            body["top_p"] = float(sampling.top_p)
        if not sampling.greedy and sampling.top_k > 0:
            body["top_k"] = int(sampling.top_k)  # vLLM/SGLang extension; only sent when set
        if sampling.seed is not None:
            body["seed"] = int(sampling.seed)
        if sampling.stop:  # the OpenAI API leaves the stop text out of the reply (local engines keep it)
            body["stop"] = list(sampling.stop)
        return body

    def _complete(self, body: dict[str, Any], n: int) -> list[Completion]:
        url = f"{self.base_url}/chat/completions"
        payload = self._send(url, body)
        try:
            choices = sorted(payload["choices"], key=lambda c: int(c.get("index", 0)))
            texts = [(c["message"].get("content") or "", c.get("finish_reason")) for c in choices]
        except (KeyError, TypeError, AttributeError, ValueError):
            raise EndpointError(
                f"{url} answered without choices[].message.content: {json.dumps(payload)[:_BODY_CHARS]}"
            ) from None
        if len(texts) != n:
            raise EndpointError(f"{url} returned {len(texts)} choices for n={n} (model {body['model']!r})")
        return [
            Completion(
                text=text,
                prompt_token_ids=[],
                token_ids=[],
                logprobs=[],
                finish_reason="length" if reason == "length" else "stop",
            )
            for text, reason in texts
        ]

    def _send(self, url: str, body: dict[str, Any] | None) -> dict[str, Any]:
        """GET (``body`` None) or POST JSON, with retries; the decoded JSON answer."""
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode("utf-8")
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        attempt = 0
        while True:
            request = urllib.request.Request(
                url, data=data, headers=headers, method="GET" if data is None else "POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    raw = response.read()
                break
            except urllib.error.HTTPError as err:
                text = err.read().decode("utf-8", "replace").strip()[:_BODY_CHARS]
                error = EndpointError(
                    f"{url} answered HTTP {err.code} {err.reason}: {text or '(empty body)'}", status=err.code
                )
                if err.code not in _RETRY_STATUS or attempt >= self.max_retries:
                    raise error from None
            except (OSError, http.client.HTTPException) as err:  # URLError, timeouts, resets, cut answers
                reason = getattr(err, "reason", err)
                if attempt >= self.max_retries:
                    raise EndpointError(
                        f"cannot reach {url} after {attempt + 1} attempt(s): {reason}. Is the server "
                        "running (e.g. `vllm serve MODEL`) and is the URL right (it usually ends in /v1)?"
                    ) from None
            time.sleep(min(self.backoff_s * 2**attempt, 30.0))
            attempt += 1
        try:
            payload = json.loads(raw)
        except ValueError:
            raise EndpointError(
                f"{url} answered with something that is not JSON: {raw[:_BODY_CHARS]!r}"
            ) from None
        if not isinstance(payload, dict):
            raise EndpointError(
                f"{url} answered with JSON that is not an object: {str(payload)[:_BODY_CHARS]}"
            )
        return payload
