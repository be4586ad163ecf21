"""llm-zoo: text multi-agent environments for training collaborating LLM agents.

Every environment is a PettingZoo AEC environment whose agents read a prompt and answer with
text. Build one with :func:`make`::

    import llm_zoo
    env = llm_zoo.make("PlanPath-v0")
    env.reset(seed=0)
    for agent in env.agent_iter():
        observation, reward, termination, truncation, info = env.last()
        action = None if termination or truncation else my_model(observation["prompt"])
        env.step(action)
"""

from llm_zoo.core import Outcome, TextAECEnv
from llm_zoo.registry import EnvSpec, UnknownEnvError, make, register, registry, spec

__version__ = "0.1.0"

__all__ = [
    "EnvSpec",
    "Outcome",
    "TextAECEnv",
    "UnknownEnvError",
    "__version__",
    "make",
    "register",
    "registry",
    "spec",
]

from llm_zoo.envs import register_builtin_envs as _register_builtin_envs

_register_builtin_envs()
