"""Test helpers for the data plane: toy KV caches and an independent byte-level reference.

The reference rebuilds a slot's expected bytes block by block and layer by layer with plain
indexing, so it shares no code (and no bug) with the workers' batched views.
"""

from __future__ import annotations

import torch

from kvoffload.layout import HostSlotLayout, KVCacheLayout
from kvoffload.transfer.host import HostBuffer

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.uint8]
if hasattr(torch, "float8_e4m3fn"):
    DTYPES.append(torch.float8_e4m3fn)

SHAPES = {
    "kv_first": lambda blocks, tokens: (2, blocks, tokens, 2, 4),
    "blocks_first": lambda blocks, tokens: (blocks, 2, tokens, 2, 4),
    "mla": lambda blocks, tokens: (blocks, tokens, 12),
    "heads_first": lambda blocks, tokens: (2, 3, blocks, tokens, 4),
}


def random_bytes(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """A tensor of ``dtype`` whose bytes are uniformly random (NaN patterns included)."""
    nbytes = torch.Size(shape).numel() * torch.tensor([], dtype=dtype).element_size()
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).view(shape)


def make_caches(
    kind: str,
    dtype: torch.dtype,
    layers: int = 3,
    blocks: int = 24,
    tokens: int = 4,
    device: str = "cpu",
    seed: int = 0,
) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shape = SHAPES[kind](blocks, tokens)
    return [random_bytes(shape, dtype, gen).to(device) for _ in range(layers)]


def block_bytes(
    layout: KVCacheLayout, tensors: list[torch.Tensor], t: int, view: int, block: int
) -> bytes:
    """The bytes of one device block in one view, by plain indexing."""
    spec = layout.tensors[t]
    tensor = tensors[t].cpu()
    if spec.kind == "heads_first":  # view = kv * heads + head; a page is [tokens, head_size]
        heads = tensor.shape[1]
        part = tensor[view // heads, view % heads, block]
    else:
        part = tensor[view, block] if spec.kind == "kv_first" else tensor[block]
    return bytes(part.contiguous().view(torch.uint8).flatten().tolist())


def expected_slot(
    layout: KVCacheLayout,
    slot_layout: HostSlotLayout,
    tensors: list[torch.Tensor],
    group: int,
    blocks: list[int],
) -> bytes:
    """What a slot holding the chunk ``blocks`` of ``group`` must contain (its used prefix)."""
    out = b""
    for region in slot_layout.regions[group]:
        for b in blocks:
            out += block_bytes(layout, tensors, region.tensor_index, region.view_index, b)
    return out


def slot_bytes(host: HostBuffer, slot: int, length: int) -> bytes:
    return bytes(host.slot(slot)[:length].tolist())
