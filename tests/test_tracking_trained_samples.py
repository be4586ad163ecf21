"""The console line and the learning curve say how many samples each adapter trained on, in words
when a step trained nothing."""

from __future__ import annotations

from llm_zoo_train.reporting.tracking import (
    RunLogger,
    answers_text,
    plot_learning_curve,
    timing_text,
    trained_samples,
    trained_samples_text,
)


def step_metrics(tool: float, reasoner: float) -> dict[str, float]:
    return {
        "train/success_rate": 0.5,
        "tool_agent/reward": 0.1,
        "reasoner/reward": 0.2,
        "update/tool_agent/samples": tool,
        "update/reasoner/samples": reasoner,
        "update/reasoner/loss": 0.3,
    }


def test_trained_samples_reads_each_adapter():
    assert trained_samples(step_metrics(8, 0)) == {"reasoner": 0.0, "tool_agent": 8.0}
    assert trained_samples({"train/success_rate": 1.0}) == {}


def test_console_words_for_trained_and_untrained_steps():
    assert trained_samples_text(step_metrics(8, 12)) == "trained samples: reasoner 12, tool_agent 8"
    assert trained_samples_text(step_metrics(8, 0)) == "trained samples: reasoner 0, tool_agent 8"
    for idle in (step_metrics(0, 0), {"train/success_rate": 0.0}):
        assert trained_samples_text(idle).startswith("NOTHING TRAINED this step")
        assert "zero variance" in trained_samples_text(idle)
    summary = RunLogger.summary(3, step_metrics(0, 0))
    assert "NOTHING TRAINED" in summary and summary.startswith("step 3")


def test_console_timing_of_synchronous_and_asynchronous_steps():
    sync = {"time/step": 9.0, "time/generation": 6.0, "time/env": 0.5, "time/update": 2.5}
    assert timing_text(sync) == "9.0s (gen 6.0 env 0.5 update 2.5)"
    both = {**sync, "time/generation": 12.0, "time/rollout_wait": 0.25, "time/trainer_rollout": 3.0}
    assert (
        timing_text(both)
        == "9.0s (update 2.5, own rollout share 3.0, waited 0.2; gen 12.0 over both processes)"
    )
    alone = {k: v for k, v in both.items() if k != "time/trainer_rollout"}
    assert timing_text(alone) == "9.0s (update 2.5, waited 0.2; gen 12.0 over both processes)"
    assert RunLogger.summary(2, {**step_metrics(4, 4), **both}).endswith(timing_text(both))


def test_learning_curve_draws_trained_samples(tmp_path, monkeypatch):
    import matplotlib.axes

    drawn: list[tuple[list, list]] = []
    original = matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        if kwargs.get("label") in {"tool_agent", "reasoner"}:
            drawn.append((list(args[0]), list(args[1])))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    history = [{"step": 1, **step_metrics(8, 4)}, {"step": 2, **step_metrics(0, 0)}]
    path = plot_learning_curve(history, tmp_path / "curve.png")
    assert path.stat().st_size > 0
    samples = [series for series in drawn if series[0] == [1, 2]]
    assert ([1, 2], [4.0, 0.0]) in samples and ([1, 2], [8.0, 0.0]) in samples


def test_console_line_shows_each_agents_usable_and_cut_answers():
    """A collapsing agent shows in its usable share (#49: the plan agent's fell to 0)."""
    metrics = {
        **step_metrics(4, 4),
        "tool_agent/format_ok": 0.0,
        "tool_agent/truncated_fraction": 1.0,
        "reasoner/format_ok": 0.25,
        "reasoner/truncated_fraction": 0.5,
    }
    text = answers_text(metrics, ["reasoner", "tool_agent"])
    assert text == "answers usable/cut reasoner 25/50% tool_agent 0/100%"
    assert f"| {text} |" in RunLogger.summary(1, metrics)


def _sample(agent: str, index: int, info: dict | None, *, format_ok: bool = True, cut: bool = False):
    from llm_zoo_train.rollout.samples import Sample

    return Sample(
        env_id="Math-v0", env_index=0, task_id="t", turn=0, agent=agent, adapter=agent,
        group_key=f"0/0/{agent}", branch=index, prompt="p", completion="c", prompt_token_ids=[1],
        completion_token_ids=[2, 3], behaviour_logprobs=[0.0, 0.0], reward=float(index), role_reward=0.0,
        global_reward=0.0, format_ok=format_ok, finish_reason="length" if cut else "stop",
        extra={} if info is None else {"info": info},
    )  # fmt: skip


def test_rollout_metrics_say_how_often_an_agent_follows_its_teammate():
    """Math-v0 reports ``agree`` after the reasoner's answer: the share of agreeing answers shows a
    reasoner learning to override its tool (#49); agents without the key get no such metric."""
    from llm_zoo_train.reporting.tracking import rollout_metrics

    samples = [
        _sample("reasoner", 0, {"agree": True}),
        _sample("reasoner", 1, {"agree": False}, format_ok=False),
        _sample("reasoner", 2, {"agree": True}, cut=True),
        _sample("reasoner", 3, {"agree": True}),
        _sample("tool_agent", 0, {"tool_status": "ok"}),
        _sample("tool_agent", 1, None),
    ]
    metrics = rollout_metrics(samples, samples, {}, "tree")
    assert metrics["reasoner/agree"] == 0.75
    assert "tool_agent/agree" not in metrics
    assert metrics["reasoner/format_ok"] == 0.75 and metrics["reasoner/truncated_fraction"] == 0.25
