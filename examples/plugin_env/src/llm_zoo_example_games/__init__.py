"""Example llm-zoo plugin: environments registered through the ``llm_zoo.envs`` entry point."""

from llm_zoo_example_games.number_guess import NumberGuessEnv


def register_envs() -> None:
    """Called by llm-zoo when its registry is first read (see this package's pyproject.toml)."""
    from llm_zoo import register

    register(
        "examples/NumberGuess-v0",
        "llm_zoo_example_games.number_guess:NumberGuessEnv",
        description="Guess a secret number; a hinter who knows it says higher or lower.",
    )


__all__ = ["NumberGuessEnv", "register_envs"]
