"""Sokoban-v0 as a PettingZoo family module: ``raw_env``, ``env()``, ``parallel_env()`` (:mod:`llm_zoo.family`).

The env's documentation is :mod:`llm_zoo.envs.sokoban`'s docstring.
"""

from llm_zoo.envs.sokoban import SokobanEnv as raw_env
from llm_zoo.family import family

__all__ = ["env", "parallel_env", "raw_env"]

env, parallel_env = family("Sokoban-v0")
