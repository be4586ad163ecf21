"""The checks a server engine makes on every vLLM server before it sends a request.

:func:`check_servers` asks each server ``GET /health``, ``/version`` and ``/v1/models`` (exactly
one base model, the trainer's: :func:`same_model`), ``POST /tokenize`` of a probe text (it must
give the trainer tokenizer's ids) and one one-token request with ``top_k=1``
(:func:`check_logprobs_mode`: with processed logprobs the sampled token's logprob is exactly 0;
with vLLM's default raw logprobs it is not). Every failure is an
:class:`~llm_zoo_train.engines.openai_compat.EndpointError` saying what to change.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llm_zoo_train.engines.openai_compat import EndpointError
from llm_zoo_train.engines.vllm.server_client import ServerClient

__all__ = ["ServerFacts", "check_logprobs_mode", "check_servers", "same_model"]

_PROBE_TEXT = "Hello, world! 0 1 2"


@dataclass(frozen=True)
class ServerFacts:
    """What the checks learned about the servers.

    Attributes:
        served_model: The base model's name on the servers (requests for the base model use it).
        max_model_len: The smallest context length the servers report (``None``: not reported).
        versions: Each server's vLLM version.
    """

    served_model: str
    max_model_len: int | None
    versions: dict[str, str]


def check_servers(
    client: ServerClient,
    servers: Sequence[str],
    tokenizer: Any,
    probe_ids: Sequence[int],
    served_model_name: str | None,
    expected: list[str],
) -> ServerFacts:
    """Health, version, base model, tokenizer and logprobs mode of every server.

    Args:
        client: Sends the requests.
        servers: The servers' root URLs.
        tokenizer: The trainer's tokenizer: each server's must encode a probe text alike.
        probe_ids: A templated prompt's token ids for the one-token logprobs probe.
        served_model_name: The base model's name on the servers (``None``: the only one served).
        expected: Names or paths the served base model must have (empty: any).
    """
    versions: dict[str, str] = {}
    names: dict[str, str] = {}
    lengths: list[int] = []
    for server in servers:
        client.send(server, "GET", "/health", None, parse=False)
        versions[server] = str(client.send(server, "GET", "/version", None).get("version"))
        models = [
            m for m in client.send(server, "GET", "/v1/models", None).get("data", []) if isinstance(m, dict)
        ]
        bases = [m for m in models if not m.get("parent")]
        if served_model_name is not None:
            bases = [m for m in bases if m.get("id") == served_model_name]
        if len(bases) != 1:
            raise EndpointError(
                f"{server} serves base model(s) {[m.get('id') for m in models if not m.get('parent')]}; "
                + (
                    f"none is named {served_model_name!r} (vllm.served_model_name)"
                    if served_model_name is not None
                    else "set vllm.served_model_name to the one to use"
                )
            )
        base = bases[0]
        if expected and not same_model(base, expected):
            raise EndpointError(
                f"{server} serves base model {base.get('id')!r} (from {base.get('root')!r}), but the trainer's "
                f"model is {expected[0]!r}: start the server with --model {expected[-1]} (or name it with "
                "--served-model-name and set vllm.served_model_name)"
            )
        names[server] = str(base["id"])
        if base.get("max_model_len"):
            lengths.append(int(base["max_model_len"]))
    if len(set(names.values())) != 1:
        raise EndpointError(f"the servers serve different base models: {names}")
    name = next(iter(names.values()))
    want = list(tokenizer(_PROBE_TEXT, add_special_tokens=False)["input_ids"])
    for server in servers:
        got = client.send(
            server,
            "POST",
            "/tokenize",
            {"model": name, "prompt": _PROBE_TEXT, "add_special_tokens": False},
        ).get("tokens")
        if got != want:
            raise EndpointError(
                f"{server}'s tokenizer encodes {_PROBE_TEXT!r} as {got}, the trainer's as {want}: the server "
                "runs another model or tokenizer than the trainer"
            )
        check_logprobs_mode(client, server, name, list(probe_ids))
    return ServerFacts(name, min(lengths) if lengths else None, versions)


def check_logprobs_mode(client: ServerClient, server: str, model: str, probe_ids: list[int]) -> None:
    """With top_k=1 the processed logprob of the sampled token is log(1) = 0; a raw one is not."""
    body = {"model": model, "prompt": list(probe_ids), "max_tokens": 1, "top_k": 1, "logprobs": 0}
    choice = client.send(server, "POST", "/v1/completions", body)["choices"][0]
    logprob = float(choice["logprobs"]["token_logprobs"][0])
    if abs(logprob) > 1e-6:
        raise EndpointError(
            f"{server} records raw logprobs (a top_k=1 sample got logprob {logprob:.3g}, not 0): the "
            "trainer needs the sampling policy's; start the server with --logprobs-mode processed_logprobs"
        )


def same_model(base: Mapping[str, Any], expected: Sequence[str]) -> bool:
    """Whether a served base model (its ``id`` and ``root``) is one of the ``expected`` names or paths."""
    served = {str(base.get("id")), str(base.get("root"))}
    wanted = set(map(str, expected))
    if served & wanted:
        return True
    real = {os.path.realpath(s) for s in served if os.path.exists(s)}
    return bool(real & {os.path.realpath(w) for w in wanted if os.path.exists(w)})
