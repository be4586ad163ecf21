"""The policy: a frozen base model with one LoRA adapter per agent, and its chat template."""
