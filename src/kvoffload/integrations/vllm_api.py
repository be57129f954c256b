"""vLLM's KV-offload policy API, imported once and checked against the release line we support.

Both adapters need the same few vLLM names; importing them here gives one clear error when vLLM
is missing or too old, instead of an ``AttributeError`` deep inside vLLM's scheduler.

Support is decided by what the installed vLLM has, not by its version string: the adapters need
``CachePolicy.on_request_access`` and ``on_request_finished(key_groups, insertion_only_keys,
reused_keys, req_context)`` and ``insert(key, chunk, req_context)``, all new in vLLM 0.33 (see
``docs/vllm-api-notes.md``). A release not in ``TESTED_VLLM_VERSIONS`` that has them is used
with a warning.
"""

from __future__ import annotations

import inspect
import logging
from importlib import metadata

logger = logging.getLogger(__name__)

#: vLLM releases the adapters were tested against (``tests/integrations/test_vllm.py``).
TESTED_VLLM_VERSIONS = ("0.33.0",)
SUPPORTED_RELEASE_LINE = "0.33"
_INSTALL_HINT = "pip install 'vllm>=0.33,<0.34'"


def installed_vllm_version() -> str:
    """The installed vLLM distribution's version, or ``"unknown"`` without package metadata."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return "unknown"


try:
    from vllm.v1.kv_offload.base import ReqContext as VllmReqContext
    from vllm.v1.kv_offload.base import get_offload_group_idx
    from vllm.v1.kv_offload.cpu.policies.base import CachePolicy as VllmCachePolicy
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
except ImportError as exc:
    raise ImportError(
        "kvoffload's vLLM integration needs vLLM's KV-offload policy API "
        f"(vllm.v1.kv_offload.cpu.policies, vLLM {SUPPORTED_RELEASE_LINE}.x), which could not "
        f"be imported: {exc}. Install vLLM: {_INSTALL_HINT}."
    ) from exc

VLLM_VERSION = installed_vllm_version()


def missing_features(policy_base: type) -> list[str]:
    """What the adapters need that ``policy_base`` (vLLM's ``CachePolicy``) lacks."""
    missing = [
        f"CachePolicy.{name}"
        for name in ("on_store_miss", "on_request_access", "on_request_finished")
        if not callable(getattr(policy_base, name, None))
    ]
    insert = getattr(policy_base, "insert", None)
    if not callable(insert) or len(inspect.signature(insert).parameters) < 4:
        missing.append("CachePolicy.insert(key, chunk, req_context)")
    finished = getattr(policy_base, "on_request_finished", None)
    if callable(finished) and len(inspect.signature(finished).parameters) < 5:
        missing.append(
            "CachePolicy.on_request_finished(key_groups, insertion_only_keys, reused_keys, "
            "req_context)"
        )
    return missing


def check_supported(policy_base: type, version: str) -> None:
    """Raise ``ImportError`` if ``policy_base`` lacks what the adapters need; warn if untested."""
    missing = missing_features(policy_base)
    if missing:
        raise ImportError(
            f"vLLM {version} is not supported by kvoffload's vLLM integration: its "
            f"CachePolicy API lacks {', '.join(missing)} (added in vLLM "
            f"{SUPPORTED_RELEASE_LINE}). Upgrade: {_INSTALL_HINT}."
        )
    if version not in TESTED_VLLM_VERSIONS:
        logger.warning(
            "kvoffload's vLLM integration was tested with vLLM %s; vLLM %s is installed. Its "
            "CachePolicy API has the methods the adapters need, but behaviour is untested.",
            ", ".join(TESTED_VLLM_VERSIONS),
            version,
        )


check_supported(VllmCachePolicy, VLLM_VERSION)

__all__ = [
    "SUPPORTED_RELEASE_LINE",
    "TESTED_VLLM_VERSIONS",
    "VLLM_VERSION",
    "ChunkStatus",
    "VllmCachePolicy",
    "VllmReqContext",
    "check_supported",
    "get_offload_group_idx",
    "installed_vllm_version",
    "missing_features",
]
