"""Training metrics: what is measured on a rollout, and where metrics go.

:func:`rollout_metrics` turns one step's samples into per-agent numbers; :class:`RunLogger`
sends every step's metrics to ``metrics.jsonl``, the Accelerate trackers (TensorBoard, W&B) and,
every ``logging_steps``, the console under a progress bar; :func:`plot_learning_curve` draws the
PNG written at the end of a run.

Metric names: ``{agent}/...`` per agent (rewards, success, advantages, groups, lengths),
``update/{adapter}/...`` per trained adapter (loss, clip fractions, KL, entropy, gradient norm,
learning rate), ``train/...`` for the whole step, ``eval/...`` for evaluations, ``time/...`` for
wall-clock seconds (the only values that differ between two runs with one seed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from llm_zoo_train.reporting.progress import RunProgress
from llm_zoo_train.rollout.samples import Sample
from llm_zoo_train.runs.checkpoint import write_error
from llm_zoo_train.training.advantages import group_samples

__all__ = [
    "RunLogger",
    "answers_text",
    "episode_successes",
    "flatten_config",
    "plot_learning_curve",
    "rollout_metrics",
    "trained_samples",
    "trained_samples_text",
]


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return float(np.mean(values)) if values else 0.0


def episode_successes(samples: Sequence[Sample], mode: str) -> list[bool]:
    """Success of each training episode: the chosen branch of each env (tree mode), or each of the
    K episodes of each env (independent mode, told apart by ``branch``)."""
    outcome: dict[tuple[int, int], bool] = {}
    for sample in samples:
        if not sample.chosen:
            continue
        key = (sample.env_index, sample.branch if mode == "independent" else 0)
        outcome[key] = outcome.get(key, False) or sample.success
    return [outcome[key] for key in sorted(outcome)]


def rollout_metrics(
    samples: Sequence[Sample], kept: Sequence[Sample], advantage_stats: Mapping[str, float], mode: str
) -> dict[str, float]:
    """Per-agent and whole-step metrics of one rollout (``kept``: samples that reach the loss)."""
    metrics: dict[str, float] = {f"train/{k}": float(v) for k, v in advantage_stats.items()}
    successes = episode_successes(samples, mode)
    metrics["train/episodes"] = float(len(successes))
    metrics["train/success_rate"] = _mean(map(float, successes))
    groups = group_samples(samples)
    kept_ids = {id(s) for s in kept}
    for agent in sorted({s.agent for s in samples}):
        mine = [s for s in samples if s.agent == agent]
        agent_groups = [g for g in groups.values() if g[0].agent == agent]
        stds = [float(np.std([s.reward for s in g])) for g in agent_groups]
        lengths = [len(s.completion_token_ids) for s in mine]
        advantages = [s.advantage for s in mine if id(s) in kept_ids]
        metrics.update(
            {
                f"{agent}/reward": _mean(s.reward for s in mine),
                f"{agent}/role_reward": _mean(s.role_reward for s in mine),
                f"{agent}/global_reward": _mean(s.global_reward for s in mine),
                f"{agent}/chosen_reward": _mean(s.reward for s in mine if s.chosen),
                f"{agent}/success": _mean(float(s.success) for s in mine),
                f"{agent}/format_ok": _mean(float(s.format_ok) for s in mine),
                f"{agent}/samples": float(len(mine)),
                f"{agent}/groups": float(len(agent_groups)),
                f"{agent}/zero_variance_groups": float(sum(std <= 1e-9 for std in stds)),
                f"{agent}/group_reward_std": _mean(stds),
                f"{agent}/advantage_mean": _mean(advantages),
                f"{agent}/advantage_abs_mean": _mean(abs(a) for a in advantages),
                f"{agent}/completion_length": _mean(lengths),
                f"{agent}/completion_length_max": float(max(lengths, default=0)),
                f"{agent}/truncated_fraction": _mean(float(s.finish_reason == "length") for s in mine),
            }
        )
        # An env that reports whether the team's answers agree after an action (Math-v0's
        # ``agree``: the reasoner's answer is the tool's printed number): how often the agent
        # follows its teammate, the first sign of a reasoner learning to ignore or override a tool.
        agreements = [agree for agree in (_info(s).get("agree") for s in mine) if isinstance(agree, bool)]
        if agreements:
            metrics[f"{agent}/agree"] = _mean(map(float, agreements))
    return metrics


def _info(sample: Sample) -> Mapping[str, Any]:
    info = sample.extra.get("info") if isinstance(sample.extra, Mapping) else None
    return info if isinstance(info, Mapping) else {}


def trained_samples(metrics: Mapping[str, float]) -> dict[str, float]:
    """Samples that reached each adapter's update in one step (``update/{adapter}/samples``)."""
    return {
        key.split("/")[1]: value
        for key, value in sorted(metrics.items())
        if key.startswith("update/") and key.endswith("/samples") and key.count("/") == 2
    }


def trained_samples_text(metrics: Mapping[str, float]) -> str:
    """The console's words for what a step trained, e.g. ``trained samples: reasoner 8, tool_agent 0``,
    or, when no sample reached any update, that nothing was trained and why."""
    counts = trained_samples(metrics)
    if not counts or not any(counts.values()):
        return "NOTHING TRAINED this step: every group's K rewards were equal (zero variance), no update"
    return "trained samples: " + ", ".join(f"{adapter} {count:.0f}" for adapter, count in counts.items())


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; non-scalar leaves become strings (TensorBoard hparams)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, f"{name}."))
        elif isinstance(value, bool | int | float | str):
            flat[name] = value
        else:
            flat[name] = json.dumps(value)
    return flat


def json_line(record: Mapping[str, Any]) -> str:
    """One ``metrics.jsonl`` line: non-finite floats become the strings "nan", "inf", "-inf"."""
    return (
        json.dumps(
            {k: v if not isinstance(v, float) or math.isfinite(v) else str(v) for k, v in record.items()}
        )
        + "\n"
    )


class RunLogger:
    """Writes metrics to ``metrics.jsonl``, Accelerate trackers and the console (main process only).

    Args:
        accelerator: The run's Accelerator (trackers already initialised when configured).
        output_dir: Where ``metrics.jsonl`` lives.
        history: Records already logged (a resumed run); ``metrics.jsonl`` is rewritten from them,
            so steps logged after the checkpoint by an interrupted run do not appear twice.
        total_steps: ``max_steps``, for the progress bar.
        logging_steps: Console period.
        progress_bar: Show progress bars on a terminal (plain lines are printed otherwise, see
            :mod:`llm_zoo_train.reporting.progress`).
    """

    def __init__(
        self,
        accelerator: Any,
        output_dir: str | Path,
        history: list[dict[str, float]],
        *,
        total_steps: int,
        logging_steps: int,
        progress_bar: bool,
    ):
        self.accelerator = accelerator
        self.history = history
        self.logging_steps = logging_steps
        self.enabled = accelerator.is_main_process
        self.path = Path(output_dir) / "metrics.jsonl"
        #: The console progress of the run's phases (bars on a terminal, plain lines otherwise).
        self.progress = RunProgress.disabled()
        if not self.enabled:
            return
        from rich.console import Console

        self.console = Console(highlight=False, soft_wrap=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "w", encoding="utf-8") as handle:
            handle.writelines(json_line(record) for record in history)
        done = max((int(r.get("step", 0)) for r in history), default=0)
        self.progress = RunProgress(self.console, total_steps=total_steps, done_steps=done, bars=progress_bar)

    def print(self, text: str) -> None:
        if self.enabled:
            self.console.print(text)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` of ``step`` (merged into that step's record if one exists).

        A NaN or infinite value is kept: a float in the history and for the trackers, and
        ``"nan"``, ``"inf"`` or ``"-inf"`` in ``metrics.jsonl`` (strings: JSON has no such numbers).
        A write that fails (a full disk) raises a one-line
        :class:`~llm_zoo_train.runs.checkpoint.CheckpointWriteError` naming ``metrics.jsonl``.
        """
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        if self.history and self.history[-1].get("step") == step:
            self.history[-1].update(clean)
        else:
            self.history.append({"step": step, **clean})
        self.accelerator.log(clean, step=step)
        if not self.enabled:
            return
        try:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json_line({"step": step, **clean}))
        except OSError as err:
            raise write_error(self.path, err) from err

    def step_done(self, step: int, metrics: Mapping[str, float]) -> None:
        """Advance the progress bar; print a summary line every ``logging_steps``."""
        if not self.enabled:
            return
        line = self.summary(step, metrics)
        self.progress.step_done(step, self.short_status(metrics))
        if step % self.logging_steps == 0:
            self.console.print(line)

    @staticmethod
    def short_status(metrics: Mapping[str, float]) -> str:
        return f"train success {100 * metrics.get('train/success_rate', 0.0):.0f}%"

    @staticmethod
    def summary(step: int, metrics: Mapping[str, float]) -> str:
        agents = sorted({k.split("/")[0] for k in metrics if k.endswith("/reward") and "/" in k} - {"eval"})
        rewards = " ".join(f"{a} {metrics[f'{a}/reward']:+.3f}" for a in agents)
        zero = sum(metrics.get(f"{a}/zero_variance_groups", 0.0) for a in agents)
        groups = sum(metrics.get(f"{a}/groups", 0.0) for a in agents)
        clips = [v for k, v in metrics.items() if k.startswith("update/") and k.endswith("/clip_fraction")]
        kls = [v for k, v in metrics.items() if k.startswith("update/") and k.endswith("/kl")]
        parts = [
            f"step {step}",
            f"reward {rewards}",
            # the step's own (sampled, tree) episodes: not the evaluation's greedy success rate
            f"train success {100 * metrics.get('train/success_rate', 0.0):.1f}%",
            f"zero-var groups {zero:.0f}/{groups:.0f}",
            answers_text(metrics, agents),
            trained_samples_text(metrics),
        ]
        if clips:
            parts.append(f"clip {max(clips):.3f}")
        if kls:
            parts.append(f"kl {max(kls):.4f}")
        parts.append(timing_text(metrics))
        return " | ".join(parts)

    def close(self) -> None:
        self.progress.close()


def answers_text(metrics: Mapping[str, float], agents: Sequence[str]) -> str:
    """Each agent's share of usable answers and of answers cut by the token limit, e.g.
    ``answers usable/cut plan_agent 33/83% tool_agent 0/100%``: the first signs of a collapse
    (#49: a plan agent whose usable share fell to 0 while its success looked alive)."""
    shares = " ".join(
        f"{a} {100 * metrics.get(f'{a}/format_ok', 0.0):.0f}/{100 * metrics.get(f'{a}/truncated_fraction', 0.0):.0f}%"
        for a in agents
    )
    return f"answers usable/cut {shares}"


def timing_text(metrics: Mapping[str, float]) -> str:
    """Where a step's seconds went, for the console line. An asynchronous step (it has
    ``time/rollout_wait``) names what the trainer itself did: its update, its share of the next
    rollouts (``time/trainer_rollout``) and its wait; its generation seconds add up both processes,
    so they can exceed the step's."""
    seconds = {key: metrics.get(f"time/{key}", 0.0) for key in ("step", "generation", "env", "update")}
    if "time/rollout_wait" not in metrics:
        return (
            f"{seconds['step']:.1f}s (gen {seconds['generation']:.1f} env {seconds['env']:.1f} "
            f"update {seconds['update']:.1f})"
        )
    share = metrics.get("time/trainer_rollout")
    return (
        f"{seconds['step']:.1f}s (update {seconds['update']:.1f}"
        + (f", own rollout share {share:.1f}" if share is not None else "")
        + f", waited {metrics['time/rollout_wait']:.1f}; gen {seconds['generation']:.1f} over both processes)"
    )


def plot_learning_curve(history: Sequence[Mapping[str, float]], path: str | Path, title: str = "") -> Path:
    """Draw per-agent mean reward, train/eval success rate and each adapter's trained samples
    (red crosses: steps that trained nothing) against the step into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, (reward_axis, success_axis, trained_axis) = plt.subplots(3, 1, figsize=(8, 9.5), sharex=True)
    train = [r for r in history if "train/success_rate" in r]
    agents = sorted(
        {k.split("/")[0] for r in train for k in r if k.endswith("/reward") and not k.startswith("eval/")}
    )
    for agent in agents:
        points = [(r["step"], r[f"{agent}/reward"]) for r in train if f"{agent}/reward" in r]
        if points:
            reward_axis.plot(*zip(*points, strict=True), marker=".", label=agent)
    reward_axis.set_ylabel("mean reward per sample")
    reward_axis.grid(alpha=0.3)
    if agents:
        reward_axis.legend()
    if train:
        success_axis.plot(
            [r["step"] for r in train],
            [100 * r["train/success_rate"] for r in train],
            marker=".",
            alpha=0.6,
            label="training episodes",
        )
    evals = [r for r in history if "eval/success_rate" in r]
    if evals:
        steps = [r["step"] for r in evals]
        rates = np.array([100 * r["eval/success_rate"] for r in evals])
        low = rates - np.array([100 * r.get("eval/success_ci_low", 0.0) for r in evals])
        high = np.array([100 * r.get("eval/success_ci_high", 1.0) for r in evals]) - rates
        success_axis.errorbar(
            steps, rates, yerr=[low, high], marker="o", capsize=4, label="evaluation (95% CI)"
        )
    success_axis.set_ylabel("success rate (%)")
    success_axis.set_ylim(-2, 102)
    success_axis.grid(alpha=0.3)
    success_axis.legend()
    adapters = sorted({adapter for r in train for adapter in trained_samples(r)})
    for adapter in adapters:
        trained_axis.plot([r["step"] for r in train], [trained_samples(r).get(adapter, 0.0) for r in train],
                          marker="o", label=adapter)  # fmt: skip
    idle = [r["step"] for r in train if not any(trained_samples(r).values())]
    if idle:
        trained_axis.scatter(idle, [0] * len(idle), marker="x", color="red", zorder=3,
                             label="nothing trained (all groups zero-variance)")  # fmt: skip
    trained_axis.set_ylabel("trained samples")
    trained_axis.set_xlabel("training step")
    trained_axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    trained_axis.grid(alpha=0.3)
    if adapters or idle:
        trained_axis.legend()
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
