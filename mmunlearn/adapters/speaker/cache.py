"""Speaker embeddings kept while the embedding model's weights stay the same: scoring after a head-only edit (both
speaker classifier adapters: ECAPA's embeddings, a Hugging Face audio classifier's pooled vectors).

An edit of the classifier head (``SpeakerAdapter.scope == "head"``: the sweep of a speaker request, the
harness's before/after scoring) leaves every embedding as it was, so only the cosine head needs computing
again. :class:`EmbeddingCache` keys an embedding by a digest of the exact bytes of everything the embedding
depends on -- every parameter and buffer outside the head, in order -- and of the utterance's samples cut
to its own length (how the adapter scores it, see ``batches.by_length``). A changed weight changes the
digest, so a stale embedding is never served; nothing is trusted to a version counter or a flag.

Hand-written because no library caches module outputs keyed by the module's weights.

>>> import torch
>>> from mmunlearn.adapters.speaker.adapter import SpeakerAdapter
>>> adapter = SpeakerAdapter.build(["a", "b"], preset="tiny", device="cpu")
>>> adapter.scope = "head"  # turns the cache on
>>> batch = adapter.collate([{"wav": torch.randn(8000), "spk_id": "a"}, {"wav": torch.randn(6000), "spk_id": "b"}])
>>> with torch.no_grad():
...     first, again = adapter.cosine(batch), adapter.cosine(batch)
>>> torch.equal(first, again), adapter.embedding_cache.hits, adapter.embedding_cache.misses
(True, 2, 2)
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import torch
from torch import nn

HEAD_PREFIX = "classifier."


def embedding_state_digest(net: nn.Module) -> str:
    """Digest of the bytes, dtypes and shapes of every parameter and buffer of ``net`` outside the head."""
    h = hashlib.blake2b(digest_size=20)
    for name, tensor in net.state_dict().items():
        if name.startswith(HEAD_PREFIX):
            continue
        t = tensor.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}\0{t.dtype}\0{tuple(tensor.shape)}\0".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def embedding_needs_grad(net: nn.Module) -> bool:
    """Whether a parameter outside the head wants a gradient (cached embeddings are detached: none reaches it)."""
    return any(p.requires_grad for name, p in net.named_parameters() if not name.startswith(HEAD_PREFIX))


def utterance_digest(wav: torch.Tensor) -> str:
    """Digest of one utterance's samples (already cut to its own length)."""
    t = wav.detach().cpu().contiguous().reshape(-1)
    return hashlib.blake2b(t.view(torch.uint8).numpy().tobytes() + str(t.dtype).encode(), digest_size=20).hexdigest()


class EmbeddingCache:
    """Embeddings per (embedding-model state, utterance); at most ``states`` states are kept (least recently
    used dropped), each with at most ``per_state`` utterances."""

    def __init__(self, states: int = 4, per_state: int = 200_000):
        if states < 1 or per_state < 1:
            raise ValueError(f"states and per_state must be >= 1, got {states} and {per_state}")
        self.states, self.per_state = states, per_state
        self._store: OrderedDict[str, dict[str, torch.Tensor]] = OrderedDict()
        self.hits = self.misses = 0

    def lookup(self, net: nn.Module, wavs: torch.Tensor, samples: list[int], compute) -> torch.Tensor:
        """Embeddings (B x d) of the utterances ``wavs[i, :samples[i]]``; ``compute(indices)`` embeds the
        missing ones (a list of batch indices) and returns them in that order."""
        state = embedding_state_digest(net)
        store = self._store.setdefault(state, {})
        self._store.move_to_end(state)
        while len(self._store) > self.states:
            self._store.popitem(last=False)
        keys = [utterance_digest(wavs[i, :n]) for i, n in enumerate(samples)]
        missing = [i for i, k in enumerate(keys) if k not in store]
        fresh = dict(zip(missing, compute(missing).detach())) if missing else {}
        for i, emb in fresh.items():
            if len(store) >= self.per_state:
                store.clear()
            store[keys[i]] = emb
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        return torch.stack([fresh[i] if i in fresh else store[k] for i, k in enumerate(keys)])
