"""The built-in environments. Each module is self-contained; its docstring is its documentation."""

from llm_zoo.registry import register

# id -> (entry point, one-line description). Modules are imported only when an env is made.
BUILTIN_ENVS: dict[str, tuple[str, str]] = {
    "PlanPath-v0": (
        "llm_zoo.envs.plan_path:PlanPathEnv",
        "Grid path planning: a tool agent writes a solver program, a plan agent submits the moves.",
    ),
    "Sokoban-v0": (
        "llm_zoo.envs.sokoban:SokobanEnv",
        "Push every box onto a goal: a tool agent writes a solver program, a plan agent submits the moves.",
    ),
    "Code-v0": (
        "llm_zoo.envs.code:CodeEnv",
        "Programming: a coder writes a stdin/stdout program or the function a problem names, a unit tester writes tests.",
    ),
    "Math-v0": (
        "llm_zoo.envs.math:MathEnv",
        "Math problems: a reasoner answers in \\boxed{}, a tool agent writes a program that prints the answer.",
    ),
    "MathRelay-v0": (
        "llm_zoo.envs.math_relay:MathRelayEnv",
        "Math with split information: a tool agent's program computes, a reasoner appends a key only it holds.",
    ),
    "KeyRelay-v0": (
        "llm_zoo.envs.key_relay:KeyRelayEnv",
        "Split information: an asker holds the question, a holder the table; they must talk to answer.",
    ),
}


def register_builtin_envs() -> None:
    for env_id, (entry_point, description) in BUILTIN_ENVS.items():
        register(env_id, entry_point, description=description)
