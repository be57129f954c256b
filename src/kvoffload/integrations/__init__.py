"""Adapters between kvoffload and serving engines (optional; each needs its engine installed).

* :mod:`kvoffload.integrations.vllm`: kvoffload's policies as classes vLLM's own CPU offloading
  manager loads by name (``eviction_policy`` + ``cache_policy_module_path``).
* :mod:`kvoffload.integrations.vllm_policy_adapter`: a policy written against vLLM's
  ``CachePolicy`` API run in kvoffload's manager and simulator (the factory wraps it itself).

Nothing here is imported by the core: ``import kvoffload.integrations`` imports no engine.
"""
