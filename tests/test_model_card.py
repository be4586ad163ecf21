"""Portable adapters: model card, facts file, public base model id - and our own loading still works."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import toy_envs_trainer  # noqa: E402, F401  (registers test/Scripted-v0)
from llm_zoo_train.config import load_config, plan_agents  # noqa: E402
from llm_zoo_train.evaluation.cli import main as eval_main  # noqa: E402
from llm_zoo_train.models.policy import public_model_id  # noqa: E402
from llm_zoo_train.reporting import model_card  # noqa: E402
from llm_zoo_train.reporting.model_card import FACTS_FILE, write_model_cards  # noqa: E402
from llm_zoo_train.trainer import Trainer  # noqa: E402
from train_helpers import toy_config  # noqa: E402

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
HISTORY = [
    {"step": 0, "eval/success_rate": 0.25, "eval/success_ci_low": 0.1, "eval/success_ci_high": 0.5, "eval/num_episodes": 8},
    {"step": 1, "train/success_rate": 0.5, "tool_agent/reward": 0.25, "plan_agent/reward": -0.5},
    {"step": 2, "train/success_rate": 0.75, "tool_agent/reward": 0.5, "plan_agent/reward": 0.125,
     "eval/success_rate": 0.5, "eval/success_ci_low": 0.2, "eval/success_ci_high": 0.8, "eval/num_episodes": 8},
]  # fmt: skip


def test_public_model_ids(tmp_path):
    assert public_model_id("smollm2-135m-instruct") == SMOLLM2
    assert public_model_id("Qwen/Qwen3-1.7B") == "Qwen/Qwen3-1.7B"
    assert public_model_id(str(tmp_path)) is None  # a local directory names nothing downloadable
    assert public_model_id("./models/mine") is None


def test_cards_for_the_smollm2_alias(tmp_path):
    cache = tmp_path / "cache"
    (cache / "smollm2-135m-instruct").mkdir(parents=True)
    (cache / "smollm2-135m-instruct" / ".llm_zoo_converted").write_text("test\n")  # no conversion needed
    config = load_config(None, ["--model.cache_dir", str(cache), "--training.max_steps", "2"])
    plan = plan_agents(config, ["tool_agent", "plan_agent"])
    adapters = tmp_path / "adapters"
    for name in plan.adapters:
        (adapters / name).mkdir(parents=True)
        (adapters / name / "adapter_config.json").write_text(
            json.dumps({"base_model_name_or_path": str(cache / "smollm2-135m-instruct"), "r": 8})
        )
    cards = write_model_cards(adapters, config, plan, 2, HISTORY)
    assert [c.parent.name for c in cards] == ["tool_agent", "plan_agent"]

    directory = adapters / "tool_agent"
    settings = json.loads((directory / "adapter_config.json").read_text())
    assert settings == {"base_model_name_or_path": SMOLLM2, "r": 8}  # only the base model changes
    facts = json.loads((directory / FACTS_FILE).read_text())
    assert facts["base_model"]["public_id"] == SMOLLM2
    assert facts["base_model"]["local_path"] == str(cache / "smollm2-135m-instruct")  # recorded here
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in facts["base_model"]["weights"]
    assert facts["agents"] == ["tool_agent"] and facts["step"] == 2 and facts["env"]["id"] == "PlanPath-v0"
    assert facts["metrics"]["eval_before_training"]["success_rate"] == 0.25
    assert facts["metrics"]["eval_latest"] == {
        "step": 2, "success_rate": 0.5, "success_ci_low": 0.2, "success_ci_high": 0.8, "num_episodes": 8,
    }  # fmt: skip
    assert facts["metrics"]["train_latest"] == {"step": 2, "success_rate": 0.75, "tool_agent/reward": 0.5}

    card = (directory / "README.md").read_text()
    assert card.startswith(f"---\nbase_model: {SMOLLM2}\nlibrary_name: peft\n")
    assert "# LoRA adapter `tool_agent` for PlanPath-v0" in card
    assert "50.0% (95% CI 20.0-80.0%, 4/8 episodes) at step 2" in card
    assert "25.0% (95% CI 10.0-50.0%, 2/8 episodes) at step 0" in card
    assert "GGUF conversion of `HuggingFaceTB/SmolLM2-135M-Instruct`" in card
    assert f'PeftModel.from_pretrained(base, "{directory.resolve()}", adapter_name="tool_agent")' in card
    assert (
        f"vllm serve {SMOLLM2} --enable-lora --lora-modules tool_agent={directory.resolve()} --max-lora-rank 8"
        in card
    )
    assert "--agent-model tool_agent=tool_agent" in card


def _card_command(card: str, program: str) -> list[str]:
    line = next(line for line in card.splitlines() if line.startswith(program))
    return shlex.split(line)


def test_the_cards_eval_command_runs_against_a_server_of_the_adapter(tmp_path, capsys):
    """The card's `llm-zoo-train eval --endpoint` command, run as printed, against a fake vLLM server."""
    from test_evaluate import FakeOpenAI

    config = load_config(
        None,
        ["--env.kwargs", "{rows: 5, cols: 5}", "--model.name_or_path", str(tmp_path), "--env.alpha", "0.5"],
    )
    plan = plan_agents(config, ["tool_agent", "plan_agent"])
    (tmp_path / "adapters" / "plan_agent").mkdir(parents=True)
    (tmp_path / "adapters" / "plan_agent" / "adapter_config.json").write_text("{}")
    (card,) = write_model_cards(tmp_path / "adapters", config, plan, 0, [])
    text = card.read_text()
    serve = _card_command(text, "vllm serve")
    assert serve[2] == str(tmp_path)  # no public id: the local base is served
    command = _card_command(text, "llm-zoo-train eval")
    answers = {"plan_agent": 'I think #### ["R"]'}
    with FakeOpenAI(
        lambda model, prompt, system: answers.get(model, "?"), models=[str(tmp_path), "plan_agent"]
    ) as server:
        command[command.index("--endpoint") + 1] = server.url
        output = tmp_path / "eval.json"
        assert eval_main([*command[2:], "--eval.num_episodes", "2", "--output", str(output)]) == 0, (
            capsys.readouterr().err
        )
        asked = {body["model"] for body in server.completions()}
    document = json.loads(output.read_text())
    assert asked == {str(tmp_path), "plan_agent"}  # the base for tool_agent, the adapter for plan_agent
    assert document["settings"]["splits"]["eval"]["env_kwargs"] == {"rows": 5, "cols": 5, "alpha": 0.5}
    capsys.readouterr()


@pytest.fixture(scope="module")
def run_with_public_id(tiny_model_dir, tmp_path_factory):
    """Two training steps of the tiny model whose saved adapters name a public id as their base
    (as the SmolLM2 alias's do); the id is not downloadable here, the base is local."""
    patch = pytest.MonkeyPatch()
    patch.setattr(model_card, "public_model_id", lambda name: SMOLLM2)
    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("card") / "run"
    overrides = ["--training.max_steps", "1", "--eval.num_episodes", "2", "--eval.eval_on_start", "false"]
    try:
        trainer = Trainer(toy_config(tiny_model_dir, run, overrides))
        trainer.train()
        trainer.close()
    finally:
        patch.undo()
    return run


def test_saved_adapters_are_portable_and_still_load_locally(
    run_with_public_id, tiny_model_dir, monkeypatch, capsys
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the public id must never be fetched by our own loading
    run = run_with_public_id
    for directory in (run / "adapters" / "alice", run / "checkpoint-1" / "adapters" / "alice"):
        assert (
            json.loads((directory / "adapter_config.json").read_text())["base_model_name_or_path"] == SMOLLM2
        )
        facts = json.loads((directory / FACTS_FILE).read_text())
        assert facts["base_model"]["local_path"] == str(tiny_model_dir)
        assert facts["step"] == 1 and facts["metrics"]["eval_latest"]["num_episodes"] == 2
        card = (directory / "README.md").read_text()
        assert f"--lora-modules alice={directory.resolve()}" in card  # the final path, not a temporary one
        assert ".tmp-" not in card

    # Plain PEFT with the local base.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(base, run / "adapters" / "alice", adapter_name="alice")
    assert "alice" in model.peft_config

    # Our evaluation and resume build the base from the run's config.
    assert eval_main([str(run), "--eval.num_episodes", "1"]) == 0
    assert "adapters" in capsys.readouterr().out
    config = load_config(run / "checkpoint-1" / "config.yaml", ["--training.max_steps", "2"])
    trainer = Trainer(config, resume_from=run)
    assert trainer.step == 1
    trainer.train()
    trainer.close()
    assert json.loads((run / "adapters" / "alice" / FACTS_FILE).read_text())["step"] == 2
    assert Path(run / "checkpoint-2" / "adapters" / "bob" / "README.md").is_file()
