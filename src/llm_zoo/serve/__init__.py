"""``llm-zoo serve``: every registered env (plugins included) over OpenEnv's protocol.

Install with ``pip install "llm-zoo[serve]"`` (Starlette, uvicorn, websockets). Start it with
``llm-zoo serve --port 8000``; play from Python with :func:`llm_zoo.remote.make` (a PettingZoo
``AECEnv``), or from any OpenEnv client::

    from openenv.core.generic_client import GenericEnvClient
    with GenericEnvClient(base_url="http://127.0.0.1:8000/envs/PlanPath-v0").sync() as env:
        result = env.reset(seed=0)
        while not result.done:
            answer = my_model(result.observation["prompt"])  # for result.observation["agent"]
            result = env.step({"text": answer})

The AEC turn model on OpenEnv's single stream: each ``step`` is the move of the *selected* agent
(``observation["agent"]``); ``reward`` is that agent's reward for it, and the observation carries
the next agent's prompt and the whole PettingZoo bookkeeping (``rewards``, ``cumulative_rewards``,
``terminations``, ``truncations``, ``infos``). ``done`` is true once no agent is left to act. A
dead agent still selected (PettingZoo's dead step) is stepped with ``{"text": null}``.

Frames (JSON ``{"type", "data"}``): ``make {env_id, kwargs}``, ``reset {seed, options}``,
``step {text}``, ``observe {agent}``, ``state``, ``render``, ``clone`` (answers a new detached
session's id), ``attach {session_id}`` (the first frame of a new connection, to take a clone),
``close``. Errors come back as ``{"type": "error", "data": {"code", "message"}}`` with OpenEnv's
codes. Sessions expire after ``--session-ttl`` seconds unused, and are dropped with their
connection. Nothing here is imported by ``import llm_zoo``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ServerProcess", "ServerThread", "create_app", "serve"]


def __getattr__(name: str) -> Any:
    # The server stack is an extra: import it only when asked for.
    if name == "create_app":
        from llm_zoo.serve.app import create_app

        return create_app
    if name in ("ServerProcess", "ServerThread", "serve"):
        from llm_zoo.serve import run

        return getattr(run, name)
    raise AttributeError(f"module 'llm_zoo.serve' has no attribute {name!r}")
