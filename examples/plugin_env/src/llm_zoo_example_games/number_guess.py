"""NumberGuess: a guesser finds a secret number with the help of a hinter who knows it.

Roles (turn order): ``guesser``, ``hinter``.

* The **guesser** sees the range and the history of guesses and hints, and answers with a line
  ``GUESS: <integer>``.
* The **hinter** sees the secret and the latest guess, and answers with one word: ``higher``,
  ``lower`` or ``correct``.

Rewards:

* guesser role reward: how much the guess improves on the closest one so far, in closeness
  ``1 - |guess - secret| / (high - low)`` (0 if it does not), plus 1 the first time it is the
  secret; -1 for an unreadable answer. Paid once for progress, so that guessing near the secret
  turn after turn never earns more than finding it: over an episode, the closest guess's closeness
  (+1 if the secret was guessed) minus 1 per unreadable answer.
* hinter role reward: 1 for a truthful hint, -1 for a false or unreadable one.
* global reward: 1 once the secret has been guessed, else 0.

Each agent's reward is ``role + alpha * global``. The episode terminates when the hinter confirms
a correct guess, and is truncated after ``max_turns`` turns.

Version history: v0: initial. v0 (2026-12): the guesser is paid for closeness once, for progress
(it was paid every turn: a near guess repeated for 7 turns earned more than the secret at once).
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
            if guess is None:
                return Outcome(-1.0, 0.0, format_ok=False, feedback="Write your guess as: GUESS: 42")
            closeness = 1.0 - min(1.0, abs(guess - self.secret) / (self.high - self.low))
            progress = max(0.0, closeness - self.best_closeness)
            self.best_closeness = max(self.best_closeness, closeness)
            bonus = 1.0 if guess == self.secret and not self.found else 0.0
            self.found = self.found or guess == self.secret
            return Outcome(progress + bonus, float(self.solved))
        hint = parse_hint(action)
        truth = None if self.last_guess is None else true_hint(self.last_guess, self.secret)
        if hint is None:
            return Outcome(-1.0, float(self.solved), format_ok=False,
                           feedback="Answer with exactly one word: higher, lower or correct.")  # fmt: skip
        if self.last_guess is not None:
            self.history.append((self.last_guess, hint))
        self.solved = self.solved or (hint == "correct" and truth == "correct")
        role = 1.0 if hint == truth else -1.0
        return Outcome(role, float(self.solved), terminated=self.solved, success=self.solved)

    def _render_state(self) -> str:
        return f"secret={self.secret} history={self.history}"


def oracle_action(env: NumberGuessEnv, agent: str) -> str:
    """A perfect answer for ``agent`` now (``llm_zoo.testing.check_env`` finds it by this name in
    the env's module and plays it in its reward-hack search)."""
    if agent == "guesser":
        return f"GUESS: {env.secret}"
    return "higher" if env.last_guess is None else true_hint(env.last_guess, env.secret)
