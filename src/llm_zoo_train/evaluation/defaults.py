"""The evaluation temperature each kind of env is validated with, when ``eval.temperature`` is None.

The paper (AT-GRPO, arXiv 2510.11062) validates planning envs greedily and math and code envs at
temperature 0.6: a planning answer is a short move list where the most likely tokens are the
policy, while math and code answers are long and greedy decoding of them tends to repeat itself.

An env class states its own value as ``metadata["eval_temperature"]`` (plugins can do so);
built-in envs without it are looked up by their ``metadata["name"]`` in :data:`EVAL_TEMPERATURES`;
anything else is evaluated greedily.
"""

from __future__ import annotations

import llm_zoo

__all__ = ["EVAL_TEMPERATURES", "eval_temperature"]

#: ``metadata["name"]`` of a built-in env -> the paper's validation temperature.
EVAL_TEMPERATURES: dict[str, float] = {
    "plan_path_v0": 0.0,
    "sokoban_v0": 0.0,
    "math_v0": 0.6,
    "code_v0": 0.6,
}


def eval_temperature(env_id: str, configured: float | None = None) -> float:
    """``configured`` when it is set, else the env's recommended evaluation temperature."""
    if configured is not None:
        return float(configured)
    env_class = llm_zoo.spec(env_id).load()
    metadata = getattr(env_class, "metadata", None) or {}
    if "eval_temperature" in metadata:
        return float(metadata["eval_temperature"])
    return EVAL_TEMPERATURES.get(str(metadata.get("name", "")), 0.0)
