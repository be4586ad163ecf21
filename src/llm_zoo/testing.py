"""Checks for environment authors: run :func:`check_env` on your env before you publish it.

``check_env`` first checks the attributes PettingZoo needs (``metadata`` with ``name`` and
``render_modes``, ``possible_agents``, the spaces), then runs PettingZoo's own test suite unmodified
(``api_test``, ``seed_test``, ``render_test`` for every declared render mode, the AEC to parallel
conversion with ``parallel_api_test``) and llm-zoo's contract checks:

* a multi-step determinism check: two envs reset with one seed and fed the same actions produce the
  same prompts, rewards and infos for whole episodes (PettingZoo's ``parallel_seed_test`` stops
  after one step, so it does not cover this);
* clone independence: stepping a clone leaves the original unchanged, and a clone fed the same
  actions as its original stays identical to it;
* the info contract: every info has ``role_reward``, ``global_reward``, ``success``, ``turn``,
  ``format_ok``;
* a fuzz of malformed actions (empty, huge, binary noise, near-misses of every answer format):
  each must be accepted without an exception and, when it is not a valid answer, flagged with
  ``format_ok = False``;
* a reward-hack search (:mod:`llm_zoo.reward_hacks`): generic adversarial policies (random and
  maximal-length text, long cyclic or repeated move lists, numbers in other forms and huge ones,
  programs that exit 0 early, print nothing, return an always-true ``__eq__`` object or patch
  builtins) and the env's own ``oracle_action``. Rewards must pay most for solving: for the same
  task, no episode that does not succeed may earn an agent (the one that deviates from the oracle)
  or the team more than the lowest return of a succeeding episode; no episode of answers that
  cannot be right may succeed; ``env.step`` never raises. The failure names the worst episode.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from gymnasium.utils.env_checker import data_equivalence
from pettingzoo import AECEnv
from pettingzoo.test import api_test, parallel_api_test, render_test, seed_test
from pettingzoo.utils.conversions import turn_based_aec_to_parallel

from llm_zoo.core import TextAECEnv, class_attribute_problem
from llm_zoo.registry import make
from llm_zoo.reward_hacks import HackReport, search_reward_hacks

__all__ = ["REQUIRED_INFO_KEYS", "check_env", "check_reward_hacks", "malformed_actions", "play_episode"]

REQUIRED_INFO_KEYS = ("role_reward", "global_reward", "success", "turn", "format_ok")


def malformed_actions(rng: np.random.Generator, count: int) -> list[str]:
    """Strings that no answer format accepts: near-misses of the common formats, then random
    Unicode noise up to ``count`` strings in all (never fewer than the near-misses)."""
    fixed = [
        "",
        " ",
        "\n\n\n",
        "\x00\x01\x02",
        "#### ",
        "#### [",
        '#### ["U", "X"]',
        "#### [1, 2, 3]",
        "#### {'a': 1}",
        "#### [[[[[[[[[[",
        "#### " + "[" * 5000 + "]" * 5000,
        "```python\n",
        "```\n```",
        "```python\nwhile True: pass\n",
        "\\boxed{",
        "\\boxed{}",
        "\\boxed{{{{",
        "**Actions List**: [",
        "ünïcödé ✓ 🚀 " * 20,
        "A" * 70_000,
        "__import__('os').system('echo pwned')",
    ]
    noise = []
    for _ in range(max(0, count - len(fixed))):
        length = int(rng.integers(0, 200))
        codes = rng.integers(1, 0x2FFF, size=length)
        noise.append("".join(chr(int(c)) for c in codes if not 0xD800 <= c <= 0xDFFF))
    return fixed + noise


def play_episode(env: Any, policy: Callable[[str, str], str], seed: int | None = None) -> list[tuple]:
    """Play one episode; ``policy(agent, prompt) -> action``. Returns the trace of
    ``(agent, prompt, action, reward, info)`` for every live step."""
    env.reset(seed=seed)
    trace = []
    for agent in env.agent_iter():
        observation, _, termination, truncation, _ = env.last()
        if termination or truncation:
            env.step(None)
            continue
        action = policy(agent, observation["prompt"])
        env.step(action)
        trace.append((agent, observation["prompt"], action, env.rewards[agent], dict(env.infos[agent])))
    return trace


def _snapshot(env: Any) -> tuple:
    prompts = {a: env.observe(a)["prompt"] for a in env.agents}
    return (
        list(env.agents),
        env.agent_selection if env.agents else None,
        prompts,
        dict(env.rewards),
        copy.deepcopy(env.infos),
        dict(env.terminations),
        dict(env.truncations),
    )


def _check_determinism(env_fn: Callable[[], Any], actions: list[str], seeds: Iterable[int]) -> None:
    for seed in seeds:
        env_a, env_b = env_fn(), env_fn()
        env_a.reset(seed=seed)
        env_b.reset(seed=seed)
        for step, action in enumerate(_cycle(actions, env_a)):
            if not data_equivalence(_snapshot(env_a), _snapshot(env_b)):
                raise AssertionError(f"seed {seed}: envs diverged before step {step}")
            if not env_a.agents:
                break
            dead = env_a.terminations[env_a.agent_selection] or env_a.truncations[env_a.agent_selection]
            env_a.step(None if dead else action)
            env_b.step(None if dead else action)


def _cycle(actions: list[str], env: Any, limit: int = 200):
    for index in range(limit):
        if not env.agents:
            return
        yield actions[index % len(actions)]


def _check_clone(env_fn: Callable[[], Any], actions: list[str], seed: int) -> None:
    env = env_fn()
    env.reset(seed=seed)
    before = _snapshot(env)
    twin = env.clone()
    if twin is env:
        raise AssertionError("clone() returned the same object")
    for action in _cycle(actions, twin):
        dead = twin.terminations[twin.agent_selection] or twin.truncations[twin.agent_selection]
        twin.step(None if dead else action)
    if not data_equivalence(before, _snapshot(env)):
        raise AssertionError("stepping a clone changed the original env")
    # The original and a fresh clone, fed the same actions, stay identical.
    twin = env.clone()
    for action in _cycle(actions, env):
        if not data_equivalence(_snapshot(env), _snapshot(twin)):
            raise AssertionError("a clone fed the same actions diverged from its original")
        dead = env.terminations[env.agent_selection] or env.truncations[env.agent_selection]
        env.step(None if dead else action)
        twin.step(None if dead else action)


def _check_fuzz(env_fn: Callable[[], Any], count: int, seed: int) -> None:
    env = env_fn()
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    for index, action in enumerate(malformed_actions(rng, count)):
        if not env.agents:
            env.reset(seed=seed + index)
        agent = env.agent_selection
        if env.terminations[agent] or env.truncations[agent]:
            env.step(None)
            continue
        env.step(action)
        info = env.infos[agent]
        missing = [k for k in REQUIRED_INFO_KEYS if k not in info]
        if missing:
            raise AssertionError(f"infos[{agent!r}] lacks {missing}")
        if info["format_ok"] and action.strip() == "":
            raise AssertionError(f"{agent!r}: an empty action was accepted as well-formed")
        reward = env.rewards[agent]
        if not np.isfinite(reward):
            raise AssertionError(f"{agent!r}: reward {reward!r} for a malformed action is not finite")
        prompt = env.observe(agent)["prompt"] if agent in env.agents else ""
        if not isinstance(prompt, str):
            raise AssertionError("observation prompt is not a string")


def check_env(
    env_or_id: Any,
    *,
    env_kwargs: dict[str, Any] | None = None,
    num_cycles: int = 50,
    fuzz_count: int = 200,
    sample_actions: list[str] | None = None,
    seeds: Iterable[int] = (0, 1, 2),
    hack_seeds: Iterable[int] = (0,),
) -> HackReport:
    """Run every check on an env; raise ``AssertionError`` naming the first failure. Returns the
    reward-hack search's report (best failing against worst succeeding return, per agent).

    Args:
        env_or_id: A registered id, or a zero-argument factory returning a fresh env (an env
            instance is accepted too: it is cloned to get fresh copies).
        env_kwargs: Constructor arguments when ``env_or_id`` is an id.
        num_cycles: Cycles for PettingZoo's ``api_test`` / ``seed_test``.
        fuzz_count: Number of malformed actions to feed.
        sample_actions: Actions (ideally some valid ones) used by the determinism and clone checks.
            Default: a mix of malformed text.
        seeds: Seeds for the determinism check.
        hack_seeds: Tasks (seeds) of the reward-hack search; empty to skip it.
    """
    env_fn = _factory(env_or_id, env_kwargs or {})
    actions = sample_actions or malformed_actions(np.random.default_rng(0), 12)
    env = _check_attributes(env_fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PettingZoo warns about non-Box observation spaces
        api_test(env, num_cycles=num_cycles)
        _check_render_modes(env_or_id, env_kwargs or {}, env.metadata["render_modes"])
        seed_test(env_fn, num_cycles=num_cycles)
        parallel = turn_based_aec_to_parallel(env_fn())
        parallel_api_test(parallel, num_cycles=num_cycles)
    _check_determinism(env_fn, actions, seeds)
    _check_clone(env_fn, actions, seed=next(iter(seeds)))
    _check_fuzz(env_fn, fuzz_count, seed=0)
    return check_reward_hacks(env_fn, seeds=hack_seeds)


def check_reward_hacks(env_fn: Callable[[], Any], *, seeds: Iterable[int] = (0,)) -> HackReport:
    """The reward-hack search alone (:mod:`llm_zoo.reward_hacks`); ``AssertionError`` describing
    the worst offending episode (and how many there were) if rewards do not pay most for solving."""
    report = search_reward_hacks(env_fn, seeds=tuple(seeds))
    if report.violations:
        count = len(report.violations)
        raise AssertionError(
            f"reward hack: {report.violations[0][1]}"
            + (f" (and {count - 1} more violation{'s' * (count > 2)})" if count > 1 else "")
        )
    return report


def _check_attributes(env_fn: Callable[[], Any]) -> Any:
    """Make one env and check what PettingZoo relies on before anything runs; return the env."""
    try:
        env = env_fn()
    except (TypeError, KeyError, AttributeError) as err:
        raise AssertionError(f"the env could not be made: {type(err).__name__}: {err}") from None
    if isinstance(env, TextAECEnv):
        problem = class_attribute_problem(type(env))
        if problem:
            raise AssertionError(problem)
    metadata = getattr(env, "metadata", None)
    if not isinstance(metadata, dict):
        raise AssertionError(f'{type(env).__name__}.metadata must be a dict with "name" and "render_modes"')
    missing = [key for key in ("name", "render_modes") if key not in metadata]
    if missing:
        raise AssertionError(
            f"{type(env).__name__}.metadata lacks {missing}: PettingZoo's tools and make() need them"
        )
    agents = getattr(env, "possible_agents", None)
    if not agents:
        raise AssertionError(f"{type(env).__name__}.possible_agents is empty or missing")
    for agent in agents:
        for kind in ("observation_space", "action_space"):
            try:
                getattr(env, kind)(agent)
            except Exception as err:
                raise AssertionError(f"{type(env).__name__}.{kind}({agent!r}) failed: {err!r}") from None
    return env


def _check_render_modes(env_or_id: Any, env_kwargs: dict[str, Any], modes: Iterable[str]) -> None:
    """PettingZoo's ``render_test`` (it always asks for ``"human"`` first), when envs can be made
    with a ``render_mode``: from an id, or a factory that takes ``render_mode``. Printing is
    captured."""
    if isinstance(env_or_id, str):

        def maker(render_mode: str | None = None) -> Any:
            return make(env_or_id, render_mode=render_mode, **env_kwargs)

    elif callable(env_or_id) and not isinstance(env_or_id, AECEnv) and _takes_render_mode(env_or_id):
        maker = env_or_id
    else:
        return  # an env instance, or a factory without render_mode: nothing to vary
    if "human" not in modes:
        raise AssertionError(
            f'metadata["render_modes"] is {list(modes)}: PettingZoo\'s render_test needs "human" '
            '(TextAECEnv provides it wherever "ansi" is)'
        )
    with contextlib.redirect_stdout(io.StringIO()):
        render_test(maker)


def _takes_render_mode(factory: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "render_mode" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _factory(env_or_id: Any, env_kwargs: dict[str, Any]) -> Callable[[], Any]:
    if isinstance(env_or_id, str):
        make(env_or_id, **env_kwargs)  # fail early with the registry's clear error
        return lambda: make(env_or_id, **env_kwargs)
    if isinstance(env_or_id, AECEnv):
        return env_or_id.clone
    if callable(env_or_id):
        return env_or_id
    raise TypeError(f"check_env takes an env id, an env or a factory, got {type(env_or_id).__name__}")
