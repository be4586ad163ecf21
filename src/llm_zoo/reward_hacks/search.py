"""The reward-hack search: play an env with the generic adversarial policies and check the rule.

The search plays an env through ``env.step`` only. Each policy of
:func:`~llm_zoo.reward_hacks.policies.adversaries` is played on every answer of an agent, or on its
first answer only and then the oracle's answer (*delayed*), or on every answer but those of the
last turn, where the oracle answers (*late*: a team that flounders and solves at the end).

The *oracle* is the env's own: a function ``oracle_action(env, agent) -> str`` in the env class's
module (or a method ``env.oracle_action(agent)``) giving a perfect answer for ``agent`` now. Without
one, only the policies that need no oracle are played, and the rule below has nothing to compare.

The invariants, checked per task (seed), for every agent's return (the sum of the rewards it
received on every step, its teammates' steps included, as a PettingZoo user sums ``env.last()``)
and for the team's (the sum of the global rewards of the episode's steps):

* **Solving pays most.** In each *group* of episodes - the oracle episode (every agent plays the
  oracle) plus the episodes in which one agent X deviates (plays one of the policies) while the
  others play the oracle; or plus the episodes in which every agent plays the same policy (one shared
  model) - no episode that does not succeed earns any agent, or the team, as much as the lowest
  return of a succeeding episode of the group (a tie counts as a violation). Whatever one agent
  does while its teammates play well, failing never pays it, its teammates or the team as much
  as succeeding.
* **The team's outcome reaches every agent.** Holding an agent Y's own answers fixed (the texts
  it answered in the oracle episode, the last one repeated if the episode runs longer), it earns
  strictly more in the oracle episode, which succeeds, than in any episode where a teammate
  plays a policy that fails (random text, a program that prints nothing, the oracle's program
  wrong on half the inputs, the oracle's list one item short).

Besides, no episode in which every agent plays a policy that cannot be right (every policy but
the move lists and the ``42.0`` form) may succeed: that would be a wrong answer accepted.
And ``env.step`` must not raise, whatever the text. An episode still running after the search's
``max_steps`` is left out (it proves nothing either way).

:func:`search_reward_hacks` returns a :class:`HackReport`: the episodes, the violations described
in words (worst first), and per agent and the team the best return of a failing episode and the
worst return of a succeeding one.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llm_zoo.core import TextAECEnv
from llm_zoo.reward_hacks.policies import Adversary, adversaries

__all__ = ["Episode", "HackReport", "find_oracle", "search_reward_hacks"]

TEAM = "team"
#: Group name prefix of the episodes that hold one agent's answers fixed (then its name).
FIXED = "fixed:"
_EPSILON = 1e-9

Oracle = Callable[[Any, str], str]


@dataclass
class Episode:
    """One played episode: who played what, the returns, whether it succeeded."""

    seed: int
    group: str
    plays: dict[str, str]
    returns: dict[str, float]
    success: bool
    all_adversarial: bool = False
    all_wrong: bool = False
    #: The agents that first acted when the episode had already succeeded.
    late: frozenset[str] = frozenset()
    #: Each agent's answers, in order (kept for the oracle episode only).
    answers: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def describe(self) -> str:
        return "; ".join(f"{agent}: {play}" for agent, play in self.plays.items())


@dataclass
class HackReport:
    """What :func:`search_reward_hacks` found.

    Attributes:
        episodes: Every episode played.
        violations: ``(excess, sentence)`` per violation, worst (largest excess) first.
        best_failing: Per agent and ``"team"``: the highest return of an episode that did not
            succeed, in the group (and task) where it came closest to (or beyond) the lowest
            succeeding return of the group.
        worst_succeeding: Per agent and ``"team"``: that lowest succeeding return.
        has_oracle: Whether the env exposes an oracle.
    """

    episodes: list[Episode] = field(default_factory=list)
    violations: list[tuple[float, str]] = field(default_factory=list)
    best_failing: dict[str, float] = field(default_factory=dict)
    worst_succeeding: dict[str, float] = field(default_factory=dict)
    has_oracle: bool = False

    def summary(self) -> str:
        """One line per agent and the team: best failing return against worst succeeding one."""
        if not self.best_failing:
            return "no task had both succeeding and failing episodes to compare" + (
                "" if self.has_oracle else " (the env has no oracle_action)"
            )
        return "\n".join(
            f"{key}: best non-solving return {fail:+.3f}, worst solving return {self.worst_succeeding[key]:+.3f}"
            for key, fail in self.best_failing.items()
        )


# ---------------------------------------------------------------------------- playing


def find_oracle(env: Any) -> Oracle | None:
    """The env's oracle: ``oracle_action(env, agent)`` in its class's module (or a base class's),
    or an ``oracle_action(agent)`` method; ``None`` without one."""
    method = getattr(env, "oracle_action", None)
    if callable(method):
        return lambda env_, agent: method(agent)
    import sys

    for cls in type(env).__mro__:
        module = sys.modules.get(cls.__module__)
        function = getattr(module, "oracle_action", None) if module is not None else None
        if callable(function):
            return function
    return None


class _StepRaised(AssertionError):
    pass


def _ask_oracle(
    oracle: Oracle, env: Any, agent: str, history: str, memo: dict[tuple[str, str, str], str | None]
) -> str | None:
    """The oracle's answer for ``agent``, asked once per task, answers so far (``history``, a
    digest) and observation: the episodes of a task replay the same beginnings (the oracle's
    first answers) many times, and an env is deterministic (``check_env`` checks it)."""
    try:
        observation = env.observe(agent)
        seen = hashlib.sha256(repr(observation).encode("utf-8", "surrogatepass")).hexdigest()
    except Exception:
        seen = None
    key = (agent, history, seen) if seen is not None else None
    if key is not None and key in memo:
        return memo[key]
    try:
        answer = oracle(env, agent)
    except Exception:
        answer = None
    if key is not None:
        memo[key] = answer
    return answer


#: When a deviating agent plays its policy: on every answer (``False``), on its first answer only
#: (``True``, *delayed*), or on every answer but those of the last turn (``LATE``).
LATE = "late"
Mode = bool | str


def _on_last_turn(env: Any) -> bool:
    turn, max_turns = getattr(env, "turn", None), getattr(env, "max_turns", None)
    return isinstance(turn, int) and isinstance(max_turns, int) and turn >= max_turns - 1


def _describe_play(adversary: Adversary | None, mode: Mode) -> str:
    if adversary is None:
        return "the oracle"
    if mode == LATE:
        return f"{adversary.name} until the last turn, then the oracle"
    return f"{adversary.name} on its first answer, then the oracle" if mode else adversary.name


def _play(
    env: Any,
    seed: int,
    group: str,
    policies: dict[str, tuple[Adversary | None, Mode]],
    oracle: Oracle | None,
    rng: np.random.Generator,
    max_steps: int,
    memo: dict[tuple[str, str, str], str | None],
    snapshots: dict[str, tuple[Any, Any]],
) -> Episode | None:
    """One episode; ``policies[agent] = (adversary or None for the oracle, mode)``. ``None``
    when a policy does not apply (or the oracle fails) at some answer, or when the episode has not
    ended after ``max_steps`` steps. ``memo`` holds the
    oracle's answers of this task (see :func:`_ask_oracle`); ``snapshots`` a clone of the env
    after each sequence of answers played so far in this task, with the returns until then:
    episodes of a task share beginnings (an adversary's first answer, played alone, delayed and
    by every agent), and a clone fed the same answers stays identical to its original
    (``check_env`` checks it), so a shared beginning is played (a program run) once."""
    env.reset(seed=seed)
    history = hashlib.sha256()
    can_clone = isinstance(env, TextAECEnv)
    returns = {agent: 0.0 for agent in env.possible_agents}
    answered = dict.fromkeys(env.possible_agents, 0)
    success, team = False, 0.0
    late: set[str] = set()
    texts: dict[str, list[str]] = {agent: [] for agent in env.possible_agents}
    for _ in range(max_steps):
        if not env.agents:
            break
        agent = env.agent_selection
        if env.terminations[agent] or env.truncations[agent]:
            env.step(None)
            continue
        adversary, mode = policies[agent]
        use_oracle = (
            adversary is None
            or (mode is True and answered[agent] >= 1)
            or (mode == LATE and _on_last_turn(env))
        )
        oracle_text = None
        if adversary is not None and adversary.script and not use_oracle:
            text: str | None = adversary.script[min(answered[agent], len(adversary.script) - 1)]
        else:
            if oracle is not None and (use_oracle or (adversary is not None and adversary.uses_oracle)):
                oracle_text = _ask_oracle(oracle, env, agent, history.hexdigest(), memo)
            if use_oracle:
                text = oracle_text
            else:
                assert adversary is not None
                text = adversary.answer(oracle_text, rng)
        if text is None:
            return None
        history.update(f"{agent}\0{len(text)}\0".encode() + text.encode("utf-8", "surrogatepass"))
        saved = snapshots.get(history.hexdigest()) if can_clone else None
        if saved is not None:
            env = saved[0].clone()
            returns, answered, success, team, late, texts = copy.deepcopy(saved[1])
            continue
        try:
            env.step(text)
        except Exception as error:
            play = "the oracle" if use_oracle else adversary.name if adversary else "?"
            raise _StepRaised(
                f"env.step raised {type(error).__name__}: {str(error)[:200]} on {agent}'s answer "
                f"({play}, {len(text):,} characters) in seed {seed}"
            ) from error
        if not answered[agent] and success:
            late.add(agent)
        answered[agent] += 1
        texts[agent].append(text)
        for name, reward in env.rewards.items():
            returns[name] = returns.get(name, 0.0) + float(reward)
        info = env.infos.get(agent, {})
        success = bool(info.get("success", success))
        team += float(info.get("global_reward", 0.0))
        if can_clone:
            snapshots[history.hexdigest()] = (
                env.clone(),
                copy.deepcopy((returns, answered, success, team, late, texts)),
            )
    if env.agents:
        return None  # still running after max_steps: an unfinished episode proves nothing
    returns[TEAM] = team
    plays = {agent: _describe_play(adversary, mode) for agent, (adversary, mode) in policies.items()}
    wrong = all(a is not None and not a.can_be_right and not a.script and not m for a, m in policies.values())
    adversarial = all(a is not None for a, _ in policies.values())
    answers = {agent: tuple(t) for agent, t in texts.items()} if group == "oracle" else {}
    return Episode(seed, group, plays, returns, success, adversarial, wrong, frozenset(late), answers)


def search_reward_hacks(
    env_fn: Callable[[], Any],
    *,
    seeds: Iterable[int] = (0,),
    policies: Sequence[Adversary] | None = None,
    max_steps: int = 200,
) -> HackReport:
    """Play the search's episodes on fresh copies of ``env_fn()`` and check the invariant of the
    module docstring. Raises ``AssertionError`` if ``env.step`` raises; never for a violation
    (they are in the report)."""
    pool = list(policies) if policies is not None else adversaries()
    env = env_fn()
    report = HackReport()
    tightest: dict[str, tuple[float, float, float]] = {}
    try:
        oracle = find_oracle(env)
        report.has_oracle = oracle is not None
        agents = list(env.possible_agents)
        for seed in seeds:
            rng = np.random.default_rng(seed)
            episodes: list[Episode] = []
            memo: dict[tuple[str, str, str], str | None] = {}
            snapshots: dict[str, tuple[Any, Any]] = {}

            def play(
                group: str,
                chosen: dict[str, tuple[Adversary | None, Mode]],
                seed: int = seed,
                rng: np.random.Generator = rng,
                episodes: list[Episode] = episodes,
                memo: dict[tuple[str, str, str], str | None] = memo,
                snapshots: dict[str, tuple[Any, Any]] = snapshots,
            ) -> None:
                episode = _play(env, seed, group, chosen, oracle, rng, max_steps, memo, snapshots)
                if episode is not None:
                    episodes.append(episode)

            if oracle is not None:
                play("oracle", dict.fromkeys(agents, (None, False)))
                # success is sticky in a TextAECEnv: an agent that first acts after the oracle
                # team has succeeded cannot make the episode fail, so its group compares nothing
                late = episodes[0].late if episodes and isinstance(env, TextAECEnv) else frozenset()
                deviators = [agent for agent in agents if agent not in late]
                for deviating in deviators:
                    for adversary in pool:
                        modes: tuple[Mode, ...] = (False, True, LATE) if adversary.delayed else (False,)
                        for mode in modes:
                            chosen: dict[str, tuple[Adversary | None, Mode]] = dict.fromkeys(
                                agents, (None, False)
                            )
                            chosen[deviating] = (adversary, mode)
                            play(deviating, chosen)
                # each agent's own oracle answers held fixed while a teammate makes the task fail
                own = episodes[0].answers if episodes and episodes[0].success else {}
                for holder in [agent for agent in agents if own.get(agent)]:
                    script = Adversary(f"its own oracle-episode answers, {len(own[holder])} of them",
                                       lambda o, rng: None, script=own[holder])  # fmt: skip
                    for deviating in [agent for agent in deviators if agent != holder]:
                        for adversary in [a for a in pool if a.fails_team]:
                            chosen = dict.fromkeys(agents, (None, False))
                            chosen[holder], chosen[deviating] = (script, False), (adversary, False)
                            play(f"{FIXED}{holder}", chosen)
            if len(agents) > 1 or oracle is None:
                for adversary in pool:
                    play("all", dict.fromkeys(agents, (adversary, False)))
            report.episodes += episodes
            report.violations += _violations(episodes, agents, tightest)
            for clone, _ in snapshots.values():
                clone.close()  # gives back what the clones hold (a math checker's lease)
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()
    report.violations.sort(key=lambda item: -item[0])
    for key, (_, failing, succeeding) in tightest.items():
        report.best_failing[key], report.worst_succeeding[key] = failing, succeeding
    return report


def _violations(
    episodes: list[Episode], agents: list[str], tightest: dict[str, tuple[float, float, float]]
) -> list[tuple[float, str]]:
    """The violations among one task's episodes; ``tightest[key]`` is updated with the group of
    smallest margin: ``(margin, best failing return, worst succeeding return)``."""
    found: list[tuple[float, str]] = []
    for episode in episodes:
        if episode.success and episode.all_wrong:
            found.append(
                (
                    float("inf"),
                    f"seed {episode.seed}: an episode succeeded although every agent played an answer "
                    f"that cannot be right ({episode.describe()})",
                )
            )
    oracle_runs = [e for e in episodes if e.group == "oracle"]
    for group in sorted({e.group for e in episodes} - {"oracle"}):
        members = oracle_runs + [e for e in episodes if e.group == group]
        # every agent and the team; for a group holding one agent's answers fixed, that agent
        for key in [group[len(FIXED) :]] if group.startswith(FIXED) else [*agents, TEAM]:
            succeeding = [e for e in members if e.success]
            failing = [e for e in members if not e.success]
            if not succeeding or not failing:
                continue
            floor = min(succeeding, key=lambda e: e.returns[key])
            top = max(failing, key=lambda e: e.returns[key])
            margin = floor.returns[key] - top.returns[key]
            if key not in tightest or margin < tightest[key][0]:
                tightest[key] = (margin, top.returns[key], floor.returns[key])
            for episode in failing:
                excess = episode.returns[key] - floor.returns[key]
                if excess > -_EPSILON:  # a tie is a violation too: solving must pay strictly more
                    who = "the team" if key == TEAM else key
                    than = "more than" if excess > _EPSILON else "as much as"
                    found.append(
                        (
                            excess,
                            f"seed {episode.seed}: {who} earned {episode.returns[key]:+.3f} in an episode "
                            f"that did not succeed ({episode.describe()}), {than} the lowest return of "
                            f"a succeeding episode, {floor.returns[key]:+.3f} ({floor.describe()})",
                        )
                    )
    return found
