"""The job ``trainer_vs_trl.py`` times on both sides, and how each side's trainer is built for it.

The job: a single-agent, one-turn task (``bench/WriteAbout-v0``: write about a topic), its reward
:func:`score` (our env's role reward, TRL's reward function), the topics of each step and the
model directory. The sides: :func:`make_ours` (our Trainer, or with ``old`` as before issue 29)
and :func:`make_trl` (TRL's GRPOTrainer on the same prompts, steps and update). The alternating
run, its timings and the results stay in ``trainer_vs_trl.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llm_zoo import Outcome, TextAECEnv

ENV_ID = "bench/WriteAbout-v0"
TOPICS = (
    "the ocean", "mountains", "bread", "a lighthouse", "the moon", "bicycles", "rain", "a library",
    "coffee", "volcanoes", "winter", "a train station", "honey bees", "the desert", "music", "a garden",
)  # fmt: skip


def prompt_for(topic: str) -> str:
    return f"Write a short paragraph about {topic}. Mention {topic} by name."


def score(completion: str, topic: str) -> float:
    """The reward of both trainers: 1 if the completion names the topic's last word, plus up to
    0.5 for vocabulary variety (distinct words / words), so the K samples of a group differ."""
    words = completion.lower().split()
    named = float(topic.split()[-1].lower() in completion.lower())
    variety = len(set(words)) / len(words) if words else 0.0
    return named + 0.5 * variety


class WriteAboutEnv(TextAECEnv):
    """Benchmark-only task: one agent writes about the topic ``TOPICS[seed % len(TOPICS)]``.

    One turn; reward :func:`score` (role reward; the global reward is 0); the episode terminates
    after the answer. Every reset is logged in :attr:`resets` (the prompts our trainer saw)."""

    metadata = {"render_modes": ["ansi"], "name": "write_about_v0", "is_parallelizable": True}
    roles = ("writer",)
    resets: list[str] = []

    def __init__(self, *, alpha: float = 1.0, render_mode: str | None = None):
        super().__init__(max_turns=1, alpha=alpha, render_mode=render_mode)

    def _new_episode(self, rng: np.random.Generator, options: dict[str, Any] | None) -> None:
        self.topic = TOPICS[self._episode_seed % len(TOPICS)]
        WriteAboutEnv.resets.append(prompt_for(self.topic))

    def _prompt(self, agent: str) -> str:
        return prompt_for(self.topic)

    def _act(self, agent: str, action: str) -> Outcome:
        reward = score(action, self.topic)
        return Outcome(reward, 0.0, terminated=True, success=reward >= 1.0)

    def _render_state(self) -> str:
        return f"topic: {self.topic}"


def trl_reward(prompts, completions, topic, **kwargs) -> list[float]:
    """TRL's reward function: the same :func:`score`; logs the prompts and completion lengths."""
    trl_reward.calls.append(
        {
            "prompts": [p[-1]["content"] for p in prompts],
            "lengths": [len(c) for c in kwargs["completion_ids"]],
        }
    )
    return [score(c[-1]["content"], t) for c, t in zip(completions, topic, strict=True)]


trl_reward.calls = []  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- setup of both trainers


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The job's options, shared by every script that runs it (what :func:`make_ours` reads)."""
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model alias, hub id or local dir")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--num-generations", type=int, default=4, help="K")
    parser.add_argument("--max-completion-length", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=8, help="completions per forward/backward")
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)


def model_dir(args: argparse.Namespace, workdir: Path) -> str:
    if args.quick:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from tiny_model import build_tiny_model_dir

        return str(build_tiny_model_dir(workdir / "tiny-model"))
    from llm_zoo_train.models.policy import resolve_model_path

    return resolve_model_path(args.model)


def step_topics(seed: int, step: int, prompts_per_step: int) -> list[str]:
    """The topics our trainer's step ``step`` draws (its task seeds, derived as in Trainer.train_step)."""
    from llm_zoo_train.runs.seeding import Stream, derive_seed

    seeds = np.random.default_rng(derive_seed(seed, step, 0, Stream.TASKS)).integers(
        0, 2**30, size=prompts_per_step
    )
    return [TOPICS[int(s) % len(TOPICS)] for s in seeds]


def make_ours(args: argparse.Namespace, path: str, workdir: Path, total_steps: int, *, old: bool = False):
    """Our trainer; ``old``: with the update and attention of before issue 29 (samples shuffled one
    by one into micro-batches, transformers' default sdpa attention, ``F.linear`` and peft's LoRA
    products in the update, adapters not merged into the engine's packed copies), for
    ``--old-too``. Its engine is today's otherwise (the prefill's first token included)."""
    from llm_zoo_train.config import (
        AgentsConfig,
        AlgorithmConfig,
        Config,
        EnvConfig,
        EvalConfig,
        LoggingConfig,
        LoraSettings,
        ModelConfig,
        RolloutConfig,
        TrainingConfig,
    )
    from llm_zoo_train.trainer import Trainer

    config = Config(
        model=ModelConfig(name_or_path=path, dtype=args.dtype, attn_implementation="sdpa" if old else "auto"),
        env=EnvConfig(id=ENV_ID),
        agents=AgentsConfig(adapters="shared"),
        lora=LoraSettings(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear"),
        rollout=RolloutConfig(
            mode="tree",
            num_generations=args.num_generations,
            envs_per_step=args.prompts_per_step,
            max_completion_length=args.max_completion_length,
            temperature=1.0,
            engine="hf",
            max_rows_per_generate_call=args.prompts_per_step * args.num_generations,
        ),
        algorithm=AlgorithmConfig(
            loss_type="dapo",
            epsilon=0.2,
            beta=0.0,
            scale_rewards="group",
            # TRL keeps zero-variance groups and divides by std + 1e-4: the same here, like for like.
            zero_variance_groups="keep",
            advantage_epsilon=1e-4,
        ),
        training=TrainingConfig(
            output_dir=str(workdir / ("ours_old" if old else "ours")),
            max_steps=total_steps,
            learning_rate=args.learning_rate,
            lr_scheduler_type="constant",
            max_grad_norm=1.0,
            per_device_train_batch_size=args.micro_batch,
            gradient_accumulation_steps=None,
            micro_batches="samples" if old else "groups",
            update_kernel="exact" if old else "auto",
            # the allocator is the process's, set once for both sides in main (--allocator)
            keep_freed_memory=args.allocator == "kept",
            seed=args.seed,
        ),
        eval=EvalConfig(num_episodes=0, eval_on_start=False),
        logging=LoggingConfig(progress_bar=False, plot=False),
    )
    trainer = Trainer(config)
    if old and getattr(trainer.engine, "packed_weights", None) is not None:
        trainer.engine.packed_weights.merge_adapters = False
    update = trainer.updater.update
    trainer.update_cpu_s = []  # type: ignore[attr-defined]

    def timed_update(*a, **k):  # the update's CPU time (one process; TRL never runs meanwhile)
        start = time.process_time()
        try:
            return update(*a, **k)
        finally:
            trainer.update_cpu_s.append(time.process_time() - start)  # type: ignore[attr-defined]

    trainer.updater.update = timed_update
    return trainer, config


def make_trl(args: argparse.Namespace, path: str, workdir: Path, total_steps: int, callback):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from llm_zoo_train.config import LoraSettings
    from llm_zoo_train.models.policy import lora_config

    topics = [
        t for step in range(1, total_steps + 1) for t in step_topics(args.seed, step, args.prompts_per_step)
    ]
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": prompt_for(t)}], "topic": t} for t in topics]
    )
    completions = args.prompts_per_step * args.num_generations
    config = GRPOConfig(
        output_dir=str(workdir / "trl"),
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        fp16=False,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=completions // args.micro_batch,
        num_generations=args.num_generations,
        num_iterations=1,
        max_completion_length=args.max_completion_length,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        loss_type="dapo",
        epsilon=0.2,
        scale_rewards="group",
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        optim="adamw_torch",  # torch.optim.AdamW, as ours
        max_grad_norm=1.0,
        max_steps=total_steps,
        gradient_checkpointing=False,  # TRL defaults to True; ours to False
        shuffle_dataset=False,  # dataset rows are already in our trainer's per-step order
        logging_steps=10**9,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        seed=args.seed,
    )
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # as llm_zoo_train.models.policy.load_base_model
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype))
    settings = LoraSettings(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=trl_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(settings),
        callbacks=[callback],
    )
    generate = trainer._generate

    def timed_generate(prompts):  # TRL's generation (tokenize, generate, decode), for the breakdown
        start = time.perf_counter()
        try:
            return generate(prompts)
        finally:
            callback.trl_generation_s.append(time.perf_counter() - start)

    trainer._generate = timed_generate
    return trainer, config
