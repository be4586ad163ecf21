"""Turning an env's plain-text prompt into the token ids a chat model expects.

Environments produce plain text (DESIGN.md: "a chat-template step belongs to the trainer"). Every
engine goes through :func:`encode_prompt`, so the transformers engine, the vLLM engine and the loss
see exactly the same prompt tokens.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["NoChatTemplateWarning", "chat_messages", "encode_prompt"]


class NoChatTemplateWarning(UserWarning):
    """The tokenizer has no chat template; prompts are tokenized as plain text."""


# Tokenizers already warned about (by id): the fallback warning is given once per tokenizer.
_warned: set[int] = set()


def chat_messages(prompt: str, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The conversation the model answers: an optional system message, then one user message."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": prompt})
    return messages


def encode_prompt(tokenizer: Any, prompt: str, system_prompt: str | None = None) -> list[int]:
    """Apply the tokenizer's chat template (one user message, generation prompt added) -> token ids.

    The template is rendered to text and then tokenized without adding special tokens: templates
    write their own BOS/role markers, and adding them again would double them.

    Falls back to plain tokenization (with the tokenizer's usual special tokens; a system prompt is
    put on a line before the prompt) with a clear warning, once per tokenizer, if the tokenizer
    has no chat template.
    """
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            chat_messages(prompt, system_prompt), tokenize=False, add_generation_prompt=True
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if id(tokenizer) not in _warned:
        _warned.add(id(tokenizer))
        warnings.warn(
            f"tokenizer {getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)!r} has no chat "
            "template: prompts are tokenized as plain text. Chat models answer best with their "
            "template; set `tokenizer.chat_template` for a base model.",
            NoChatTemplateWarning,
            stacklevel=2,
        )
    text = f"{system_prompt}\n\n{prompt}" if system_prompt else prompt
    return list(tokenizer(text)["input_ids"])
