"""A tiny random chat model and tokenizer, built offline for the trainer tests.

``build_tiny_model_dir(path)`` writes a Llama-architecture model (about 100k parameters) and a
byte-level BPE tokenizer with a ChatML chat template, loadable with ``from_pretrained(path)`` like
any hub model. Everything is seeded, so every build is identical.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "apple banana cherry say the word reply with one word",
    'U D L R move up down left right #### ["U", "R"]',
    "def main(): print(sum(map(int, input().split())))",
    "The answer is \\boxed{42}. 0 1 2 3 4 5 6 7 8 9",
    "You are the tool agent. You are the plan agent. Grid: # . @ $ * +",
] * 20


def train_byte_level_bpe(corpus: list[str], vocab_size: int, special_tokens: list[str]):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``corpus`` (at most ``vocab_size`` tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return tokenizer


def build_tokenizer():
    from transformers import PreTrainedTokenizerFast

    tokenizer = train_byte_level_bpe(_CORPUS, 400, ["<pad>", "<|im_start|>", "<|im_end|>"])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_llama_config(tokenizer, **sizes):
    """A two-layer Llama config over ``tokenizer``'s vocabulary and special tokens: hidden size 32,
    4 heads (2 key/value heads) unless ``sizes`` says otherwise (any ``LlamaConfig`` field)."""
    from transformers import LlamaConfig

    fields = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    return LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**fields, **sizes},
    )


def build_tiny_model_dir(path: str | Path, *, seed: int = 0) -> Path:
    """Write the tiny model and its tokenizer to ``path`` and return it."""
    import torch
    from transformers import LlamaForCausalLM

    path = Path(path)
    tokenizer = build_tokenizer()
    config = tiny_llama_config(tokenizer)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_lora_engine(model_dir: str | Path, adapters: list[str], *, max_batch_size: int = 16):
    """An :class:`~llm_zoo_train.engines.hf.engine.HFEngine` over the tiny model with one random LoRA
    adapter (``r=4`` on q/v, seeded, not zero-initialised, so adapters answer differently) per
    name in ``adapters``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_zoo_train.engines.hf.engine import HFEngine

    def lora() -> LoraConfig:
        return LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), lora(), adapter_name=adapters[0])
    for name in adapters[1:]:
        model.add_adapter(name, lora())
    return HFEngine(model, AutoTokenizer.from_pretrained(model_dir), max_batch_size=max_batch_size)
