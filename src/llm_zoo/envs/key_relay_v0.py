"""KeyRelay-v0 as a PettingZoo family module: ``raw_env``, ``env()``, ``parallel_env()`` (:mod:`llm_zoo.family`).

The env's documentation is :mod:`llm_zoo.envs.key_relay`'s docstring.
"""

from llm_zoo.envs.key_relay import KeyRelayEnv as raw_env
from llm_zoo.family import family

__all__ = ["env", "parallel_env", "raw_env"]

env, parallel_env = family("KeyRelay-v0")
