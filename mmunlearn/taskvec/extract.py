"""Task matrices from a partition (fine-tune delta, layer-wise fine-tune delta, LoRA delta, accumulated gradient),
or from two models (a training update).

Common to every adapter (text, speech, speaker): it only uses ``adapter.model``,
``adapter.layers()``, ``adapter.collate`` and ``adapter.loss``. Forget and retain matrices must
come from the same kind and settings. The model is left exactly as it was (bit for bit).

- ``finetune``: only the extracted layers are trained (a copy of just those weights is kept to
  restore them), N steps of AdamW; T = W_ft - W.
- ``lora``: a peft LoRA on the extracted layers; T = (alpha / r) B A, kept factored as a
  :class:`~mmunlearn.taskvec.lowrank.LowRank` (the erase path takes the subspace from B alone and
  never forms the m x n matrix; ``.dense()`` does when something needs it).
- ``gradient``: T = -lr * sum of the partition's loss gradients over one pass (no optimiser
  state): the cheapest, a linearised SGD step.
- ``layerwise``: UNLEARN's protocol (Lizzo & Heck, arXiv 2408.04140, Figure 1): one layer group (block) at a
  time is unfrozen and fine-tuned alone for N steps with every other weight frozen, then put back; its change
  is that block's task matrix (blocks x N steps in all).

:func:`update_task_matrices` gives the training update ``T = target - reference`` (the model the target was
fine-tuned from), the task matrix of whatever that training taught.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from mmunlearn.taskvec.lowrank import LowRank
from mmunlearn.taskvec.store import TaskMatrices
from mmunlearn.train import TrainConfig, train

KINDS = ("finetune", "lora", "gradient", "layerwise")


@dataclass(frozen=True)
class ExtractConfig:
    """How task matrices are extracted from a partition."""

    kind: str = "finetune"  # finetune | lora | gradient | layerwise
    steps: int = 20  # optimizer steps (finetune, lora; layerwise: per block); gradient: ignored (one pass)
    lr: float = 1e-3  # learning rate (finetune, lora) or gradient step size (gradient)
    batch_size: int = 16
    lora_rank: int = 8
    lora_alpha: float = 16.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown task-vector kind {self.kind!r}; choose one of {KINDS}")
        if self.steps < 1 or self.batch_size < 1 or self.lora_rank < 1:
            raise ValueError("steps, batch_size and lora_rank must be >= 1")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")


def data_hash(examples: Sequence[Any]) -> str:
    """A short digest of a partition's examples (for the metadata)."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(repr(ex.to_dict() if hasattr(ex, "to_dict") else ex).encode())
    return h.hexdigest()[:16]


def _selected(adapter, layers: Sequence[str] | None) -> dict[str, torch.nn.Parameter]:
    found = {lw.name: lw.weight for lw in adapter.layers()}
    if layers is None:
        return found
    missing = [n for n in layers if n not in found]
    if missing:
        raise KeyError(f"not layers of this adapter: {missing[:3]}{' ...' if len(missing) > 3 else ''}")
    return {n: found[n] for n in layers}


def _finetune(adapter, examples, params, cfg: ExtractConfig, progress: bool) -> dict[str, torch.Tensor]:
    saved = {n: p.detach().clone() for n, p in params.items()}  # only the extracted layers
    buffers = {n: b.detach().clone() for n, b in adapter.model.named_buffers()}  # e.g. BatchNorm statistics
    try:
        train(
            adapter.model,
            lambda m, b: adapter.loss(b, model=m),
            examples,
            adapter.collate,
            TrainConfig(steps=cfg.steps, lr=cfg.lr, batch_size=cfg.batch_size, seed=cfg.seed, max_grad_norm=None),
            params=list(params.values()),
            progress=progress,
            desc=f"task vector ({cfg.kind})",
        )
        return {n: (p.detach() - saved[n]).float().cpu() for n, p in params.items()}
    finally:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(saved[n])
            for n, b in adapter.model.named_buffers():
                if n in buffers:
                    b.copy_(buffers[n])


def _layerwise(adapter, examples, params, cfg: ExtractConfig, progress: bool) -> dict[str, torch.Tensor]:
    """Each layer group fine-tuned alone (the others frozen, then restored): its own change is its task matrix."""
    block = {lw.name: lw.block for lw in adapter.layers()}
    out: dict[str, torch.Tensor] = {}
    for group in dict.fromkeys(block[n] for n in params):
        out.update(_finetune(adapter, examples, {n: p for n, p in params.items() if block[n] == group}, cfg, progress))
    return out


def _gradient(adapter, examples, params, cfg: ExtractConfig) -> dict[str, torch.Tensor]:
    model = adapter.model
    flags = {id(p): p.requires_grad for p in model.parameters()}
    grads = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()}
    chosen = {id(p) for p in params.values()}
    try:
        for p in model.parameters():
            p.requires_grad_(id(p) in chosen)
        for i in range(0, len(examples), cfg.batch_size):
            for p in params.values():
                p.grad = None
            adapter.loss(adapter.collate(examples[i : i + cfg.batch_size])).backward()
            for n, p in params.items():
                if p.grad is not None:
                    grads[n] += p.grad.float()
    finally:
        for p in model.parameters():
            p.grad = None
            p.requires_grad_(flags[id(p)])
    return {n: (-cfg.lr * g).cpu() for n, g in grads.items()}


def _lora(adapter, examples, params, cfg: ExtractConfig, progress: bool) -> dict[str, LowRank]:
    from peft import LoraConfig, inject_adapter_in_model

    model = adapter.model
    modules = sorted({n.rsplit(".", 1)[0] for n in params})
    before = {n: p.detach().clone() for n, p in model.state_dict().items()}
    lcfg = LoraConfig(
        r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=modules, lora_dropout=0.0, init_lora_weights=True
    )
    torch.manual_seed(cfg.seed)
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    had_config = hasattr(model, "peft_config")
    try:
        inject_adapter_in_model(lcfg, model)  # inside try: a partial injection is undone too
        lora = [p for n, p in model.named_parameters() if "lora_" in n]
        train(
            model,
            lambda m, b: adapter.loss(b, model=m),
            examples,
            adapter.collate,
            TrainConfig(steps=cfg.steps, lr=cfg.lr, batch_size=cfg.batch_size, seed=cfg.seed, max_grad_norm=None),
            params=lora,
            progress=progress,
            desc="task vector (lora)",
        )
        out = {}
        named = dict(model.named_modules())
        for n in params:
            layer = named[n.rsplit(".", 1)[0]]
            A = layer.lora_A["default"].weight.detach().float()
            B = layer.lora_B["default"].weight.detach().float()
            out[n] = LowRank((layer.scaling["default"] * B).cpu(), A.cpu())  # kept factored
        return out
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in buffers:
                    b.copy_(buffers[n])
        if not had_config and hasattr(model, "peft_config"):
            del model.peft_config  # left by the injection: a later extraction would warn about it
        _remove_lora(model, before)


def _remove_lora(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> None:
    """Swap every injected LoRA layer back for its base layer and check the weights are untouched."""
    from peft.tuners.lora import LoraLayer

    for name, module in list(model.named_modules()):
        if isinstance(module, LoraLayer):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, module.get_base_layer())
    after = model.state_dict()
    if set(after) != set(before) or any(not torch.equal(after[k], before[k]) for k in before):
        raise RuntimeError("removing the LoRA layers did not give back the original model")


def extract_task_matrices(
    adapter,
    examples: Sequence[Any],
    config: ExtractConfig | None = None,
    *,
    layers: Sequence[str] | None = None,
    progress: bool = True,
    **overrides,
) -> TaskMatrices:
    """Task matrices (layer name -> tensor of the weight's shape) of a partition.

    ``layers`` restricts extraction to some of ``adapter.layers()`` (default: all of them).
    ``overrides`` replace fields of ``config`` (e.g. ``kind="gradient", steps=50``).
    """
    cfg = ExtractConfig(**{**(asdict(config) if config else {}), **overrides})
    if len(examples) == 0:
        raise ValueError("the partition is empty: no examples to extract a task vector from")
    params = _selected(adapter, layers)
    if not params:
        raise ValueError("the adapter exposes no layers to extract")
    start = time.perf_counter()
    if cfg.kind == "finetune":
        tensors = _finetune(adapter, examples, params, cfg, progress)
    elif cfg.kind == "gradient":
        tensors = _gradient(adapter, examples, params, cfg)
    elif cfg.kind == "layerwise":
        tensors = _layerwise(adapter, examples, params, cfg, progress)
    else:
        tensors = _lora(adapter, examples, params, cfg, progress)
    meta = {
        **asdict(cfg),
        "data_hash": data_hash(examples),
        "examples": len(examples),
        "seconds": time.perf_counter() - start,
    }
    return TaskMatrices(tensors, json.loads(json.dumps(meta)))


def update_task_matrices(
    target, reference, *, layers: Sequence[str] | None = None, what: str = "target"
) -> TaskMatrices:
    """The training update ``T = W_target - W_reference`` per layer of ``target.layers()`` (``layers``: only those):
    the task matrix of the training that made ``target`` from ``reference`` (the model it was fine-tuned from).
    ``what`` names ``target`` in the errors. Raises when the two are not the same architecture."""
    ours = _selected(target, layers)
    theirs = {lw.name: lw.weight for lw in reference.layers()}
    missing = [n for n in ours if n not in theirs]
    if missing:
        raise ValueError(
            f"the reference model has no layer {missing[0]!r} of the {what}: a training update needs the "
            "model it was fine-tuned from (same architecture)"
        )
    tensors = {}
    for name, w in ours.items():
        r = theirs[name]
        if r.shape != w.shape:
            raise ValueError(
                f"layer {name}: {what} shape {tuple(w.shape)}, reference {tuple(r.shape)}: a training "
                "update needs the model it was fine-tuned from"
            )
        tensors[name] = w.detach().float().cpu() - r.detach().float().cpu()
    if not any(bool(t.any()) for t in tensors.values()):
        raise ValueError(f"the {what} and the reference model have the same weights: no training update to erase")
    return TaskMatrices(tensors, {"kind": "update", "of": what})
