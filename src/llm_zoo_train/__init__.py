"""llm_zoo_train: AT-GRPO training of one LoRA adapter per agent on llm_zoo environments."""

__version__ = "0.1.0"
