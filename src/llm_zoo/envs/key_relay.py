"""KeyRelay-v0: one agent holds a table, the other the question; they must talk to answer.

The split-information pattern of agent systems (one agent holds private data, another the user's
question) in its smallest form, sized for a 135M model: no single agent sees what the answer needs.

Roles, in turn order:

* ``asker`` - sees only the *query key* (a short made-up word such as ``bemo``). In every turn but
  the last it writes a message to the holder; in the last turn it answers with a number.
* ``holder`` - sees only the *table*: ``num_keys`` lines ``key: value`` (keys made-up words,
  values 3-digit numbers, drawn at each reset), never the query. Each turn it reads the asker's
  latest message and replies.

With the default ``max_turns=2``: the asker sends a message, the holder replies, the asker answers
(the holder's second turn never comes: the episode ends with the answer). ``max_turns=n`` allows
``n - 1`` exchanges before the answer; ``max_turns=1`` makes the asker answer at once, blind.

Messages are capped in **words** (whitespace-separated pieces): a message reaches the partner
up to its ``message_words``-th word (default 12) or up to and including its first number,
whichever comes first (the sender's feedback says when a message was cut). So a reply carries at
most one value of the table: a holder that does not know the key is right at most ``1 /
num_keys`` of the time, however large the cap, and a verbose reply ("The number of the key lego
is 270.") still goes through whole.

Observations (``{"prompt": text}``, short prompts for small models): the asker's first prompt asks
it to ask its teammate for the number of its key; its last quotes the holder's latest reply and
asks for the number. The holder's prompt is the asker's latest message (or that there is none),
then its table and a request to reply with the number of the message's key. Prompts never say
whether an answer is right. Measured with SmolLM2-135M-Instruct on the evaluation tasks of
``examples/key_relay_smollm2_cpu.yaml`` (12 keys), greedy: the asker names its key 45 times in 48
and the base team solves 43 of 100. The message goes *before* the table because with the table
first the model mostly copies the table's last row: given a message naming the key (6 keys, 32
tasks), its reply carried the value 3 times greedy and 22 of 256 at temperature 0.7; with the
message first, 26 and 79. Blander asker prompts ("Write a message to your teammate") gave 0 of
24: the asker never named its key.

Actions: free text. A message with no word is unusable (``format_ok=False``). The asker's answer
is the **last number** in its reply (``"It is 412."`` -> ``412``, leading zeros dropped); a last
number that is not a plain whole number (``412.5``, ``412%``) is a wrong answer, and a reply
without any number is unusable. Text never raises.

Rewards (each agent's *level* starts at 0 and every reward is a change of level, so returns
telescope and do not grow with the number of turns):

* team level ``c`` = 1 once the asker's answer is the query's value, else 0; each action's global
  reward is the change of ``c`` it made (only the asker's answer changes it). Every agent gets
  ``alpha`` times it on that step (the acting agent ``role + alpha * global``), so both
  returns carry the team's outcome (:class:`llm_zoo.core.TextAECEnv`).
* asker: level ``c`` (its own answer's correctness), plus ``FORMAT_PENALTY`` (-0.5) while its
  latest action was unusable; plus, with ``dense_rewards=True``, ``DENSE_REWARD`` (0.25) once its
  message names the query key.
* holder: level ``FORMAT_PENALTY`` while its latest reply is unusable, else 0; plus, with
  ``dense_rewards=True``, ``DENSE_REWARD`` once a reply carries the query's value.

Bounds: over an episode the asker's return is ``(1 + alpha) * c_final`` plus at most 0.25 (dense),
the holder's ``alpha * c_final`` plus at most 0.25; a penalty is repaid by the next usable action,
and one left unpaid costs 0.5. So a succeeding episode pays each agent at least ``alpha - 0.25``
more than any failing one (the asker ``1 + alpha - 0.25``): solving pays most, for both, whatever
the dense option.

Training note: AT-GRPO's look-ahead credits an action with the team's outcome after its
teammates' next actions, up to the agent's own next action. The asker's message is followed by the
holder's reply and then by the asker's own answer, so its credited global is taken before the
answer and is always 0: without ``dense_rewards`` a tree rollout gives the message no signal
(independent GRPO episodes do: every action carries the episode return).

Termination: the asker's answer ends the episode (``terminated``); ``success`` is that answer being
right. There is no truncation before it: the last turn is the answer turn.

Single-agent controls (``agents``), each with the same prompts:

* ``("asker",)``: the holder is silent: the asker's messages reach no one and its last prompt says
  there was no reply. It can only guess: at most ``1 / 900`` by its view (values are uniform).
* ``("holder",)``: the asker is silent: the holder sees its table and no message, and its reply is
  read as the team's answer (its last whole number): at most ``1 / num_keys`` by its view.
* ``("oracle",)``: one agent sees the table *and* the query and answers at once (one action of
  the same token limit): the information the team has, in one head.

Options: ``num_keys`` (2-26), ``message_words`` (1-64), ``distractors`` (the other keys share the
query's first two letters, so the holder must match the whole key), ``dense_rewards``.
``reset(options={"table": {key: value}, "query": key})`` plays a fixed task (keys lowercase words
of 2-12 letters, values whole numbers; the query a key of the table).

Infos, besides the common ones: ``query`` and ``value`` only once the episode is over (they are
the task), ``names_query`` (the asker's message contains the query key; asker messages),
``sends_value`` (the reply contains the query's value; holder replies), ``answer`` (the number
read, or ``None``; answers), ``message_cut`` (words dropped by the cap).

:func:`oracle_action` gives perfect actions (the asker names the key and answers the value, the
holder sends the pair the message names).

Version history:

* v0: first version (before its first release, the holder's prompt moved the message before the
  table).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from llm_zoo.arguments import check_int
from llm_zoo.core import Outcome, TextAECEnv

__all__ = [
    "DENSE_REWARD",
    "FORMAT_PENALTY",
    "KeyRelayEnv",
    "cap_message",
    "last_number",
    "oracle_action",
    "oracle_policy",
]

#: The level an unusable action puts its agent at (repaid by the agent's next usable action).
FORMAT_PENALTY = -0.5
#: The once-per-episode dense reward for naming the query key (asker) or sending its value (holder).
DENSE_REWARD = 0.25
#: The roles, and the single-agent controls ``agents`` may name instead.
ROLES = ("asker", "holder")
AGENT_SETS = (ROLES, ("asker",), ("holder",), ("oracle",))
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_CONSONANTS = "bcdfghjklmnprstvz"
_VOWELS = "aeiou"
_KEY = re.compile(r"[a-z]{2,12}")
_NUMBER = re.compile(r"-?\d+")
# A number as written, with a decimal part or a percent sign (plain or TeX) when it has one.
_NUMBER_TOKEN = re.compile(r"-?\d+(?:\.\d+)?(?:\\?%)?")
_WORD = re.compile(r"[a-z]+")
_MAX_KEY_DRAWS = 10_000


def cap_message(text: str, words: int) -> tuple[str, int]:
    """What of a message reaches the partner: its first ``words`` words, and nothing after the word
    holding its first number; returns that text (words joined by single spaces) and how many
    words were dropped."""
    pieces = text.split()
    kept = pieces[:words]
    for index, piece in enumerate(kept):
        if _NUMBER.search(piece):
            kept = kept[: index + 1]
            break
    return " ".join(kept), len(pieces) - len(kept)


def last_number(text: str) -> str | None:
    """The last number written in ``text``: a whole number without leading zeros (``"It is 412."``
    -> ``"412"``, ``"-0"`` -> ``"0"``), or, when the last number is not a plain whole number
    (``412.5``, ``412%``), that text as written (which no value equals); ``None`` without any."""
    found = _NUMBER_TOKEN.findall(text)
    if not found:
        return None
    return _canonical(found[-1]) if _NUMBER.fullmatch(found[-1]) else found[-1]


def _canonical(number: str) -> str:
    """A whole number's digits without leading zeros (text only: a 5000-digit answer must not
    reach ``int()``, which refuses more than 4300 digits)."""
    digits = number.lstrip("-").lstrip("0") or "0"
    return f"-{digits}" if number.startswith("-") and digits != "0" else digits


def _count_words(text: str) -> str:
    n = len(text.split())
    return f"{n} word" if n == 1 else f"{n} words"


def _names(text: str, key: str) -> bool:
    """Whether ``text`` contains ``key`` as a whole word (any case)."""
    return key in _WORD.findall(text.lower())


def _contains_number(text: str, value: str) -> bool:
    return any(_canonical(n) == value for n in _NUMBER.findall(text))


class KeyRelayEnv(TextAECEnv):
    """KeyRelay-v0 (see the module docstring for the full rules).

    Args:
        num_keys: Rows of the holder's table (2-26).
        message_words: Most words of a message that reach the partner (1-64); a message is also cut
            after its first number.
        distractors: The other keys share the query key's first two letters.
        dense_rewards: Pay ``DENSE_REWARD`` once for naming the query key (asker) and once for
            sending its value (holder).
        agents: ``("asker", "holder")`` (default), or one control: ``("asker",)``, ``("holder",)``,
            ``("oracle",)``.
        max_turns: Turns; the last is the asker's answer (default 2: one exchange, then the answer).
        alpha: Weight of the global (team) reward in each agent's reward.
        render_mode: ``None``, ``"ansi"`` or ``"human"``.
    """

    metadata: ClassVar[dict[str, Any]] = {
        "render_modes": ["ansi"],
        "name": "key_relay_v0",
        "is_parallelizable": False,
    }
    roles: ClassVar[tuple[str, ...]] = ROLES
    reset_options: ClassVar[dict[str, str] | None] = {
        "table": "the holder's table, {key: value} (keys lowercase words, values whole numbers)",
        "query": "the asker's key (a key of the table)",
    }

    def __init__(
        self,
        *,
        num_keys: int = 6,
        message_words: int = 12,
        distractors: bool = False,
        dense_rewards: bool = False,
        agents: Sequence[str] = ROLES,
        max_turns: int = 2,
        alpha: float = 1.0,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, alpha=alpha, render_mode=render_mode)
        self.num_keys = check_int("num_keys", num_keys, low=2, high=len(_LETTERS))
        self.message_words = check_int("message_words", message_words, low=1, high=64)
        if not isinstance(distractors, bool) or not isinstance(dense_rewards, bool):
            raise ValueError(
                f"distractors and dense_rewards must be true or false, got {distractors!r} and {dense_rewards!r}"
            )
        self.distractors, self.dense_rewards = distractors, dense_rewards
        if isinstance(agents, str) or tuple(agents) not in AGENT_SETS:
            choices = " or ".join(repr(list(s)) for s in AGENT_SETS)
            raise ValueError(f"agents must be {choices}, got {agents!r}")
        if (
            tuple(agents) != ROLES
        ):  # a control seats one agent (the oracle is no role: it takes the asker's spaces)
            observation, action = self.observation_spaces["asker"], self.action_spaces["asker"]
            self.possible_agents = list(agents)
            self.observation_spaces = dict.fromkeys(self.possible_agents, observation)
            self.action_spaces = dict.fromkeys(self.possible_agents, action)
        self.table: dict[str, str] = {}
        self.query = ""

    # ------------------------------------------------------------------ the task

    def _new_episode(self, rng: np.random.Generator, options: dict[str, Any] | None) -> None:
        options = options or {}
        if "table" in options or "query" in options:
            self.table, self.query = _fixed_task(options.get("table"), options.get("query"))
        else:
            self.table, self.query = self._draw_task(rng)
        self.message = ""  # the asker's latest message, as the holder reads it
        self.reply = ""  # the holder's latest reply, as the asker reads it
        self.answer: str | None = None
        self._level = {a: 0.0 for a in self.possible_agents}
        self._dense_paid = {a: False for a in self.possible_agents}

    def _draw_task(self, rng: np.random.Generator) -> tuple[dict[str, str], str]:
        """``num_keys`` distinct 4-letter keys (with ``distractors``, all sharing their first two
        letters), distinct 3-digit values, and one key as the query."""
        prefix = _word(rng, 2) if self.distractors else ""
        keys: list[str] = []
        for _ in range(_MAX_KEY_DRAWS):
            key = prefix + _word(rng, 4 - len(prefix))
            if key not in keys:
                keys.append(key)
                if len(keys) == self.num_keys:
                    break
        values = rng.choice(np.arange(100, 1000), size=self.num_keys, replace=False)
        table = {key: str(int(value)) for key, value in zip(keys, values, strict=True)}
        return table, keys[int(rng.integers(len(keys)))]

    def _task_id(self) -> str:
        rows = ",".join(f"{k}={v}" for k, v in self.table.items())
        return f"{rows}?{self.query}"

    @property
    def value(self) -> str:
        """The query's value: the answer."""
        return self.table[self.query]

    # ------------------------------------------------------------------ prompts

    def _prompt(self, agent: str) -> str:
        if agent == "oracle":
            return f"{self._table_text()}\nWhat is the number stored under the key {self.query}? Reply with the number only."
        if agent == "holder":
            if self.possible_agents == ["holder"]:
                return (
                    f"{self._table_text()}\nYour teammate has sent no message.\n"
                    "What is the number your teammate needs? Reply with the number only."
                )
            heard = self.message if self.message else "(no message)"
            # The message comes before the table: with the table first SmolLM2-135M mostly copies
            # its last row (module docstring, measured).
            return (
                f'Your teammate\'s message: "{heard}"\n{self._table_text()}\n'
                "Find the key of the message in your table and reply with its number."
            )
        if self._answer_turn():
            if "holder" not in self.possible_agents:
                heard = "Your teammate did not reply."
            else:
                heard = (
                    f'Your teammate replied: "{self.reply}"' if self.reply else "Your teammate sent no reply."
                )
            return (
                f"{heard}\nWhat is the number stored under the key {self.query}? Reply with the number only."
            )
        return f"Ask your teammate for the number of the key {self.query}. Write the question."

    def _table_text(self) -> str:
        return "Your table:\n" + "\n".join(f"{key}: {value}" for key, value in self.table.items())

    def _answer_turn(self) -> bool:
        return self.turn >= self.max_turns - 1

    # ------------------------------------------------------------------ actions

    def _act(self, agent: str, action: str) -> Outcome:
        if (
            agent == "oracle"
            or self.possible_agents == ["holder"]
            or (agent == "asker" and self._answer_turn())
        ):
            return self._answer(agent, action)
        text, dropped = cap_message(action, self.message_words)
        info: dict[str, Any] = {"message_cut": dropped}
        if not text:
            return self._unusable(agent, "Your message had no words.", info)
        if agent == "asker":
            self.message = text
            info["names_query"] = _names(text, self.query)
            dense = info["names_query"]
        else:
            self.reply = text
            info["sends_value"] = _contains_number(text, self.value)
            dense = info["sends_value"]
        reward = self._move_level(agent, 0.0) + self._dense(agent, dense)
        feedback = f"Only the first {_count_words(text)} of your message were sent." if dropped else ""
        return Outcome(role_reward=reward, global_reward=0.0, feedback=feedback, info=info)

    def _answer(self, agent: str, action: str) -> Outcome:
        self.answer = last_number(action)
        info: dict[str, Any] = {"answer": self.answer, "query": self.query, "value": self.value}
        if agent == "holder":  # alone, its reply is the team's answer
            info["sends_value"] = self.answer == self.value
        if self.answer is None:
            outcome = self._unusable(agent, "Your reply had no number.", info)
            outcome.terminated = True
            return outcome
        correct = self.answer == self.value
        role = self._move_level(agent, 1.0 if correct else 0.0)
        return Outcome(role_reward=role, global_reward=1.0 if correct else 0.0, terminated=True,
                       success=correct, info=info)  # fmt: skip

    def _unusable(self, agent: str, why: str, info: dict[str, Any]) -> Outcome:
        role = self._move_level(agent, FORMAT_PENALTY)
        return Outcome(role_reward=role, global_reward=0.0, format_ok=False, feedback=why, info=info)

    def _move_level(self, agent: str, level: float) -> float:
        change, self._level[agent] = level - self._level[agent], level
        return change

    def _dense(self, agent: str, earned: bool) -> float:
        if not (self.dense_rewards and earned) or self._dense_paid[agent]:
            return 0.0
        self._dense_paid[agent] = True
        return DENSE_REWARD

    def _render_state(self) -> str:
        over = not self.agents or all(self.terminations.values()) or all(self.truncations.values())
        query = f"{self.query} -> {self.value}" if over else "(shown when the episode is over)"
        return (
            f"KeyRelay | {self.turn_label()} | query: {query}\n{self._table_text()}\n"
            f'message: "{self.message}"\nreply: "{self.reply}"\nanswer: {self.answer}'
        )


def _word(rng: np.random.Generator, length: int) -> str:
    """A pronounceable made-up word: consonant, vowel, consonant, vowel, ..."""
    return "".join(
        (_CONSONANTS if i % 2 == 0 else _VOWELS)[
            int(rng.integers(len(_CONSONANTS if i % 2 == 0 else _VOWELS)))
        ]
        for i in range(length)
    )


def _fixed_task(table: Any, query: Any) -> tuple[dict[str, str], str]:
    if not isinstance(table, Mapping) or not table:
        raise ValueError(f"options['table'] must be a non-empty {{key: value}} mapping, got {table!r}")
    fixed: dict[str, str] = {}
    for key, value in table.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise ValueError(f"table keys must be lowercase words of 2-12 letters, got {key!r}")
        if isinstance(value, bool) or not isinstance(value, int | str) or not _NUMBER.fullmatch(str(value)):
            raise ValueError(f"table values must be whole numbers, got {value!r} for {key!r}")
        fixed[key] = _canonical(str(value))
    if query not in fixed:
        raise ValueError(f"options['query'] must be a key of the table ({', '.join(fixed)}), got {query!r}")
    return fixed, str(query)


def oracle_action(env: KeyRelayEnv, agent: str) -> str:
    """A perfect action for ``agent`` now: the asker names its key, then answers the value; the holder
    sends the pair of the key the asker's message names (the query's value when alone); the
    oracle answers the value."""
    if agent == "oracle" or env.possible_agents == ["holder"] or (agent == "asker" and env._answer_turn()):
        return env.value
    if agent == "asker":
        return env.query
    named = next((key for key in env.table if _names(env.message, key)), None)
    return f"{named} {env.table[named]}" if named else "Which key?"


def oracle_policy(env: KeyRelayEnv) -> Callable[[str, str], str]:
    """``policy(agent, prompt) -> action`` playing :func:`oracle_action` on ``env``."""
    return lambda agent, prompt: oracle_action(env, agent)
