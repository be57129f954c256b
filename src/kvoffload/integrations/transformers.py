"""A prefix cache for Hugging Face causal LMs: reuse a prompt's stored KV, prefill the rest.

    pc = PrefixCache(model, cpu_bytes=1 << 30, block_tokens=64)
    out = pc.prefill(input_ids)            # logits of the last prompt token, and the cache
    text = pc.generate(input_ids, max_new_tokens=32)   # the same through model.generate

How it works. The KV of one sequence lives in fixed per-layer buffers of kind
``heads_first`` (``[2, kv_heads, blocks, block_tokens, head_dim]``): ``buffer[0]`` viewed as
``[1, kv_heads, tokens, head_dim]`` is exactly the ``[batch, heads, seq, dim]`` tensor a
transformers cache layer holds. :class:`BufferCache` is a ``DynamicCache`` whose layers write
new keys and values into those buffers and hand the model views of them, so the transfer
worker copies blocks straight between the buffers and the host slots (no staging copy) and
attention runs over the live length only (a ``StaticCache`` attends over all of its
``max_cache_len``). Block ``b`` of the buffers is always tokens ``[b*T, (b+1)*T)``.

A request: hash the prompt in blocks (chained, namespaced by the model's identity), find the
longest prefix stored on any configured tier (capped so the last token is computed), load it
into blocks ``0..hit-1``, prefill only the rest, and after the first token's logits offload
the prompt's new full blocks (in the background; the next request waits for them).

Exactness: with ``split_prefill=True`` (the default) the rest is prefilled in pieces cut at
every block boundary, exactly as a cold request is, so each forward sees the same shapes and
the logits are bit-identical to a cold run's (CPU kernels pick their blocking from the
shape; one forward over the whole rest gives the same token with differences around 1e-6).

Limits: batch size 1 and one live sequence per :class:`PrefixCache` (the buffers hold one
sequence; a new request reuses them); full-attention decoder layers only (no sliding window
or linear attention); generated tokens are not offloaded (only the prompt's full blocks).
Needs ``transformers>=5.25,<6`` (``pip install 'kvoffload[hf]'``): these releases take the
cache as ``cache=`` and derive positions from its length; earlier 5.x releases (5.20, which
vLLM 0.33/0.34 environments pin) reject ``cache=``, so importing this module there fails with
one line saying so.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from kvoffload.context import ReqContext
from kvoffload.manager.recorder import TraceRecorder
from kvoffload.offloader import KVOffloader, OffloaderStats

#: The transformers releases this module is tested with (it passes the cache as ``cache=``).
TESTED_TRANSFORMERS = ((5, 25), (6, 0))


def _release(version: str) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


if not TESTED_TRANSFORMERS[0] <= _release(transformers.__version__) < TESTED_TRANSFORMERS[1]:
    raise ImportError(
        f"kvoffload.integrations.transformers needs transformers>=5.25,<6, found "
        f"{transformers.__version__} (earlier releases do not take the cache as cache=): "
        "pip install 'kvoffload[hf]'"
    )


def model_identity(model: Any) -> str:
    """A digest of the model's config and every weight's bytes: two fine-tunes of one
    architecture, or two random seeds, get different identities. Reads every parameter once
    (about a second per few hundred MB); pass ``model_id`` to :class:`PrefixCache` to skip it."""
    digest = hashlib.sha256(model.config.to_json_string(use_diff=False).encode())
    with torch.inference_mode():
        for name, tensor in sorted(model.state_dict().items()):
            digest.update(name.encode())
            flat = tensor.detach().reshape(-1).contiguous().cpu()
            digest.update(flat.view(torch.uint8).numpy().tobytes())
    return f"sha256:{digest.hexdigest()}"


class _BufferLayer(DynamicLayer):
    """One layer's cache backed by a fixed ``[2, H, blocks, T, D]`` buffer: new keys and
    values are written at the current length, and the model gets views up to it."""

    def __init__(self, buffer: torch.Tensor, length: int) -> None:
        super().__init__()
        _, heads, blocks, tokens, dim = buffer.shape
        self._k = buffer[0].view(1, heads, blocks * tokens, dim)
        self._v = buffer[1].view(1, heads, blocks * tokens, dim)
        self.capacity = blocks * tokens
        self.device = buffer.device
        self._set_length(length)

    def _set_length(self, length: int) -> None:
        self.length = length
        self.keys = self._k[:, :, :length]
        self.values = self._v[:, :, :length]
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if key_states.shape[0] != 1:
            raise ValueError(f"PrefixCache serves batch size 1, got {key_states.shape[0]}")
        start, n = self.length, key_states.shape[-2]
        if start + n > self.capacity:
            raise ValueError(
                f"the sequence needs {start + n} tokens but the PrefixCache holds "
                f"max_tokens={self.capacity}; build it with a larger max_tokens"
            )
        self._k[:, :, start : start + n].copy_(key_states)
        self._v[:, :, start : start + n].copy_(value_states)
        self._set_length(start + n)
        return self._k[:, :, : start + n], self._v[:, :, : start + n]

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        self._set_length(max(0, self.length + tokens_to_remove))

    def reset(self) -> None:
        self._set_length(0)


class BufferCache(DynamicCache):
    """A ``DynamicCache`` over a :class:`PrefixCache`'s buffers, pre-filled to ``length``
    tokens; pass it to the model as ``cache=`` (forward) or to ``generate``."""

    def __init__(self, buffers: Sequence[torch.Tensor], length: int = 0) -> None:
        super().__init__()
        self.layers = [_BufferLayer(b, length) for b in buffers]


@dataclass
class Prefix:
    """A prepared request: the pre-filled cache and what was reused."""

    cache: BufferCache
    token_ids: list[int]
    hit_tokens: int  # tokens whose KV came from kvoffload
    hashes: list[bytes]
    ctx: ReqContext
    restore_seconds: float  # lookup + load + building the cache, wall
    restore_cpu_seconds: float
    store_wait_seconds: float = 0.0  # waiting for the last request's background store


@dataclass
class PrefillResult:
    """The last prompt token's logits and the cache after the prompt."""

    logits: torch.Tensor  # [vocab]
    cache: BufferCache
    hit_tokens: int
    computed_tokens: int
    restore_seconds: float
    restore_cpu_seconds: float
    store_wait_seconds: float = 0.0
    stored_blocks: int = 0


@dataclass
class PrefixCacheStats:
    """Counters of a :class:`PrefixCache` since construction."""

    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    computed_tokens: int = 0
    restore_seconds: float = 0.0
    store_seconds: float = 0.0
    offloader: OffloaderStats | None = field(default=None, repr=False)


def _token_list(input_ids: Any) -> list[int]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise ValueError(
                    f"input_ids: PrefixCache serves batch size 1, got {input_ids.shape[0]} rows"
                )
            input_ids = input_ids[0]
        if input_ids.dim() != 1:
            raise ValueError(f"input_ids must be [1, seq] or [seq], got {list(input_ids.shape)}")
        return [int(t) for t in input_ids.tolist()]
    if isinstance(input_ids, (str, bytes)):
        raise TypeError("input_ids must be token ids (a tensor or a sequence of ints), not text")
    return [int(t) for t in input_ids]


class PrefixCache:
    """Prefix caching for one Hugging Face causal LM (batch size 1) through kvoffload.

    Args:
        model: a transformers causal LM with full-attention layers (Llama, Qwen2, Mistral
            without a sliding window, ...), in eval mode.
        cpu_bytes: host memory for kvoffload's CPU tier.
        block_tokens: tokens per offloaded block (also where prefill is cut with
            ``split_prefill``). Larger blocks cost fewer forwards; smaller ones reuse more.
        max_tokens: the longest sequence (prompt plus generated tokens) the buffers hold.
        model_id: the model's identity for the keys; default :func:`model_identity` (a
            digest of config and weights). Blocks of different identities never meet.
        split_prefill: prefill in pieces cut at block boundaries (bit-identical logits
            between cold and warm requests); ``False``: one forward over the uncached rest.
        recorder: a :class:`~kvoffload.manager.recorder.TraceRecorder` that writes every
            request as the trace ``kvoffload simulate`` replays (or the config key
            ``record_trace="trace.jsonl"``); :meth:`close` closes it.
        policy / tiers / tier_wait_s / **config: passed to :class:`KVOffloader` (e.g.
            ``tiers=[{"type": "disk", "path": ..., "capacity_bytes": "2GiB"}]``).
    """

    def __init__(
        self,
        model: Any,
        cpu_bytes: int,
        *,
        block_tokens: int = 64,
        max_tokens: int = 4096,
        model_id: str | None = None,
        split_prefill: bool = True,
        policy: str = "lru",
        recorder: TraceRecorder | None = None,
        **config: Any,
    ) -> None:
        text = model.config.get_text_config(decoder=True)
        layer_types = getattr(text, "layer_types", None) or ["full_attention"]
        if set(layer_types) != {"full_attention"} or getattr(text, "sliding_window", None):
            raise ValueError(
                "PrefixCache supports full-attention decoders only; this model has layer "
                f"types {sorted(set(layer_types))} / sliding_window "
                f"{getattr(text, 'sliding_window', None)}"
            )
        for name, value in (("block_tokens", block_tokens), ("max_tokens", max_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if model_id is not None and (not isinstance(model_id, str) or not model_id):
            raise ValueError(f"model_id must be a non-empty string or None, got {model_id!r}")
        self.model = model
        self.block_tokens = block_tokens
        self.split_prefill = bool(split_prefill)
        self.model_id = model_id if model_id is not None else model_identity(model)
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        param = next(model.parameters())
        blocks = math.ceil(max_tokens / block_tokens)
        # Normal tensors even when built under inference_mode: the user may run the model
        # on the cache outside it, and inference tensors refuse in-place writes there.
        with torch.inference_mode(False):
            self.buffers = [
                torch.zeros(
                    (2, heads, blocks, block_tokens, head_dim),
                    dtype=param.dtype,
                    device=param.device,
                )
                for _ in range(text.num_hidden_layers)
            ]
        self.offloader = KVOffloader(
            self.buffers, cpu_bytes, policy, kind="heads_first", namespace=self.model_id, **config
        )
        if recorder is not None:
            self.offloader.manager.set_recorder(recorder)  # type: ignore[attr-defined]
        self._stats = PrefixCacheStats()

    # ------------------------------------------------------------------ requests
    def prepare(self, input_ids: Any) -> Prefix:
        """Find the longest stored prefix of the prompt, load it, and return the cache
        pre-filled with it (the last prompt token is never a hit)."""
        tokens = _token_list(input_ids)
        if not tokens:
            raise ValueError("input_ids is empty")
        off = self.offloader
        # Background stores of the last request read the buffers this one overwrites.
        waited = time.perf_counter()
        off.flush(tier_timeout_s=0.0)
        waited = time.perf_counter() - waited
        wall, cpu = time.perf_counter(), time.process_time()
        hashes = off.hash_tokens(tokens)
        ctx = off.begin_request()
        try:
            hit = off.lookup(hashes, ctx=ctx, num_tokens=len(tokens))
            if hit:
                off.load(hashes[:hit], range(hit), ctx=ctx)
        except BaseException:
            off.end_request(ctx)
            raise
        cache = BufferCache(self.buffers, hit * self.block_tokens)
        restore = time.perf_counter() - wall
        restore_cpu = time.process_time() - cpu
        return Prefix(
            cache, tokens, hit * self.block_tokens, hashes, ctx, restore, restore_cpu, waited
        )

    def finish(self, prefix: Prefix, wait: bool = False) -> int:
        """Offload the prompt's full blocks not stored yet (call after the first token);
        return the blocks written. ``wait=False`` copies in the background."""
        off = self.offloader
        start = time.perf_counter()
        try:
            first = prefix.hit_tokens // self.block_tokens
            stored = off.store(
                prefix.hashes[first:],
                range(first, len(prefix.hashes)),
                ctx=prefix.ctx,
                wait=wait,
                first_block=first,
            )
        finally:
            off.end_request(prefix.ctx)
        self._stats.store_seconds += time.perf_counter() - start
        return stored

    def prefill(self, input_ids: Any, store: bool = True, **forward_kwargs: Any) -> PrefillResult:
        """Prefill the prompt over its stored prefix; return the last token's logits.

        The prompt's new full blocks are offloaded after the logits exist (``store=False``:
        not at all), in the background.
        """
        prefix = self.prepare(input_ids)
        try:
            logits = self._forward_rest(prefix, len(prefix.token_ids), **forward_kwargs)
        except BaseException:
            self.offloader.end_request(prefix.ctx)
            raise
        result = PrefillResult(
            logits=logits,
            cache=prefix.cache,
            hit_tokens=prefix.hit_tokens,
            computed_tokens=len(prefix.token_ids) - prefix.hit_tokens,
            restore_seconds=prefix.restore_seconds,
            restore_cpu_seconds=prefix.restore_cpu_seconds,
            store_wait_seconds=prefix.store_wait_seconds,
        )
        self._count(prefix)
        if store:
            result.stored_blocks = self.finish(prefix)
        else:
            self.offloader.end_request(prefix.ctx)
        return result

    def generate(self, input_ids: Any, **generate_kwargs: Any) -> torch.Tensor:
        """``model.generate`` over the stored prefix; returns what generate returns.

        With ``split_prefill`` the prompt but its last token is prefilled here (cut at block
        boundaries), so ``generate`` computes one token of prompt, then decodes.
        """
        prefix = self.prepare(input_ids)
        ids = torch.tensor([prefix.token_ids], device=self.buffers[0].device)
        try:
            if self.split_prefill and len(prefix.token_ids) - 1 > prefix.hit_tokens:
                self._forward_rest(prefix, len(prefix.token_ids) - 1)
            with torch.inference_mode():
                out = self.model.generate(ids, cache=prefix.cache, **generate_kwargs)
        except BaseException:
            self.offloader.end_request(prefix.ctx)
            raise
        self._count(prefix)
        self.finish(prefix)
        return out  # type: ignore[no-any-return]

    def stats(self) -> PrefixCacheStats:
        """Tokens reused and computed, kvoffload's own seconds, and the offloader's stats."""
        s = self._stats
        return PrefixCacheStats(
            s.requests,
            s.prompt_tokens,
            s.hit_tokens,
            s.computed_tokens,
            s.restore_seconds,
            s.store_seconds,
            self.offloader.stats(),
        )

    @property
    def recorder(self) -> TraceRecorder | None:
        """The trace recorder the manager writes into (``recorder=`` or ``record_trace``)."""
        manager = self.offloader.manager
        cpu = getattr(manager, "cpu", manager)  # a tiering manager records in its CPU tier
        found = getattr(cpu, "recorder", None)
        return found if isinstance(found, TraceRecorder) else None

    def close(self) -> None:
        """Finish the stores (and the tiers' writes), release the offloader, and write out
        and close the trace recorder, if any."""
        recorder = self.recorder
        try:
            self.offloader.close()
        finally:
            if recorder is not None:
                recorder.close()

    def __enter__(self) -> PrefixCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _forward_rest(self, prefix: Prefix, end: int, **forward_kwargs: Any) -> torch.Tensor:
        """Run the model over tokens ``[cache length, end)``; the last one's logits."""
        cache = prefix.cache
        start = cache.get_seq_length()
        ids = torch.tensor([prefix.token_ids[:end]], device=self.buffers[0].device)
        step = self.block_tokens if self.split_prefill else max(1, end - start)
        logits = None
        first, began = start, time.perf_counter()
        with torch.inference_mode():
            while start < end:
                stop = min(end, (start // step + 1) * step) if self.split_prefill else end
                out = self.model(
                    ids[:, start:stop],
                    cache=cache,
                    use_cache=True,
                    logits_to_keep=1,
                    **forward_kwargs,
                )
                logits = out.logits[0, -1]
                start = stop
        if logits is None:
            raise ValueError("nothing to prefill: the whole prompt is cached")
        # The measured prefill speed is what the load-or-recompute decision weighs reads by.
        self.offloader.observe_prefill(end - first, time.perf_counter() - began)
        return logits

    def _count(self, prefix: Prefix) -> None:
        s = self._stats
        s.requests += 1
        s.prompt_tokens += len(prefix.token_ids)
        s.hit_tokens += prefix.hit_tokens
        s.computed_tokens += len(prefix.token_ids) - prefix.hit_tokens
        s.restore_seconds += prefix.restore_seconds


__all__ = [
    "BufferCache",
    "PrefillResult",
    "Prefix",
    "PrefixCache",
    "PrefixCacheStats",
    "model_identity",
]
