"""Descriptions of an engine's KV-cache tensors and of the host slot that holds one chunk.

Pure Python (no torch import), so the scheduler side can size the CPU tier from shapes alone.

Supported tensor kinds (``B`` = device blocks, ``T`` = tokens per block, ``H`` = KV heads,
``D`` = head size):

* ``"kv_first"``     ``[2, B, T, H, D]``: K then V (FlashAttention's layout); two byte views.
* ``"blocks_first"`` ``[B, 2, T, H, D]``: K and V inside each block (FlashInfer's layout).
* ``"mla"``          ``[B, T, dim]``: one latent vector per token (MLA models).
* ``"heads_first"``  ``[2, H, B, T, D]``: K then V, each head's tokens contiguous. ``t[0]``
  viewed as ``[1, H, B*T, D]`` is a batch-1 ``[batch, kv_heads, seq, head_dim]`` cache (Hugging
  Face's per-layer layout) whose block ``b`` holds tokens ``b*T .. b*T+T-1``; a block is
  ``2*H`` pages (one per K/V and head).

Tensors belong to KV-cache groups (``0 .. G-1``); all tensors of one group share the device
block ids, so they share ``B`` and ``T``. An offloaded *chunk* is ``blocks_per_chunk``
device blocks of one group; a host *slot* holds one chunk for every tensor of its group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvoffload._checks import check_int

KINDS = ("kv_first", "blocks_first", "mla", "heads_first")

#: dtype name -> element size in bytes. fp8 caches may also be given as ``uint8``.
DTYPE_SIZES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int8": 1,
    "uint8": 1,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
}

_EXPECTED_SHAPES = {
    "kv_first": "[2, num_blocks, block_size, num_kv_heads, head_size]",
    "blocks_first": "[num_blocks, 2, block_size, num_kv_heads, head_size]",
    "mla": "[num_blocks, block_size, latent_dim]",
    "heads_first": "[2, num_kv_heads, num_blocks, block_size, head_size]",
}

WORD_SIZES = (8, 4, 2, 1)


def dtype_name(dtype: Any) -> str:
    """``torch.float16`` / ``"float16"`` / ``"torch.float16"`` -> ``"float16"``."""
    name = str(dtype)
    return name[len("torch.") :] if name.startswith("torch.") else name


@dataclass(frozen=True)
class KVTensorLayout:
    """One engine KV-cache tensor: its name, kind, shape, dtype and KV-cache group."""

    name: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    group: int = 0

    def __post_init__(self) -> None:
        where = f"KV tensor '{self.name}'"
        if self.kind not in KINDS:
            raise ValueError(f"{where}: kind must be one of {list(KINDS)}, got {self.kind!r}")
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        if self.dtype not in DTYPE_SIZES:
            raise ValueError(
                f"{where}: dtype {self.dtype!r} is not supported; use one of "
                f"{sorted(DTYPE_SIZES)} (store fp8 caches as uint8 if your torch lacks fp8)"
            )
        check_int(f"{where}: group", self.group, 0)
        shape = tuple(self.shape)
        object.__setattr__(self, "shape", shape)
        expected = _EXPECTED_SHAPES[self.kind]
        rank = 3 if self.kind == "mla" else 5
        if len(shape) != rank:
            raise ValueError(
                f"{where}: kind {self.kind!r} needs a shape {expected} of positive ints, "
                f"got {list(shape)}"
            )
        for i, d in enumerate(shape):
            check_int(f"{where}: shape[{i}]", d, 1, why=f" (kind {self.kind!r}: {expected})")
        if self.kind in ("kv_first", "heads_first") and shape[0] != 2:
            raise ValueError(
                f"{where}: kind {self.kind!r} needs shape[0] == 2 (K, V), got {shape[0]}"
            )
        if self.kind == "blocks_first" and shape[1] != 2:
            raise ValueError(
                f"{where}: kind 'blocks_first' needs shape[1] == 2 (K, V), got {shape[1]}"
            )

    @property
    def num_blocks(self) -> int:
        """Device blocks in this tensor."""
        if self.kind == "heads_first":
            return self.shape[2]
        return self.shape[1] if self.kind == "kv_first" else self.shape[0]

    @property
    def block_size(self) -> int:
        """Tokens per device block."""
        if self.kind == "heads_first":
            return self.shape[3]
        return self.shape[2] if self.kind in ("kv_first", "blocks_first") else self.shape[1]

    @property
    def element_size(self) -> int:
        return DTYPE_SIZES[self.dtype]

    @property
    def num_views(self) -> int:
        """Contiguous per-block byte ranges per device block: 2 (K, V) for kv_first, 2 per
        KV head for heads_first (K heads, then V heads), else 1."""
        if self.kind == "heads_first":
            return 2 * self.shape[1]
        return 2 if self.kind == "kv_first" else 1

    @property
    def page_bytes(self) -> int:
        """Bytes of one device block in one view (K or V for kv_first, the whole block else)."""
        per_block = 1
        for d in self.shape:
            per_block *= d
        per_block //= self.num_blocks * self.num_views
        return per_block * self.element_size

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one device block in this tensor (K and V together)."""
        return self.page_bytes * self.num_views


@dataclass(frozen=True)
class SlotRegion:
    """Where one view of one tensor lives inside a slot: ``blocks_per_chunk`` pages back to back."""

    tensor_index: int  # index into KVCacheLayout.tensors
    view_index: int  # 0 = K (or the whole block), 1 = V for kv_first; kv * heads + head
    offset: int  # byte offset inside the slot
    page_bytes: int  # bytes of one device block of this view


@dataclass(frozen=True)
class HostSlotLayout:
    """Byte map of one host slot: per group, the region of every tensor view.

    A slot is contiguous: one chunk of one group for every layer, so a later disk or remote
    tier can write or read it as one buffer. Groups whose chunks are smaller than the
    largest group's leave the slot's tail unused.
    """

    blocks_per_chunk: int
    slot_bytes: int
    regions: tuple[tuple[SlotRegion, ...], ...]  # per group
    word_size: int  # widest of 8/4/2/1 bytes dividing every page and the slot

    def chunk_bytes(self, group: int = 0) -> int:
        """Payload bytes of one chunk of ``group`` (what one slot's transfer moves)."""
        return sum(r.page_bytes for r in self.regions[group]) * self.blocks_per_chunk

    @property
    def num_groups(self) -> int:
        return len(self.regions)


class KVCacheLayout:
    """An engine's whole KV cache: every tensor, grouped by KV-cache group.

    Build it from shapes (``KVCacheLayout([KVTensorLayout(...), ...])``) on the scheduler
    side, or from the tensors themselves with :meth:`from_tensors` on the worker side.
    """

    def __init__(self, tensors: Sequence[KVTensorLayout]) -> None:
        tensors = tuple(tensors)
        if not tensors:
            raise ValueError("a KV-cache layout needs at least one tensor")
        for t in tensors:
            if not isinstance(t, KVTensorLayout):
                raise TypeError(f"layout tensors must be KVTensorLayout, got {type(t).__name__}")
        names = [t.name for t in tensors]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"KV tensor names must be unique, duplicated: {duplicates}")
        groups = sorted({t.group for t in tensors})
        if groups != list(range(len(groups))):
            raise ValueError(f"KV-cache groups must be numbered 0..G-1 without gaps, got {groups}")
        self.tensors = tensors
        self._groups: tuple[tuple[int, ...], ...] = tuple(
            tuple(i for i, t in enumerate(tensors) if t.group == g) for g in groups
        )
        for g, members in enumerate(self._groups):
            first = tensors[members[0]]
            for i in members[1:]:
                t = tensors[i]
                if (t.num_blocks, t.block_size) != (first.num_blocks, first.block_size):
                    raise ValueError(
                        f"group {g}: tensor '{t.name}' has {t.num_blocks} blocks of "
                        f"{t.block_size} tokens but '{first.name}' has {first.num_blocks} "
                        f"blocks of {first.block_size}; a group shares its block ids"
                    )

    @classmethod
    def from_tensors(
        cls,
        kv_caches: Sequence[Any] | Mapping[str, Any],
        kind: str | Sequence[str] = "kv_first",
        groups: Sequence[int] | None = None,
    ) -> KVCacheLayout:
        """Describe tensors (anything with ``.shape`` and ``.dtype``, e.g. torch tensors).

        ``kind`` is one kind for all tensors or one per tensor; ``groups`` gives each
        tensor's KV-cache group (default: all in group 0). Names are the mapping's keys, or
        ``"layer.<i>"`` for a sequence.
        """
        named = (
            list(kv_caches.items())
            if isinstance(kv_caches, Mapping)
            else [(f"layer.{i}", t) for i, t in enumerate(kv_caches)]
        )
        n = len(named)
        kinds = [kind] * n if isinstance(kind, str) else list(kind)
        group_ids = [0] * n if groups is None else list(groups)
        if len(kinds) != n:
            raise ValueError(f"kind: got {len(kinds)} kinds for {n} tensors")
        if len(group_ids) != n:
            raise ValueError(f"groups: got {len(group_ids)} group ids for {n} tensors")
        layouts = []
        for (name, tensor), k, g in zip(named, kinds, group_ids, strict=True):
            if not hasattr(tensor, "shape") or not hasattr(tensor, "dtype"):
                raise TypeError(f"KV tensor '{name}' must be a tensor, got {type(tensor).__name__}")
            layouts.append(KVTensorLayout(name, k, tuple(tensor.shape), tensor.dtype, g))
        return cls(layouts)

    @property
    def num_groups(self) -> int:
        return len(self._groups)

    def group_tensors(self, group: int) -> tuple[int, ...]:
        """Indices (into :attr:`tensors`) of the tensors of ``group``."""
        return self._groups[self._check_group(group)]

    def num_blocks(self, group: int = 0) -> int:
        """Device blocks of ``group``."""
        return self.tensors[self.group_tensors(group)[0]].num_blocks

    def block_size(self, group: int = 0) -> int:
        """Tokens per device block of ``group``."""
        return self.tensors[self.group_tensors(group)[0]].block_size

    def bytes_per_block(self, group: int = 0) -> int:
        """Bytes of one device block of ``group`` across all its tensors."""
        return sum(self.tensors[i].bytes_per_block for i in self.group_tensors(group))

    def blocks_per_chunk_for_tokens(self, tokens_per_chunk: int) -> int:
        """Device blocks per chunk for a chunk size given in tokens (vLLM's ``block_size``)."""
        tokens_per_chunk = check_int("block_size", tokens_per_chunk, 1, why=" (tokens per chunk)")
        sizes = sorted({self.block_size(g) for g in range(self.num_groups)})
        if len(sizes) != 1:
            raise ValueError(
                f"block_size (tokens) needs one device block size for all groups, got {sizes}; "
                "set blocks_per_chunk instead"
            )
        if tokens_per_chunk % sizes[0]:
            raise ValueError(
                f"block_size {tokens_per_chunk} must be a multiple of the device block size "
                f"{sizes[0]} tokens"
            )
        return tokens_per_chunk // sizes[0]

    def slot_layout(self, blocks_per_chunk: int = 1) -> HostSlotLayout:
        """The host slot for chunks of ``blocks_per_chunk`` device blocks."""
        bpc = check_int("blocks_per_chunk", blocks_per_chunk, 1)
        regions = []
        pages = []
        for g in range(self.num_groups):
            offset = 0
            group_regions = []
            for i in self.group_tensors(g):
                t = self.tensors[i]
                for v in range(t.num_views):
                    group_regions.append(SlotRegion(i, v, offset, t.page_bytes))
                    pages.append(t.page_bytes)
                    offset += t.page_bytes * bpc
            regions.append(tuple(group_regions))
        slot_bytes = max(sum(r.page_bytes for r in rs) * bpc for rs in regions)
        word = next(w for w in WORD_SIZES if all(p % w == 0 for p in pages))
        return HostSlotLayout(bpc, slot_bytes, tuple(regions), word)

    def _check_group(self, group: int) -> int:
        # Per job part (worker._parts): check inline and call the validator only to raise.
        if (
            isinstance(group, bool)
            or not isinstance(group, int)
            or not 0 <= group < len(self._groups)
        ):
            check_int("group", group, 0, len(self._groups) - 1)
        return group

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KVCacheLayout) and self.tensors == other.tensors

    def __hash__(self) -> int:
        return hash(self.tensors)

    def __repr__(self) -> str:
        return f"KVCacheLayout({list(self.tensors)!r})"


def slots_for_budget(slot_bytes: int, budget_bytes: int) -> int:
    """``budget_bytes // slot_bytes``, refusing a budget that holds no slot at all."""
    check_int("budget_bytes", budget_bytes)
    check_int("slot_bytes", slot_bytes, 1)
    num_slots = budget_bytes // slot_bytes
    if num_slots < 1:
        raise ValueError(
            f"a budget of {budget_bytes} bytes holds no slot: one slot (one chunk for every "
            f"layer of a group) takes {slot_bytes} bytes"
        )
    return num_slots


__all__ = [
    "DTYPE_SIZES",
    "KINDS",
    "HostSlotLayout",
    "KVCacheLayout",
    "KVTensorLayout",
    "SlotRegion",
    "dtype_name",
    "slots_for_budget",
]
