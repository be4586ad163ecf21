"""The wire format of ``llm-zoo serve``: message types, error codes, and the episode snapshot.

Shared by the server (:mod:`llm_zoo.serve.app`) and the client (:mod:`llm_zoo.remote`); it needs
only the standard library, so importing it never pulls in the server stack.

Every WebSocket frame is one JSON object ``{"type": ..., "data": {...}}``, as in OpenEnv. The types
OpenEnv defines keep its meaning (``reset``, ``step``, ``state``, ``close`` from the client;
``observation``, ``state``, ``error`` from the server); the AEC extras (``make``, ``observe``,
``clone``, ``attach``, ``render``) are answered with ``session``, ``observe`` and ``render`` frames.
An OpenEnv client never sends the extras, so it sees only OpenEnv's own frames.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = [
    "ACTION_SCHEMA",
    "CLIENT_TYPES",
    "ERROR_CODES",
    "MAX_EPISODE_ID_CHARS",
    "MAX_JSON_DEPTH",
    "OBSERVATION_SCHEMA",
    "RESET_KEYS",
    "STATE_SCHEMA",
    "STEP_KEYS",
    "ProtocolError",
    "decode",
    "encode",
    "episode_id_of",
    "error_frame",
    "is_done",
    "observation_payload",
    "parse_json",
    "reset_arguments",
    "step_text",
]

#: Message types a client may send.
CLIENT_TYPES = ("make", "attach", "reset", "step", "observe", "state", "render", "clone", "close")

#: Error codes: OpenEnv's ``WSErrorCode`` values, so OpenEnv clients report them as usual.
ERROR_CODES = (
    "INVALID_JSON",  # a frame that is not a JSON object
    "UNKNOWN_TYPE",  # a "type" outside CLIENT_TYPES
    "VALIDATION_ERROR",  # a field missing or of the wrong type
    "EXECUTION_ERROR",  # the env refused the call (e.g. a step after the end)
    "CAPACITY_REACHED",  # the server holds its maximum number of sessions
    "FACTORY_ERROR",  # the env could not be made (unknown id, bad kwargs)
    "SESSION_ERROR",  # no session yet, or it expired or was closed
)

#: Exceptions the client raises again under their own name (anything else is a RemoteEnvError).
REPLAYED_EXCEPTIONS = (
    "RuntimeError",
    "ValueError",
    "TypeError",
    "KeyError",
    "AssertionError",
    "UnknownEnvError",
)


class ProtocolError(Exception):
    """A request the server refuses; becomes an ``error`` frame with ``code`` and ``message``."""

    def __init__(self, code: str, message: str, exception: str | None = None, *, status: int = 400):
        super().__init__(message)
        self.code = code
        self.message = message
        self.exception = exception
        self.status = status  # the HTTP status, where the request came over HTTP


def _plain(value: Any) -> Any:
    """JSON's fallback for what env infos may hold: numpy scalars and arrays, sets, anything else
    as its ``str``."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return str(value)


def encode(kind: str, data: dict[str, Any]) -> str:
    """One frame as text."""
    return json.dumps({"type": kind, "data": data}, default=_plain)


#: Deepest nesting of arrays and objects a frame or body may have: no env argument needs more, and
#: a deeper one (``[[[[...]]]]``) made the parser raise RecursionError, which closed the WebSocket
#: without an error frame and answered HTTP 500.
MAX_JSON_DEPTH = 64


def parse_json(text: str | bytes, what: str) -> Any:
    """``text`` parsed as JSON; :class:`ProtocolError` (``INVALID_JSON``) when it is not JSON or
    nests deeper than :data:`MAX_JSON_DEPTH`."""
    try:
        value = json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise ProtocolError("INVALID_JSON", f"{what} is not valid JSON: {err}") from None
    except RecursionError:
        value = None
        deep = True
    else:
        deep = _deeper_than(value, MAX_JSON_DEPTH)
    if deep:
        raise ProtocolError(
            "INVALID_JSON", f"{what} nests arrays or objects deeper than {MAX_JSON_DEPTH} levels"
        )
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def decode(text: str | bytes) -> tuple[str, dict[str, Any]]:
    """Parse one client frame into ``(type, data)``.

    Raises:
        ProtocolError: The frame is not a JSON object with a known ``type`` and an object ``data``.
    """
    message = parse_json(text, "the frame")
    if not isinstance(message, dict):
        raise ProtocolError(
            "INVALID_JSON",
            f'a frame must be a JSON object {{"type": ..., "data": ...}}, got {type(message).__name__}',
        )
    kind = message.get("type")
    if kind not in CLIENT_TYPES:
        raise ProtocolError(
            "UNKNOWN_TYPE", f"unknown message type {kind!r}; valid types: {', '.join(CLIENT_TYPES)}"
        )
    data = message.get("data", {})
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProtocolError(
            "VALIDATION_ERROR", f'"data" of a {kind!r} frame must be an object, got {type(data).__name__}'
        )
    return kind, data


def error_frame(err: ProtocolError) -> str:
    data: dict[str, Any] = {"code": err.code, "message": err.message}
    if err.exception:
        data["exception"] = err.exception
    return encode("error", data)


def is_done(env: Any) -> bool:
    """No agent is left to act: every agent is gone, terminated or truncated."""
    agents = getattr(env, "agents", [])
    return not agents or all(env.terminations[a] or env.truncations[a] for a in agents)


def _finite_or_none(value: Any) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None


def observation_payload(env: Any, acting: str | None) -> dict[str, Any]:
    """OpenEnv's ``{"observation", "reward", "done"}`` after a reset (``acting`` None) or a step.

    ``observation`` is the whole AEC bookkeeping, so a client can mirror the env exactly: the
    selected ``agent`` and its ``prompt`` (None when that agent is no longer in ``agents``), ``agents``, ``rewards``,
    ``cumulative_rewards``, ``terminations``, ``truncations``, ``infos``, ``turn``, ``task_id``,
    ``success``. ``reward`` is the acting agent's reward for this step (None after a reset), and
    ``done`` is true once no agent is left to act.
    """
    agents = list(env.agents)
    selected = getattr(env, "agent_selection", None)
    prompt = env.observe(selected)["prompt"] if selected in agents else None
    observation = {
        "agent": selected,
        "prompt": prompt,
        "agents": agents,
        "rewards": {a: float(r) for a, r in env.rewards.items()},
        "cumulative_rewards": {a: float(r) for a, r in env._cumulative_rewards.items()},
        "terminations": {a: bool(v) for a, v in env.terminations.items()},
        "truncations": {a: bool(v) for a, v in env.truncations.items()},
        "infos": env.infos,
        "turn": getattr(env, "turn", None),
        "task_id": getattr(env, "task_id", None),
        "success": bool(getattr(env, "success", False)),
    }
    reward = None
    if acting is not None and acting in env.rewards:
        reward = _finite_or_none(env.rewards[acting])
    return {"observation": observation, "reward": reward, "done": is_done(env)}


#: JSON schema of a ``step`` frame's data (OpenEnv's ``/schema`` "action").
ACTION_SCHEMA = {
    "type": "object",
    "properties": {
        "text": {
            "type": ["string", "null"],
            "description": "the selected agent's answer; null for a dead agent",
        },
        "agent": {"type": "string", "description": "optional: the agent you believe is selected (checked)"},
        "metadata": {"type": "object"},
    },
    "required": ["text"],
}
OBSERVATION_SCHEMA = {
    "type": "object",
    "properties": {
        "agent": {"type": ["string", "null"]},
        "prompt": {"type": ["string", "null"]},
        "agents": {"type": "array", "items": {"type": "string"}},
        "rewards": {"type": "object"},
        "cumulative_rewards": {"type": "object"},
        "terminations": {"type": "object"},
        "truncations": {"type": "object"},
        "infos": {"type": "object"},
        "turn": {"type": ["integer", "null"]},
        "task_id": {"type": ["string", "null"]},
        "success": {"type": "boolean"},
    },
}
STATE_SCHEMA = {
    "type": "object",
    "properties": {"episode_id": {"type": ["string", "null"]}, "step_count": {"type": "integer"}},
}
RESET_KEYS = ("seed", "options", "episode_id", "env_kwargs")
STEP_KEYS = ("text", "agent", "metadata")


def reset_arguments(data: dict[str, Any]) -> tuple[int | None, dict[str, Any] | None]:
    """A ``reset`` frame's seed and options, checked."""
    unknown = sorted(set(data) - set(RESET_KEYS))
    if unknown:
        raise ProtocolError(
            "VALIDATION_ERROR", f"reset got unknown fields {unknown}; valid: {list(RESET_KEYS)}"
        )
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ProtocolError("VALIDATION_ERROR", f"reset's seed must be an integer or null, got {seed!r}")
    options = data.get("options")
    if options is not None and not isinstance(options, dict):
        raise ProtocolError("VALIDATION_ERROR", f"reset's options must be an object or null, got {options!r}")
    return seed, options


MAX_EPISODE_ID_CHARS = 256


def episode_id_of(data: dict[str, Any]) -> str | None:
    """A ``reset`` frame's OpenEnv ``episode_id``, checked (``None`` when absent)."""
    episode_id = data.get("episode_id")
    if episode_id is not None and (
        not isinstance(episode_id, str) or not 0 < len(episode_id) <= MAX_EPISODE_ID_CHARS
    ):
        raise ProtocolError(
            "VALIDATION_ERROR",
            f"reset's episode_id must be a string of 1 to {MAX_EPISODE_ID_CHARS} characters or null, "
            f"got {str(episode_id)[:40]!r}",
        )
    return episode_id


def step_text(data: dict[str, Any], env: Any) -> str | None:
    """A ``step`` frame's text, checked against ``env``: reset, the claimed agent selected, the
    episode not over for it."""
    unknown = sorted(set(data) - set(STEP_KEYS))
    if unknown or "text" not in data:
        raise ProtocolError(
            "VALIDATION_ERROR",
            f'step needs {{"text": str or null}}; got fields {sorted(data)} (valid: {list(STEP_KEYS)})',
        )
    text = data["text"]
    if text is not None and not isinstance(text, str):
        raise ProtocolError(
            "VALIDATION_ERROR", f"step's text must be a string or null, got {type(text).__name__}"
        )
    if not getattr(env, "_has_reset", True) or not hasattr(env, "agent_selection"):
        raise ProtocolError("EXECUTION_ERROR", "step before reset: send a reset frame first", "RuntimeError")
    selected = env.agent_selection
    claimed = data.get("agent")
    if claimed is not None and claimed != selected:
        raise ProtocolError(
            "VALIDATION_ERROR", f"step for {claimed!r}, but the selected agent is {selected!r}"
        )
    if not env.agents:
        raise ProtocolError(
            "EXECUTION_ERROR",
            "step after the end: the episode is over (no agent left); send reset",
            "RuntimeError",
        )
    if text is not None and (env.terminations[selected] or env.truncations[selected]):
        over = "the episode is over" if is_done(env) else f"{selected} is done"
        raise ProtocolError(
            "EXECUTION_ERROR",
            f"step after the end: {over}; a done agent's step takes text null (send reset for a new episode)",
            "ValueError",
        )
    return text
