"""Tiny environments for testing the core and the trainer."""

from __future__ import annotations

from llm_zoo.core import Outcome, TextAECEnv


class KeywordEnv(TextAECEnv):
    """Two agents; each earns 1 for a reply containing its keyword, -1 for an empty reply.

    The global reward is 1 once both have said their keyword in the same turn.
    """

    metadata = {"render_modes": ["ansi"], "name": "keyword_v0", "is_parallelizable": True}
    roles = ("alice", "bob")
    keywords = {"alice": "apple", "bob": "banana"}

    def _new_episode(self, rng, options):
        self.number = int(rng.integers(100))
        self.said = {a: False for a in self.roles}

    def _prompt(self, agent):
        return f"[{self.number}] {agent}, say the word {self.keywords[agent]!r}. Turn {self.turn}."

    def _act(self, agent, action):
        if not action.strip():
            return Outcome(-1.0, 0.0, format_ok=False, feedback="Your reply was empty.")
        self.said[agent] = self.keywords[agent] in action.lower()
        both = all(self.said.values())
        return Outcome(
            float(self.said[agent]),
            float(both),
            terminated=both,
            success=both,
            info={"said_keyword": self.said[agent]},
        )

    def _render_state(self):
        return f"number={self.number} said={self.said} turn={self.turn}"
