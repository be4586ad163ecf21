"""The training config: YAML + command-line overrides, type checks, and validation before any model."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("yaml")

import toy_envs_trainer  # noqa: F401  (registers test/Scripted-v0, agents alice and bob)
from llm_zoo_train.config import (
    Config,
    ConfigError,
    config_from_dict,
    field_docs,
    format_help,
    load_config,
    parse_overrides,
    plan_agents,
    validate,
)

TOY = "env: {id: test/Scripted-v0, plugins: [toy_envs_trainer]}\n"


def _yaml(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def _config(tmp_path, text=TOY, overrides=()):
    return load_config(_yaml(tmp_path, text), list(overrides))


def test_yaml_sections_and_defaults(tmp_path):
    config = _config(
        tmp_path,
        TOY
        + "rollout: {num_generations: 8, mode: independent}\ntraining: {learning_rate: 1e-5, max_steps: 3}\n",
    )
    assert config.rollout.num_generations == 8 and config.rollout.mode == "independent"
    assert config.training.learning_rate == 1e-5  # PyYAML reads 1e-5 as a string; it is accepted as a float
    assert config.training.max_steps == 3
    assert config.algorithm == Config().algorithm  # untouched sections keep their defaults
    assert config.env.plugins == ["toy_envs_trainer"]


def test_command_line_overrides_win_and_are_typed(tmp_path):
    config = _config(
        tmp_path,
        TOY + "rollout: {num_generations: 8}\n",
        [
            "--rollout.num_generations",
            "6",
            "--training.learning_rate=3e-4",
            "--env.kwargs.letters",
            "ba",
            "--env.kwargs",
            "{max_turns: 2, letters: ab}",
            "--env.kwargs.max_turns",
            "1",
            "--agents.frozen",
            "[bob]",
            "--algorithm.epsilon_high",
            "0.28",
            "--training.gradient_accumulation_steps",
            "null",
            "--lora.target_modules",
            "[q_proj, v_proj]",
            "--model.system_prompt",
            "be brief",
        ],
    )
    assert config.rollout.num_generations == 6
    assert config.training.learning_rate == pytest.approx(3e-4)
    assert config.env.kwargs == {"max_turns": 1, "letters": "ab"}  # later overrides win
    assert config.agents.frozen == ["bob"]
    assert config.algorithm.epsilon_high == 0.28
    assert config.training.gradient_accumulation_steps is None
    assert config.lora.target_modules == ["q_proj", "v_proj"]
    assert config.model.system_prompt == "be brief"


@pytest.mark.parametrize(
    ("text", "overrides", "message"),
    [
        (
            TOY + "rollout: {num_generation: 8}\n",
            [],
            r"unknown config key 'rollout.num_generation'.*Did you mean 'rollout.num_generations'.*Valid keys here: rollout.mode",
        ),
        (TOY + "rollouts: {}\n", [], r"unknown config key 'rollouts'.*Did you mean 'rollout'"),
        (
            TOY,
            ["--training.learning_rat", "1"],
            r"unknown config key 'training.learning_rat'.*'training.learning_rate'",
        ),
        (TOY, ["--nope.x", "1"], r"unknown config key 'nope'.*Valid keys here: model, env, agents"),
        (
            TOY + "rollout: {num_generations: four}\n",
            [],
            r"rollout.num_generations: expected int, got 'four'",
        ),
        (TOY, ["--rollout.num_generations", "2.5"], r"rollout.num_generations: expected int, got 2.5"),
        (TOY, ["--training.seed", "true"], r"training.seed: expected int, got True"),
        (
            TOY,
            ["--rollout.mode", "tre"],
            r"rollout.mode: 'tre' is not one of tree, independent. Did you mean 'tree'",
        ),
        (
            TOY,
            ["--algorithm.loss_type", "ppo"],
            r"algorithm.loss_type: 'ppo' is not one of grpo, dr_grpo, dapo, bnpo",
        ),
        (TOY, ["--agents.frozen", "bob"], r"agents.frozen: expected list\[str\], got 'bob'"),
        (
            TOY,
            ["--logging.log_with", "[tensorbord]"],
            r"logging.log_with\[0\]: 'tensorbord' is not one of tensorboard, wandb",
        ),
        (TOY + "rollout: 3\n", [], r"rollout.: expected a mapping|rollout: expected a mapping"),
        (TOY, ["--rollout", "3"], r"--rollout is a section"),
        (TOY, ["--rollout.mode.x", "1"], r"rollout.mode is a value"),
        (TOY, ["--rollout.mode"], r"--rollout.mode needs a value"),
        (TOY, ["rollout.mode", "tree"], r"expected an option like --section.field VALUE"),
        ("- just\n- a list\n", [], r"expected a mapping of sections"),
        ("", [], r"holds no settings \(empty, or only comments\)"),  # it started a 100-step run of defaults
        ("# only a comment\n", ["--training.max_steps", "1"], r"holds no settings"),
        ("rollout: {mode: [\n", [], r"not valid YAML"),
    ],
)
def test_bad_keys_and_types_are_named(tmp_path, text, overrides, message):
    with pytest.raises(ConfigError, match=message):
        _config(tmp_path, text, overrides)


def test_an_explicitly_empty_mapping_takes_every_default(tmp_path):
    assert _config(tmp_path, "{}\n", []) == load_config(None)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")


def test_parse_overrides_reads_yaml_values():
    pairs = parse_overrides(["--a.b", "1", "--c=[x, y]", "--d", "null", "--e", "x: y"])
    assert [(key, value) for key, value, _ in pairs] == [
        ("a.b", 1),
        ("c", ["x", "y"]),
        ("d", None),
        ("e", {"x": "y"}),
    ]
    assert pairs[-1][2] == "x: y"


def test_text_fields_keep_text_that_looks_like_yaml(tmp_path):
    config = _config(
        tmp_path, overrides=["--model.system_prompt", "Answer: briefly", "--env.id", "test/Scripted-v0"]
    )
    assert config.model.system_prompt == "Answer: briefly"
    with pytest.raises(ConfigError, match=r"rollout\.num_generations: expected int"):
        _config(tmp_path, overrides=["--rollout.num_generations", "a: b"])


def test_every_field_is_documented_and_in_help():
    help_text = format_help()
    for section in dataclasses.fields(Config):
        cls = section.type if isinstance(section.type, type) else type(getattr(Config(), section.name))
        docs = field_docs(cls)
        for field in dataclasses.fields(cls):
            assert docs.get(field.name), f"{section.name}.{field.name} has no docstring"
            assert f"--{section.name}.{field.name} (" in help_text
    assert "Did you mean" not in help_text
    assert "number of candidates" in help_text.lower() or "candidates sampled per group" in help_text


# --------------------------------------------------------------------------- validation


def test_validate_returns_the_agent_plan(tmp_path):
    plan = validate(_config(tmp_path))
    assert plan.agent_adapters == {"alice": "alice", "bob": "bob"}
    assert plan.trainable == ["alice", "bob"]
    assert plan.lora["alice"].r == 8


def test_agent_maps(tmp_path):
    shared = plan_agents(_config(tmp_path, overrides=["--agents.adapters", "shared"]), ["alice", "bob"])
    assert shared.agent_adapters == {"alice": "shared", "bob": "shared"} and shared.adapters == ["shared"]
    grouped = plan_agents(
        _config(
            tmp_path,
            overrides=[
                "--agents.adapters",
                "{alice: team, bob: team, carol: solo}",
                "--agents.adapter_lora",
                "{solo: {r: 4}}",
            ],
        ),
        ["alice", "bob", "carol"],
    )
    assert grouped.adapters == ["team", "solo"] and grouped.agents_of("team") == ["alice", "bob"]
    assert grouped.lora["solo"].r == 4 and grouped.lora["team"].r == 8
    frozen = plan_agents(
        _config(
            tmp_path, overrides=["--agents.adapters", "{alice: a, bob: null}", "--agents.frozen", "[bob]"]
        ),
        ["alice", "bob"],
    )
    assert frozen.agent_adapters == {"alice": "a", "bob": None} and frozen.trainable == ["a"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["--env.id", "test/Scripted-v9"],
            r"env.id: no environment registered with id 'test/Scripted-v9'.*Did you mean 'test/Scripted-v0'",
        ),
        (["--env.id", "not an id"], r"env.id: malformed environment id"),
        (
            ["--env.kwargs.colour", "red"],
            r"env.kwargs: cannot make test/Scripted-v0: .*unknown argument.*'colour'.*valid arguments: letters",
        ),
        (
            ["--env.kwargs.letters", "abc"],
            r"env.kwargs: cannot make test/Scripted-v0: letters must have one letter per role",
        ),
        (["--eval.env_kwargs.colour", "red"], r"eval.env_kwargs: cannot make"),
        (["--env.plugins", "[no_such_module_xyz]"], r"env.plugins: cannot import 'no_such_module_xyz'"),
        (
            ["--agents.adapters", "{alice: a}"],
            r"must name every agent of test/Scripted-v0 exactly once: missing \['bob'\].*The env's agents: \['alice', 'bob'\]",
        ),
        (
            ["--agents.adapters", "{alice: a, bob: b, carol: c}"],
            r"not agents of test/Scripted-v0 \['carol'\]",
        ),
        (
            ["--agents.adapters", "everyone"],
            r"agents.adapters: 'everyone' is not 'per_agent', 'shared' or a map",
        ),
        (
            ["--agents.adapters", "{alice: a, bob: null}"],
            r"agents.adapters.bob is null .* add it to agents.frozen",
        ),
        (["--agents.adapters", "{alice: a.b, bob: c}"], r"adapter name 'a.b'"),
        (["--agents.frozen", "[carol]"], r"agents.frozen: \['carol'\] are not agents of test/Scripted-v0"),
        (
            ["--agents.adapters", "shared", "--agents.frozen", "[bob]"],
            r"adapter 'shared' is shared by frozen agent\(s\) \['bob'\] and trained agent\(s\) \['alice'\]",
        ),
        (["--agents.frozen", "[alice, bob]"], r"nothing to train: every agent is frozen"),
        (["--agents.adapter_lora", "{carol: {r: 4}}"], r"agents.adapter_lora: \['carol'\] are not adapters"),
        (
            ["--agents.adapter_lora", "{alice: {lora_alpa: 4}}"],
            r"unknown config key 'agents.adapter_lora.alice.lora_alpa'.*Did you mean 'agents.adapter_lora.alice.lora_alpha'",
        ),
        (
            ["--agents.init_adapters", "{alice: /nowhere}"],
            r"agents.init_adapters.alice: /nowhere is not a PEFT adapter directory",
        ),
        (["--rollout.num_generations", "1"], r"num_generations must be >= 2"),
        (["--rollout.temperature", "0"], r"rollout.temperature 0"),
        (["--rollout.top_p", "1.5"], r"rollout.top_p must be in \(0, 1\]"),
        (["--training.per_device_train_batch_size", "0"], r"per_device_train_batch_size must be > 0"),
        (["--algorithm.num_iterations", "0"], r"num_iterations must be > 0"),
        (["--training.max_steps", "-1"], r"max_steps must be >= 0"),
    ],
)
def test_validation_errors(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(_config(tmp_path, overrides=overrides))


def test_all_frozen_is_fine_for_evaluation_only(tmp_path):
    plan = validate(
        _config(tmp_path, overrides=["--agents.frozen", "[alice, bob]", "--training.max_steps", "0"])
    )
    assert plan.trainable == []


def test_vllm_engine_needs_vllm(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"'vllm' needs vLLM: `pip install \"llm-zoo\[vllm\]\"`"):
        validate(_config(tmp_path, overrides=["--rollout.engine", "vllm"]))


def test_missing_tracker_is_named(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"'wandb' is not installed; `pip install wandb`"):
        validate(_config(tmp_path, overrides=["--logging.log_with", "[wandb]"]))


def test_config_from_dict_round_trip():
    config = Config()
    assert config_from_dict(dataclasses.asdict(config), Config) == config


def test_no_and_yes_are_strings_not_yaml_1_1_booleans(tmp_path):
    config = _config(tmp_path, TOY + "training: {mixed_precision: no}\n")
    assert config.training.mixed_precision == "no"
    config = _config(
        tmp_path, overrides=["--training.mixed_precision", "no", "--training.gradient_checkpointing", "true"]
    )
    assert config.training.mixed_precision == "no" and config.training.gradient_checkpointing is True
    with pytest.raises(ConfigError, match=r"training\.gradient_checkpointing: expected bool"):
        _config(tmp_path, overrides=["--training.gradient_checkpointing", "yes"])
