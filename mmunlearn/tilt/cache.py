"""Hidden-state cache for T3: one frozen pass over retain and forget answers, stored on disk.

For every answer token y_t the cache keeps the final hidden state at position t-1 (the state
that predicts y_t), the token id, the partition label (retain 1, forget 0) and whether y_t is already in the text
before it (the prompt or the answer so far: the tokens T3's ``spare_seen`` spares). The file name
is a key over the model's fingerprint, the data and the layer, so later runs with the same
model and data reuse it; the one-off extraction time is reported separately from training.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from mmunlearn.adapters.base import HiddenStateTap
from mmunlearn.adapters.text.adapter import IGNORE, _qa
from mmunlearn.files.atomic import atomic_path
from mmunlearn.progress import StageBar
from mmunlearn.tilt.head import pool_states


@dataclass
class StateCache:
    """Cached (state, token, label) triples and where they came from."""

    states: torch.Tensor  # N x d
    tokens: torch.Tensor  # N (the answer token each state predicts)
    labels: torch.Tensor  # N, 1.0 = retain, 0.0 = forget
    seq: torch.Tensor  # N, index of the example the token belongs to
    seen: torch.Tensor  # N bools: the token occurs earlier in its row (prompt or answer so far)
    path: Path | None
    seconds: float  # extraction time (0 if loaded from disk)
    reused: bool


def model_fingerprint(model: torch.nn.Module) -> str:
    """A cheap identity of a model's weights: names, shapes, dtypes, sums and a few values."""
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        flat = p.detach().reshape(-1)
        sample = torch.cat([flat[:8], flat[-8:]]).float().cpu() if flat.numel() else flat.float().cpu()
        h.update(f"{name}|{tuple(p.shape)}|{p.dtype}|{float(flat.double().sum()) if flat.numel() else 0.0!r}".encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()


def _example_key(example: Any) -> tuple:
    """(question, answer), plus the audio segment for spoken-QA examples whose ``wav`` is a file path."""
    wav = example.get("wav") if isinstance(example, Mapping) else None
    if isinstance(wav, (str, os.PathLike)):
        return (*_qa(example), str(wav), example.get("start"), example.get("stop"))
    return _qa(example)


def data_digest(examples: Sequence[Any]) -> str:
    """Hash of the (question, answer[, audio]) of the examples, in order."""
    return hashlib.sha256(json.dumps([_example_key(e) for e in examples]).encode()).hexdigest()


def cache_key(model: torch.nn.Module, retain: Sequence[Any], forget: Sequence[Any], layer: str) -> str:
    parts = [model_fingerprint(model), data_digest(retain), data_digest(forget), layer]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


@torch.no_grad()
def extract_states(
    adapter, examples: Sequence[Any], batch_size: int = 16, desc: str | None = None, pooling: str = "last"
):
    """(states, tokens, seq, seen) of every answer token of ``examples`` from the final hidden states, pooled as the
    head reads them (:func:`~mmunlearn.tilt.head.pool_states`); ``seen``: the token occurs at an earlier real position
    of its row."""
    tap = HiddenStateTap(adapter.model.base_model)
    try:
        states, tokens, seq, seen = [], [], [], []
        for i in StageBar(range(0, len(examples), batch_size), desc=desc, disable=desc is None, leave=False):
            batch = adapter.collate(examples[i : i + batch_size])
            b = {k: v.to(adapter.device) for k, v in batch.items()}
            adapter.model(**{k: v for k, v in b.items() if k != "labels"})  # audio inputs too, if any
            h = pool_states(tap.states, b.get("attention_mask"), pooling)[:, :-1]
            targets = b["labels"][:, 1:]
            mask = targets != IGNORE
            states.append(h[mask].float().cpu())
            tokens.append(targets[mask].cpu())
            rows = torch.arange(i, i + len(batch["input_ids"]), device=mask.device)[:, None].expand_as(mask)
            seq.append(rows[mask].cpu())
            seen.append(earlier(b["input_ids"], b.get("attention_mask"))[mask].cpu())
    finally:
        tap.remove()
    return torch.cat(states), torch.cat(tokens), torch.cat(seq), torch.cat(seen)


def earlier(input_ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """B x (L-1) bools: entry (b, t) is True when token ``input_ids[b, t+1]`` occurs at a real position <= t of row b
    (``mask`` B x L, 1 = a real token; padding never counts): the next token is a copy of one already in the text,
    as :func:`mmunlearn.tilt.processor.seen_tokens` marks it when scoring and generating."""
    same = input_ids[:, 1:, None] == input_ids[:, None, :]  # (b, t, s): the token after t equals the token at s
    length = input_ids.shape[1]
    before = torch.ones(length - 1, length, dtype=torch.bool, device=input_ids.device).tril()  # s <= t
    same = same & before
    if mask is not None:
        same = same & mask.to(input_ids.device).bool()[:, None, :]
    return same.any(-1)


def build_cache(
    adapter,
    retain: Sequence[Any],
    forget: Sequence[Any],
    cache_dir: str | os.PathLike | None = None,
    batch_size: int = 16,
    layer: str = "final",
    pooling: str = "last",
) -> StateCache:
    """Extract (or reuse from ``cache_dir``) the hidden states of retain and forget answers, pooled as ``pooling``."""
    if not retain or not forget:
        raise ValueError(f"T3 needs both retain and forget examples (got {len(retain)} retain, {len(forget)} forget)")
    if layer != "final":
        raise ValueError(f"only the final hidden state is supported as the tilt input, got layer={layer!r}")
    path = None
    if cache_dir is not None:
        key = cache_key(adapter.model, retain, forget, layer if pooling == "last" else f"{layer}-{pooling}")
        path = Path(cache_dir) / f"states-{key}.safetensors"
        if path.is_file():
            t = load_file(str(path))
            if "seen" in t:  # a cache written before the seen marks were kept is extracted again
                return StateCache(t["states"], t["tokens"], t["labels"], t["seq"], t["seen"], path, 0.0, True)
    start = time.perf_counter()
    hr, yr, sr, er = extract_states(adapter, retain, batch_size, desc="cache retain states", pooling=pooling)
    hf, yf, sf, ef = extract_states(adapter, forget, batch_size, desc="cache forget states", pooling=pooling)
    cache = StateCache(
        states=torch.cat([hr, hf]),
        tokens=torch.cat([yr, yf]),
        labels=torch.cat([torch.ones(len(yr)), torch.zeros(len(yf))]),
        seq=torch.cat([sr, sf + len(retain)]),
        seen=torch.cat([er, ef]),
        path=path,
        seconds=time.perf_counter() - start,
        reused=False,
    )
    if path is not None:
        with atomic_path(path) as tmp:
            save_file(
                {
                    "states": cache.states.contiguous(),
                    "tokens": cache.tokens,
                    "labels": cache.labels,
                    "seq": cache.seq,
                    "seen": cache.seen,
                },
                str(tmp),
            )
    return cache
