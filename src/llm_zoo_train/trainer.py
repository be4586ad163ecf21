"""The training loop: rollout -> advantages -> update each adapter -> sync the engine -> log.

One training step (:meth:`Trainer.train_step`):

1. **Rollout.** ``envs_per_step`` tasks (seeds drawn from ``(seed, step, process)``) are played by
   the engine with the current adapters: AT-GRPO tree rollouts or independent episodes
   (:mod:`llm_zoo_train.rollout.tree`). Sampling seeds and greedy tie-breaks also derive from
   ``(seed, step, process)``, so a step's rollout depends only on the seed, the step and the
   adapter weights - which is what makes a resumed run identical to an uninterrupted one.
2. **Advantages.** Group-relative per ``(env, turn, agent)`` (:mod:`llm_zoo_train.training.advantages`).
3. **Update.** Each trainable adapter on its agents' samples (:mod:`llm_zoo_train.training.update`:
   micro-batches, exact gradient accumulation, one AdamW optimizer and LR schedule per adapter).
   Frozen adapters have no optimizer and never change.
4. **Sync.** Engines with their own weights (vLLM) get the saved adapters under a new version;
   the transformers engine shares the live model.
5. **Log.** Per-agent metrics to ``metrics.jsonl``, the trackers and the console.

Multi-process runs are data parallel: every process rolls out its own tasks, and the adapters'
gradients are summed across processes before each optimizer step, so all processes keep identical
adapters. With ``training.strategy: ddp`` every process holds the whole model and the sum is a
manual all-reduce (rather than DDP's, because processes may hold different numbers of samples per
adapter). With ``fsdp2`` PyTorch's ``fully_shard`` splits the base and the adapters across the
processes, which sum in the backward and run their passes in lockstep
(:mod:`llm_zoo_train.models.sharding`). Launch with ``accelerate launch --multi_gpu
--num_processes N -m llm_zoo_train ...`` on GPUs, or ``ACCELERATE_USE_CPU=1 torchrun
--nproc_per_node N -m llm_zoo_train ...`` on CPU (``accelerate launch --cpu --num_processes N``
starts a single process). DeepSpeed is not supported.

What the constructor builds before the first step (the accelerator, the policy, the engine, the
optimizers) is made by the functions of :mod:`llm_zoo_train.trainer_setup`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from llm_zoo_train.config import (
    Config,
    ConfigError,
    config_to_dict,
    eval_env_kwargs,
    train_env_kwargs,
    validate,
)
from llm_zoo_train.config.agent_sampling import rollout_overrides
from llm_zoo_train.engines.hf.engine import HFEngine
from llm_zoo_train.evaluation.evaluate import EvalResult, evaluate, summarize
from llm_zoo_train.evaluation.plan import eval_sampling
from llm_zoo_train.evaluation.tasks import eval_tasks
from llm_zoo_train.kernels.rollout_activations import attached
from llm_zoo_train.models.policy import Policy
from llm_zoo_train.models.sharding import gathered, policy_models, saveable
from llm_zoo_train.reporting.model_card import write_model_cards
from llm_zoo_train.reporting.progress import RunProgress, turn_limit
from llm_zoo_train.reporting.tracking import RunLogger, flatten_config, plot_learning_curve, rollout_metrics
from llm_zoo_train.reporting.update_progress import update_layer_progress
from llm_zoo_train.rollout.asynchronous import AsyncRollouts, algorithm_settings
from llm_zoo_train.rollout.env_servers import check_envs_answer, configure_env_servers
from llm_zoo_train.rollout.replay import GenerationRecorder, ReplayEngine
from llm_zoo_train.rollout.step import StepRollout, play_step, save_step_rollout
from llm_zoo_train.rollout.team_credit import team_credit_metrics
from llm_zoo_train.rollout.tree import NonFiniteRewardError
from llm_zoo_train.runs.checkpoint import find_checkpoint, warn_line
from llm_zoo_train.runs.finite import NonFiniteError, check_finite_metrics, check_finite_weights
from llm_zoo_train.runs.interrupts import InterruptGuard, RunInterrupted
from llm_zoo_train.runs.memory import keep_freed_memory
from llm_zoo_train.runs.run_dir import (
    ResumePoint,
    begin_run,
    check_resume,
    save_final_adapters,
    start_run,
    step_evaluated,
)
from llm_zoo_train.runs.seeding import derive_seed
from llm_zoo_train.trainer_setup import (
    base_fingerprints,
    check_resumed_base,
    check_strategy,
    load_policy,
    make_accelerator,
    make_engine,
    make_optimizers,
)
from llm_zoo_train.trainer_state import (
    capture_save_point,
    restore_trainer,
    save_interrupted,
    save_trainer_checkpoint,
)
from llm_zoo_train.training.advantages import compute_advantages
from llm_zoo_train.training.model_pools import ModelRouter, live_engine, make_updater
from llm_zoo_train.training.update import mean_across_processes

__all__ = ["Trainer", "derive_seed"]


class Trainer:
    """Trains the adapters of ``config`` (see the module docstring for one step).

    Args:
        config: The run's configuration; it is validated (env, agents) before any model loads.
        resume_from: A checkpoint directory, or an output directory whose newest checkpoint is used.
        accelerator: An ``accelerate.Accelerator`` (default: one built from the config).

    The constructor loads the model; :meth:`train` runs the loop.
    """

    def __init__(self, config: Config, *, resume_from: str | Path | None = None, accelerator: Any = None):
        #: The output directory's lock (llm_zoo_train.runs.lock), released when train() ends.
        self.run_lock: Any = None
        try:
            self._setup(config, resume_from, accelerator)
        except BaseException:
            if self.run_lock is not None:  # a model that does not load leaves the directory free
                self.run_lock.release()
            raise

    def _setup(self, config: Config, resume_from: str | Path | None, accelerator: Any) -> None:
        self.config = config
        self.plan = validate(config)
        configure_env_servers(config.env.servers)
        training = config.training
        self.output_dir = Path(training.output_dir)
        checkpoint = find_checkpoint(resume_from) if resume_from is not None else None
        if accelerator is None:
            accelerator = make_accelerator(config, self.output_dir)
        self.accelerator = accelerator
        #: training.strategy fsdp2: the model is sharded across the processes (models.sharding).
        self.sharded = training.strategy == "fsdp2"
        check_strategy(training, accelerator)
        if training.keep_freed_memory and accelerator.device.type == "cpu" and not self.sharded:
            keep_freed_memory()
        #: Where a resumed run continues (None: a new run); checked before any model loads.
        self.resume_point: ResumePoint | None
        self.resume_point, self.run_lock = start_run(config, checkpoint, accelerator)
        #: Ctrl-C and SIGTERM while train() runs (llm_zoo_train.runs.interrupts).
        self.interrupts = InterruptGuard()
        from accelerate.utils import set_seed

        set_seed(training.seed)
        #: The trainer's own generator (micro-batch order); saved and restored by checkpoints.
        self.rng = np.random.default_rng(training.seed)
        #: Console progress of the phases; the run's own while :meth:`train` runs.
        self.progress = RunProgress.disabled()
        load_start = time.perf_counter()
        names = ", ".join(model.name_or_path for model in self.plan.models.values())
        accelerator.print(f"loading model {names} ...")
        #: A Policy, or a PolicyGroup when agents.base_models puts agents on several base models.
        self.policy = load_policy(config, self.plan, accelerator, sharded=self.sharded)
        #: Each base model's files, as a checkpoint records them: a resume refuses a base replaced
        #: under the same path (llm_zoo_train.runs.base_fingerprint).
        self.base_fingerprints, base_paths = base_fingerprints(self.plan)
        if checkpoint is not None:
            check_resumed_base(checkpoint, self.base_fingerprints, base_paths)
        #: The PEFT model (None with several base models: each is in self.policy.policies).
        self.model = self.policy.model if isinstance(self.policy, Policy) else None
        accelerator.print(f"model loaded in {time.perf_counter() - load_start:.1f} s")
        self.engine = self._make_engine()
        #: Evaluation plays new episodes, which a replayed recording does not hold: the live model
        #: answers. It prefills without the prefix cache, so that its figures are those of
        #: ``llm-zoo-train eval`` and of a run without the cache.
        live = self._live_engine() if isinstance(self.engine, ReplayEngine) else self.engine
        self.eval_engine = live.without_prefix_cache() if isinstance(live, HFEngine | ModelRouter) else live
        self._served_paths: dict[str, Path] = {}  # adapter -> directory the engine loaded it from

        self.optimizers, self.schedulers = make_optimizers(
            self.policy, self.plan.trainable, training, accelerator
        )
        self.updater = make_updater(
            self.policy,
            self.optimizers,
            accelerator,
            algorithm_settings(config),  # importance sampling on by default for async rollouts
            # the packed copies of the oneDNN update kernel need whole weights, which fsdp2 shards
            dataclasses.replace(training, update_kernel="exact") if self.sharded else training,
            temperature=config.rollout.temperature,
            agent_temperatures={
                agent: float(o["temperature"])
                for agent, o in rollout_overrides(config).items()
                if "temperature" in o
            },
            max_completion_length=config.rollout.max_completion_length,
            rng=self.rng,
            lockstep=self.sharded,
        )
        self.step = 0
        self.version = 0
        self.history: list[dict[str, float]] = []
        #: The generation process's side of rollout.async_steps > 0 (None: synchronous rollouts).
        self.async_rollouts = self._async_rollouts() if config.rollout.async_steps else None
        # The model, the env (on every configured server) and the config work: only now may an
        # earlier run be replaced.
        check_envs_answer(config.env.id, [train_env_kwargs(config), eval_env_kwargs(config)])
        begin_run(config, checkpoint is not None, accelerator)
        if checkpoint is not None:
            loaded = restore_trainer(self, checkpoint, warn_line)
            if loaded != checkpoint:  # the checkpoint could not be loaded: an older one was
                self.resume_point = check_resume(loaded, config)
                accelerator.print(self.resume_point.describe(training.max_steps))
        self._sync_engine()

    # ------------------------------------------------------------------ the loop

    def _interrupted_evaluation(self) -> bool:
        """Whether the resumed checkpoint's step was due an evaluation its record lacks."""
        evaluation = self.config.eval
        if self.resume_point is None or self.step == 0 or not evaluation.num_episodes:
            return False
        final = self.step >= self.config.training.max_steps  # a run ends with an evaluation
        if not final and (not evaluation.eval_steps or self.step % evaluation.eval_steps):
            return False
        return not step_evaluated(self.history, self.step)

    def train(self, *, stop_after_step: int | None = None) -> dict[str, Any]:
        """Run until ``training.max_steps`` (or, for tests, return right after ``stop_after_step``).

        Returns ``{"before": EvalResult-like dict or None, "after": ..., "history": [...]}``.
        """
        config, accelerator = self.config, self.accelerator
        max_steps = config.training.max_steps
        finishing = self.resume_point is not None and self.resume_point.finished(max_steps)
        if finishing and not self._interrupted_evaluation():
            # Said so at start; nothing to do: no evaluation, no rewritten outputs, no before/after.
            return {"before": None, "after": None, "history": self.history, "finished": True}
        if config.logging.log_with:
            accelerator.init_trackers(
                config.logging.project_name,
                config=flatten_config(config_to_dict(config)),
                init_kwargs={"wandb": {"name": config.logging.run_name or self.output_dir.name}},
            )
        logger = RunLogger(
            accelerator,
            self.output_dir,
            self.history,
            total_steps=max_steps,
            logging_steps=config.logging.logging_steps,
            progress_bar=config.logging.progress_bar,
        )
        self.progress = logger.progress
        self.interrupts.install()
        self._save_point = capture_save_point(self)
        try:
            if self.step == 0 and not self.history and config.eval.eval_on_start and config.eval.num_episodes:
                metrics = self._evaluation_metrics()
                logger.log(0, metrics)
                logger.print(f"eval success rate before training: {_describe(metrics)}")
            if self._interrupted_evaluation():
                # the step's record was kept without it (a signal stopped it): it is run now, not lost
                logger.print(f"the evaluation of step {self.step} was interrupted: running it again")
                metrics = self._evaluation_metrics()
                logger.log(self.step, metrics)
                logger.print(f"eval success rate at step {self.step}: {_describe(metrics)}")
                if finishing:  # its checkpoint keeps the record: a later resume finds the run finished
                    self.save_checkpoint()
            while self.step < max_steps:
                step = self.step + 1
                metrics = self.train_step(step)
                self.step = step
                self._save_point = capture_save_point(self)
                logger.step_done(step, metrics)  # the step's line now, not after an evaluation of minutes
                eval_steps = config.eval.eval_steps
                try:
                    self.interrupts.end_update()  # a signal during the update stops here
                    if config.eval.num_episodes and (
                        step == max_steps or (eval_steps and step % eval_steps == 0)
                    ):
                        metrics.update(self._evaluation_metrics())
                finally:
                    logger.log(step, metrics)  # the step is complete, even when its evaluation is not
                save_steps = config.training.save_steps
                if step == max_steps or (save_steps and step % save_steps == 0):
                    self.save_checkpoint()
                self._save_point = capture_save_point(self)
                if stop_after_step is not None and step >= stop_after_step and step < max_steps:
                    return {"before": None, "after": None, "history": self.history}
            if (
                max_steps == 0
                and config.eval.num_episodes
                and not any("eval/success_rate" in r for r in self.history)
            ):
                logger.log(0, self._evaluation_metrics())
        except RunInterrupted as interrupted:
            logger.close()
            interrupted.checkpoint = save_interrupted(self, self._save_point)
            self.run_lock.release()
            raise
        except BaseException:
            self.run_lock.release()
            raise
        finally:
            self.interrupts.uninstall()
            if self.async_rollouts is not None:
                self.async_rollouts.close()  # no generation process outlives train(), error or not
            logger.close()
            self.progress = RunProgress.disabled()
        try:
            return self._finish(logger)
        finally:
            self.run_lock.release()  # after the final adapters are written

    def train_step(self, step: int) -> dict[str, float]:
        """One rollout and one update of every trainable adapter; returns the step's metrics."""
        rollout, algorithm = self.config.rollout, self.config.algorithm
        start = time.perf_counter()
        if self.async_rollouts is not None:
            produced, waited = self.async_rollouts.take(step, self.version, self.config.training.max_steps)
        else:
            try:
                produced = self._rollout(step)
            except NonFiniteRewardError as err:  # one line from the CLI, like a non-finite update
                raise NonFiniteError(
                    f"step {step}: {err}; stopped before anything of this step was trained or saved"
                ) from err
        samples = produced.samples

        kept, stats = compute_advantages(
            samples,
            scale_rewards=algorithm.scale_rewards,
            zero_variance_groups=algorithm.zero_variance_groups,
            epsilon=algorithm.advantage_epsilon,
        )
        metrics = mean_across_processes(
            self.accelerator,
            {**rollout_metrics(samples, kept, stats, rollout.mode), **team_credit_metrics(samples)},
        )
        if self.async_rollouts is not None:
            metrics["rollout/policy_version"] = float(produced.policy_version)
            metrics["rollout/staleness"] = float(self.version - produced.policy_version)
            metrics["time/rollout_wait"] = waited
            if rollout.async_trainer_envs:
                metrics["time/trainer_rollout"] = self.async_rollouts.own_seconds

        update_start = time.perf_counter()
        sleep, wake_up = getattr(self.engine, "sleep", None), getattr(self.engine, "wake_up", None)
        if sleep is not None:
            sleep()  # vLLM with sleep mode gives its GPU memory to the update (no-op otherwise)
        self.interrupts.begin_update()  # from here to the end of the step a signal waits for it
        for adapter in self.plan.trainable:
            with (
                self.progress.update(step, adapter) as phase,
                update_layer_progress(self._model_of(adapter), phase),
            ):
                try:
                    result = self.updater.update(adapter, [s for s in kept if s.adapter == adapter], phase)
                except NonFiniteError as err:
                    raise NonFiniteError(f"step {step}: {err}") from None
            check_finite_metrics(adapter, result, step)
            check_finite_weights(adapter, self.policy.adapter_parameters(adapter), step)
            metrics.update(result)
            # An adapter without samples makes no update and reports nothing: record its 0, so the
            # console, metrics.jsonl and the learning curve say what it trained.
            metrics.setdefault(f"update/{adapter}/samples", 0.0)
        if wake_up is not None:
            wake_up()
        # The rollout's recorded outputs have served this step's updates: none is of use after them
        # (frozen adapters' included, whose records would otherwise pile up to the store's limit).
        for model in {id(m): m for m in map(self._model_of, self.plan.adapters)}.values():
            store = attached(model)
            if store is not None:
                store.clear()
        for adapter, scheduler in self.schedulers.items():
            metrics[f"update/{adapter}/learning_rate"] = float(scheduler.get_last_lr()[0])
            with warnings.catch_warnings():
                # The schedule follows training steps; a step whose groups all had zero variance
                # makes no optimizer step, which torch would report as a misordered call.
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
                scheduler.step()
        self.version += 1
        self._sync_engine(self.plan.trainable)
        metrics["time/generation"] = produced.generation_seconds
        metrics["time/env"] = produced.seconds - produced.generation_seconds
        metrics["time/update"] = time.perf_counter() - update_start
        metrics["time/step"] = time.perf_counter() - start
        return metrics

    def _rollout(self, step: int, envs: range | None = None) -> StepRollout:
        """Step ``step``'s rollout (its tasks ``envs``; ``None``: all), played here with the
        adapters being trained."""
        rollout, accelerator = self.config.rollout, self.accelerator
        rank = accelerator.process_index
        if isinstance(self.engine, ReplayEngine):
            self.engine.load_step(step, rank, accelerator.num_processes)
        recorder = GenerationRecorder(self.engine) if rollout.save_rollouts else None
        watched = self.progress.rollout(
            recorder or self.engine,
            step,
            len(envs) if envs is not None else rollout.envs_per_step,
            mode=rollout.mode,
            num_generations=rollout.num_generations,
            agents_per_turn=len(self.plan.agent_adapters),
            max_turns=turn_limit(self.config.env.kwargs),
        )
        with self._whole_weights(self.engine):
            produced = play_step(
                self.config, self.plan.agent_adapters, watched, step, rank, self.version, envs
            )
        watched.close()
        if isinstance(self.engine, ReplayEngine):
            self.engine.check_all_served()
        if recorder is not None:
            save_step_rollout(self.output_dir, produced, rank, accelerator.num_processes, recorder)
        return produced

    # ------------------------------------------------------------------ evaluation

    def evaluate(self) -> EvalResult:
        """Success rate of the current adapters on ``eval.num_episodes`` evaluation tasks."""
        config, accelerator = self.config, self.accelerator
        settings = config.eval
        tasks = eval_tasks(
            config.env.id,
            eval_env_kwargs(config),
            settings.num_episodes,
            settings.seed,
            distinct=settings.distinct_problems,
        )
        local = tasks.seeds[accelerator.process_index :: accelerator.num_processes]
        ids = tasks.problem_ids
        local_ids = None if ids is None else ids[accelerator.process_index :: accelerator.num_processes]
        sampling = eval_sampling(config, accelerator.process_index)
        watched = self.progress.evaluation(
            self.eval_engine,
            len(local),
            agents_per_turn=len(self.plan.agent_adapters),
            max_turns=turn_limit(eval_env_kwargs(config)),
        )
        with self._whole_weights(self.eval_engine):
            _, episodes = evaluate(
                watched,
                config.env.id,
                eval_env_kwargs(config),
                local,
                self.plan.agent_adapters,
                sampling,
                local_ids,
            )
        watched.close()
        if accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            episodes = gather_object(episodes)
        return summarize(episodes)

    def _whole_weights(self, engine: Any) -> contextlib.AbstractContextManager[None]:
        """While ``engine`` generates with the live model: under fsdp2 the model gathered whole
        (every process enters together), so each process generates at its own pace."""
        if self.sharded and isinstance(engine, HFEngine | ModelRouter):
            return gathered(policy_models(self.policy))
        return contextlib.nullcontext()

    def _model_of(self, adapter: str) -> Any:
        """The base model that carries ``adapter`` (a pool of base models has several)."""
        policy_of = getattr(self.policy, "policy_of", None)
        return (policy_of(adapter) if policy_of is not None else self.policy).model

    def _evaluation_metrics(self) -> dict[str, float]:
        start = time.perf_counter()
        metrics = self.evaluate().metrics()
        metrics["time/eval"] = time.perf_counter() - start
        return metrics

    # ------------------------------------------------------------------ engine, checkpoints, end

    def _make_engine(self) -> Any:
        return make_engine(self.config, self.plan, self.policy, sharded=self.sharded)

    def _live_engine(self) -> HFEngine | ModelRouter:
        return live_engine(self.config, self.plan, self.policy, sharded=self.sharded)

    def _sync_engine(self, adapters: Sequence[str] | None = None) -> None:
        """Hand the current ``adapters`` (default: all) to an engine that keeps its own copy of the
        weights, as version ``self.version``; older saved versions are deleted."""
        if isinstance(self.engine, HFEngine | ModelRouter | ReplayEngine):
            return  # generates with the live model, or replays a recording: nothing to load
        if adapters is not None and not adapters:
            return
        root = self.output_dir / "engine_adapters" / f"rank{self.accelerator.process_index}"
        paths = saveable(self.policy, adapters).save_adapters(root / f"v{self.version}", adapters)
        self.engine.load_adapters(paths, self.version)
        self._served_paths.update({name: Path(path) for name, path in paths.items()})
        in_use = {path.parent for path in self._served_paths.values()}
        for old in root.glob("v*"):
            if old not in in_use:  # no adapter is served from this version any more
                shutil.rmtree(old, ignore_errors=True)

    def save_checkpoint(self) -> Path:
        """Write ``output_dir/checkpoint-STEP`` atomically (see :mod:`llm_zoo_train.trainer_state`);
        with async rollouts, after the rollouts in flight arrive (the checkpoint keeps them)."""
        if self.async_rollouts is not None:
            self.async_rollouts.wait_for_in_flight()
        return save_trainer_checkpoint(self)

    def _async_rollouts(self) -> AsyncRollouts:
        if self.accelerator.num_processes > 1 or not isinstance(self.policy, Policy):
            raise ConfigError(
                "rollout.async_steps > 0 runs with one training process and one base model for now: "
                "use async_steps 0 with several processes or agents.base_models"
            )
        return AsyncRollouts(
            self.config,
            self.policy,
            output_dir=self.output_dir,
            rank=self.accelerator.process_index,
            num_processes=self.accelerator.num_processes,
            device=str(self.accelerator.device),
            play_own=self._rollout,
        )

    def _finish(self, logger: RunLogger) -> dict[str, Any]:
        accelerator = self.accelerator
        evals = [r for r in self.history if "eval/success_rate" in r]
        before = next((r for r in evals if r["step"] == 0), None)
        after = next(
            (r for r in reversed(evals) if r["step"] > 0 or self.config.training.max_steps == 0), None
        )
        final = saveable(self.policy)  # under fsdp2 gathered whole, by every process
        if accelerator.is_main_process:
            save_final_adapters(
                self.output_dir,
                final,
                lambda directory: write_model_cards(
                    directory,
                    self.config,
                    self.plan,
                    self.step,
                    self.history,
                    final_dir=self.output_dir / "adapters",  # written in a temporary dir, renamed
                ),
            )
            if self.config.logging.plot and self.history:
                plot = plot_learning_curve(
                    self.history,
                    self.output_dir / "learning_curve.png",
                    title=f"{self.config.env.id} - {self.config.model.name_or_path}",
                )
                logger.print(f"learning curve: {plot}")
            logger.print(f"adapters: {self.output_dir / 'adapters'}  metrics: {logger.path}")
            if before is not None:
                logger.print(f"eval success rate before training: {_describe(before)}")
            if after is not None:
                logger.print(f"eval success rate after training:  {_describe(after)}")
        accelerator.wait_for_everyone()
        accelerator.end_training()
        return {"before": before, "after": after, "history": self.history}

    def close(self) -> None:
        """Stop the engine's worker processes (vLLM); the trainer cannot generate afterwards.

        Separate from :meth:`train` so callers can still use the engine after a run (for example to
        compare what it serves with the live policy).
        """
        if self.async_rollouts is not None:
            self.async_rollouts.close()
        close = getattr(self.engine, "close", None)
        if close is not None and not isinstance(self.engine, HFEngine):
            close()


def _describe(record: Mapping[str, float]) -> str:
    n = int(record.get("eval/num_episodes", 0))
    successes = round(record["eval/success_rate"] * n)
    return (
        f"{100 * record['eval/success_rate']:.1f}% (95% CI {100 * record['eval/success_ci_low']:.1f}-"
        f"{100 * record['eval/success_ci_high']:.1f}%, {successes}/{n} episodes)"
    )
