from llm_zoo_example_games.number_guess import parse_guess, parse_hint, true_hint

import llm_zoo
from llm_zoo.testing import check_env, play_episode


def test_rules():
    assert true_hint(3, 5) == "higher" and true_hint(7, 5) == "lower" and true_hint(5, 5) == "correct"
    assert parse_guess("I think... GUESS: 12\nno, GUESS: 40") == 40
    assert parse_guess("forty") is None
    assert parse_hint(" Higher. ") == "higher" and parse_hint("go higher") is None


def test_found_through_the_entry_point():
    assert "examples/NumberGuess-v0" in llm_zoo.registry
    assert llm_zoo.spec("examples/NumberGuess-v0").plugin == "example_games"


def test_passes_llm_zoo_check_env():
    check_env("examples/NumberGuess-v0", sample_actions=["GUESS: 50", "lower", "GUESS: 3", "higher"])


def test_binary_search_with_honest_hints_succeeds():
    bounds = {"low": 1, "high": 100}

    def policy(agent, prompt):
        if agent == "guesser":
            return f"GUESS: {(bounds['low'] + bounds['high']) // 2}"
        secret = int(prompt.split("secret number is ")[1].split(".")[0])
        guess = int(prompt.split("just guessed ")[1].split(".")[0])
        hint = true_hint(guess, secret)
        if hint == "higher":
            bounds["low"] = guess + 1
        elif hint == "lower":
            bounds["high"] = guess - 1
        return hint

    env = llm_zoo.make("examples/NumberGuess-v0")
    trace = play_episode(env, policy, seed=11)
    assert env.success
    hints = [info["role_reward"] for agent, *_, info in trace if agent == "hinter"]
    assert sum(hints) == 1.0 and min(hints) >= 0.0  # every hint truthful: the level stays 1
