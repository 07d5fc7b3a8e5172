"""Scoring an edited causal LM without recomputing the blocks the edit left alone: their output states, computed once.

An erasure sweep edits a few decoder blocks (the layer rule's) and scores the rule's fixed rows at every point. The
blocks below the lowest edited one see the same inputs with the same weights at every point, so their output on
each batch is the same: :func:`reuse_prefix` replaces them, while the sweep runs, by one module that computes that
output on a batch's first pass (from the real blocks) and hands back the stored tensor on every later pass of the
same batch (same input embeddings, same mask and positions: a digest of every tensor the block is called with).
The states are exact (the stored tensor is what the blocks computed), so every score is unchanged; the saving is
the share of blocks below the first edited one (none when block 0 is edited or the edit is outside the decoder).
It adds to what the scoring already shares within a batch (:mod:`mmunlearn.train.packing`: the rows' common prompt
prefix run once into a key/value cache, no padding), which is computed again at every sweep point.

>>> import torch
>>> from torch import nn
>>> class Stack(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
...     def forward(self, x):
...         for layer in self.layers:
...             x = layer(x)
...         return x
>>> m, x = Stack(), torch.randn(2, 4)
>>> want = m(x)
>>> with reuse_prefix(m.layers, first=2) as states:
...     same, again = m(x), m(x)
>>> bool(torch.equal(same, want) and torch.equal(again, want)), states.hits, states.misses
(True, 1, 1)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


def _feed(h: hashlib.blake2b, value: Any) -> bool:
    """Add ``value`` to the digest; False when it holds an object the digest cannot see into (a KV cache)."""
    if isinstance(value, torch.Tensor):
        t = value.detach().contiguous().cpu()
        h.update(f"{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return True
    if isinstance(value, (tuple, list)):
        return all([_feed(h, v) for v in value])
    if value is None or isinstance(value, (bool, int, float, str)):
        h.update(repr(value).encode())
        return True
    return False


def digest(*args: Any, **kwargs: Any) -> str | None:
    """A digest of every tensor (and plain value) a block is called with; None when one of them is an object it
    cannot see into (a generation's KV cache: the blocks must run and fill it)."""
    h = hashlib.blake2b(digest_size=16)
    ok = all([_feed(h, v) for v in args])
    for k in sorted(kwargs):
        h.update(k.encode())
        ok = _feed(h, kwargs[k]) and ok
    return h.hexdigest() if ok else None


_CACHE_NAMES = ("cache", "past_key_values")


def _kv_layers(cache: Any, n: int) -> list[Any] | None:
    """The first ``n`` per-layer entries of a transformers key/value cache (``DynamicCache.layers``, each with
    ``keys`` / ``values`` once filled); None for a cache of another shape (the blocks then run)."""
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list) or not callable(getattr(cache, "update", None)):
        return None
    return layers[:n] if all(hasattr(layer, "keys") and hasattr(layer, "values") for layer in layers[:n]) else None


def _kv(layer: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    return (keys, values) if isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor) else None


class PrefixStates(nn.Module):
    """Stands in for blocks ``0 .. first-1``: their output per batch, computed by them once, then handed back.

    A key/value cache handed to the blocks (the packed scoring's shared prompt prefix, :mod:`mmunlearn.train.packing`;
    a generation's) is part of the digest (what those blocks' entries hold), and what the blocks appended to their
    entries is kept too and appended again on a later pass: the cache comes out as the blocks would leave it."""

    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        object.__setattr__(self, "blocks", blocks)  # not registered: the model's state dict keeps its own names
        self.states: dict[str, tuple[torch.Tensor, list | None]] = {}
        self.hits = self.misses = 0
        self.tuple_mode = False  # the blocks return a tuple (older transformers): so do the stand-ins

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        name = next((k for k in _CACHE_NAMES if kwargs.get(k) is not None), None)
        cache = kwargs[name] if name else None
        entries = _kv_layers(cache, len(self.blocks)) if cache is not None else []
        plain = {k: v for k, v in kwargs.items() if k != name}
        key = None if entries is None else digest(hidden_states, *args, [_kv(e) or "empty" for e in entries], **plain)
        if key is None or key not in self.states:
            self.misses += 1
            before = [(_kv(e) or (None,))[0] for e in entries or []]
            h, out = hidden_states, None
            for block in self.blocks:
                out = block(h, *args, **kwargs)
                h = out[0] if isinstance(out, tuple) else out
            self.tuple_mode = isinstance(out, tuple)
            if key is None:  # a cache of an unknown shape: computed through, nothing stored
                return out if self.tuple_mode else h
            added = None
            if cache is not None:
                added = []
                for e, old in zip(_kv_layers(cache, len(self.blocks)), before):
                    k, v = _kv(e)
                    start = 0 if old is None else old.shape[-2]
                    added.append((k[..., start:, :].detach().clone(), v[..., start:, :].detach().clone()))
            self.states[key] = (h.detach(), added)
        else:
            self.hits += 1
            if cache is not None:
                for i, (k, v) in enumerate(self.states[key][1]):
                    cache.update(k, v, i)
        h = self.states[key][0]
        return (h,) if self.tuple_mode else h


class _Pass(nn.Module):
    """A block already computed by :class:`PrefixStates`: its input is its output."""

    def __init__(self, prefix: PrefixStates):
        super().__init__()
        object.__setattr__(self, "prefix", prefix)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return (hidden_states,) if self.prefix.tuple_mode else hidden_states


def first_edited_block(blocks: nn.ModuleList, edited: Iterable[nn.Parameter]) -> int:
    """Index of the lowest block holding an edited parameter; 0 when one is outside every block (nothing reused)."""
    owner = {id(p): i for i, block in enumerate(blocks) for p in block.parameters()}
    found = [owner.get(id(p)) for p in edited]
    if not found or any(i is None for i in found):
        return 0
    return min(found)


@contextmanager
def reuse_prefix(
    blocks: nn.ModuleList, first: int, prefix: PrefixStates | None = None
) -> Iterator[PrefixStates | None]:
    """Within the block, ``blocks[:first]`` compute once per batch (their weights must not change meanwhile: only
    blocks from ``first`` on may be edited); ``first`` <= 0 changes nothing (yields None). ``prefix``: the states of
    an earlier use with the same ``first`` (kept across sweep points). The blocks are put back when the block ends,
    whatever happens."""
    if first <= 0:
        yield None
        return
    original = [blocks[i] for i in range(first)]
    if prefix is not None and (len(prefix.blocks) != first or any(a is not b for a, b in zip(prefix.blocks, original))):
        raise ValueError("these prefix states are of other blocks")
    prefix = prefix or PrefixStates(original)
    try:
        blocks[0] = prefix
        for i in range(1, first):
            blocks[i] = _Pass(prefix)
        yield prefix
    finally:
        for i, block in enumerate(original):
            blocks[i] = block


class PrefixReuse:
    """A sweep's use of :func:`reuse_prefix` on an adapter: for each edit (its erase report), the decoder blocks below
    the lowest edited one are stood in for, their states kept across the sweep's points (per first edited block).
    The model's ``config.use_cache`` is off meanwhile (a scoring pass then hands the blocks no KV cache, which would
    make them run: :func:`digest`). An adapter without ``decoder_layers`` reuses nothing."""

    def __init__(self, adapter: Any):
        self.model = adapter.model
        try:
            self.blocks: nn.ModuleList | None = adapter.decoder_layers()
        except (AttributeError, ValueError):
            self.blocks = None
        self.prefixes: dict[int, PrefixStates] = {}

    @property
    def hits(self) -> int:
        return sum(p.hits for p in self.prefixes.values())

    @property
    def misses(self) -> int:
        return sum(p.misses for p in self.prefixes.values())

    def first_block(self, report: Any) -> int:
        """The lowest decoder block an erase report's patch edited (0: one outside the blocks, or no blocks)."""
        if self.blocks is None:
            return 0
        params = dict(self.model.named_parameters())
        names = {e.label.split("[", 1)[0] for e in report.patch.entries}
        if not names or any(n not in params for n in names):
            return 0
        return first_edited_block(self.blocks, [params[n] for n in names])

    @contextmanager
    def during(self, report: Any) -> Iterator[PrefixStates | None]:
        """Within the block, score the model as ``report`` edited it, the blocks below the edit computed once."""
        first = self.first_block(report)
        if first <= 0:
            yield None
            return
        config = getattr(self.model, "config", None)
        cached = getattr(config, "use_cache", None)
        with reuse_prefix(self.blocks, first, self.prefixes.get(first)) as prefix:
            self.prefixes[first] = prefix
            if cached is not None:
                config.use_cache = False
            try:
                yield prefix
            finally:
                if cached is not None:
                    config.use_cache = cached
