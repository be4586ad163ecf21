"""PlanPath-v0 as a PettingZoo family module: ``raw_env``, ``env()``, ``parallel_env()`` (:mod:`llm_zoo.family`).

The env's documentation is :mod:`llm_zoo.envs.plan_path`'s docstring.
"""

from llm_zoo.envs.plan_path import PlanPathEnv as raw_env
from llm_zoo.family import family

__all__ = ["env", "parallel_env", "raw_env"]

env, parallel_env = family("PlanPath-v0")
