"""Plugin-style toy envs where one agent finishes before the others, with no dead-agent bookkeeping.

Importing this module registers ``test/ScoutQuits-v0`` -> :class:`ScoutQuitsEnv`, the scout and
builder of :class:`toy_envs_credit.EarlyExitEnv` in more arrangements: ``scout_last`` puts the scout
after the builder in turn order; ``quit_in`` is where the env ends the scout's part: ``"step"``
(after ``super().step``, as ``EarlyExitEnv`` does) or ``"act"`` (inside ``_act``). Neither does
anything about agent selection: :class:`~llm_zoo.core.TextAECEnv` must select a live agent after
the scout's ``step(None)`` and count the builder's actions alone as turns.
"""

from __future__ import annotations

from typing import Any

import llm_zoo
from llm_zoo.core import TextAECEnv
from toy_envs_credit import EarlyExitEnv

__all__ = ["SCOUT_QUITS_ENV_ID", "ScoutQuitsEnv"]

SCOUT_QUITS_ENV_ID = "test/ScoutQuits-v0"


class ScoutQuitsEnv(EarlyExitEnv):
    """:class:`EarlyExitEnv` with the scout first or last, ending its part in ``step`` or ``_act``."""

    metadata = {"render_modes": ["ansi"], "name": "scout_quits_v0", "is_parallelizable": True}

    def __init__(self, *, scout_last: bool = False, quit_in: str = "step", **kwargs: Any):
        super().__init__(**kwargs)
        if scout_last:
            self.possible_agents = ["builder", "scout"]
        self.quit_in = quit_in

    def _act(self, agent, action):
        outcome = super()._act(agent, action)
        if agent == "scout" and self.quit_in == "act":
            self.terminations["scout"] = True  # the scout's job is done; the builder goes on
        return outcome

    def step(self, action):
        if self.quit_in == "step":
            super().step(action)  # EarlyExitEnv ends the scout's part after its step
        else:
            TextAECEnv.step(self, action)


llm_zoo.register(
    SCOUT_QUITS_ENV_ID, ScoutQuitsEnv, description="tests: an agent that quits first", override=True
)
