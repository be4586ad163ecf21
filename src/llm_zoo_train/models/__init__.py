"""The policy: a frozen base model with one LoRA adapter per agent, its chat template, and its FSDP2 sharding.

The CPU speed kernels that run it faster are apart, in :mod:`llm_zoo_train.kernels`.
"""
