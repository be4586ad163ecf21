"""The transformers engine: generation on the live (training) model, adapters by name.

:mod:`~llm_zoo_train.engines.hf.engine` is the engine (:class:`~llm_zoo_train.engines.hf.engine.HFEngine`);
beside it are its parts: the prompt pass shared by a prompt's samples
(:mod:`~llm_zoo_train.engines.hf.prefill`), the decode loop that drops finished rows
(:mod:`~llm_zoo_train.engines.hf.decode`), the key/value buffer it decodes into
(:mod:`~llm_zoo_train.engines.hf.kv_buffer`), the cache of shared prompt prefixes
(:mod:`~llm_zoo_train.engines.hf.prefix_cache`) and the progress of long prompt readings
(:mod:`~llm_zoo_train.engines.hf.reading`).
"""
