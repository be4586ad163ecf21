"""Bridges from llm-zoo envs to other trainers (:mod:`llm_zoo.integrations.trl`)."""
