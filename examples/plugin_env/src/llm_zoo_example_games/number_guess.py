"""NumberGuess: a guesser finds a secret number with the help of a hinter who knows it.

Roles (turn order): ``guesser``, ``hinter``.

* The **guesser** sees the range and the history of guesses and hints, and answers with a line
  ``GUESS: <integer>``.
* The **hinter** sees the secret and the latest guess, and answers with one word: ``higher``,
  ``lower`` or ``correct``.

Rewards:

Each role is paid the change of its *level* after each of its answers (a potential difference),
so a return is where the agent ends, whatever the number of turns:

* guesser level: the closeness of its closest guess so far, ``1 - |guess - secret| / (high -
  low)``, plus 1 once it has guessed the secret, minus 1 while its latest answer is unreadable
  (the next readable one pays it back). Guessing near the secret turn after turn never earns more
  than finding it.
* hinter level: 1 while its latest hint is truthful, -1 while it is false or unreadable.
* global reward: the change of the team's level, which is 1 once the secret has been guessed
  and confirmed, else 0: 1 for the hinter's answer that confirms it, 0 for every other.

The acting agent's reward is ``role + alpha * global``; its teammate gets ``alpha * global`` on
the same step, so both returns carry the team's outcome. The episode terminates when the hinter
confirms a correct guess, and is truncated after ``max_turns`` turns.

Version history: v0: initial. v0 (2026-12): the guesser is paid for closeness once, for progress
(it was paid every turn: a near guess repeated for 7 turns earned more than the secret at once).
v0 (2026-12, rewards v2): both roles are paid level changes and the team's outcome reaches both
(the hinter earned 7 for 7 truthful hints in a failing episode, more than confirming the secret
at once; the guesser's unreadable answers were never paid back).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from llm_zoo import Outcome, TextAECEnv

HINTS = ("higher", "lower", "correct")


def true_hint(guess: int, secret: int) -> str:
    """The truthful hint for ``guess``: which way the secret lies."""
    if guess < secret:
        return "higher"
    if guess > secret:
        return "lower"
    return "correct"


def parse_guess(text: str) -> int | None:
    """The integer of the last ``GUESS: n`` line, or None."""
    found = re.findall(r"GUESS:\s*(-?\d{1,9})", text, flags=re.IGNORECASE)
    return int(found[-1]) if found else None


def parse_hint(text: str) -> str | None:
    """The hint word if the answer is exactly one of the hints (case-insensitive), else None."""
    word = text.strip().strip(".!").lower()
    return word if word in HINTS else None


class NumberGuessEnv(TextAECEnv):
    """See the module docstring."""

    metadata = {"render_modes": ["ansi"], "name": "number_guess_v0", "is_parallelizable": False}
    roles = ("guesser", "hinter")

    def __init__(self, *, low: int = 1, high: int = 100, max_turns: int = 7, alpha: float = 1.0,
                 render_mode: str | None = None):  # fmt: skip
        if high <= low:
            raise ValueError(f"high must be greater than low, got low={low}, high={high}")
        super().__init__(max_turns=max_turns, alpha=alpha, render_mode=render_mode)
        self.low, self.high = int(low), int(high)

    def _new_episode(self, rng: np.random.Generator, options: dict[str, Any] | None) -> None:
        self.secret = int(rng.integers(self.low, self.high + 1))
        self.history: list[tuple[int, str]] = []
        self.last_guess: int | None = None
        self.solved = False
        self.best_closeness = 0.0
        self.found = False
        self.unreadable = False  # the guesser's latest answer
        self.paid = {"guesser": 0.0, "hinter": 0.0}  # the levels paid so far

    def _prompt(self, agent: str) -> str:
        if agent == "guesser":
            lines = [f"Guess the secret integer between {self.low} and {self.high}."]
            lines += [f"You guessed {g}; the hint was: {h}" for g, h in self.history]
            lines.append("Answer with one line: GUESS: <integer>")
            return "\n".join(lines)
        guess = "none (it was unreadable)" if self.last_guess is None else str(self.last_guess)
        return (
            f"The secret number is {self.secret}. The guesser just guessed {guess}.\n"
            "Answer with exactly one word: higher, lower or correct."
        )

    def _act(self, agent: str, action: str) -> Outcome:
        if agent == "guesser":
            guess = parse_guess(action)
            self.last_guess = guess
            self.unreadable = guess is None
            if guess is not None:
                closeness = 1.0 - min(1.0, abs(guess - self.secret) / (self.high - self.low))
                self.best_closeness = max(self.best_closeness, closeness)
                self.found = self.found or guess == self.secret
            level = self.best_closeness + float(self.found) - float(self.unreadable)
            feedback = "Write your guess as: GUESS: 42" if self.unreadable else ""
            # a guess alone changes nothing for the team: global 0
            return Outcome(self._pay("guesser", level), 0.0, format_ok=not self.unreadable, feedback=feedback)
        hint = parse_hint(action)
        truth = None if self.last_guess is None else true_hint(self.last_guess, self.secret)
        if hint is None:
            return Outcome(self._pay("hinter", -1.0), 0.0, format_ok=False,
                           feedback="Answer with exactly one word: higher, lower or correct.")  # fmt: skip
        if self.last_guess is not None:
            self.history.append((self.last_guess, hint))
        newly_solved = not self.solved and hint == "correct" and truth == "correct"
        self.solved = self.solved or newly_solved
        role = self._pay("hinter", 1.0 if hint == truth else -1.0)
        return Outcome(role, float(newly_solved), terminated=self.solved, success=self.solved)

    def _pay(self, agent: str, level: float) -> float:
        """``level`` paid as its change since ``agent``'s last answer."""
        change, self.paid[agent] = level - self.paid[agent], level
        return change

    def _render_state(self) -> str:
        return f"secret={self.secret} history={self.history}"


def oracle_action(env: NumberGuessEnv, agent: str) -> str:
    """A perfect answer for ``agent`` now (``llm_zoo.testing.check_env`` finds it by this name in
    the env's module and plays it in its reward-hack search)."""
    if agent == "guesser":
        return f"GUESS: {env.secret}"
    return "higher" if env.last_guess is None else true_hint(env.last_guess, env.secret)
