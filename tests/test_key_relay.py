"""KeyRelay-v0: the information is really split, the team can solve every task, a team that does
not talk cannot, and the rewards pay most for solving."""

from __future__ import annotations

import pytest

import llm_zoo
from llm_zoo.envs.key_relay import (
    DENSE_REWARD,
    FORMAT_PENALTY,
    KeyRelayEnv,
    cap_message,
    last_number,
    oracle_action,
)
from llm_zoo.testing import check_env

TABLE = {"bemo": "412", "bela": "385", "kati": "907", "rudo": "150"}


def play(env: KeyRelayEnv, actions, *, seed: int = 0, options=None):
    """Play an episode; ``actions`` are strings or ``f(env) -> str``. Returns each agent's return
    as a PettingZoo user sums it, and the env."""
    env.reset(seed=seed, options=options)
    returns = {agent: 0.0 for agent in env.possible_agents}
    pending = iter(actions)
    for agent in env.agent_iter():
        _, reward, terminated, truncated, _ = env.last()
        returns[agent] += reward
        if terminated or truncated:
            env.step(None)
            continue
        action = next(pending)
        env.step(action(env) if callable(action) else action)
    return returns, env


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"distractors": True, "dense_rewards": True}, {"agents": ("asker",)}, {"agents": ("holder",)},
     {"agents": ("oracle",)}, {"max_turns": 3}, {"max_turns": 1}],
)  # fmt: skip
def test_check_env(kwargs):
    check_env("KeyRelay-v0", env_kwargs=kwargs, num_cycles=10, fuzz_count=40)


def test_the_holder_never_sees_the_query_and_the_asker_never_sees_the_table():
    holder_views, asker_views = set(), set()
    for query in TABLE:
        env = KeyRelayEnv()
        env.reset(seed=0, options={"table": TABLE, "query": query})
        env.step("hello there")  # the same message whatever the query
        holder_views.add(env.observe("holder")["prompt"])
    for values in (("1", "2", "3", "4"), ("9", "8", "7", "6")):
        env = KeyRelayEnv()
        env.reset(seed=0, options={"table": dict(zip(TABLE, values, strict=True)), "query": "kati"})
        asker_views.add(env.observe("asker")["prompt"])
        env.step("kati?")
        env.step("the same reply")
        asker_views.add(env.observe("asker")["prompt"])
    assert len(holder_views) == 1
    assert len(asker_views) == 2  # the first prompt and the answer prompt, the same for both tables
    assert not any(value in view for view in asker_views for value in ("1", "9", "412"))


def test_the_oracle_team_solves_every_task():
    for seed in range(200):
        for kwargs in ({}, {"distractors": True, "num_keys": 12}, {"max_turns": 3}):
            env = KeyRelayEnv(**kwargs)
            returns, env = play(env, [lambda e: oracle_action(e, e.agent_selection)] * 5, seed=seed)
            assert env.success, (seed, kwargs)
            assert returns == {"asker": 2.0, "holder": 1.0}
    for query in TABLE:
        _, env = play(KeyRelayEnv(), [lambda e: oracle_action(e, e.agent_selection)] * 3,
                      options={"table": TABLE, "query": query})  # fmt: skip
        assert env.success


def best_guess(env: KeyRelayEnv) -> str:
    """The asker's best answer from the reply: the number after its key, if the reply has it."""
    words = env.reply.split()
    return words[words.index(env.query) + 1] if env.query in words[:-1] else "0"


def test_a_team_whose_asker_names_no_key_is_right_at_most_once_in_num_keys():
    """Without the key, the holder's reply is the same whatever the query, and a reply carries one
    value (it is cut after its first number): a best-case asker is right on 1 of the 4 queries."""
    solved = 0
    for query in TABLE:
        _, env = play(KeyRelayEnv(), ["please help me", "bemo 412 bela 385 kati 907 rudo 150", best_guess],
                      options={"table": TABLE, "query": query})  # fmt: skip
        assert env.reply == "bemo 412"  # cut after the first number
        solved += env.success
    assert solved == 1


def test_messages_are_capped_in_words_and_the_sender_is_told():
    env = KeyRelayEnv(message_words=2)
    env.reset(seed=0, options={"table": TABLE, "query": "bemo"})
    env.step("what is   bemo please")
    assert env.message == "what is" and env.infos["asker"]["message_cut"] == 2
    assert "Only the first 2 words" in env.observe("asker")["prompt"]
    assert '"what is"' in env.observe("holder")["prompt"]
    assert cap_message(" a  b\nc ", 5) == ("a b c", 0)
    assert cap_message("The number of lego is 270. Also kati is 907.", 12) == (
        "The number of lego is 270.",
        4,
    )
    assert cap_message("a b c d e", 3) == ("a b c", 2)


@pytest.mark.parametrize(
    ("text", "number"),
    [("It is 412.", "412"), ("412", "412"), ("first 12 then 007", "7"), ("412%", "412%"), ("412.5", "412.5"),
     ("no number", None), ("-0", "0")],
)  # fmt: skip
def test_the_answer_is_the_last_number(text, number):
    assert last_number(text) == number


def test_rewards_pay_most_for_solving_with_and_without_dense_rewards():
    name_and_send = [lambda e: f"what is {e.query}", lambda e: f"{e.query} {e.value}"]
    for dense in (False, True):
        bonus = DENSE_REWARD if dense else 0.0
        solved, env = play(KeyRelayEnv(dense_rewards=dense), [*name_and_send, lambda e: f"It is {e.value}."])
        assert env.success and solved == {"asker": 2.0 + bonus, "holder": 1.0 + bonus}
        failed, env = play(KeyRelayEnv(dense_rewards=dense), [*name_and_send, "It is 5."])
        assert not env.success and failed == {"asker": bonus, "holder": bonus}
        assert solved["asker"] - failed["asker"] == 2.0 and solved["holder"] - failed["holder"] == 1.0
    silent, env = play(KeyRelayEnv(), ["", "", "no idea"])
    assert not env.success and silent == {"asker": FORMAT_PENALTY, "holder": FORMAT_PENALTY}
    env.reset(seed=0)
    env.step("")
    env.step("")
    env.step("no idea")
    assert env.infos["asker"]["format_ok"] is False and "no number" in env.infos["asker"]["feedback"]
    repaid, env = play(KeyRelayEnv(), ["", lambda e: e.value, lambda e: e.value])
    assert env.success and repaid["asker"] == 2.0  # the unusable message's penalty is paid back


def test_the_single_agent_controls():
    returns, env = play(
        KeyRelayEnv(agents=("asker",)), ["bemo?", "412"], options={"table": TABLE, "query": "bemo"}
    )
    assert env.success and returns == {"asker": 2.0}
    env.reset(seed=0, options={"table": TABLE, "query": "bemo"})
    env.step("bemo?")
    assert "did not reply" in env.observe("asker")["prompt"]
    holder = KeyRelayEnv(agents=("holder",))
    holder.reset(seed=0, options={"table": TABLE, "query": "kati"})
    prompt = holder.observe("holder")["prompt"]
    assert "no message" in prompt and "kati" in prompt  # its table, not the query: every key is listed
    holder.step("907")
    assert holder.success and holder.terminations["holder"]
    oracle = KeyRelayEnv(agents=("oracle",))
    oracle.reset(seed=0, options={"table": TABLE, "query": "rudo"})
    prompt = oracle.observe("oracle")["prompt"]
    assert "key rudo" in prompt and "rudo: 150" in prompt  # the table and the query in one view
    oracle.step("150")
    assert oracle.success


def test_the_answer_turn_follows_max_turns():
    _, env = play(KeyRelayEnv(max_turns=1), ["412"], options={"table": TABLE, "query": "bemo"})
    assert env.success  # a blind guess that happened to be right
    _, env = play(KeyRelayEnv(max_turns=3), ["bemo?", "which?", "bemo!", "bemo 412", "412"],
                  options={"table": TABLE, "query": "bemo"})  # fmt: skip
    assert env.success and env.turn == 2  # answered in the third turn (counted from 0)


def test_distractor_keys_share_the_querys_first_two_letters():
    env = KeyRelayEnv(distractors=True, num_keys=8)
    for seed in range(20):
        env.reset(seed=seed)
        assert len(env.table) == 8 and len({key[:2] for key in env.table}) == 1
        assert len(set(env.table.values())) == 8


@pytest.mark.parametrize(
    ("kwargs", "options", "message"),
    [
        ({"num_keys": 1}, None, "num_keys"),
        ({"message_words": 0}, None, "message_words"),
        ({"agents": ("holder", "asker")}, None, "agents must be"),
        ({"dense_rewards": "yes"}, None, "true or false"),
        ({}, {"table": {"Bemo": "1"}, "query": "Bemo"}, "lowercase words"),
        ({}, {"table": {"bemo": "x"}, "query": "bemo"}, "whole numbers"),
        ({}, {"table": TABLE, "query": "nope"}, "a key of the table"),
        ({}, {"table": {}, "query": "bemo"}, "non-empty"),
    ],
)
def test_bad_arguments_are_named(kwargs, options, message):
    with pytest.raises(ValueError, match=message):
        llm_zoo.make("KeyRelay-v0", **kwargs).reset(seed=0, options=options)


def test_the_task_is_shown_only_once_the_episode_is_over():
    env = KeyRelayEnv(render_mode="ansi")
    env.reset(seed=0, options={"table": TABLE, "query": "bemo"})
    assert "bemo -> 412" not in env.render()
    env.step("bemo")
    env.step("bemo 412")
    env.step("412")
    assert "bemo -> 412" in env.render()
    assert env.infos["asker"]["value"] == "412"


@pytest.mark.slow
def test_team_benchmark_quick_run_with_every_control(tmp_path, monkeypatch):
    """``benchmarks/learning_math.py --task key_relay`` trains the team, the roles apart (each with
    its partner frozen) and the single-agent controls, and pairs them task by task."""
    import importlib
    import json
    import sys
    from pathlib import Path

    pytest.importorskip("llm_zoo_train.trainer", reason="the trainer is not installed")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    monkeypatch.delitem(sys.modules, "learning_math", raising=False)
    benchmark = importlib.import_module("learning_math")
    variants = "per_agent,separate,independent,asker_alone,holder_alone,oracle"
    benchmark.main(["--task", "key_relay", "--quick", "--output-dir", str(tmp_path), "--variants", variants])
    result = json.loads((tmp_path / "learning_team_key_relay.json").read_text())
    assert set(result["variants"]) == {
        *variants.split(","),
        "role_swap",
        "oracle_majority",
        "holder_alone_majority",
    }
    separate = result["variants"]["separate"][0]
    assert set(separate["histories"]) == {"asker", "holder"}
    for agent, partner in (("asker", "holder"), ("holder", "asker")):
        trained = [
            key for record in separate["histories"][agent] for key in record if key.startswith("update/")
        ]
        assert not any(key.startswith(f"update/{partner}/") for key in trained)  # the partner stayed frozen
    assert result["variants"]["role_swap"][0]["agent_adapters"] == {"asker": "holder", "holder": "asker"}
    assert set(result["befores"]) == {"team", "asker_alone", "holder_alone", "oracle"}
    tasks = result["befores"]["team"]["solved"].keys()
    assert separate["after"]["solved"].keys() == tasks == result["befores"]["oracle"]["solved"].keys()
    assert "per_agent vs separate" in result["summary"]["comparisons"]
    for single in ("oracle", "holder_alone"):  # the single agent at the team's 3 calls per task
        voted = result["variants"][f"{single}_majority"][0]
        assert voted["majority_k"] == 3 and voted["after"]["solved"].keys() == tasks
        assert voted["agent_adapters"] == result["variants"][single][0]["agent_adapters"]
        assert f"per_agent vs {single}_majority" in result["summary"]["comparisons"]
    assert "team better than the roles trained apart, paired p < 0.05" in result["summary"]["verdict"]
