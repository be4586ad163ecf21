"""The ASGI app of ``llm-zoo serve`` (Starlette): OpenEnv's endpoints for every registered env.

Routes (``{env_id}`` is a registered id such as ``PlanPath-v0``; plugins included):

* ``WS /envs/{env_id}/ws`` - an OpenEnv session on that env: OpenEnv's ``EnvClient`` appends
  ``/ws`` to its base URL, so ``GenericEnvClient(base_url="http://host:port/envs/PlanPath-v0")``
  works unchanged. The env is made on the first ``reset`` (with ``data["env_kwargs"]``, if any)
  or by a ``make`` frame.
* ``WS /ws`` - the same without an env: the first frame is ``make`` (or ``attach`` to a clone).
* ``POST /reset``, ``POST /envs/{env_id}/reset`` - OpenEnv's stateless HTTP reset: a fresh env,
  reset with the body's ``seed``/``options``, its first observation, then closed.
* ``POST /step`` - refused: OpenEnv's HTTP step runs on a fresh env, which for a turn-based
  episode means nothing; use the WebSocket session.
* ``GET /state``, ``/health``, ``/metadata``, ``/schema`` (also under ``/envs/{env_id}``), and
  ``GET /envs`` (the registered ids).

A ``reset`` frame may carry OpenEnv's ``episode_id``: the same reset again (same id, seed and
options) before any step answers the same first observation without a new episode, so a client
that retries a reset whose answer it lost does not start a second one; ``state`` reports the id.

Every env call runs in a worker thread, so one slow env (Code-v0 runs programs) never stalls the
other sessions. Frames and HTTP bodies above ``max_message_bytes`` are refused (the WebSocket is
closed with code 1009 "message too big", HTTP answers 413) and the session is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketDisconnect

from llm_zoo.registry import UnknownEnvError, make, registry
from llm_zoo.sandbox.cancel import cancel_when
from llm_zoo.serve.arguments import argument_problem
from llm_zoo.serve.auth import TokenMiddleware, client_of
from llm_zoo.serve.limits import CONNECTIONS_BEYOND_SESSIONS, ClientLimits, refuse_connection
from llm_zoo.serve.protocol import (
    ACTION_SCHEMA,
    OBSERVATION_SCHEMA,
    STATE_SCHEMA,
    ProtocolError,
    decode,
    encode,
    episode_id_of,
    error_frame,
    observation_payload,
    parse_json,
    reset_arguments,
    step_text,
)
from llm_zoo.serve.sessions import Session, SessionStore

T = TypeVar("T")

__all__ = ["create_app"]


def _execution_error(err: Exception, what: str) -> ProtocolError:
    return ProtocolError("EXECUTION_ERROR", f"{what}: {type(err).__name__}: {err}", type(err).__name__)


def session_info(session: Session) -> dict[str, Any]:
    """What a client needs to mirror the env: agents, metadata, spaces' bounds."""
    env = session.env
    spaces = {}
    for agent in env.possible_agents:
        observation_space = env.observation_space(agent)
        prompt_space = (
            observation_space["prompt"] if "prompt" in getattr(observation_space, "spaces", {}) else None
        )
        spaces[agent] = {
            "observation_max_length": getattr(prompt_space, "max_length", None),
            "action_max_length": getattr(env.action_space(agent), "max_length", None),
        }
    metadata = {k: v for k, v in env.metadata.items() if isinstance(v, (str, int, float, bool, list, tuple))}
    return {
        "session_id": session.id,
        "env_id": session.env_id,
        "possible_agents": list(env.possible_agents),
        "metadata": metadata,
        "max_turns": getattr(env, "max_turns", None),
        "alpha": getattr(env, "alpha", None),
        "render_mode": getattr(env, "render_mode", None),
        "spaces": spaces,
    }


class _Server:
    """The routes' shared state: the session store and the limits."""

    def __init__(
        self,
        store: SessionStore,
        max_message_bytes: int,
        env_ids: Collection[str] | None = None,
        allowed_arguments: Collection[str] = (),
        env_threads: int = 64,
        max_calls_per_client: int | None = None,
        max_connections_per_client: int | None = None,
    ):
        self.store = store
        self.max_message_bytes = max_message_bytes
        #: The env ids served (None: every registered env).
        self.env_ids = set(env_ids) if env_ids is not None else None
        #: Argument names clients may set freely (llm_zoo.serve.arguments).
        self.allowed_arguments = set(allowed_arguments)
        self.limits = ClientLimits(
            env_threads,
            max_calls_per_client or env_threads,
            max_connections_per_client or store.max_per_client + CONNECTIONS_BEYOND_SESSIONS,
        )
        #: Clones one connection may hold before anyone attaches to them (one connection made 963
        #: in 0.6 s and filled every slot of the server).
        self.max_detached_clones = MAX_DETACHED_CLONES

    # ------------------------------------------------------------------ env calls

    async def _call(self, session: Session, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        session.busy += 1
        try:
            call = functools.partial(_until_gone, session, functools.partial(fn, *args, **kwargs))
            return await self.limits.on_thread(session.client, call)
        except ProtocolError:
            raise
        except Exception as err:
            raise _execution_error(err, what) from None
        finally:
            session.busy -= 1
            self.store.touch(session)

    async def _make(self, env_id: Any, kwargs: Any, *, attached: bool, client: str = "anyone") -> Session:
        if not isinstance(env_id, str) or not env_id:
            raise ProtocolError(
                "VALIDATION_ERROR", f"make needs data.env_id, a registered env id; got {env_id!r}"
            )
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ProtocolError(
                "VALIDATION_ERROR", f"make's data.kwargs must be an object, got {type(kwargs).__name__}"
            )
        if self.env_ids is not None and env_id not in self.env_ids:
            served = ", ".join(sorted(self.env_ids))
            raise ProtocolError(
                "FACTORY_ERROR", f"{env_id!r} is not served here; served: {served}", "UnknownEnvError"
            )
        if env_id in registry:
            problem = argument_problem(env_id, registry[env_id].load(), kwargs, self.allowed_arguments)
            if problem:
                raise ProtocolError("FACTORY_ERROR", problem, "PermissionError")
        try:
            env = await self.limits.on_thread(client, functools.partial(make, env_id, **kwargs))
        except UnknownEnvError as err:
            raise ProtocolError("FACTORY_ERROR", str(err), "UnknownEnvError") from None
        except Exception as err:
            raise ProtocolError(
                "FACTORY_ERROR",
                f"could not make {env_id} with {kwargs!r}: {type(err).__name__}: {err}",
                type(err).__name__,
            ) from None
        return self.store.add(env_id, env, attached=attached, kwargs=kwargs, client=client)

    # ------------------------------------------------------------------ WebSocket

    async def websocket(self, websocket: WebSocket) -> None:
        path_env_id = websocket.path_params.get("env_id")
        client = client_of(websocket.scope)
        if not self.limits.open_connection(client):
            await refuse_connection(
                websocket,
                f"this client ({client}) has its maximum of {self.limits.max_connections_per_client} "
                "connections open; close one or retry later",
            )
            return
        try:
            await websocket.accept()
            await self._serve_connection(websocket, client, path_env_id)
        finally:
            self.limits.close_connection(client)

    async def _serve_connection(self, websocket: WebSocket, client: str, path_env_id: str | None) -> None:
        session: Session | None = None
        clones: set[str] = set()  # detached clones this connection made: they end with it
        waiting: Message | None = None  # a frame that came while a step ran
        try:
            while True:
                message, waiting = waiting or await websocket.receive(), None
                if message["type"] == "websocket.disconnect":
                    return
                try:
                    kind, data = decode(_frame_payload(message))
                    if kind == "close":
                        return
                    if session is not None and session.closed:
                        session = None
                        raise ProtocolError(
                            "SESSION_ERROR",
                            f"the session expired after {self.store.ttl_s:g} s without a message; make a new one",
                        )
                    work = asyncio.ensure_future(
                        self._handle(kind, data, session, path_env_id, clones, client)
                    )
                    if kind == "step" and session is not None:  # steps may run programs for long
                        waiting = await _listen_until_done(websocket, session, work)
                    reply, session = await work
                except ProtocolError as err:
                    reply = error_frame(err)
                if waiting is not None and waiting["type"] == "websocket.disconnect":
                    return
                await websocket.send_text(reply)
        except WebSocketDisconnect:
            return
        finally:
            if session is not None:
                self.store.remove(session.id)
            for clone_id in clones:  # a clone nobody attached to is gone with the connection that made it
                self.store.remove_detached(clone_id)
            with contextlib.suppress(Exception):
                await websocket.close()

    async def _handle(
        self,
        kind: str,
        data: dict[str, Any],
        session: Session | None,
        path_env_id: str | None,
        clones: set[str] | None = None,
        client: str = "anyone",
    ) -> tuple[str, Session | None]:
        if kind == "make":
            env_id = data.get("env_id", path_env_id)
            if path_env_id is not None and env_id != path_env_id:
                raise ProtocolError(
                    "VALIDATION_ERROR", f"this connection serves {path_env_id}; make asked for {env_id!r}"
                )
            new = await self._make(env_id, data.get("kwargs", {}), attached=True, client=client)
            if session is not None:
                self.store.remove(session.id)
            return encode("session", session_info(new)), new
        if kind == "attach":
            if session is not None:
                raise ProtocolError("VALIDATION_ERROR", "attach must be the first frame of a connection")
            new = self.store.attach(data.get("session_id"))
            return encode("session", session_info(new)), new
        if kind == "reset" and path_env_id is not None and "env_kwargs" in data:
            wanted = data["env_kwargs"]
            if session is None or session.kwargs != wanted:  # OpenEnv clients pass arguments here
                new = await self._make(path_env_id, wanted, attached=True, client=client)
                if session is not None:
                    self.store.remove(session.id)
                session = new
        if session is None:
            if kind == "reset" and path_env_id is not None:
                session = await self._make(path_env_id, {}, attached=True, client=client)
            else:
                ids = ", ".join(sorted(registry))
                raise ProtocolError(
                    "SESSION_ERROR",
                    f"{kind} before make: connect to /envs/ENV_ID/ws (OpenEnv clients: base URL "
                    f'http://HOST:PORT/envs/ENV_ID), or send {{"type": "make", "data": {{"env_id": ...}}}} '
                    f"first; env ids: {ids}",
                )
        self.store.touch(session)
        env = session.env
        if kind == "reset":
            seed, options = reset_arguments(data)
            episode_id = episode_id_of(data)
            key = json.dumps([episode_id, seed, options], sort_keys=True, default=str)
            retried = session.last_reset is not None and session.last_reset[0] == key
            if episode_id is not None and session.steps == 0 and retried:  # the same episode again
                return encode("observation", session.last_reset[1]), session  # type: ignore[index]
            await self._call(session, "reset", env.reset, seed=seed, options=options)
            session.steps, session.episode_id = 0, episode_id
            payload = await self._call(session, "observe", observation_payload, env, None)
            session.last_reset = (key, payload)
            return encode("observation", payload), session
        if kind == "step":
            text = step_text(data, env)
            acting = getattr(env, "agent_selection", None)
            await self._call(session, "step", env.step, text)
            session.steps += 1
            session.last_reset = None  # the episode moved on: a reset now starts a new one
            payload = await self._call(session, "observe", observation_payload, env, acting)
            return encode("observation", payload), session
        if kind == "observe":
            agent = data.get("agent")
            if agent not in env.possible_agents:
                raise ProtocolError(
                    "VALIDATION_ERROR",
                    f"observe needs data.agent, one of {list(env.possible_agents)}; got {agent!r}",
                )
            observation = await self._call(session, f"observe({agent!r})", env.observe, agent)
            return encode("observe", {"agent": agent, "observation": observation}), session
        if kind == "state":
            return encode("state", _state(session)), session
        if kind == "render":
            text = await self._call(session, "render", env.render)
            return encode("render", {"text": text}), session
        # clone
        clones = clones if clones is not None else set()
        clones.intersection_update(self.store.detached_ids())  # attached or expired ones no longer count
        if len(clones) >= self.max_detached_clones:
            raise ProtocolError(
                "CAPACITY_REACHED",
                f"this connection holds {len(clones)} clones nobody attached to, the server's limit per "
                "connection: attach to them (or let them expire) before cloning again",
            )
        twin = await self._call(session, "clone", env.clone)
        copy = self.store.add(
            session.env_id, twin, attached=False, kwargs=session.kwargs, client=session.client
        )
        clones.add(copy.id)
        copy.steps = session.steps
        return encode("session", session_info(copy)), session

    # ------------------------------------------------------------------ HTTP

    async def _json_body(self, request: Request) -> dict[str, Any]:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_message_bytes:
            raise ProtocolError(
                "VALIDATION_ERROR",
                f"the body of {declared} bytes exceeds the server's limit of {self.max_message_bytes}",
                status=413,
            )
        body = bytearray()
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > self.max_message_bytes:
                raise ProtocolError(
                    "VALIDATION_ERROR",
                    f"the body exceeds the server's limit of {self.max_message_bytes} bytes",
                    status=413,
                )
        if not body.strip():
            return {}
        data = parse_json(bytes(body), "the body")
        if not isinstance(data, dict):
            raise ProtocolError("INVALID_JSON", f"the body must be a JSON object, got {type(data).__name__}")
        return data

    async def http_reset(self, request: Request) -> JSONResponse:
        try:
            data = await self._json_body(request)
            env_id = request.path_params.get("env_id", data.pop("env_id", None))
            session = await self._make(
                env_id, data.get("env_kwargs", {}), attached=True, client=client_of(request.scope)
            )
            try:
                seed, options = reset_arguments(data)
                episode_id_of(data)
                await self._call(session, "reset", session.env.reset, seed=seed, options=options)
                payload = observation_payload(session.env, None)
            finally:
                self.store.remove(session.id)
            return JSONResponse(json.loads(json.dumps(payload, default=str)))
        except ProtocolError as err:
            return JSONResponse({"detail": err.message, "code": err.code}, status_code=err.status)

    async def http_step(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "detail": "HTTP /step is stateless in OpenEnv (a fresh env per request), which cannot play a "
                "turn-based episode: open a WebSocket session at /envs/{env_id}/ws",
                "code": "SESSION_ERROR",
            },
            status_code=400,
        )

    async def http_get(self, request: Request) -> JSONResponse:
        what = request.url.path.rstrip("/").rsplit("/", 1)[-1]
        env_id = request.path_params.get("env_id")
        if env_id is not None and env_id not in registry:
            return JSONResponse(
                {"detail": f"unknown env {env_id!r}", "code": "FACTORY_ERROR"}, status_code=404
            )
        if what == "health":
            return JSONResponse(
                {
                    "status": "healthy",
                    "sessions": len(self.store),
                    "sessions_made": self.store.created,
                    "max_sessions": self.store.max_sessions,
                    "max_sessions_per_client": self.store.max_per_client,
                    "max_calls_per_client": self.limits.max_calls_per_client,
                    "max_connections_per_client": self.limits.max_connections_per_client,
                    "sessions_of_this_client": self.store.held_by(client_of(request.scope)),
                }
            )
        if what == "envs":
            return JSONResponse({"envs": list(registry)})
        if what == "schema":
            return JSONResponse(
                {"action": ACTION_SCHEMA, "observation": OBSERVATION_SCHEMA, "state": STATE_SCHEMA}
            )
        if what == "metadata":
            name = env_id or "llm-zoo"
            description = registry[env_id].description if env_id else "llm-zoo text multi-agent envs"
            return JSONResponse({"name": name, "description": description, "version": "llm-zoo"})
        return JSONResponse({"episode_id": None, "step_count": 0})  # /state: stateless, as in OpenEnv


def _state(session: Session) -> dict[str, Any]:
    env = session.env
    return {
        "episode_id": session.episode_id if session.episode_id is not None else getattr(env, "task_id", None),
        "step_count": session.steps,
        "session_id": session.id,
        "env_id": session.env_id,
        "agent_selection": getattr(env, "agent_selection", None),
        "agents": list(getattr(env, "agents", [])),
        "turn": getattr(env, "turn", None),
        "success": bool(getattr(env, "success", False)),
    }


async def _listen_until_done(
    websocket: WebSocket, session: Session, work: asyncio.Future[Any]
) -> Message | None:
    """Read the connection's next frame until ``work`` is done; returns the frame if one came first
    (to be handled after ``work``). A disconnect or a ``close`` frame meanwhile marks ``session``
    gone, so the call's sandboxed programs are stopped (``llm_zoo.sandbox.cancel_when``): an
    outside test saw a step start programs for 8 s after its client was gone, and a client's
    abandoned Code-v0 steps held its next make for minutes."""
    listening = asyncio.ensure_future(websocket.receive())
    done, _ = await asyncio.wait({work, listening}, return_when=asyncio.FIRST_COMPLETED)
    if listening not in done:
        listening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listening
        return None
    message = listening.result()
    if message["type"] == "websocket.disconnect" or _is_close_frame(message):
        session.gone.set()  # a client that says close before it leaves (llm_zoo.remote does) is gone too
    return message


def _frame_payload(message: Message) -> str | bytes:
    """A received WebSocket message's text or bytes."""
    text = message.get("text")
    return text if text is not None else message.get("bytes") or b""


def _is_close_frame(message: Message) -> bool:
    try:
        return decode(_frame_payload(message))[0] == "close"
    except ProtocolError:
        return False


def _until_gone(session: Session, call: Callable[[], T]) -> T:
    """``call()`` on an env thread, its sandboxed programs stopped once ``session`` is gone."""
    with cancel_when(session.gone):
        return call()


#: Detached clones one connection may hold at once (a trainer clones K per env and attaches at once).
MAX_DETACHED_CLONES = 64


def create_app(
    *,
    session_ttl_s: float = 600.0,
    max_sessions: int = 1024,
    max_message_bytes: int = 8 << 20,
    token: str | Sequence[str] | None = None,
    env_ids: Collection[str] | None = None,
    allowed_arguments: Collection[str] = (),
    env_threads: int = 64,
    max_sessions_per_client: int | None = None,
    max_calls_per_client: int | None = None,
    max_connections_per_client: int | None = None,
) -> Starlette:
    """The ASGI app. Serve it with uvicorn's ``ws_max_size`` equal to ``max_message_bytes``
    (:func:`llm_zoo.serve.run` does).

    Args:
        session_ttl_s: A session unused for this long expires, its env closed.
        max_sessions: Sessions held at once (clones included); more are refused.
        max_message_bytes: Largest WebSocket frame / HTTP body accepted.
        token: Serve only requests carrying ``Authorization: Bearer TOKEN`` (:mod:`llm_zoo.serve.auth`);
            several tokens: one per client, each held to ``max_sessions_per_client``. ``None`` (or
            none) serves everyone who can reach the server.
        env_ids: The env ids clients may make (``None``: every registered env).
        allowed_arguments: Constructor argument names clients may set even to name a file or
            raise a resource bound (:mod:`llm_zoo.serve.arguments`).
        env_threads: Env calls running at once; more wait for a thread. Each call mostly waits
            (on a sandboxed program), so many threads keep cheap steps from queueing behind slow
            ones.
        max_sessions_per_client: Sessions (clones included) one client, that is one token, may hold
            at once. Default: with several tokens, half of ``max_sessions``, so no client can take
            every session from the others; with one token or none, ``max_sessions``.
        max_calls_per_client: Env calls (make, reset, step, clone...) of one client running at once;
            its further calls wait without holding a thread. Default: with several tokens, half of
            ``env_threads``, so one client's slow steps leave the other half to everyone else's
            cheap ones; with one token or none, ``env_threads``.
        max_connections_per_client: WebSocket connections one client may have open; the next
            handshake is refused with HTTP 429. Default: its sessions plus
            :data:`llm_zoo.serve.limits.CONNECTIONS_BEYOND_SESSIONS`.
    """
    tokens = (token,) if isinstance(token, str) else tuple(token or ())
    if max_sessions_per_client is None:
        max_sessions_per_client = max(1, max_sessions // 2) if len(tokens) > 1 else max_sessions
    if max_calls_per_client is None:
        max_calls_per_client = max(1, env_threads // 2) if len(tokens) > 1 else env_threads
    store = SessionStore(session_ttl_s, max_sessions, max_per_client=max_sessions_per_client)
    server = _Server(
        store,
        int(max_message_bytes),
        env_ids,
        allowed_arguments,
        env_threads,
        max_calls_per_client,
        max_connections_per_client,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async def reap() -> None:
            while True:
                await asyncio.sleep(min(store.ttl_s / 4, 5.0))
                store.expire()

        task = asyncio.create_task(reap())
        try:
            yield
        finally:
            task.cancel()
            store.close_all()
            server.limits.shutdown()

    routes: list[Any] = [
        WebSocketRoute("/ws", server.websocket),
        WebSocketRoute("/envs/{env_id:path}/ws", server.websocket),
        Route("/reset", server.http_reset, methods=["POST"]),
        Route("/envs/{env_id:path}/reset", server.http_reset, methods=["POST"]),
        Route("/step", server.http_step, methods=["POST"]),
        Route("/envs/{env_id:path}/step", server.http_step, methods=["POST"]),
        Route("/envs", server.http_get, methods=["GET"]),
    ]
    for what in ("health", "state", "metadata", "schema"):
        routes.append(Route(f"/{what}", server.http_get, methods=["GET"]))
        routes.append(Route(f"/envs/{{env_id:path}}/{what}", server.http_get, methods=["GET"]))
    middleware = [Middleware(TokenMiddleware, token=tokens)] if tokens else []
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
    app.state.sessions = store
    return app
