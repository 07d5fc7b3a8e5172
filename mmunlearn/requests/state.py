"""The retain side of QR-Erase computed once: retain task matrices stored in a folder with fingerprints.

A deletion service edits the same model again and again with the same retain data; only the forget side
changes. ``obtain_retain_state(folder, adapter, retain, extract, kind=...)`` loads the retain task
matrices from ``folder`` when its fingerprints match (the weights they were taken from, the retain data,
the extraction settings, the layers and, for a text LLM, the prompt format its rows are written in), and otherwise
computes them, writes ``folder`` (atomically) and
says why. The erasure methods take them from :attr:`~mmunlearn.methods.base.RunContext.retain_task` and
extract only the forget side.

Folder layout::

    state/
      retain_state.json          format, fingerprints, extraction settings, cost
      retain_task.safetensors    name -> tensor (dense), or name::B / name::A (factored LoRA updates)

Models derived from the one a state was computed on by recorded requests (``lineage``: the fingerprints
of the models before each request, oldest first) keep using it: a QR-Erase edit is projected off the
retain subspace, so the retain task it was computed from is still the one to protect. ``refresh=True``
recomputes anyway.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from mmunlearn.files.checkpoint import atomic_dir
from mmunlearn.kinds import get_kind
from mmunlearn.methods.erasure import batchnorm_safe
from mmunlearn.taskvec.extract import ExtractConfig, extract_task_matrices
from mmunlearn.taskvec.lowrank import LowRank

log = logging.getLogger(__name__)

FORMAT = "mmunlearn-retain-state-1"
META_NAME = "retain_state.json"
TENSORS_NAME = "retain_task.safetensors"


def model_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 of a model's state (names, dtypes, shapes and bytes of every parameter and buffer)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\n".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _file_digest(path: str, cache: dict[str, str]) -> str:
    if path not in cache:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        cache[path] = h.hexdigest()
    return cache[path]


def data_fingerprint(items: Sequence[Any]) -> str:
    """SHA-256 of a partition: each item's fields and, for rows naming an audio file, the file's bytes."""
    h, files = hashlib.sha256(), {}
    for item in items:
        fields = item.to_dict() if hasattr(item, "to_dict") else dict(item) if isinstance(item, Mapping) else item
        h.update(repr(sorted(fields.items()) if isinstance(fields, dict) else fields).encode())
        wav = fields.get("wav") if isinstance(fields, dict) else None
        if isinstance(wav, (str, os.PathLike)) and os.path.isfile(wav):
            h.update(_file_digest(os.fspath(wav), files).encode())
        h.update(b"\n")
    return h.hexdigest()


def _layers(adapter) -> list[list[Any]]:
    return [[lw.name, list(lw.weight.shape)] for lw in adapter.layers()]


@dataclass
class RetainState:
    """Retain task matrices and what they were computed from. ``status``: loaded | computed | recomputed."""

    task: dict[str, Any]  # layer name -> tensor or LowRank
    meta: dict[str, Any]
    status: str = "computed"
    reason: str = ""
    folder: Path | None = None
    seconds: float = 0.0  # to obtain it now (load or compute)

    def describe(self) -> dict[str, Any]:
        """What the unlearning report records about the retain state used."""
        return {
            "folder": str(self.folder) if self.folder else None,
            "status": self.status,
            "reason": self.reason,
            "seconds": self.seconds,
            "model_fingerprint": self.meta.get("model_fingerprint"),
            "retain_fingerprint": self.meta.get("retain_fingerprint"),
            "extract": self.meta.get("extract"),
            "prompt_format": self.meta.get("prompt_format"),
            "compute_seconds": self.meta.get("compute_seconds"),
        }


def expected_meta(adapter, retain: Sequence[Any], extract: ExtractConfig, kind: str) -> dict[str, Any]:
    """The fingerprints a state for these inputs must carry (the model's is computed here); a text LLM's also the
    prompt format its rows are written in (the task matrices are trained on the rows in it)."""
    meta = {
        "format": FORMAT,
        "kind": kind,
        "model_fingerprint": model_fingerprint(adapter.model),
        "retain_fingerprint": data_fingerprint(retain),
        "retain_items": len(retain),
        "extract": asdict(extract),
        "layers": _layers(adapter),
    }
    fmt = getattr(adapter, "format_name", None)
    if fmt is not None:
        meta["prompt_format"] = fmt
    return meta


def compute_retain_state(
    adapter,
    retain: Sequence[Any],
    extract: ExtractConfig,
    *,
    kind: str,
    progress: bool = True,
    meta: Mapping[str, Any] | None = None,
) -> RetainState:
    """Extract the retain task matrices of ``retain`` from ``adapter`` (left unchanged, bit for bit)."""
    if not retain:
        raise ValueError("the retain set is empty: no retain state to compute")
    info = dict(meta) if meta is not None else expected_meta(adapter, retain, extract, kind)
    source = adapter
    if get_kind(kind).has_batchnorm:
        extract = batchnorm_safe(extract, len(retain))
        source = adapter.clone()  # fine-tuning moves BatchNorm statistics: do it on a copy
    t0 = time.perf_counter()
    task = dict(extract_task_matrices(source, retain, extract, progress=progress))
    info["compute_seconds"] = time.perf_counter() - t0
    info["extract_used"] = asdict(extract)
    return RetainState(task, info, "computed", "", None, info["compute_seconds"])


def save_retain_state(
    state: RetainState, folder: str | os.PathLike, *, overwrite: bool = True, inputs: Sequence[str | os.PathLike] = ()
) -> Path:
    """Write ``state`` into ``folder`` atomically (``inputs``: folders it must not be, lie in or contain)."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for name, t in state.task.items():
        if isinstance(t, LowRank):
            tensors[f"{name}::B"], tensors[f"{name}::A"] = t.B.contiguous(), t.A.contiguous()
        else:
            tensors[name] = t.detach().to("cpu").contiguous()
    folder = Path(folder)
    with atomic_dir(folder, overwrite=overwrite, inputs=inputs) as tmp:
        save_file(tensors, str(tmp / TENSORS_NAME), metadata={"format": FORMAT})
        (tmp / META_NAME).write_text(json.dumps(state.meta, indent=2))
    state.folder = folder.resolve()
    return folder


def load_retain_state(folder: str | os.PathLike) -> RetainState:
    """Read a state folder (safetensors and JSON only); a missing or malformed one raises an error naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    meta_path, tensor_path = folder / META_NAME, folder / TENSORS_NAME
    if not meta_path.is_file() or not tensor_path.is_file():
        raise FileNotFoundError(f"{folder} is not a retain state folder (no {META_NAME} / {TENSORS_NAME})")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{meta_path} is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(
            f"{meta_path} is not an mmunlearn retain state (format {meta.get('format')!r})"
            if isinstance(meta, dict)
            else f"{meta_path} is not an mmunlearn retain state"
        )
    try:
        raw = load_file(str(tensor_path))
    except SafetensorError as exc:
        raise ValueError(f"{tensor_path} is not a readable safetensors file: {exc}") from exc
    task: dict[str, Any] = {}
    for key, t in raw.items():
        if key.endswith("::B") or key.endswith("::A"):
            name = key[:-3]
            if name not in task:
                if f"{name}::B" not in raw or f"{name}::A" not in raw:
                    raise ValueError(f"{tensor_path}: factored entry {name!r} lacks its B or A part")
                task[name] = LowRank(raw[f"{name}::B"], raw[f"{name}::A"])
        else:
            task[key] = t
    return RetainState(task, meta, "loaded", "", folder.resolve())


def _mismatch(stored: Mapping[str, Any], want: Mapping[str, Any], lineage: Sequence[str]) -> tuple[str | None, str]:
    """Why ``stored`` does not fit (None: it fits) and, when it fits, how."""
    for key, what in (
        ("kind", "model kind"),
        ("retain_fingerprint", "retain data"),
        ("extract", "extraction settings"),
        ("layers", "model layers"),
        ("prompt_format", "prompt format"),
    ):
        if key == "extract" and want.get(key) is None:
            continue  # any extraction the stored state used
        if stored.get(key) != want.get(key):
            if key == "prompt_format":  # a state written before formats were recorded has none
                return (
                    f"the prompt format changed (the state's: {stored.get(key) or 'not recorded'}, this run's: "
                    f"{want.get(key)})"
                ), ""
            return f"the {what} changed", ""
    if stored.get("model_fingerprint") == want["model_fingerprint"]:
        return None, "fingerprints match"
    if stored.get("model_fingerprint") in lineage:
        back = len(lineage) - list(lineage).index(stored.get("model_fingerprint"))
        return None, f"computed on this model {back} request(s) ago (edits since are recorded)"
    return "the model weights changed", ""


def obtain_retain_state(
    folder: str | os.PathLike | None,
    adapter,
    retain: Sequence[Any],
    extract: ExtractConfig | None,
    *,
    kind: str,
    default_extract: ExtractConfig | None = None,
    lineage: Sequence[str] = (),
    refresh: bool = False,
    progress: bool = True,
    inputs: Sequence[str | os.PathLike] = (),
    note: Mapping[str, Any] | None = None,
) -> RetainState:
    """The retain state of ``adapter`` and ``retain``: loaded from ``folder`` when it matches, else computed
    (and written to ``folder`` unless it is None); ``state.status`` / ``state.reason`` say which and why.

    Args:
        extract: the extraction settings the state must have (None: whatever the stored state used; when
            computing, ``default_extract``).
        lineage: fingerprints of the models ``adapter`` derives from by recorded requests (oldest first); a
            state computed on one of them is used as is.
        refresh: recompute even when the stored state matches.
        inputs: folders ``folder`` must not be, lie in or contain (the model's own folder).
        note: more fields a computed state records (not compared; e.g. why its prompt format was chosen).
    """
    t0 = time.perf_counter()
    if extract is None and default_extract is None:
        raise ValueError("obtain_retain_state needs extract or default_extract")
    want = {**expected_meta(adapter, retain, extract or default_extract, kind), **(note or {})}
    check = want if extract is not None else {**want, "extract": None}
    status, reason = "computed", "no retain state stored yet"
    if folder is not None and Path(folder).exists():
        try:
            stored = load_retain_state(folder)
        except (FileNotFoundError, ValueError) as exc:
            status, reason = "recomputed", f"the stored state is unreadable ({exc})"
        else:
            why, how = _mismatch(stored.meta, check, lineage)
            if why is None and not refresh:
                stored.reason, stored.seconds = how, time.perf_counter() - t0
                return stored
            status, reason = "recomputed", "refresh asked" if why is None else why
            if extract is None and isinstance(stored.meta.get("extract"), dict):
                try:  # recomputed as it was prepared
                    default_extract = ExtractConfig(**stored.meta["extract"])
                except (TypeError, ValueError):
                    pass
                want = {**want, "extract": asdict(default_extract)}
    if status == "recomputed":
        log.warning("retain state %s: %s; recomputing it", folder, reason)
    state = compute_retain_state(adapter, retain, extract or default_extract, kind=kind, progress=progress, meta=want)
    state.status, state.reason = status, reason
    if folder is not None:
        save_retain_state(state, folder, overwrite=True, inputs=inputs)
    state.seconds = time.perf_counter() - t0
    return state


__all__ = [
    "FORMAT",
    "META_NAME",
    "TENSORS_NAME",
    "RetainState",
    "compute_retain_state",
    "data_fingerprint",
    "expected_meta",
    "load_retain_state",
    "model_fingerprint",
    "obtain_retain_state",
    "save_retain_state",
]
