"""The base class every llm-zoo environment builds on.

:class:`TextAECEnv` is a PettingZoo :class:`~pettingzoo.AECEnv` whose agents read and write text.
It owns all PettingZoo bookkeeping (agent selection, the dead-agent steps, cumulative rewards,
truncation at ``max_turns``, reward mixing, ``infos``) so an environment author writes only the
rules, in four methods:

* :meth:`TextAECEnv._new_episode` - build the initial state from the env's seeded ``rng``.
* :meth:`TextAECEnv._prompt` - the full text an agent must answer (instructions + state).
* :meth:`TextAECEnv._act` - apply one agent's text action and return an :class:`Outcome`.
* :meth:`TextAECEnv._render_state` - a human-readable picture of the state.

and two class attributes: :attr:`TextAECEnv.roles` and ``metadata["name"]`` (``render_modes`` and
``is_parallelizable`` default to the base class's). ``render()`` returns that picture in ``"ansi"``
mode and prints it in ``"human"`` mode; without a render mode it warns and returns ``None``, as
PettingZoo's envs do. ``state()`` is PettingZoo's own: no built-in env defines a global state, so
it raises ``NotImplementedError`` as PettingZoo's base class does (an env's attributes must not
hide it: the Plan-Path and Sokoban envs keep their board in ``puzzle_state``).

PettingZoo conventions:

* ``max_cycles`` is PettingZoo's name for the turn limit: every env takes ``max_cycles=n`` as
  ``max_turns=n`` (not both), so ``pettingzoo.test.max_cycles_test`` applies.
* The parallel API: ``is_parallelizable`` is ``False`` by default, so PettingZoo's
  ``aec_to_parallel`` refuses these envs. That conversion collects every agent's action of a turn
  before any of them is played, but here an agent later in the turn reads what the earlier ones
  answered in the same turn (the plan agent reads the tool agent's program and output): in a
  parallel step it would answer without them ("The tool agent has not answered yet"). The
  faithful parallel view is ``pettingzoo.utils.conversions.turn_based_aec_to_parallel``: one agent
  acts per parallel step (the one whose turn it is; the other agents' actions are ignored), which
  ``llm_zoo.testing.check_env`` tests with ``parallel_api_test``.

Contract (see ``DESIGN.md``):

* Observations are ``{"prompt": str}`` (a ``Dict`` space with a ``prompt`` text key: PettingZoo's
  ``api_test`` cannot handle a bare ``Text`` observation). The prompt is the whole message the
  agent should answer; applying a chat template is the trainer's job.
* Actions are strings. *Any* string is a legal action: text the rules cannot parse earns the env's
  format penalty and an explanation in that agent's next prompt, never an exception.
* Rewards (the reward algebra of every env, plugins included): an action's :class:`Outcome` has a
  ``role_reward`` (what the acting agent's own work earned) and a ``global_reward`` (the change
  of the team's level that the action made: a potential difference, so the global rewards of an
  episode sum to the team's final level). On each step the acting agent's reward is
  ``role_reward + alpha * global_reward`` and **every other agent still in the episode** gets
  ``alpha * global_reward``, through PettingZoo's cumulative rewards: a PettingZoo user summing
  ``env.last()``'s reward for every agent the iterator yields gets, for agent A,
  ``sum of A's role rewards + alpha * (the team's final level)``. So whoever moves first still
  sees whether the team solved. ``alpha`` (a constructor argument, default 1) is the one team
  weight. ``infos[agent]`` always carries ``role_reward``, ``global_reward`` (of the agent's
  own last action), ``success``, ``turn``, ``format_ok`` and ``feedback``, plus env-specific keys.
* A *turn* is one action by every agent, in the order of ``possible_agents``. After ``max_turns``
  turns every agent is truncated.
* An agent may finish before the others: a subclass sets ``terminations[agent] = True`` (in
  ``_act`` or after ``super().step``). The base class then selects it once more in its turn, to be
  stepped with ``None`` as the AEC API requires, and moves on to the next agent left; a turn is
  then one action by every agent still playing. No bookkeeping is needed in the subclass.
* :meth:`TextAECEnv.clone` returns an independent copy, the tree rollout branches on it.
* All randomness comes from ``self.rng``, seeded by ``reset(seed=...)``; the global RNGs are never
  touched, so ``reset(seed=s)`` always yields the same episode. A seed is ``None`` or an integer
  >= 0, as in Gymnasium; anything else is refused with :class:`~llm_zoo.arguments.EnvArgumentError`,
  as are ``observe`` of an unknown agent and wrong constructor arguments (:mod:`llm_zoo.arguments`).
"""

from __future__ import annotations

import copy
import functools
import inspect
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium
import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv

from llm_zoo.arguments import check_agent, check_int, check_number, check_options, check_seed

__all__ = [
    "MAX_ACTION_CHARS",
    "MAX_PROMPT_CHARS",
    "MAX_TURNS",
    "RENDER_MODES",
    "Outcome",
    "TextAECEnv",
    "TextSpace",
    "class_attribute_problem",
]

#: Actions longer than this are still accepted by ``step``, which cuts them to their first
#: ``MAX_ACTION_CHARS`` characters before the rules read them (the feedback says so); they are
#: outside the declared action space.
MAX_ACTION_CHARS = 65_536
#: Upper bound of the declared observation space.
MAX_PROMPT_CHARS = 1_000_000
#: Most ``max_turns`` an env accepts: far beyond any episode a model plays, it catches typos such
#: as ``10**9``.
MAX_TURNS = 10_000

#: The render modes :meth:`TextAECEnv.render` implements: ``"ansi"`` returns the picture of the
#: state, ``"human"`` prints it.
RENDER_MODES = ("ansi", "human")

_SAMPLE_CHARSET = string.printable  # letters, digits, punctuation, space, \t \n \r \x0b \x0c


class TextSpace(spaces.Text):
    """A :class:`gymnasium.spaces.Text` that contains *every* string up to ``max_length``.

    Gymnasium's ``Text`` only contains strings drawn from its ``charset`` (letters and digits by
    default). Model output is arbitrary Unicode, and observations quote it back, so membership here
    only checks type and length. ``sample()`` still draws from printable ASCII (including spaces and
    newlines), which is what the PettingZoo test suites use to fuzz an env.
    """

    def __init__(self, max_length: int, *, seed: int | np.random.Generator | None = None):
        super().__init__(max_length=max_length, min_length=0, charset=_SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"


@dataclass
class Outcome:
    """What one action did, as returned by :meth:`TextAECEnv._act`.

    Attributes:
        role_reward: The acting agent's own reward for this action.
        global_reward: The team's reward for this action: the change of the team's level it made
            (0 when it changed nothing), so an episode's global rewards sum to the team's final
            level. ``alpha`` times it reaches every agent still in the episode, not only the
            acting one (module docstring, "Rewards").
        format_ok: Whether the action could be parsed as the agent was asked to answer.
        feedback: A message shown at the top of this agent's next prompt (at its end where the env
            sets :attr:`TextAECEnv.feedback_last`), e.g. why the action could not be parsed, or what
            happened. Empty for none.
        terminated: The episode is over for every agent (solved, or failed for good).
        success: The team solved the task. Sticky: once true it stays true for the episode.
        info: Env-specific extras merged into ``infos[agent]`` (plain, comparable values only).
    """

    role_reward: float
    global_reward: float
    format_ok: bool = True
    feedback: str = ""
    terminated: bool = False
    success: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class TextAECEnv(AECEnv):
    """A turn-based, text-in text-out multi-agent environment (PettingZoo AEC API).

    Subclasses set :attr:`roles` (the turn order) and :attr:`metadata` ``["name"]`` and implement
    the four rule methods. A subclass's ``metadata`` is completed with the base class's
    ``render_modes`` and ``is_parallelizable`` when it omits them, and ``"human"`` is added to
    ``render_modes`` wherever ``"ansi"`` is (unless the subclass renders by itself): both come from
    :meth:`_render_state`. Constructor keyword arguments common to every env (``max_turns`` an
    integer in ``[1, MAX_TURNS]``, ``alpha`` a finite number; others are refused with
    :class:`~llm_zoo.arguments.EnvArgumentError`):

    Args:
        max_turns: Number of turns (one action by every role) before every agent is truncated.
        max_cycles: PettingZoo's name for ``max_turns`` (give one of them).
        alpha: Weight of the global (team) reward in each agent's reward.
        render_mode: ``None``, ``"ansi"`` (``render()`` returns the picture of the state) or
            ``"human"`` (``render()`` prints it and returns ``None``).
    """

    metadata: ClassVar[dict[str, Any]] = {
        "render_modes": list(RENDER_MODES),
        "name": "text_aec_env",
        "is_parallelizable": False,
    }
    #: The agents, in the order they act within a turn.
    roles: ClassVar[tuple[str, ...]] = ()
    #: The ``reset`` options that pick the task -> what each does, or ``None`` (no check). With a
    #: dict, ``reset`` refuses another env's task option (``problem_id`` where levels are generated)
    #: and a typo of one of these (:func:`llm_zoo.arguments.check_options`).
    reset_options: ClassVar[dict[str, str] | None] = None
    #: Where an agent's feedback goes in its next prompt: at the top (``False``), or at the end for
    #: an env whose layout keeps the text that does not change first (a prefix cache reuses it).
    feedback_last: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("metadata")
        if not isinstance(declared, dict):
            return  # inherited (or not a dict: reported when the env is made)
        metadata = dict(declared)
        metadata.setdefault("render_modes", list(RENDER_MODES))
        metadata.setdefault("is_parallelizable", False)
        modes = metadata["render_modes"]
        renders_itself = cls.render is not TextAECEnv.render
        if (
            isinstance(modes, (list, tuple))
            and "ansi" in modes
            and "human" not in modes
            and not renders_itself
        ):
            metadata["render_modes"] = [*modes, "human"]
        cls.metadata = metadata
        init = cls.__dict__.get("__init__")
        if init is not None:
            cls.__init__ = _accepting_max_cycles(init)  # type: ignore[method-assign]

    def __init__(
        self,
        *,
        max_turns: int = 3,
        alpha: float = 1.0,
        render_mode: str | None = None,
        max_cycles: int | None = None,
    ):
        super().__init__()
        if max_cycles is not None:
            max_turns = max_cycles  # the subclass wrapper refuses both at once
        problem = class_attribute_problem(type(self))
        if problem:
            raise TypeError(problem)
        max_turns = check_int("max_turns", max_turns, low=1, high=MAX_TURNS)
        alpha = check_number("alpha", alpha)
        modes = list(self.metadata["render_modes"])
        if render_mode is not None and render_mode not in modes:
            raise ValueError(
                f"{type(self).__name__}: render_mode must be one of {modes} or None, got {render_mode!r}"
            )
        self.max_turns = int(max_turns)
        self.alpha = float(alpha)
        self.render_mode = render_mode
        self.possible_agents = list(self.roles)
        self.observation_spaces = {
            a: spaces.Dict({"prompt": TextSpace(MAX_PROMPT_CHARS)}) for a in self.possible_agents
        }
        self.action_spaces = {a: TextSpace(MAX_ACTION_CHARS) for a in self.possible_agents}
        self.rng = np.random.default_rng()
        self._seeded = False
        self._has_reset = False
        self.agents: list[str] = []

    # ------------------------------------------------------------------ rules (override these)

    def _new_episode(self, rng: np.random.Generator, options: dict[str, Any] | None) -> None:
        """Build the initial state of an episode. Use only ``rng`` for randomness."""
        raise NotImplementedError

    def _prompt(self, agent: str) -> str:
        """The full text ``agent`` must answer now: role instructions, the state, answer format."""
        raise NotImplementedError

    def _act(self, agent: str, action: str) -> Outcome:
        """Apply ``agent``'s text ``action`` to the state and score it. Must not raise on any str."""
        raise NotImplementedError

    def _render_state(self) -> str:
        """A picture of the state for people (``render()``)."""
        raise NotImplementedError

    def _task_id(self) -> str:
        """A stable id of the task instance (problem id, or seed for generated tasks)."""
        return f"seed-{self._episode_seed}"

    def task_ids(self) -> list[str] | None:
        """The ids of the env's finite task set, each content once (``reset(options={"problem_id":
        id})`` plays one), or ``None`` when tasks are drawn from an unlimited space (generated
        grids: the default). The one accessor for an env's tasks; an env overrides it."""
        return None

    # ------------------------------------------------------------------ PettingZoo API

    def observation_space(self, agent: str) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        seed = check_seed(seed)
        if self.reset_options is not None:
            check_options(options, self.reset_options, type(self).__name__)
        if seed is not None or not self._seeded:
            self.rng = np.random.default_rng(seed)
            self._seeded = True
        # A seed for the episode drawn from the env's rng, so unseeded resets are reproducible
        # from the first seed and every episode has an id.
        self._episode_seed = int(self.rng.integers(2**31)) if seed is None else int(seed)
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.turn = 0
        self._last_action_turn = 0
        self.success = False
        self._feedback = {a: "" for a in self.agents}
        self._new_episode(self.rng, options)
        self.task_id = self._task_id()
        self.infos = {a: self._base_info() for a in self.agents}
        self.agent_selection = self.agents[0]
        self._skip_agent_selection = None
        self._has_reset = True

    def observe(self, agent: str) -> dict[str, str]:
        self._require_reset("observe")
        check_agent(agent, self.possible_agents)
        prompt = self._prompt(agent)
        feedback = self._feedback.get(agent, "")
        if feedback:
            prompt = (
                f"{prompt}\n\n{feedback.strip()}" if self.feedback_last else f"{feedback.strip()}\n\n{prompt}"
            )
        return {"prompt": prompt}

    def last(self, observe: bool = True) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self._require_reset("last")
        return super().last(observe)

    def step(self, action: str | None) -> None:
        self._require_reset("step")
        if not self.agents:
            raise RuntimeError(
                f"{type(self).__name__}.step(): the episode is over (no agent left); call reset() first"
            )
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            if self.agents and self.agent_selection not in self.agents:
                # PettingZoo's helper leaves the removed agent selected when no other agent is dead
                # (an agent that finished before the others): move on to the next one left.
                self.agent_selection = self._next_agent(agent)
            return
        text = action if isinstance(action, str) else ("" if action is None else _as_text(action))
        cut_from = len(text) if len(text) > MAX_ACTION_CHARS else 0
        if cut_from:  # before any parsing: a 10 MB answer must not cost 10 MB of regex work
            text = text[:MAX_ACTION_CHARS]
        outcome = self._act(agent, text)
        if cut_from:
            note = f"Your answer had {cut_from:,} characters; only its first {MAX_ACTION_CHARS:,} were read."
            outcome.feedback = f"{note}\n{outcome.feedback}" if outcome.feedback else note
            outcome.info["action_cut_from"] = cut_from
        self.success = self.success or bool(outcome.success)

        self._cumulative_rewards[agent] = 0.0
        team_part = self.alpha * float(outcome.global_reward)
        # the team's outcome reaches every agent's return, not only the actor's (module docstring)
        self.rewards = {a: team_part for a in self.agents}
        self.rewards[agent] = float(outcome.role_reward) + team_part
        self._feedback[agent] = outcome.feedback
        info = self._base_info()
        info.update(
            role_reward=float(outcome.role_reward),
            global_reward=float(outcome.global_reward),
            format_ok=bool(outcome.format_ok),
            feedback=outcome.feedback,
        )
        info.update(outcome.info)
        self.infos[agent] = info
        for other in self.agents:
            if other != agent:
                self.infos[other].update(success=self.success, turn=self.turn)

        self._last_action_turn = self.turn + 1
        is_last_role = agent == self._last_live_agent(agent)
        if is_last_role:
            self.turn += 1
        if outcome.terminated:
            self.terminations = {a: True for a in self.agents}
        elif is_last_role and self.turn >= self.max_turns:
            self.truncations = {a: True for a in self.agents}
        self.agent_selection = self._next_agent(agent)
        self._accumulate_rewards()

    def render(self) -> str | None:
        """The picture of the state: returned in ``"ansi"`` mode, printed in ``"human"`` mode
        (returns ``None``); without a ``render_mode`` a warning, as PettingZoo's envs give, and
        ``None``."""
        if self.render_mode is None:
            gymnasium.logger.warn(
                f"You are calling render method without specifying any render mode: make the env with "
                f"render_mode set to one of {list(self.metadata['render_modes'])}."
            )
            return None
        self._require_reset("render")
        picture = self._render_state()
        if self.render_mode == "human":
            print(picture, flush=True)
            return None
        if self.render_mode == "ansi":
            return picture
        raise NotImplementedError(
            f"{type(self).__name__} lists render mode {self.render_mode!r}, which TextAECEnv does not "
            f"implement ({', '.join(RENDER_MODES)}): override render()"
        )

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ helpers

    def clone(self) -> TextAECEnv:
        """An independent deep copy: stepping the copy never changes this env, and vice versa.

        The copy's RNG continues from the same state, so a clone and its original given the same
        actions stay identical. The observation and action spaces are shared, not copied: they
        describe the env and never change, and copying them was most of the cost of a clone.
        """
        memo = {
            id(self.observation_spaces): self.observation_spaces,
            id(self.action_spaces): self.action_spaces,
        }
        return copy.deepcopy(self, memo)

    def turn_label(self) -> str:
        """The turn as people count it, from 1: ``"turn 2 of 3"`` while the episode runs (the turn
        the next action belongs to), ``"over in turn 2 of 3"`` once it has ended (the turn of its
        last action). Prompts, renders and ``llm-zoo play`` all use this one convention."""
        self._require_reset("turn_label")
        finished = not self.agents or all(self.terminations[a] or self.truncations[a] for a in self.agents)
        if finished:
            return f"over in turn {max(self._last_action_turn, 1)} of {self.max_turns}"
        return f"turn {self.turn + 1} of {self.max_turns}"

    def _base_info(self) -> dict[str, Any]:
        return {
            "role_reward": 0.0,
            "global_reward": 0.0,
            "success": self.success,
            "turn": self.turn,
            "format_ok": True,
            "feedback": "",
            "task_id": self.task_id,
        }

    def _last_live_agent(self, acting: str) -> str:
        """The last agent in turn order that still plays, counting ``acting`` (which has just
        acted, even if its action ended its own part): its action completes the turn."""
        live = [
            a
            for a in self.possible_agents
            if a == acting or (a in self.agents and not (self.terminations[a] or self.truncations[a]))
        ]
        return live[-1]

    def _require_reset(self, method: str) -> None:
        if not self._has_reset:
            raise RuntimeError(f"{type(self).__name__}.{method}() before reset(): call env.reset() first")

    def _next_agent(self, agent: str) -> str:
        """The agent after ``agent`` in turn order among those still in ``agents`` (``agent`` if it
        is the only one). A dead agent still in ``agents`` is selected in its turn, to be stepped
        with ``None`` (the AEC API's way to remove it); one already removed is skipped."""
        order = [a for a in self.possible_agents if a == agent or a in self.agents]
        return order[(order.index(agent) + 1) % len(order)]


def _as_text(action: Any) -> str:
    """A non-string action as text (``str``), or its type's name if even that fails."""
    try:
        return str(action)
    except Exception:  # e.g. an int over Python's 4300-digit conversion limit
        return f"<{type(action).__name__}>"


def _accepting_max_cycles(init: Callable[..., None]) -> Callable[..., None]:
    """A subclass ``__init__`` that names ``max_turns`` also takes PettingZoo's ``max_cycles`` for
    it (its signature says so, so ``llm_zoo.make`` accepts it); one that does not is left alone."""
    signature = inspect.signature(init)
    parameters = list(signature.parameters.values())
    if "max_turns" not in signature.parameters or "max_cycles" in signature.parameters:
        return init

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, max_cycles: int | None = None, **kwargs: Any) -> None:
        if max_cycles is not None:
            if "max_turns" in kwargs:
                raise TypeError(
                    f"{type(self).__name__}: give max_turns or max_cycles (PettingZoo's name for it), "
                    f"not both; got max_turns={kwargs['max_turns']!r}, max_cycles={max_cycles!r}"
                )
            kwargs["max_turns"] = max_cycles
        init(self, *args, **kwargs)

    extra = inspect.Parameter(
        "max_cycles", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="int | None"
    )
    at = next(
        (i for i, p in enumerate(parameters) if p.kind is inspect.Parameter.VAR_KEYWORD), len(parameters)
    )
    __init__.__signature__ = signature.replace(parameters=[*parameters[:at], extra, *parameters[at:]])  # type: ignore[attr-defined]
    return __init__


def class_attribute_problem(cls: type) -> str:
    """What is wrong with the class attributes an env must define (``roles``, ``metadata`` with
    ``name`` and ``render_modes``), as one line naming the fix; ``""`` when nothing is."""
    name = cls.__name__
    roles = getattr(cls, "roles", None)
    if not roles or not isinstance(roles, (tuple, list)) or not all(isinstance(r, str) and r for r in roles):
        return f'{name} must define the class attribute `roles`, the agents in turn order, e.g. roles = ("caller", "echoer")'
    if len(set(roles)) != len(roles):
        return f"{name}.roles has a repeated agent: {tuple(roles)!r}"
    metadata = getattr(cls, "metadata", None)
    if not isinstance(metadata, dict):
        return f'{name}.metadata must be a dict, e.g. metadata = {{"name": "echo_v0"}}; got {type(metadata).__name__}'
    own_name = metadata.get("name")
    if (
        not own_name
        or not isinstance(own_name, str)
        or (cls is not TextAECEnv and own_name == TextAECEnv.metadata["name"])
    ):
        return f'{name}.metadata lacks "name": set metadata = {{"name": "echo_v0", ...}} (a lowercase id for your env)'
    modes = metadata.get("render_modes")
    if not isinstance(modes, (list, tuple)) or not all(isinstance(m, str) for m in modes):
        return f'{name}.metadata["render_modes"] must be a list of mode names such as {list(RENDER_MODES)}; got {modes!r}'
    return ""
