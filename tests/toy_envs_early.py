"""Plugin-style toy envs where one agent finishes before the others, with no dead-agent bookkeeping.

Importing this module registers ``test/ScoutQuits-v0`` -> :class:`ScoutQuitsEnv`. The ``scout``
reports once and is terminated on its own (legal in the PettingZoo AEC API); the ``builder`` plays
on until ``max_turns``. Unlike :class:`toy_envs_credit.EarlyExitEnv` the env does nothing about
agent selection: :class:`~llm_zoo.core.TextAECEnv` must select a live agent after the scout's
``step(None)`` and count the builder's actions alone as turns.

Arguments: ``scout_last`` puts the scout after the builder in turn order; ``quit_in`` is where the
env ends the scout's part: ``"step"`` (after ``super().step``) or ``"act"`` (inside ``_act``).
"""

from __future__ import annotations

from typing import Any

import llm_zoo
from llm_zoo.core import Outcome, TextAECEnv

__all__ = ["SCOUT_QUITS_ENV_ID", "ScoutQuitsEnv"]

SCOUT_QUITS_ENV_ID = "test/ScoutQuits-v0"


class ScoutQuitsEnv(TextAECEnv):
    """``scout`` and ``builder``; the scout is terminated after its first action.

    Rewards: scout ``role = 1`` if its report contains ``"map"``; builder ``role = 1`` if its reply
    contains ``"build"``; ``global = 1`` once both hold (``success``).
    """

    metadata = {"render_modes": ["ansi"], "name": "scout_quits_v0", "is_parallelizable": True}
    roles = ("scout", "builder")

    def __init__(self, *, scout_last: bool = False, quit_in: str = "step", **kwargs: Any):
        super().__init__(**kwargs)
        if scout_last:
            self.possible_agents = ["builder", "scout"]
        self.quit_in = quit_in

    def _new_episode(self, rng, options):
        self.site = int(rng.integers(1000))
        self.mapped = self.built = self.reported = False
        self.actions: list[str] = []

    def _prompt(self, agent):
        return f"Site {self.site}, turn {self.turn}: you are the {agent}. So far: {self.actions}"

    def _act(self, agent, action):
        self.actions.append(f"{agent}={action}")
        if agent == "scout":
            self.mapped, self.reported = "map" in action, True
            if self.quit_in == "act":
                self.terminations["scout"] = True
            role = float(self.mapped)
        else:
            self.built = "build" in action
            role = float(self.built)
        both = self.mapped and self.built
        return Outcome(role, float(both), success=both)

    def _render_state(self):
        return f"site={self.site} actions={self.actions}"

    def step(self, action):
        super().step(action)
        if self.quit_in == "step" and self.reported and "scout" in self.terminations:
            self.terminations["scout"] = True  # the scout's job is done; the builder goes on


llm_zoo.register(
    SCOUT_QUITS_ENV_ID, ScoutQuitsEnv, description="tests: an agent that quits first", override=True
)
