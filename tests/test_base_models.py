"""A separate base model per agent (``agents.models`` / ``agents.base_models``).

Agent ``alice`` of the toy env ``test/Scripted-v0`` runs on the tiny Llama model (about 400
tokens, hidden size 32, ChatML template), ``bob`` on a tiny GPT-2 model built here (about 300
tokens, hidden size 48, a ``### role:`` template, LoRA on ``c_attn`` and ``lm_head``). The tests train both,
checkpoint, resume exactly, evaluate with ``llm-zoo-train eval``, and check the refusals.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import toy_envs_trainer  # noqa: E402, F401  (registers test/Scripted-v0)
from llm_zoo_train.config import ConfigError, load_config, plan_agents, save_config  # noqa: E402
from llm_zoo_train.config.base_models import base_model_label  # noqa: E402
from llm_zoo_train.engines.base import Completion, SamplingParams  # noqa: E402
from llm_zoo_train.evaluation.cli import main as eval_main  # noqa: E402
from llm_zoo_train.models.chat import encode_prompt  # noqa: E402
from llm_zoo_train.reporting.progress import run_summary  # noqa: E402
from llm_zoo_train.rollout.replay import ReplayEngine  # noqa: E402
from llm_zoo_train.runs.checkpoint import find_checkpoint  # noqa: E402
from llm_zoo_train.trainer import Trainer  # noqa: E402
from llm_zoo_train.training.model_pools import ModelRouter, PolicyGroup, UpdaterByModel  # noqa: E402
from tiny_model import train_byte_level_bpe  # noqa: E402
from train_helpers import history_without_timing, toy_config  # noqa: E402

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    # PEFT adjusts fan_in_fan_out itself for GPT-2's Conv1D layers (and back for its lm_head).
    pytest.mark.filterwarnings("ignore:fan_in_fan_out is set to:UserWarning"),
]

GPT_TEMPLATE = (
    "{% for message in messages %}{{ '### ' + message['role'] + ':\n' + message['content'] + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '### assistant:\n' }}{% endif %}"
)
_CORPUS = ["ab ba abba bob says b", "### user: reply ### assistant: ok", "a b c d e f g h"] * 20


def build_tiny_gpt2_dir(path: Path) -> Path:
    """A tiny random GPT-2 model (vocabulary about 300, hidden size 48) with its own tokenizer and template."""
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tokenizer = train_byte_level_bpe(_CORPUS, 300, ["<|endoftext|>", "<pad>"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<pad>")
    fast.chat_template = GPT_TEMPLATE
    config = GPT2Config(
        vocab_size=len(fast),
        n_embd=48,
        n_layer=2,
        n_head=4,
        n_positions=1024,
        bos_token_id=fast.eos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(1)
    model = GPT2LMHeadModel(config)
    model.generation_config.pad_token_id = fast.pad_token_id
    model.generation_config.eos_token_id = fast.eos_token_id
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return build_tiny_gpt2_dir(tmp_path_factory.mktemp("tiny_gpt2"))


def two_model_overrides(gpt2_dir: Path) -> list[str]:
    return [
        "--agents.models.gpt",
        f"{{name_or_path: {gpt2_dir}}}",
        "--agents.base_models.bob",
        "gpt",
        "--agents.adapter_lora.bob",
        "{target_modules: [c_attn, lm_head]}",
        "--rollout.envs_per_step",
        "4",
    ]


def _weights(policy, names):
    return {name: policy.adapter_state_dict(name) for name in names}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def trained_run(tiny_model_dir, gpt2_dir, tmp_path_factory):
    """Two steps on two base models, evaluated at the end: (trainer, initial adapter weights)."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("two_models")
    overrides = [*two_model_overrides(gpt2_dir), "--training.max_steps", "2", "--eval.eval_on_start", "false"]
    trainer = Trainer(toy_config(tiny_model_dir, root / "run", overrides))
    start = _weights(trainer.policy, ["alice", "bob"])
    trainer.train()
    return trainer, start


def test_each_agent_trains_its_adapter_on_its_own_base_model(trained_run, gpt2_dir):
    trainer, start = trained_run
    plan = trainer.plan
    assert plan.agent_models == {"alice": "model", "bob": "gpt"}
    assert plan.adapter_models == {"alice": "model", "bob": "gpt"}
    assert isinstance(trainer.policy, PolicyGroup) and trainer.model is None
    assert isinstance(trainer.engine, ModelRouter) and isinstance(trainer.updater, UpdaterByModel)
    llama, gpt = trainer.policy.policies["model"], trainer.policy.policies["gpt"]
    assert (llama.adapter_names, gpt.adapter_names) == (["alice"], ["bob"])
    vocabularies = (
        llama.model.get_input_embeddings().num_embeddings,
        gpt.model.get_input_embeddings().num_embeddings,
    )
    assert vocabularies == (len(llama.tokenizer), len(gpt.tokenizer)) and len(set(vocabularies)) == 2
    assert llama.model.config.hidden_size == 32 and gpt.model.config.n_embd == 48
    # Both adapters trained. A step trains an agent unless all its groups had one reward for every
    # candidate (zero variance: dropped, no signal), which the sampled tokens decide.
    for name in ("alice", "bob"):
        assert not _same(start[name], trainer.policy.adapter_state_dict(name)), name
        steps = [r for r in trainer.history if r["step"] > 0]
        assert any(r[f"update/{name}/samples"] > 0 for r in steps), name
        assert all(r[f"update/{name}/samples"] > 0 or r[f"{name}/zero_variance_groups"] > 0 for r in steps)
    assert "eval/success_rate" in trainer.history[-1]
    # Each prompt is templated and tokenized by its own base model's tokenizer.
    sampling = SamplingParams(max_tokens=3, temperature=1.0, seed=5)
    (bob,), (alice,) = trainer.engine.generate(["say b", "say a"], ["bob", "alice"], 1, sampling)
    assert bob.prompt_token_ids == encode_prompt(gpt.tokenizer, "say b", None)
    assert alice.prompt_token_ids == encode_prompt(llama.tokenizer, "say a", None)
    assert max(bob.token_ids) < len(gpt.tokenizer) and gpt.tokenizer.decode(bob.prompt_token_ids).startswith(
        "### user:"
    )
    # Saved adapters and their model cards name their own base model.
    adapters = Path(trainer.config.training.output_dir) / "adapters"
    facts = {n: json.loads((adapters / n / "llm_zoo_adapter.json").read_text()) for n in ("alice", "bob")}
    assert facts["bob"]["base_model"]["config_name"] == str(gpt2_dir)
    assert facts["alice"]["base_model"]["config_name"] == trainer.config.model.name_or_path


def test_router_sends_each_row_to_its_model_with_its_own_seed():
    calls = []

    class Fake:
        def __init__(self, name):
            self.name = name

        def generate(self, prompts, adapters, n, sampling):
            calls.append((self.name, list(prompts), list(adapters), sampling.seed))
            return [[Completion(f"{self.name}:{p}", [], [], [], "stop")] * n for p in prompts]

        def load_adapters(self, paths, version):
            calls.append((self.name, dict(paths), version))

    router = ModelRouter({"model": Fake("m"), "gpt": Fake("g")}, {"alice": "model", "bob": "gpt"})
    out = router.generate(
        ["p0", "p1", "p2"], ["bob", "alice", base_model_label("gpt")], 2, SamplingParams(seed=7)
    )
    assert [[c.text for c in row] for row in out] == [["g:p0"] * 2, ["m:p1"] * 2, ["g:p2"] * 2]
    (m_name, m_prompts, m_adapters, m_seed), (g_name, g_prompts, g_adapters, g_seed) = calls
    assert (m_name, m_prompts, m_adapters) == ("m", ["p1"], ["alice"])
    assert (g_name, g_prompts, g_adapters) == ("g", ["p0", "p2"], ["bob", None])
    assert m_seed != g_seed and None not in (m_seed, g_seed)
    calls.clear()
    router.load_adapters({"bob": "/b"}, 3)
    assert calls == [("g", {"bob": "/b"}, 3)]
    with pytest.raises(ValueError, match="none of the base models"):
        router.generate(["p"], [None], 1, SamplingParams())


def test_resumed_run_equals_uninterrupted_run(tiny_model_dir, gpt2_dir, tmp_path):
    overrides = [
        *two_model_overrides(gpt2_dir),
        "--training.max_steps",
        "3",
        "--training.save_steps",
        "2",
        "--eval.num_episodes",
        "2",
        "--training.per_device_train_batch_size",
        "4",
        "--training.gradient_accumulation_steps",
        "2",
        "--algorithm.num_iterations",
        "2",
        "--training.lr_scheduler_type",
        "linear",
        "--rollout.envs_per_step",
        "2",
    ]
    straight = Trainer(toy_config(tiny_model_dir, tmp_path / "straight", overrides))
    straight.train()
    interrupted = toy_config(tiny_model_dir, tmp_path / "resumed", overrides)
    Trainer(interrupted).train(stop_after_step=2)
    checkpoint = find_checkpoint(tmp_path / "resumed")
    assert checkpoint.name == "checkpoint-2"
    assert sorted(p.name for p in (checkpoint / "adapters").iterdir()) == ["alice", "bob"]
    resumed = Trainer(interrupted, resume_from=tmp_path / "resumed")
    assert resumed.step == 2
    resumed.train()
    assert history_without_timing(resumed.history) == history_without_timing(straight.history)
    for name in ("alice", "bob"):
        assert _same(straight.policy.adapter_state_dict(name), resumed.policy.adapter_state_dict(name)), name
        optimizer_a, optimizer_b = straight.optimizers[name], resumed.optimizers[name]
        state_a, state_b = optimizer_a.state_dict()["state"], optimizer_b.state_dict()["state"]
        assert state_a, f"{name} never made an optimizer step: the comparison would be trivial"
        assert all(torch.equal(state_a[k]["exp_avg"], state_b[k]["exp_avg"]) for k in state_a)


def test_eval_command_reproduces_the_trainers_evaluation_and_refuses_the_swap(trained_run, capsys):
    trainer, _ = trained_run
    run = Path(trainer.config.training.output_dir)
    assert eval_main([str(run), "--policies", "base,adapters", "--splits", "eval"]) == 0
    document = json.loads((run / "eval" / "eval_results.json").read_text())
    settings = document["settings"]
    assert settings["policies"]["base"] == {"alice": "base_model:model", "bob": "base_model:gpt"}
    assert settings["model"]["agent_models"] == {"alice": "model", "bob": "gpt"}
    rows = {row["policy"]: row["result"] for row in document["results"]}
    last = trainer.history[-1]
    assert rows["adapters"]["success_rate"] == last["eval/success_rate"]
    for agent in ("alice", "bob"):
        assert rows["adapters"]["mean_rewards"][agent] == pytest.approx(last[f"eval/{agent}/reward"])
    capsys.readouterr()
    assert eval_main([str(run), "--policies", "swap", "--splits", "eval"]) == 2
    error = capsys.readouterr().err
    assert "different base models" in error and "alice on model" in error and "bob on gpt" in error


def test_replayed_steps_give_the_same_adapters_on_both_base_models(tiny_model_dir, gpt2_dir, tmp_path):
    common = [*two_model_overrides(gpt2_dir), "--training.max_steps", "2", "--eval.num_episodes", "2"]
    common += [
        "--training.rollout_activations_mb",
        "0",
    ]  # a replay computes every pass (tests/test_replay.py)
    recorded = Trainer(
        toy_config(tiny_model_dir, tmp_path / "recorded", [*common, "--rollout.save_rollouts", "true"])
    )
    recorded.train()
    replay = ["--rollout.engine", "replay", "--rollout.replay_path", str(tmp_path / "recorded" / "rollouts")]
    replayed = Trainer(toy_config(tiny_model_dir, tmp_path / "replayed", [*common, *replay]))
    assert isinstance(replayed.engine, ReplayEngine) and isinstance(replayed.eval_engine, ModelRouter)
    replayed.train()
    for name in ("alice", "bob"):
        assert _same(recorded.policy.adapter_state_dict(name), replayed.policy.adapter_state_dict(name)), name
    # Same rewards, advantages and update metrics; the evaluation ran on the live models.
    assert history_without_timing(replayed.history) == history_without_timing(recorded.history)


@pytest.mark.slow
def test_two_cpu_processes_keep_identical_adapters_on_both_base_models(tiny_model_dir, gpt2_dir, tmp_path):
    """Data parallel on CPU (gloo, torchrun): each adapter's gradients are summed over the processes
    on its own base model, so both processes end with the same two adapters."""
    config = toy_config(tiny_model_dir, tmp_path / "run", two_model_overrides(gpt2_dir))
    config_path = tmp_path / "two_models.yaml"
    save_config(config, config_path)
    script = tmp_path / "check.py"
    script.write_text(
        "import hashlib\n"
        "from llm_zoo_train.config import load_config\n"
        "from llm_zoo_train.trainer import Trainer\n"
        f"config = load_config({str(config_path)!r}, ['--training.max_steps', '2', '--eval.num_episodes', '2'])\n"
        "trainer = Trainer(config)\n"
        "trainer.train()\n"
        "for name in trainer.plan.adapters:\n"
        "    digest = hashlib.sha256()\n"
        "    for value in trainer.policy.adapter_state_dict(name).values():\n"
        "        digest.update(value.numpy().tobytes())\n"
        "    print('ADAPTER', trainer.accelerator.process_index, name, digest.hexdigest())\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
        "ACCELERATE_USE_CPU": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    torchrun = Path(sys.executable).parent / "torchrun"
    command = [str(torchrun) if torchrun.exists() else "torchrun", "--nproc_per_node", "2", str(script)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    digests = {}
    for line in result.stdout.splitlines():
        if line.startswith("ADAPTER"):
            _, rank, name, digest = line.split()
            digests.setdefault(name, {})[rank] = digest
    assert sorted(digests) == ["alice", "bob"]
    for name, by_rank in digests.items():
        assert sorted(by_rank) == ["0", "1"] and len(set(by_rank.values())) == 1, name


def _plan(overrides, agents=("alice", "bob")):
    config = load_config(None, ["--env.id", "test/Scripted-v0", *overrides])
    return plan_agents(config, list(agents))


def test_one_base_model_unless_asked():
    plan = _plan([])
    assert list(plan.models) == ["model"] and plan.agent_models == {"alice": "model", "bob": "model"}
    assert plan.models["model"].name_or_path == "smollm2-135m-instruct"
    big = _plan(["--agents.models.big", "{name_or_path: org/big}", "--agents.base_models.bob", "big",
                 "--model.dtype", "bfloat16", "--model.system_prompt", "hi"])  # fmt: skip
    assert list(big.models) == ["model", "big"] and big.model_of("bob").name_or_path == "org/big"
    assert (big.model_of("bob").dtype, big.model_of("bob").system_prompt) == ("bfloat16", "hi")  # inherited
    assert big.adapters_on("big") == ["bob"]
    config = load_config(None, ["--agents.models.big", "{name_or_path: org/big}"])
    assert "with smollm2-135m-instruct and big=org/big (hf engine)" in run_summary(config)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--agents.adapters", "shared"], r"adapter 'shared' is shared by agents on different base models \(alice on model, bob on big\)"),
        (["--agents.adapters", "{alice: alice, bob: null}", "--agents.frozen", "[bob]"], r"\['bob'\] act with the bare base model"),
        (["--rollout.engine", "vllm"], r"rollout.engine 'vllm' serves one base model"),
        (["--rollout.async_steps", "1"], r"rollout.async_steps 1: the generation process holds one base model"),
        (["--agents.base_models.carol", "big"], r"agents.base_models: \['carol'\] are not agents"),
        (["--agents.base_models.bob", "huge"], r"'huge' is not a base model; base models: \['model', 'big'\]"),
        (["--agents.models.spare", "{name_or_path: org/x}"], r"agents.models: \['spare'\] run no agent"),
        (["--agents.models.model", "{name_or_path: org/x}"], r"the name 'model' is the `model` section"),
        (["--agents.base_models.alice", "big"], r"every agent runs on agents.models.big"),
        (["--agents.models.big.nme_or_path", "x"], r"unknown config key 'agents.models.big.nme_or_path'"),
        (["--agents.models.big.dtype", "int3"], r"agents.models.big.dtype: 'int3' is not one of"),
    ],
)  # fmt: skip
def test_bad_base_model_configs_are_clear_errors(overrides, message):
    base = ["--agents.models.big", "{name_or_path: org/big}", "--agents.base_models.bob", "big"]
    with pytest.raises(ConfigError, match=message):
        _plan([*base, *overrides])
