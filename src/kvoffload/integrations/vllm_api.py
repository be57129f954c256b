"""vLLM's KV-offload policy API, imported once and checked against the releases we support.

Both adapters need the same few vLLM names; importing them here gives one clear error when vLLM
is missing or too old, instead of an ``AttributeError`` deep inside vLLM's scheduler.

Support is decided by what the installed vLLM has, not by its version string: the adapters need
``CachePolicy.on_request_access`` and ``on_request_finished(key_groups, insertion_only_keys,
reused_keys, req_context)`` and ``insert(key, chunk, req_context)``, all new in vLLM 0.33 (see
``docs/vllm-api-notes.md``). The two releases tested differ in one point the adapters follow:

* 0.33 (``POLICY_HAS_TOUCH``): ``CachePolicy.touch(keys, ctx)`` is abstract, the manager has a
  ``touch`` that forwards to it, and the default ``on_store_miss`` calls it.
* 0.34: ``touch`` is gone from the policy, the manager and the tiers; the default
  ``on_store_miss`` does nothing and ``on_request_finished`` is abstract, so a request's
  accesses reach a policy only through ``on_store_miss`` / ``on_request_access`` /
  ``on_request_finished``.

A release not in ``TESTED_VLLM_VERSIONS`` that has the hooks is used with a one-line warning.
"""

from __future__ import annotations

import inspect
import logging
import re
from importlib import metadata

logger = logging.getLogger(__name__)

#: vLLM releases the adapters were tested against (``tests/integrations``, run by ``.ci/vllm``).
TESTED_VLLM_VERSIONS = ("0.33.0", "0.34.0")
SUPPORTED_RELEASE_LINE = "0.33"
INSTALL_HINT = "pip install 'vllm>=0.33,<0.35'"


def installed_vllm_version() -> str:
    """The installed vLLM distribution's version, or ``"unknown"`` without package metadata."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return "unknown"


def release_tuple(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string (``"0.34.1rc2"`` -> ``(0, 34, 1)``)."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


try:
    from vllm.v1.kv_offload.base import ReqContext as VllmReqContext
    from vllm.v1.kv_offload.base import get_offload_group_idx
    from vllm.v1.kv_offload.cpu.policies.base import CachePolicy as VllmCachePolicy
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
except ImportError as exc:
    raise ImportError(
        "kvoffload's vLLM integration needs vLLM's KV-offload policy API "
        f"(vllm.v1.kv_offload.cpu.policies, vLLM {SUPPORTED_RELEASE_LINE} or later), which "
        f"could not be imported: {exc}. Install vLLM: {INSTALL_HINT}."
    ) from exc

VLLM_VERSION = installed_vllm_version()

#: vLLM 0.33's policy contract: ``touch`` is part of ``CachePolicy`` (0.34 removed it).
POLICY_HAS_TOUCH = callable(getattr(VllmCachePolicy, "touch", None))


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


def untested_warning(version: str) -> str | None:
    """The one-line warning for a release not in ``TESTED_VLLM_VERSIONS`` (None if tested)."""
    if version in TESTED_VLLM_VERSIONS:
        return None
    newest = max(TESTED_VLLM_VERSIONS, key=release_tuple)
    newer = release_tuple(version) > release_tuple(newest)
    return (
        f"kvoffload's vLLM integration is tested with vLLM {', '.join(TESTED_VLLM_VERSIONS)}; "
        f"vLLM {version} is {'newer and ' if newer else ''}untested, used because its "
        "CachePolicy API has the hooks the adapters need"
    )


def check_supported(policy_base: type, version: str) -> None:
    """Raise ``ImportError`` if ``policy_base`` lacks what the adapters need; warn if untested."""
    missing = missing_features(policy_base)
    if missing:
        raise ImportError(
            f"vLLM {version} is not supported by kvoffload's vLLM integration: its "
            f"CachePolicy API lacks {', '.join(missing)} (added in vLLM "
            f"{SUPPORTED_RELEASE_LINE}). Install a tested release: {INSTALL_HINT}."
        )
    warning = untested_warning(version)
    if warning is not None:
        logger.warning("%s", warning)


check_supported(VllmCachePolicy, VLLM_VERSION)

__all__ = [
    "INSTALL_HINT",
    "POLICY_HAS_TOUCH",
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
    "release_tuple",
    "untested_warning",
]
