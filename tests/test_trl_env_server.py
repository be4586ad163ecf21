"""TRL's GRPOTrainer trains the tiny model for 2 steps on Math-v0 through ``llm-zoo serve``, with
its rewards from the env (examples/trl_grpo_env_server.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")
pytest.importorskip("starlette")
torch = pytest.importorskip("torch")

import llm_zoo  # noqa: E402
from llm_zoo.serve import ServerThread  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import trl_grpo_env_server as example  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """GRPOTrainer sets Accelerate's process-wide state (bf16 mixed precision by TRL's default);
    a Trainer built by a later test in this process would find it and refuse its own settings."""
    from accelerate.state import AcceleratorState

    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_trl_grpo_trains_on_math_through_the_server(tiny_model_dir, tmp_path):
    with ServerThread() as url:
        trainer, reward = example.build_trainer(
            url, "Math-v0", str(tiny_model_dir), str(tmp_path / "trl"), steps=2, max_completion_length=8
        )
        trainer.train()
    assert trainer.state.global_step == 2
    assert len(reward.calls) == 2 * 2 * 2  # steps x prompts x generations
    # Each reward is what the env itself gives that completion as the reasoner's first action.
    for seed, text, value in reward.calls:
        env = llm_zoo.make("Math-v0")
        env.reset(seed=seed)
        env.step(text)
        assert env.rewards["reasoner"] == value
    logged = [record["reward"] for record in trainer.state.log_history if "reward" in record]
    per_step = [[r for *_, r in reward.calls[i * 4 : (i + 1) * 4]] for i in range(2)]
    assert logged == pytest.approx([sum(rs) / len(rs) for rs in per_step])
