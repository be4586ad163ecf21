"""The vLLM engines: vLLM in this process, or vLLM OpenAI-compatible servers with LoRA synced at run time.

* :mod:`~llm_zoo_train.engines.vllm.engine`: one in-process vLLM engine with one LoRA per agent
  (``rollout.engine: vllm``), placed on GPUs by :mod:`~llm_zoo_train.engines.vllm.placement`.
* :mod:`~llm_zoo_train.engines.vllm.server`: vLLM servers started by the user
  (``rollout.engine: vllm_server``), reached through
  :mod:`~llm_zoo_train.engines.vllm.server_client` and checked by
  :mod:`~llm_zoo_train.engines.vllm.server_checks`;
  :mod:`~llm_zoo_train.engines.vllm.server_launch` starts one on this machine.
* :mod:`~llm_zoo_train.engines.vllm.requests`: what both share: LoRA ranks and adapters as vLLM
  takes them, and one request's sampling fields.

Nothing here imports vLLM until an engine is built, so the package imports where vLLM is absent.
"""
