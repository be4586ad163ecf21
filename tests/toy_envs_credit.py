"""A plugin-style toy env for team credit and dead-agent tests.

Importing this module registers ``test/EarlyExit-v0`` -> :class:`EarlyExitEnv`: the ``scout``
reports once and is done (terminated on its own, as the general PettingZoo AEC API allows), while
the ``builder`` plays on until ``max_turns``. A rollout must then step ``None`` for the scout when
it is selected, never text, and never generate for it.
"""

from __future__ import annotations

import llm_zoo
from llm_zoo.core import Outcome, TextAECEnv

__all__ = ["EARLY_EXIT_ENV_ID", "RELAY_ENV_ID", "EarlyExitEnv", "RelayEnv"]

EARLY_EXIT_ENV_ID = "test/EarlyExit-v0"


class EarlyExitEnv(TextAECEnv):
    """``scout`` then ``builder``; the scout is terminated after its first action.

    Rewards: scout ``role = 1`` if its report contains ``"map"``; builder ``role = 1`` if its
    reply contains ``"build"``. ``global = 1`` once the scout has reported a map and the builder's
    latest reply builds (``success``). Non-empty replies only; an empty one earns ``-0.5``.

    Dead agents: no bookkeeping here; after the scout's step(None) :class:`TextAECEnv` selects
    the builder.
    """

    metadata = {"render_modes": ["ansi"], "name": "early_exit_v0", "is_parallelizable": True}
    roles = ("scout", "builder")

    def _new_episode(self, rng, options):
        self.site = int(rng.integers(1000))
        self.mapped = False
        self.built = False
        self.actions: list[str] = []

    def _prompt(self, agent):
        return f"Site {self.site}, turn {self.turn}: you are the {agent}. So far: {self.actions}"

    def _act(self, agent, action):
        self.actions.append(f"{agent}={action}")
        if not action:
            return Outcome(-0.5, float(self.mapped and self.built), format_ok=False)
        if agent == "scout":
            self.mapped = "map" in action
            role = float(self.mapped)
        else:
            self.built = "build" in action
            role = float(self.built)
        both = self.mapped and self.built
        return Outcome(role, float(both), success=both)

    def _render_state(self):
        return f"site={self.site} actions={self.actions}"

    def step(self, action):
        agent = self.agent_selection
        was_dead = self.terminations.get(agent, False) or self.truncations.get(agent, False)
        super().step(action)  # a dead agent's step: PettingZoo's _was_dead_step (None only)
        if not was_dead and agent == "scout" and not self.truncations.get("scout", False):
            self.terminations["scout"] = True  # the scout's job is done; the builder goes on


llm_zoo.register(
    EARLY_EXIT_ENV_ID, EarlyExitEnv, description="tests: an agent that finishes first", override=True
)


RELAY_ENV_ID = "test/Relay-v0"


class RelayEnv(TextAECEnv):
    """Math-v0's credit problem in miniature: ``tool`` then ``reporter``, one turn.

    The tool's action is right when it contains ``"ok"`` (role reward 1, else 0). The reporter sees
    what the tool said and answers; it is right when its reply contains ``"right"``. The global
    reward and ``success`` are the reporter's correctness: a reporter may be right by copying a
    right tool or by a lucky guess after a wrong one, which a one-sample look-ahead credits to the
    wrong tool candidate. ``info["correct"]`` is the acting agent's own correctness.
    """

    metadata = {"render_modes": ["ansi"], "name": "relay_v0", "is_parallelizable": True}
    roles = ("tool", "reporter")

    def _new_episode(self, rng, options):
        self.case = int(rng.integers(1000))
        self.tool_said: str | None = None

    def _prompt(self, agent):
        if agent == "tool":
            return f"Case {self.case}: you are the tool."
        return f"Case {self.case}: you are the reporter. The tool said: {self.tool_said}"

    def _act(self, agent, action):
        if agent == "tool":
            self.tool_said = action
            right = "ok" in action
            return Outcome(float(right), 0.0, info={"correct": right})
        right = "right" in action
        return Outcome(float(right), float(right), success=right, info={"correct": right})

    def _render_state(self):
        return f"case={self.case} tool said={self.tool_said}"


llm_zoo.register(
    RELAY_ENV_ID, RelayEnv, description="tests: a teammate that sometimes guesses", override=True
)
