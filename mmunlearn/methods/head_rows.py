"""The forgotten speakers' rows of a speaker classifier's head, turned away from every forgotten speaker's audio.

With two or more forgotten speakers, editing each forgotten class row along its own speaker's direction moves it
*towards* the other forgotten speakers (their centroids are not orthogonal: on FSDD their cosines run from -0.6 to
0.2), so speaker A's audio goes to forgotten speaker B and "predicted as any forgotten speaker" stays high (57 % on
FSDD with 3 forgotten). Here every forgotten row ``w_s`` is moved against the same direction, the mean
``u = normalise(sum_k c_k)`` of the forgotten speakers' normalised centroids ``c_k``:

    T_head[s] = ||w_s|| u          (other rows 0; rank 1)

``W - a * T_head`` lowers every forgotten class's cosine with every forgotten speaker's mean direction as ``a``
grows (the row's limit is ``-u``) and leaves the retained rows untouched, so the share of forgotten audio predicted
as any forgotten speaker falls with the edit size and the erasure's sweep can bisect it. (Also removing each row's
component in the span of the ``c_k`` works at ``a = 1`` but reflects it beyond, which pulls forgotten row B towards
A's audio again: on FSDD the response was not monotone and the doubling grid missed its window.) A cosine head
needs edits several times the row's norm (FSDD, 3 of 6 forgotten: about 16x). Measured in docs/speakers.md
(issue 24, item 3). A later deletion request turns the rows of the speakers earlier requests forgot as well, with
their original rows standing in for their audio in ``u`` (:func:`forgotten_rows`; measured in docs/requests.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mmunlearn.taskvec.extract import ExtractConfig
from mmunlearn.taskvec.store import TaskMatrices


def forgotten_speakers(forget: Sequence[Any]) -> list[str]:
    """The speaker IDs of the forget rows, sorted (rows without ``spk_id`` are not speaker rows)."""
    return sorted({str(r["spk_id"]) for r in forget if isinstance(r, dict) and "spk_id" in r})


@torch.no_grad()
def speaker_directions(adapter, forget: Sequence[Any], batch_size: int = 16) -> dict[str, torch.Tensor]:
    """Each forgotten speaker's centroid of unit-length embeddings (what a cosine head reads), itself normalised
    (float64, one d-vector per speaker)."""
    model = adapter.model
    was_training = model.training
    model.eval()
    sums: dict[str, torch.Tensor] = {}
    try:
        for i in range(0, len(forget), batch_size):
            chunk = forget[i : i + batch_size]
            emb = torch.nn.functional.normalize(adapter.embeddings(adapter.collate(chunk)).double(), dim=-1)
            for row, e in zip(chunk, emb):
                spk = str(row["spk_id"])
                sums[spk] = sums[spk] + e if spk in sums else e.clone()
    finally:
        model.train(was_training)
    out = {}
    for spk, total in sums.items():
        norm = float(total.norm())
        if not norm > 0:
            raise ValueError(f"forget speaker {spk!r}: its utterances' embeddings cancel out (zero centroid)")
        out[spk] = total / norm
    return out


def forgotten_rows(
    adapter,
    forget: Sequence[Any],
    tf: TaskMatrices,
    extract: ExtractConfig,
    earlier: Sequence[str] | Mapping[str, torch.Tensor | None] = (),
) -> TaskMatrices:
    """``tf`` with the head's task matrix replaced by ``T_head`` (module doc).

    Applies with gradient task vectors, the head among the edited weights and either two or more forgotten speakers
    or speakers forgotten ``earlier`` (by earlier deletion requests): their rows are turned against the same
    direction ``u``, so this request's audio cannot land on them. Their audio is not at hand; ``earlier`` may map
    a speaker to a stand-in for its direction (its class row before any request edited it, see
    :func:`mmunlearn.requests.history.original_tensor`), which then joins ``u`` as a centroid would, so the
    edit does not pull that speaker's audio onto the rows it turns. ``tf`` is returned unchanged otherwise (one
    speaker's own direction already sends it to the retained speakers). ``meta["forgotten_rows"]`` lists the
    speakers whose rows are edited, ``meta["earlier_directions"]`` those whose stand-in joined ``u``."""
    speakers = forgotten_speakers(forget)
    stand_in = dict(earlier) if isinstance(earlier, Mapping) else {}
    earlier = sorted({str(s) for s in earlier} - set(speakers))
    head_weight = adapter.head_weight  # the class-weight matrix, one row per speaker, as the adapter names it
    if extract.kind != "gradient" or len(speakers) + len(earlier) < 2 or head_weight not in tf:
        return tf
    index = adapter.index
    missing = [s for s in speakers + earlier if s not in index]
    if missing:
        raise ValueError(f"forget speaker(s) {missing[:5]} are not classes of the model")
    dirs = speaker_directions(adapter, forget)
    joined = [s for s in earlier if stand_in.get(s) is not None]
    u = torch.stack(
        [dirs[s] for s in speakers] + [torch.nn.functional.normalize(stand_in[s].double().cpu(), dim=0) for s in joined]
    ).sum(0)
    if not float(u.norm()) > 0:
        raise ValueError("the forgotten speakers' mean directions cancel out: no common direction to move away from")
    u = u / u.norm()
    weight = dict(adapter.model.named_parameters())[head_weight].detach().double().cpu()
    head = torch.zeros_like(weight)
    for spk in speakers + earlier:
        head[index[spk]] = weight[index[spk]].norm() * u
    like = tf[head_weight]
    return TaskMatrices(
        {**tf.tensors, head_weight: head.to(like.dtype).to(like.device)},
        {**tf.meta, "forgotten_rows": sorted(speakers + earlier), "earlier_directions": joined},
    )
