"""Live progress within an update's micro-batch (llm_zoo_train.reporting.update_progress): the decoder layers
the forward and the backward pass have reached; the gradients are bit for bit those without it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from llm_zoo_train.engines.hf.reading import decoder_layers  # noqa: E402
from llm_zoo_train.reporting.update_progress import update_layer_progress  # noqa: E402


class RecordingPhase:
    def __init__(self):
        self.infos: list[str] = []

    def update(self, completed=None, *, total=None, info=None):
        if info is not None:
            self.infos.append(info)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    return get_peft_model(base, config, adapter_name="one")


def lora_gradients(model, phase=None) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    ids = torch.arange(3, 3 + 2 * 9).reshape(2, 9) % model.config.vocab_size
    if phase is None:
        model(input_ids=ids, labels=ids).loss.backward()
    else:
        with update_layer_progress(model, phase):
            model(input_ids=ids, labels=ids).loss.backward()
    return [p.grad.clone() for p in model.parameters() if p.requires_grad]


def test_forward_and_backward_layers_are_reported_and_the_gradients_are_unchanged(model):
    layers = model.config.num_hidden_layers
    plain = lora_gradients(model)
    phase = RecordingPhase()
    watched = lora_gradients(model, phase)
    assert all(torch.equal(a, b) for a, b in zip(plain, watched, strict=True))
    forward = [f"forward, {i}/{layers} layers" for i in range(1, layers + 1)]
    backward = [f"backward, {i}/{layers} layers" for i in range(1, layers + 1)]
    head = ["forward, vocabulary projection and loss"], ["backward, vocabulary projection and loss"]
    # the text is cleared when the block ends
    assert phase.infos == [*forward, *head[0], *head[1], *backward, ""]
    watched = [*decoder_layers(model), model.get_output_embeddings()]
    assert sum(len(module._forward_hooks) for module in watched) == 0


def test_a_pass_without_gradient_reports_its_forward_only(model):
    phase = RecordingPhase()
    with torch.no_grad(), update_layer_progress(model, phase):
        model(input_ids=torch.tensor([[3, 4, 5]]))
    assert phase.infos[-2:] == ["forward, vocabulary projection and loss", ""]
    assert not any(info.startswith("backward") for info in phase.infos)
