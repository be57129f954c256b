"""Policy classes written for another engine's API, adapted to kvoffload's contract.

The factory does not know engines: it asks the adapters advertised under the entry-point group
``kvoffload.policy_adapters`` whether they recognise a class that is not a kvoffload
``CachePolicy`` (layer arrows point one way). This module is kvoffload's own entry: it
recognises vLLM ``CachePolicy`` subclasses by their module names, so vLLM is imported only for
such a class.
"""

from __future__ import annotations

import inspect

from kvoffload.policies.base import CachePolicy

#: Classes defined under this package (or subclassing one) are vLLM-API policies.
VLLM_POLICY_PACKAGE = "vllm.v1.kv_offload"


def is_vllm_policy_class(obj: object) -> bool:
    """A class written against vLLM's CachePolicy API (checked by name: vLLM is not imported)."""
    return inspect.isclass(obj) and any(
        getattr(klass, "__module__", "").startswith(VLLM_POLICY_PACKAGE) for klass in obj.__mro__
    )


def adapt_vllm_policy_class(obj: object) -> type[CachePolicy] | None:
    """The kvoffload adapter class for a vLLM-API policy class, or ``None`` if ``obj`` isn't one."""
    if not is_vllm_policy_class(obj):
        return None
    from kvoffload.integrations.vllm_policy_adapter import adapt_vllm_policy

    return adapt_vllm_policy(obj)  # type: ignore[arg-type]


__all__ = ["VLLM_POLICY_PACKAGE", "adapt_vllm_policy_class", "is_vllm_policy_class"]
