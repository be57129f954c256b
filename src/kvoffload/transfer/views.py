"""Byte-exact views of KV tensors and host slots, as words, so copies ignore the dtype.

Every copy moves whole device-block pages, reinterpreted as the widest integer word that
divides every page (``HostSlotLayout.word_size``): the data are never converted, fp8 and
bf16 move like anything else, and wide words make torch's indexed copies several times
faster than byte-wise ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from kvoffload.layout import HostSlotLayout, KVCacheLayout, dtype_name

_WORD_DTYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def word_dtype(word_size: int) -> torch.dtype:
    """The integer dtype of ``word_size`` bytes."""
    try:
        return _WORD_DTYPES[word_size]
    except KeyError:
        raise ValueError(
            f"word_size must be one of {sorted(_WORD_DTYPES)}, got {word_size}"
        ) from None


def ordered_tensors(
    layout: KVCacheLayout, kv_caches: Sequence[torch.Tensor] | Mapping[str, torch.Tensor]
) -> list[torch.Tensor]:
    """The tensors in the layout's order, checked against it (shape, dtype, contiguity, device)."""
    if isinstance(kv_caches, Mapping):
        missing = [t.name for t in layout.tensors if t.name not in kv_caches]
        extra = sorted(set(kv_caches) - {t.name for t in layout.tensors})
        if missing or extra:
            raise ValueError(
                f"kv_caches do not match the layout: missing {missing}, unexpected {extra}"
            )
        tensors = [kv_caches[t.name] for t in layout.tensors]
    else:
        tensors = list(kv_caches)
        if len(tensors) != len(layout.tensors):
            raise ValueError(
                f"kv_caches: the layout has {len(layout.tensors)} tensors, got {len(tensors)}"
            )
    device = None
    for spec, tensor in zip(layout.tensors, tensors, strict=True):
        where = f"KV tensor '{spec.name}'"
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{where} must be a torch.Tensor, got {type(tensor).__name__}")
        if tuple(tensor.shape) != spec.shape or dtype_name(tensor.dtype) != spec.dtype:
            raise ValueError(
                f"{where}: the layout says shape {list(spec.shape)} {spec.dtype}, the tensor is "
                f"{list(tensor.shape)} {dtype_name(tensor.dtype)}"
            )
        if not tensor.is_contiguous():
            raise ValueError(
                f"{where} is not contiguous: blocks are copied as raw bytes, so each block's "
                "bytes must be contiguous (pass the cache tensor itself, not a permuted view)"
            )
        if device is None:
            device = tensor.device
        elif tensor.device != device:
            raise ValueError(
                f"{where} is on {tensor.device} but the first tensor is on {device}; "
                "all KV tensors of one worker must be on one device"
            )
    return tensors


def block_byte_views(
    layout: KVCacheLayout, tensors: Sequence[torch.Tensor]
) -> list[list[torch.Tensor]]:
    """Per tensor, per view (K/V or whole block): a ``(num_blocks, page_bytes)`` uint8 view."""
    views: list[list[torch.Tensor]] = []
    for spec, tensor in zip(layout.tensors, tensors, strict=True):
        if spec.kind == "heads_first":  # one page per (K/V, head): [num_blocks, T, D] each
            parts = [tensor[kv, h] for kv in (0, 1) for h in range(spec.shape[1])]
        else:
            parts = [tensor[0], tensor[1]] if spec.kind == "kv_first" else [tensor]
        shape = (spec.num_blocks, spec.page_bytes)
        views.append([p.view(torch.uint8).reshape(shape) for p in parts])
    return views


def block_views(
    layout: KVCacheLayout,
    tensors: Sequence[torch.Tensor],
    slot_layout: HostSlotLayout,
) -> list[list[torch.Tensor]]:
    """Per tensor, per view: a ``(num_blocks, page_words)`` view in the slot layout's words."""
    word = word_dtype(slot_layout.word_size)
    return [[v.view(word) for v in views] for views in block_byte_views(layout, tensors)]


def host_words(host: torch.Tensor, slot_layout: HostSlotLayout) -> torch.Tensor:
    """The ``(num_slots, slot_bytes)`` uint8 host tensor as ``(num_slots, slot_words)`` words."""
    if host.dtype != torch.uint8 or host.dim() != 2 or host.shape[1] != slot_layout.slot_bytes:
        raise ValueError(
            f"host tensor must be uint8 [num_slots, {slot_layout.slot_bytes}], got "
            f"{host.dtype} {list(host.shape)}"
        )
    return host.view(word_dtype(slot_layout.word_size))


def host_region_views(words: torch.Tensor, slot_layout: HostSlotLayout) -> list[list[torch.Tensor]]:
    """Per group, per slot region: a ``(num_slots, blocks_per_chunk, page_words)`` view."""
    w = slot_layout.word_size
    bpc = slot_layout.blocks_per_chunk
    out: list[list[torch.Tensor]] = []
    for regions in slot_layout.regions:
        group_views = []
        for r in regions:
            page = r.page_bytes // w
            start = r.offset // w
            group_views.append(words[:, start : start + bpc * page].unflatten(1, (bpc, page)))
        out.append(group_views)
    return out


__all__ = [
    "block_byte_views",
    "block_views",
    "host_region_views",
    "host_words",
    "ordered_tensors",
    "word_dtype",
]
