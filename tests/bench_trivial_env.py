"""Registers ``bench/Keyword-v0`` (the toy KeywordEnv) on import: ``llm-zoo serve --plugin
bench_trivial_env`` serves it to benchmarks/env_server_speed.py."""

import llm_zoo
from toy_envs import KeywordEnv

llm_zoo.register(
    "bench/Keyword-v0", KeywordEnv, description="trivial env for the protocol benchmark", override=True
)
