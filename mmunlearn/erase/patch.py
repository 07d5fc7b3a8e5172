"""Undo patches: low-rank factors of every edit, applied and reverted bit for bit.

An edit is W' = W - D with D = A @ B (A: m x k, B: k x n, the scale folded into A). In floating
point (W - D) + D differs from W wherever W - D lands in a coarser binade than W (its spacing
is twice W's, so W is not reachable from any neighbour either): a few percent of entries for
realistic updates, and wherever the sum has W's value but not its bits (a -0.0 in W comes back as 0.0).
``apply_exact`` records those entries, compared bit by bit (int32/int64 index + original value);
``revert_exact`` recomputes D the same way (float64 on the CPU, so the result does not depend on
the device or BLAS threading), adds it and writes the recorded entries back: the original
weights return bit for bit, at a fraction of the size of a dense copy.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from mmunlearn.files.atomic import atomic_path

FORMAT = "mmunlearn-undo-1"


def delta(A: torch.Tensor, B: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """D = A @ B computed in float64 on the CPU, cast to the weight dtype (deterministic)."""
    return (A.detach().to("cpu", torch.float64) @ B.detach().to("cpu", torch.float64)).to(dtype)


_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise, whether ``a`` and ``b`` (same dtype and shape) differ in their bits, not only in value: -0.0 and
    0.0 compare equal as numbers but not here (real checkpoints hold negative zeros: Whisper-tiny.en's float16 file)."""
    width = _SAME_WIDTH_INT[a.element_size()]
    return a.contiguous().view(width) != b.contiguous().view(width)


def digest(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes (dtype-agnostic)."""
    flat = t.detach().contiguous().to("cpu").reshape(-1).view(torch.uint8)
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


@dataclass
class PatchEntry:
    """Undo record of one edited matrix."""

    label: str  # e.g. "model.layers.3.mlp.up_proj.weight" or "....experts.gate_up_proj[5]"
    A: torch.Tensor  # m x k, float64, scale folded in
    B: torch.Tensor  # k x n, float64
    fix_idx: torch.Tensor  # flat indices where W' + D does not round back to W
    fix_val: torch.Tensor  # original values there
    before: str  # digest of the original matrix
    after: str  # digest of the edited matrix
    original: torch.Tensor | None = None  # dense record: the original tensor itself (any shape; A, B unused)


@dataclass
class UndoPatch:
    """All undo records of one erase, storable as one safetensors file."""

    entries: list[PatchEntry] = field(default_factory=list)

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (temp file + rename)."""
        path = Path(path)
        tensors: dict[str, torch.Tensor] = {}
        meta = []
        for i, e in enumerate(self.entries):
            tensors[f"{i}.A"] = e.A.contiguous()
            tensors[f"{i}.B"] = e.B.contiguous()
            tensors[f"{i}.fix_idx"] = e.fix_idx.contiguous()
            tensors[f"{i}.fix_val"] = e.fix_val.contiguous()
            if e.original is not None:
                tensors[f"{i}.orig"] = e.original.detach().cpu().contiguous()
            meta.append({"label": e.label, "before": e.before, "after": e.after})
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata={"format": FORMAT, "entries": json.dumps(meta)})
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> UndoPatch:
        """Read a saved patch; a missing, unreadable or malformed file raises an error naming it."""
        from safetensors import SafetensorError, safe_open

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"undo patch not found: {path}")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
        except SafetensorError as exc:
            raise ValueError(f"{path} is not a readable undo patch: not a valid safetensors file ({exc})") from exc
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path} is not an mmunlearn undo patch (format {meta.get('format')!r})")
        try:
            tensors = load_file(str(path))
            records = json.loads(meta["entries"])
            entries = [
                PatchEntry(
                    label=str(m["label"]),
                    A=tensors[f"{i}.A"],
                    B=tensors[f"{i}.B"],
                    fix_idx=tensors[f"{i}.fix_idx"],
                    fix_val=tensors[f"{i}.fix_val"],
                    before=m["before"],
                    after=m["after"],
                    original=tensors.get(f"{i}.orig"),
                )
                for i, m in enumerate(records)
            ]
        except SafetensorError as exc:
            raise ValueError(f"{path} is a corrupt undo patch: {exc}") from exc
        except KeyError as exc:
            raise ValueError(f"{path} is a corrupt undo patch: {exc.args[0]!r} is missing") from exc
        except (json.JSONDecodeError, TypeError) as exc:
            raise ValueError(f"{path} is a corrupt undo patch: its 'entries' list is not valid ({exc})") from exc
        except RecursionError:
            raise ValueError(f"{path} is a corrupt undo patch: its 'entries' list is nested too deeply") from None
        return cls(entries)


def apply_exact(view: torch.Tensor, A: torch.Tensor, B: torch.Tensor, label: str) -> tuple[PatchEntry, float]:
    """Subtract A @ B from ``view`` in place; return its undo record and ||A @ B||_F."""
    W = view.detach().to("cpu").clone()
    D = delta(A, B, W.dtype)
    new = W - D
    bad = bits_differ(new + D, W).reshape(-1).nonzero().squeeze(1)
    if W.numel() < 2**31:
        bad = bad.to(torch.int32)
    entry = PatchEntry(
        label=label,
        A=A.detach().to("cpu", torch.float64),
        B=B.detach().to("cpu", torch.float64),
        fix_idx=bad,
        fix_val=W.reshape(-1)[bad].clone(),
        before=digest(W),
        after=digest(new),
    )
    with torch.no_grad():
        view.copy_(new.to(view.device))
    return entry, float(torch.linalg.vector_norm(D.double()))


def dense_entry(label: str, before: torch.Tensor, after: torch.Tensor) -> PatchEntry:
    """Undo record of a tensor changed by any means (training, ...): its original value, stored whole."""
    empty = torch.zeros(0, dtype=torch.float64)
    return PatchEntry(
        label=label,
        A=empty,
        B=empty,
        fix_idx=torch.zeros(0, dtype=torch.int32),
        fix_val=torch.zeros(0, dtype=before.dtype),
        before=digest(before),
        after=digest(after),
        original=before.detach().to("cpu").clone(),
    )


def revert_exact(view: torch.Tensor, entry: PatchEntry) -> torch.Tensor:
    """The original matrix of an edited ``view`` (not written back; see ``restore``)."""
    cur = view.detach().to("cpu")
    if digest(cur) != entry.after:
        raise ValueError(
            f"{entry.label}: the weights are not the ones this patch produced "
            "(already restored, edited again, or another model)"
        )
    if entry.original is not None:
        if entry.original.shape != cur.shape or digest(entry.original) != entry.before:
            raise ValueError(f"{entry.label}: the undo patch's stored original is damaged")
        return entry.original.clone()
    out = cur + delta(entry.A, entry.B, cur.dtype)
    flat, idx = out.reshape(-1), entry.fix_idx.long()
    if idx.shape != entry.fix_val.shape or (idx.numel() and not 0 <= int(idx.min()) <= int(idx.max()) < flat.numel()):
        raise ValueError(
            f"{entry.label}: the undo patch's fix_idx does not index its {flat.numel()} weights "
            f"({idx.numel()} fixes for {entry.fix_val.numel()} values): a corrupt or foreign patch"
        )
    flat[idx] = entry.fix_val.to(out.dtype)
    if digest(out) != entry.before:
        raise RuntimeError(f"{entry.label}: restoring did not reproduce the original bits")
    return out
