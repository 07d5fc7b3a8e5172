"""Streaming QR-Erase and restore of (sharded) safetensors checkpoints: one shard, one task matrix at a time.

``stream_erase_checkpoint`` gives the weights, undo patch and report of
:func:`mmunlearn.erase.in_memory.erase_checkpoint` bit for bit, without holding the model or the task
matrices in memory (the undo patch, as there, goes to ``<out>.undo/`` beside ``out``, never into it:
:mod:`mmunlearn.files.undo_store`):

1. headers only: every forget (and retain) task matrix is matched with a checkpoint tensor and its
   shape and ranks are checked, as ``erase`` does before touching a weight;
2. layer energies: the forget matrices are read one at a time for their norms, then the layers to
   edit are selected;
3. per shard, in file order: a shard with nothing to edit is hard-linked into the output (copied
   when linking fails, e.g. across file systems, or with ``hardlink=False``); a shard with edits is
   opened (memory-mapped), each of its edited tensors is erased with its own forget / retain matrix
   (read just then) by :func:`mmunlearn.erase.erase`, and the shard is written anew with its
   header metadata. The index and the non-weight files are copied.

Peak memory is about one shard plus one matrix's forget and retain task matrices and the
temporaries of one edit, whatever the size of the model. Everything is written into a temporary
sibling of ``out`` that is renamed into place at the end: an interrupted run leaves no ``out``
(and the next run on the same ``out`` removes its temporary folder). ``out`` may not overlap an input,
and no edited or restored tensor with NaN or Inf values is ever written.
Hard-linked shards share their inode with the input: rewriting one of them *in place* would change
both (writers that replace the file, as safetensors and HF ``save_pretrained`` do, are safe).

One difference from the in-memory path: a selected matrix whose forget task matrix is exactly zero
is left as it is without an undo entry (the in-memory path records a no-op edit for it); the
weights are the same either way.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from mmunlearn.erase.apply import _check_rank, erase, restore
from mmunlearn.erase.energy import group_of, layer_energy, select_layers
from mmunlearn.erase.norms import sq_norm
from mmunlearn.erase.options import EraseOptions
from mmunlearn.erase.patch import PatchEntry, UndoPatch
from mmunlearn.erase.report import EraseReport, LayerRow, MatrixRow
from mmunlearn.erase.subspace.basis import METHODS
from mmunlearn.erase.views import ParamTable, task_matrices_for
from mmunlearn.errors import NonFiniteError, about, writing
from mmunlearn.files.checkpoint import (
    INDEX,
    atomic_dir,
    check_finite,
    check_output_dir,
    copy_extra_files,
    save_shard,
    shard_files,
)
from mmunlearn.files.layout import ERASE_REPORT, PATCH_NAME, PLOT_NAME, TILT_DIR, UNLEARN_REPORT
from mmunlearn.files.safecopy import copy_from_fd, open_inside
from mmunlearn.files.undo_store import default_undo_dir, patch_of, split_undo, undo_dir_path
from mmunlearn.progress import StageBar
from mmunlearn.taskvec.store import LazyTaskMatrices, open_task_matrices

log = logging.getLogger(__name__)
_EDITABLE = ("F16", "BF16", "F32", "F64")  # safetensors' names of erase.apply.EDITABLE
#: outputs of an erase or of the unlearning harness (its report, T3's head), not part of a model
LEFTOVERS = (PATCH_NAME, ERASE_REPORT, PLOT_NAME, UNLEARN_REPORT, TILT_DIR)


@dataclass
class ShardedCheckpoint:
    """The layout of a safetensors checkpoint directory, from its index and shard headers only."""

    root: Path
    shards: dict[str, list[str]]  # shard file -> tensor names, in index order
    shard_of: dict[str, str]  # tensor name -> shard file
    shapes: dict[str, tuple[int, ...]]
    shard_meta: dict[str, dict]  # shard file -> safetensors header metadata
    dtypes: dict[str, str] = field(default_factory=dict)  # tensor name -> safetensors dtype ("F32", "BF16", ...)

    def meta_tensors(self) -> dict[str, torch.Tensor]:
        """Shape-only (``meta`` device) stand-ins of every tensor: validation without loading."""
        return {n: torch.empty(s, device="meta") for n, s in self.shapes.items()}


def open_checkpoint(root: str | os.PathLike) -> ShardedCheckpoint:
    """Read the layout of a checkpoint directory (``model.safetensors`` or index + shards)."""
    root = Path(root)
    shards = shard_files(root)
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    shard_meta: dict[str, dict] = {}
    for shard, names in shards.items():
        try:
            with safe_open(str(root / shard), framework="pt") as f:
                shard_meta[shard] = f.metadata() or {}
                present = set(f.keys())
                for name in names:
                    if name not in present:
                        raise ValueError(f"{root / INDEX} maps {name!r} to {shard}, which does not hold it")
                    shapes[name] = tuple(f.get_slice(name).get_shape())
                    dtypes[name] = f.get_slice(name).get_dtype()
        except (SafetensorError, FileNotFoundError) as exc:
            raise ValueError(f"cannot read shard {root / shard}: {exc}") from exc
    shard_of = {n: s for s, names in shards.items() for n in names}
    return ShardedCheckpoint(
        root=root, shards=shards, shard_of=shard_of, shapes=shapes, shard_meta=shard_meta, dtypes=dtypes
    )


def _load_shard(root: Path, shard: str) -> dict[str, torch.Tensor]:
    """Every tensor of one shard, memory-mapped copy-on-write: edits never reach the file."""
    try:
        with safe_open(str(root / shard), framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"cannot read shard {root / shard}: {exc}") from exc


def _write_shard(tensors: Mapping[str, torch.Tensor], path: Path, metadata: dict) -> None:
    """Write one shard (the layout ``write_checkpoint`` uses)."""
    save_shard(tensors, path, metadata)


def _link_or_copy(root: Path, shard: str, dst: Path, hardlink: bool, shown: Path) -> bool:
    """Hard-link the shard ``root/shard`` to ``dst``, or copy it; True when linked. The shard is opened once,
    without following a link out of ``root`` (:func:`mmunlearn.files.safecopy.open_inside`); the hard link is kept
    only if it is that very file (same device and inode), else the opened file is copied: replacing the
    shard by a link meanwhile never brings another file into the output."""
    fd = open_inside(root, shard)
    try:
        if hardlink:
            opened = os.fstat(fd)
            try:
                os.link(os.path.realpath(root / shard), dst, follow_symlinks=False)
            except OSError:  # other file system, no link support, or not permitted
                pass
            else:
                linked = os.lstat(dst)
                if (linked.st_dev, linked.st_ino) == (opened.st_dev, opened.st_ino):
                    return True
                os.unlink(dst)  # the name now leads elsewhere: copy what was opened and checked
        with writing(dst, shown):
            copy_from_fd(fd, dst)
        return False
    finally:
        os.close(fd)


def _check_inputs(
    ckpt: ShardedCheckpoint,
    forget: LazyTaskMatrices,
    retain: LazyTaskMatrices | None,
    rank: int | None,
    retain_rank: int | None,
) -> None:
    """The name, shape and rank checks of ``erase`` on headers only (values are checked when read)."""
    params = ParamTable(ckpt.meta_tensors())
    for name in forget:
        param, kind = params.get(name)
        dtype = ckpt.dtypes.get(name)
        if dtype is not None and dtype not in _EDITABLE:
            raise ValueError(
                f"model parameter {name!r} in {ckpt.root / ckpt.shard_of[name]} has dtype {dtype}; "
                "expected floating point (float16, bfloat16, float32 or float64)"
            )
        tf = task_matrices_for(name, torch.empty(forget.shape(name), device="meta"), param, kind)
        tr = [None] * len(tf)
        if retain is not None:
            if name not in retain:
                raise KeyError(f"retain task matrices have no entry for {name!r}")
            tr = [t for _, t in task_matrices_for(name, torch.empty(retain.shape(name), device="meta"), param, kind)]
        for (label, t), r in zip(tf, tr):
            _check_rank(rank, label, tuple(t.shape), "forget")
            if r is not None:
                _check_rank(retain_rank, label, tuple(r.shape), "retain")


class _WithProgress(Mapping):
    """A mapping whose iteration shows a progress bar (for the energy pass)."""

    def __init__(self, inner: Mapping, desc: str, enabled: bool):
        self.inner, self.desc, self.enabled = inner, desc, enabled

    def __getitem__(self, key):
        return self.inner[key]

    def __iter__(self) -> Iterator:
        return iter(StageBar(list(self.inner), desc=self.desc, disable=not self.enabled, dynamic_ncols=True))

    def __len__(self) -> int:
        return len(self.inner)


def stream_erase_checkpoint(
    model_dir: str | os.PathLike,
    forget: str | os.PathLike,
    out: str | os.PathLike,
    *,
    retain: str | os.PathLike | None = None,
    overwrite: bool = False,
    hardlink: bool = True,
    progress: bool = True,
    **options,
) -> EraseReport:
    """QR-Erase a checkpoint directory into ``out`` shard by shard (see the module docstring).

    ``forget`` / ``retain``: a task-matrix file, a directory of them or a sharded file's index.
    ``options``: ``groups`` and the fields of :class:`~mmunlearn.erase.options.EraseOptions` (as
    :func:`mmunlearn.erase.erase` takes them).
    ``hardlink``: hard-link the shards with no edit (else copy them).
    """
    start = time.perf_counter()
    groups = options.pop("groups", None)
    o = EraseOptions.of(options).resolved()
    model_dir, out = Path(model_dir), Path(out)
    inputs = (model_dir, forget, retain)
    check_output_dir(out, *inputs, overwrite=overwrite)
    check_output_dir(default_undo_dir(out), *inputs, out, overwrite=overwrite)  # before the work, not after it
    key = _group_key(groups)
    if o.method not in METHODS:
        raise ValueError(f"unknown subspace method {o.method!r}; choose one of {sorted(METHODS)}")

    ckpt = open_checkpoint(model_dir)
    tf = open_task_matrices(forget)
    tr = open_task_matrices(retain) if retain is not None else None
    files = f"model {model_dir}, forget {forget}" + (f", retain {retain}" if retain is not None else "")
    energies, chosen = _choose_layers(ckpt, tf, tr, o, key, files, progress)
    edit = [n for n in tf if key(n) in chosen]
    by_shard: dict[str, list[str]] = {}
    for name in edit:
        by_shard.setdefault(ckpt.shard_of[name], []).append(name)

    rows: dict[str, list[MatrixRow]] = {}
    entries: dict[str, list[PatchEntry]] = {}
    linked = 0
    with atomic_dir(out, overwrite=overwrite, inputs=inputs) as tmp:
        copy_extra_files(model_dir, tmp, skip=set(ckpt.shards))  # the index too, through the same walk
        for shard in StageBar(ckpt.shards, desc="erase shards", disable=not progress, dynamic_ncols=True):
            if shard not in by_shard:
                linked += _link_or_copy(model_dir, shard, tmp / shard, hardlink, out / shard)
                continue
            shard_rows, shard_entries = _erase_shard(
                model_dir, shard, by_shard[shard], tf, tr, o, tmp, out, ckpt.shard_meta[shard]
            )
            rows.update(shard_rows)
            entries.update(shard_entries)
        report = _stream_report(edit, rows, entries, key, energies, chosen, o, tr is not None)
        save_patch_apart(report, tmp, out, overwrite, inputs)
        report.seconds = time.perf_counter() - start
        report.to_json(tmp / ERASE_REPORT)
        report.plot_energy(tmp / PLOT_NAME)
    log.info("streamed erase: %d of %d shards rewritten, %d hard-linked", len(by_shard), len(ckpt.shards), linked)
    return report


def save_patch_apart(
    report: EraseReport, staging: Path, out: Path, overwrite: bool, inputs: tuple[str | os.PathLike | None, ...]
) -> None:
    """Save ``report``'s undo patch into ``<out>.undo/`` beside the erase output ``out`` (whose ``staging`` folder
    never ships it: :func:`mmunlearn.files.undo_store.split_undo`, replaced with ``overwrite``) and record where: the
    reference (``report.undo``, the report's ``undo`` entry) and the patch's path."""
    report.patch.save(staging / PATCH_NAME)
    final = out.resolve()
    report.undo = split_undo(staging, final, overwrite=overwrite, inputs=inputs)
    if report.undo is None:
        raise RuntimeError(f"the undo patch of {out} was not moved into its undo folder")
    report.patch_path = str(undo_dir_path(final, report.undo) / PATCH_NAME)


def _group_key(groups: Mapping[str, str] | Callable[[str], str] | None) -> Callable[[str], str]:
    """The layer group of a matrix name: ``groups`` when callable, its entry (else the default), or the default."""
    return groups if callable(groups) else (lambda n: groups.get(n, group_of(n))) if groups else group_of


def _choose_layers(
    ckpt: ShardedCheckpoint,
    tf: LazyTaskMatrices,
    tr: LazyTaskMatrices | None,
    o: EraseOptions,
    key: Callable[[str], str],
    files: str,
    progress: bool,
) -> tuple[dict[str, float], set[str]]:
    """Check the inputs on headers only, then the layer energies and the layers chosen to edit."""
    clamp = o.clamp_ranks
    with about(files):
        _check_inputs(ckpt, tf, tr, None if clamp else o.rank, None if clamp else o.retain_rank)
        energies = layer_energy(_WithProgress(tf, "layer energies", progress), key)
        chosen = set(select_layers(energies, o.rule, top=o.top, threshold=o.threshold) if o.localize else energies)
    return energies, chosen


def _erase_shard(
    model_dir: Path,
    shard: str,
    names: list[str],
    tf: LazyTaskMatrices,
    tr: LazyTaskMatrices | None,
    o: EraseOptions,
    tmp: Path,
    out: Path,
    metadata: dict,
) -> tuple[dict[str, list[MatrixRow]], dict[str, list[PatchEntry]]]:
    """Erase ``names`` in one shard, each with its own task matrices, and write the shard; their rows and entries."""
    rows: dict[str, list[MatrixRow]] = {}
    entries: dict[str, list[PatchEntry]] = {}
    tensors = _load_shard(model_dir, shard)
    for name in names:
        t_f = tf[name]
        if sq_norm(t_f) == 0.0:  # nothing to remove (erase() cannot localise a zero task)
            continue
        t_r = {name: tr[name]} if tr is not None else None
        try:
            sub = erase({name: tensors[name]}, {name: t_f}, t_r, out=None, **{**asdict(o), "localize": False})
        except NonFiniteError as exc:
            raise NonFiniteError(f"erase of {model_dir / shard}: {exc}") from exc
        rows[name] = [m for layer in sub.layers for m in layer.matrices]
        entries[name] = list(sub.patch.entries)
        del t_f, t_r, sub
    check_finite({n: tensors[n] for n in names}, f"erase of {model_dir} into {out}")
    with writing(tmp / shard, out / shard):  # a full disk names the output's shard
        _write_shard(tensors, tmp / shard, metadata)
    del tensors
    return rows, entries


def _stream_report(
    edit: list[str],
    rows: dict[str, list[MatrixRow]],
    entries: dict[str, list[PatchEntry]],
    key: Callable[[str], str],
    energies: dict[str, float],
    chosen: set[str],
    o: EraseOptions,
    has_retain: bool,
) -> EraseReport:
    """The report, with its undo patch, of the edits: entries and rows in forget order, as the in-memory erase."""
    patch = UndoPatch([e for name in edit for e in entries.get(name, [])])
    by_group: dict[str, list[MatrixRow]] = {}
    for name in edit:
        by_group.setdefault(key(name), []).extend(rows.get(name, []))
    settings = o.report_settings(has_retain)  # the keys and values of erase()'s own report
    layers = [
        LayerRow(layer=g, energy=e, selected=g in chosen, matrices=by_group.get(g, [])) for g, e in energies.items()
    ]
    return EraseReport(method=o.method, settings=settings, layers=layers, seconds=0.0, patch=patch)


def stream_restore_checkpoint(
    model_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    patch: str | os.PathLike | None = None,
    overwrite: bool = False,
    hardlink: bool = True,
    progress: bool = True,
) -> None:
    """Write the original checkpoint of an erased one into ``out``, shard by shard.

    Only the shards holding patched tensors are read and rewritten; the others are hard-linked
    (or copied). Each shard's matrices are checked against the patch before any is written back.
    The undo patch is ``patch``, else the one in the undo folder ``model_dir``'s report names
    (:func:`mmunlearn.files.undo_store.patch_of`).
    """
    model_dir, out = Path(model_dir), Path(out)
    patch = Path(patch) if patch is not None else patch_of(model_dir)
    inputs = (model_dir, patch)
    check_output_dir(out, *inputs, overwrite=overwrite)
    ckpt = open_checkpoint(model_dir)  # first: a missing model folder is reported as such
    undo = UndoPatch.load(patch)
    by_shard: dict[str, list[PatchEntry]] = {}
    for entry in undo.entries:
        name = entry.label.split("[", 1)[0]
        if name not in ckpt.shard_of:
            raise KeyError(f"the undo patch edits {entry.label!r}, which {model_dir} does not hold")
        by_shard.setdefault(ckpt.shard_of[name], []).append(entry)
    with atomic_dir(out, overwrite=overwrite, inputs=inputs) as tmp:
        copy_extra_files(model_dir, tmp, skip=set(ckpt.shards) | set(LEFTOVERS))
        for shard in StageBar(ckpt.shards, desc="restore shards", disable=not progress, dynamic_ncols=True):
            if shard not in by_shard:
                _link_or_copy(model_dir, shard, tmp / shard, hardlink, out / shard)
                continue
            tensors = _load_shard(model_dir, shard)
            names = {e.label.split("[", 1)[0] for e in by_shard[shard]}
            with about(f"model {model_dir}, undo patch {patch}"):
                restore({n: tensors[n] for n in names}, UndoPatch(by_shard[shard]))
            check_finite({n: tensors[n] for n in names}, f"restore of {model_dir} into {out}")
            with writing(tmp / shard, out / shard):
                _write_shard(tensors, tmp / shard, ckpt.shard_meta[shard])
            del tensors
