"""TRL's ``GRPOTrainer`` on an llm-zoo env: the env writes the prompts and gives the rewards.

TRL trains one policy on single-turn prompts. The bridge makes each env episode one such prompt:

* :func:`env_dataset_rows`: one conversational dataset row per seed, the prompt of the agent
  that acts first after ``reset(seed)``, with the seed and the agent as extra columns (TRL passes
  them to the reward function);
* :class:`EnvReward`: a TRL reward function that plays each completion as that agent's first
  action in a fresh episode of the same seed and returns the env's reward for it (its role reward
  plus ``alpha`` x the team reward of that action; a malformed answer gets the env's format
  penalty, with the explanation the env would show in the next prompt).

The env runs in this process (``url=None``: :func:`llm_zoo.make`) or on an ``llm-zoo serve``
server (``url``: :func:`llm_zoo.remote.make`, one session per thread, reused). Only the first
agent is trained, one action per episode; for several agents and multi-turn episodes use
``llm-zoo-train`` (its ``env.servers`` puts its envs on the same servers). TRL is not imported
here: the rows and the reward function are plain Python, so this module loads without it.

    from trl import GRPOConfig, GRPOTrainer
    from datasets import Dataset
    from llm_zoo.integrations.trl import EnvReward, env_dataset_rows

    rows = env_dataset_rows(None, "Math-v0", range(64), prompt_style="compact")
    trainer = GRPOTrainer(model=..., reward_funcs=EnvReward(None, "Math-v0", prompt_style="compact"),
                          train_dataset=Dataset.from_list(rows), args=GRPOConfig(...))

Its first steps may train nothing: when every completion of a prompt earns the same reward
(a small model's answers all malformed, say), GRPO's group-relative advantages are all zero.
``examples/trl_grpo_env_server.py`` is a whole run; ``docs/serving.md`` says how to make it learn.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from llm_zoo import remote
from llm_zoo.registry import make

__all__ = ["EnvReward", "env_dataset_rows", "make_env"]


def make_env(url: str | None, env_id: str, **env_kwargs: Any) -> Any:
    """The env: in this process when ``url`` is ``None``, else a session on that server."""
    if url is None:
        return make(env_id, **env_kwargs)
    return remote.make(url, env_id, **env_kwargs)


def env_dataset_rows(
    url: str | None, env_id: str, seeds: Sequence[int], **env_kwargs: Any
) -> list[dict[str, Any]]:
    """One conversational row per seed: ``{"prompt": [{"role": "user", "content": ...}], "seed",
    "agent"}``, the prompt of the agent that acts first after ``reset(seed)``."""
    env = make_env(url, env_id, **env_kwargs)
    try:
        rows = []
        for seed in seeds:
            env.reset(seed=int(seed))
            agent = env.agent_selection
            prompt = env.observe(agent)["prompt"]
            rows.append({"prompt": [{"role": "user", "content": prompt}], "seed": int(seed), "agent": agent})
        return rows
    finally:
        env.close()


class EnvReward:
    """A TRL reward function: each completion's reward from the env (module docstring).

    Args:
        url: An ``llm-zoo serve`` URL, or ``None`` for an env in this process.
        env_id: The env.
        **env_kwargs: The env's arguments (the same as the dataset rows were made with).

    ``calls`` keeps every ``(seed, completion text, reward)`` it returned, in order.
    """

    __name__ = "llm_zoo_env"  # TRL logs a reward function under its name

    def __init__(self, url: str | None, env_id: str, **env_kwargs: Any):
        self.url, self.env_id, self.env_kwargs = url, env_id, env_kwargs
        self.calls: list[tuple[int, str, float]] = []
        self._local = threading.local()

    def _env(self) -> Any:
        env = getattr(self._local, "env", None)
        if env is None:  # one env per thread, reused: reset(seed) starts each episode afresh
            env = self._local.env = make_env(self.url, self.env_id, **self.env_kwargs)
        return env

    def __call__(
        self, prompts: list[Any], completions: list[Any], seed: list[int], agent: list[str], **_: Any
    ) -> list[float]:
        env = self._env()
        rewards = []
        for completion, episode_seed, acting in zip(completions, seed, agent, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
            env.reset(seed=int(episode_seed))
            if env.agent_selection != acting:
                raise RuntimeError(f"{self.env_id} seed {episode_seed}: expected {acting} to act first")
            env.step(text)
            reward = float(env.rewards[acting])
            self.calls.append((int(episode_seed), text, reward))
            rewards.append(reward)
        return rewards
