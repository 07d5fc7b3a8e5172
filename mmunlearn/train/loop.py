"""The one training loop of the toolkit, on HF accelerate (one CPU process here, ``accelerate launch`` on GPUs).

Target/retain fine-tuning, task-vector extraction, the optimisation baselines and the T3 head all
call :func:`train` with their own ``loss_fn(model, batch)`` (or ``loss_fn(model, batch, batch2)``
with a second dataset iterated alongside, e.g. forget and retain batches). accelerate handles
devices, mixed precision, gradient accumulation and the distributed wrappers; this module adds
epoch-seeded data order, a learning-rate schedule, parameter subsets and checkpoint/resume.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from mmunlearn.files.paths import make_private_dirs
from mmunlearn.progress import StageBar
from mmunlearn.train import resume_state
from mmunlearn.train.answer_only import answer_logits
from mmunlearn.train.config import TrainConfig, resolve_mixed_precision
from mmunlearn.train.sampling import EpochSampler, PairCollate, PairedDataset
from mmunlearn.train.schedule import make_optimizer, make_scheduler

log = logging.getLogger(__name__)
STATE_FILE = "train_state.json"
StepCallback = Callable[[int, float], Any]


@dataclass
class TrainResult:
    """What a run did: the loss of every optimizer step (mean over its micro-batches and processes),
    the learning rate used at each step, the mean loss of the last epoch's worth of steps
    (``final_loss``), wall-clock seconds of this call, steps done in total and epochs of data seen,
    and the step a resumed run started from (0 for a fresh run)."""

    losses: list[float]
    lrs: list[float]
    final_loss: float
    seconds: float
    steps: int
    epochs: float
    resumed_from: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Progress:
    """Loop position and history; checkpoints carry it (:mod:`mmunlearn.train.resume_state`)."""

    step: int = 0
    micro: int = 0
    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "micro": self.micro, "losses": list(self.losses), "lrs": list(self.lrs)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.step, self.micro = int(state["step"]), int(state["micro"])
        self.losses, self.lrs = list(state["losses"]), list(state["lrs"])


def causal_lm_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Mean NLL of the labelled tokens (labels -100 elsewhere, e.g. answer tokens only) of an HF causal LM.

    Calls the model it is given (the accelerate-wrapped one inside :func:`train`), so gradients are
    synchronised across processes; the output projection runs on the labelled positions only
    (:func:`mmunlearn.train.answer_only.answer_logits`).
    """
    logits, targets, _ = answer_logits(model, batch["input_ids"], batch.get("attention_mask"), batch["labels"])
    return torch.nn.functional.cross_entropy(logits.float(), targets)


def _select_params(model: nn.Module, params: Iterable[nn.Parameter | str] | None) -> list[nn.Parameter]:
    if params is None:
        return list(model.parameters())
    named = dict(model.named_parameters(remove_duplicate=False))  # tied weights answer to either name
    by_id = {id(p): p for p in named.values()}
    chosen: dict[int, nn.Parameter] = {}
    for p in params:
        if isinstance(p, str):
            if p not in named:
                raise KeyError(f"params: the model has no parameter named {p!r}")
            p = named[p]
        if not isinstance(p, torch.Tensor) or id(p) not in by_id:
            raise ValueError("params: every entry must be a parameter of the model (or its name)")
        chosen[id(p)] = p
    if not chosen:
        raise ValueError("params is empty: nothing to train")
    return list(chosen.values())


def _fresh_accelerator(device: str, mixed_precision: str, grad_accum: int):
    """A new Accelerator. accelerate keeps process-wide state: it is reset here so that successive runs
    in one process may use other precision or accumulation settings (an initialised process group is
    kept; see :func:`_process_state_is_stale`)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' requested but CUDA is not available")
    AcceleratorState._reset_state(reset_partial_state=_process_state_is_stale())
    GradientState._reset_state()
    on_cpu = device == "cpu" or not torch.cuda.is_available()  # accelerate needs cpu=True for CPU processes
    precision = resolve_mixed_precision(mixed_precision, "cpu" if on_cpu else "cuda")
    return Accelerator(cpu=on_cpu, mixed_precision=precision, gradient_accumulation_steps=grad_accum)


def is_main_process() -> bool:
    """True in a single-process run and on rank 0 of an ``accelerate launch``: where files are written."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return True
    from accelerate.state import PartialState

    return PartialState().is_main_process


def wait_for_everyone() -> None:
    """Barrier across the launched processes (nothing in a single-process run)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        from accelerate.state import PartialState

        PartialState().wait_for_everyone()


def _process_state_is_stale() -> bool:
    """Whether accelerate's process state may be rebuilt: always when no process group exists (nothing
    to lose), and when its process count disagrees with the group's (a ``PartialState()`` made without
    ``cpu=True`` under a CPU launch sets up the group yet records a single process)."""
    from accelerate.state import PartialState

    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return True
    return bool(PartialState._shared_state) and PartialState().num_processes != dist.get_world_size()


def _checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def _save_checkpoint(acc, objects: tuple, root: Path, step: int, run_info: dict[str, Any], keep: int) -> None:
    """``objects``: (model, optimizer, scheduler, progress), saved in safetensors + JSON (no pickle)."""
    final = root / f"step_{step:08d}"
    tmp = root / f".step_{step:08d}.tmp"
    if acc.is_main_process:
        if tmp.exists():
            shutil.rmtree(tmp)
        make_private_dirs(root)
        os.mkdir(tmp, 0o700)  # private: only this user reads it back
    acc.wait_for_everyone()
    model, optimizer, scheduler, prog = objects
    resume_state.save_state(acc, model, optimizer, scheduler, prog.state_dict(), tmp)
    acc.wait_for_everyone()
    if acc.is_main_process:
        (tmp / STATE_FILE).write_text(json.dumps(run_info, indent=1))
        resume_state.seal(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in _checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    acc.wait_for_everyone()


def _check_resumable(ckpt: Path, run_info: dict[str, Any]) -> None:
    resume_state.check_folder(ckpt, frozenset({STATE_FILE}))  # safetensors and JSON only: never a pickle
    path = ckpt / STATE_FILE
    try:
        saved = json.loads(path.read_text()) if path.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        saved = "unreadable"
    if saved != run_info:
        raise ValueError(
            f"checkpoint {ckpt} was written by a different run (config or data size differ): "
            f"saved {saved}, now {run_info}; use another checkpoint_dir or resume=False"
        )


def train(
    model: nn.Module,
    loss_fn: Callable[..., torch.Tensor],
    data: Sequence,
    collate: Callable[[list], Any] | None = None,
    config: TrainConfig | None = None,
    *,
    params: Iterable[nn.Parameter | str] | None = None,
    data2: Sequence | None = None,
    collate2: Callable[[list], Any] | None = None,
    device: str = "auto",
    progress: bool = True,
    desc: str = "train",
    log_every: int = 50,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    keep_checkpoints: int = 1,
    resume: bool = False,
    on_step: StepCallback | None = None,
    train_mode: bool = True,
    **overrides: Any,
) -> TrainResult:
    """Train ``model`` in place on ``data`` and return the loss history.

    - ``loss_fn(model, batch)`` returns a scalar loss; ``batch`` is ``collate(list of examples)``
      (torch's default collate when None), already on the device. With ``data2``, each example of
      ``data`` is paired with one of ``data2`` (walked through in a fresh order each cycle, repeating
      as needed), and the loss is ``loss_fn(model, batch, batch2)`` with ``batch2 = collate2(...)``
      (``collate2`` defaults to ``collate``). Epochs count passes over ``data``.
    - Hyperparameters come from ``config`` (a :class:`TrainConfig`) with ``overrides`` applied, e.g.
      ``train(m, f, d, c, epochs=3, lr=1e-3, schedule="onecycle", grad_accum=4)``.
    - ``params``: train only these parameters (objects or names); the others keep their values
      bit for bit (their ``requires_grad`` is switched off during the run and restored after).
    - ``checkpoint_dir`` + ``checkpoint_every`` N: the training state every N optimizer steps into
      ``step_<N>`` in safetensors + JSON (:mod:`mmunlearn.train.resume_state`: never a pickle, so resuming runs
      no code; written atomically; the last ``keep_checkpoints`` are kept). ``resume=True``
      continues from the latest one there (or starts fresh when there is none); the data order is a
      function of (seed, epoch), so a resumed run ends with the weights of an uninterrupted one.
    - ``on_step(step, loss)`` is called after each optimizer step; returning True stops the run.
    - ``train_mode=False`` keeps the model in eval mode while it trains (dropout off, BatchNorm
      running statistics frozen), e.g. when unlearning a classifier on forget-only batches.
    - ``device``: ``auto`` (accelerate's choice: the launcher's GPU, else CPU), ``cpu`` or ``cuda``.

    Deterministic for a seed on the CPU. The model is left in eval mode, unwrapped, on the device.
    """
    cfg = config or TrainConfig(epochs=1)  # one epoch unless told otherwise
    if overrides:
        cfg = cfg.replace(**overrides)
    ckroot = _checked_run_args(data, data2, checkpoint_dir, checkpoint_every, keep_checkpoints, resume)

    from accelerate.utils import set_seed

    acc = _fresh_accelerator(device, cfg.mixed_precision, cfg.grad_accum)
    set_seed(cfg.seed)
    trainable = _select_params(model, params)
    keep_ids = {id(p) for p in trainable}
    grad_flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in grad_flags:
        p.requires_grad_(id(p) in keep_ids)
    try:
        return _run(
            acc,
            cfg,
            model,
            loss_fn,
            data,
            collate,
            data2,
            collate2,
            trainable,
            progress,
            desc,
            log_every,
            ckroot,
            checkpoint_every,
            keep_checkpoints,
            resume,
            on_step,
            train_mode,
        )
    finally:
        for p, flag in grad_flags:
            p.requires_grad_(flag)


def _checked_run_args(
    data: Sequence,
    data2: Sequence | None,
    checkpoint_dir: str | os.PathLike | None,
    checkpoint_every: int | None,
    keep_checkpoints: int,
    resume: bool,
) -> Path | None:
    """Refuse empty data and inconsistent checkpoint settings; the checkpoint folder (None: no checkpoints)."""
    if len(data) == 0:
        raise ValueError("data is empty: nothing to train on")
    if data2 is not None and len(data2) == 0:
        raise ValueError("data2 is empty: pass None to train on one dataset")
    if checkpoint_every is not None and (checkpoint_every < 1 or checkpoint_dir is None):
        raise ValueError("checkpoint_every needs a checkpoint_dir and must be >= 1")
    if keep_checkpoints < 1:
        raise ValueError(f"keep_checkpoints must be >= 1, got {keep_checkpoints}")
    ckroot = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if ckroot is not None and not resume and _checkpoints(ckroot):
        raise FileExistsError(
            f"{ckroot} already holds checkpoints: pass resume=True to continue from them, "
            f"or use an empty checkpoint_dir"
        )
    return ckroot


def _run(
    acc,
    cfg: TrainConfig,
    model,
    loss_fn,
    data,
    collate,
    data2,
    collate2,
    trainable,
    progress,
    desc,
    log_every,
    ckroot,
    checkpoint_every,
    keep_checkpoints,
    resume,
    on_step,
    train_mode=True,
) -> TrainResult:
    paired = data2 is not None
    sampler = EpochSampler(len(data), cfg.seed, cfg.shuffle, n2=len(data2) if paired else None)
    dataset = PairedDataset(data, data2) if paired else data
    collate_fn = PairCollate(collate, collate2 or collate) if paired else collate
    loader = acc.prepare(DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler, collate_fn=collate_fn))
    per_epoch = math.ceil(len(loader) / cfg.grad_accum)  # accelerate syncs at the end of each epoch
    total = cfg.steps if cfg.steps is not None else cfg.epochs * per_epoch
    optimizer = make_optimizer(trainable, cfg)
    # accelerate steps a prepared scheduler once per process per optimizer step (AcceleratedScheduler).
    scheduler = make_scheduler(optimizer, cfg, total * acc.num_processes)
    wrapped, optimizer, scheduler = acc.prepare(model, optimizer, scheduler)
    prog = _Progress()
    if checkpoint_every and not resume_state.supported(acc):
        log.warning("no resumable checkpoints under %s: its state is not saved in safetensors", acc.distributed_type)
        checkpoint_every, resume = None, False
    run_info = {
        "config": cfg.to_dict(),
        "n": len(data),
        "n2": len(data2) if paired else None,
        "processes": acc.num_processes,
    }
    if resume and ckroot is not None and _checkpoints(ckroot):
        _load_latest(acc, ckroot, run_info, (wrapped, optimizer, scheduler, prog))
    start_step, t0 = prog.step, time.perf_counter()
    bar = StageBar(
        total=total,
        initial=prog.step,
        desc=desc,
        disable=not progress or not acc.is_local_main_process,
        dynamic_ncols=True,
    )
    wrapped.train(train_mode)
    epoch, skip = divmod(prog.micro, len(loader))
    running, n_micro, done = torch.zeros((), device=acc.device), 0, prog.step >= total
    try:
        while not done:
            loader.set_epoch(epoch)
            batches = acc.skip_first_batches(loader, skip) if skip else loader
            skip = 0
            for batch in batches:
                loss, lr_used = _micro_step(
                    acc, wrapped, loss_fn, batch, paired, optimizer, scheduler, trainable, cfg.max_grad_norm
                )
                prog.micro += 1
                running += loss.detach().float()
                n_micro += 1
                if not acc.sync_gradients:
                    continue
                step_loss = acc.reduce(running / n_micro, reduction="mean").item()
                running, n_micro = torch.zeros((), device=acc.device), 0
                _record_step(prog, bar, step_loss, lr_used, log_every=log_every, desc=desc, total=total)
                stop = bool(on_step(prog.step, step_loss)) if on_step is not None else False
                if checkpoint_every and prog.step % checkpoint_every == 0 and prog.step < total:
                    _save_checkpoint(
                        acc, (wrapped, optimizer, scheduler, prog), ckroot, prog.step, run_info, keep_checkpoints
                    )
                if prog.step >= total or stop:
                    done = True
                    break
            epoch += 1
    finally:
        _release(acc, wrapped, model, bar)
    last = prog.losses[-min(per_epoch, len(prog.losses)) :] if prog.losses else [float("nan")]
    return TrainResult(
        losses=list(prog.losses),
        lrs=list(prog.lrs),
        final_loss=sum(last) / len(last),
        seconds=time.perf_counter() - t0,
        steps=prog.step,
        epochs=prog.micro / len(loader),
        resumed_from=start_step,
    )


def _load_latest(acc, ckroot: Path, run_info: dict[str, Any], objects: tuple) -> None:
    """Resume from the latest checkpoint under ``ckroot``: ``objects`` (model, optimizer, scheduler, progress)."""
    wrapped, optimizer, scheduler, prog = objects
    latest = _checkpoints(ckroot)[-1]
    _check_resumable(latest, run_info)
    prog.load_state_dict(resume_state.load_state(acc, wrapped, optimizer, scheduler, latest, frozenset({STATE_FILE})))
    log.info("resumed from %s (step %d)", latest, prog.step)


def _micro_step(
    acc,
    wrapped: nn.Module,
    loss_fn: Callable[..., torch.Tensor],
    batch: Any,
    paired: bool,
    optimizer,
    scheduler,
    trainable: list[nn.Parameter],
    max_grad_norm: float | None,
) -> tuple[torch.Tensor, float | None]:
    """One micro-batch under accelerate's accumulation; its loss and, on a synced step, the learning rate used."""
    lr_used = None
    with acc.accumulate(wrapped):
        loss = loss_fn(wrapped, *batch) if paired else loss_fn(wrapped, batch)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise TypeError(
                f"loss_fn must return a scalar tensor, got {type(loss).__name__} {tuple(getattr(loss, 'shape', ()))}"
            )
        acc.backward(loss)
        if acc.sync_gradients:
            lr_used = float(optimizer.param_groups[0]["lr"])
            if max_grad_norm is not None:
                acc.clip_grad_norm_(trainable, max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    return loss, lr_used


def _record_step(
    prog: _Progress, bar: Any, step_loss: float, lr_used: float | None, *, log_every: int, desc: str, total: int
) -> None:
    """Count one optimizer step: its loss and learning rate, the progress bar and every ``log_every``-th log line."""
    prog.step += 1
    prog.losses.append(step_loss)
    prog.lrs.append(lr_used)
    window = prog.losses[-max(1, log_every) :]
    bar.update(1)
    bar.set_postfix(loss=f"{sum(window) / len(window):.4f}", refresh=False)
    if log_every and prog.step % log_every == 0:
        log.info("%s step %d/%d loss %.4f lr %.3g", desc, prog.step, total, sum(window) / len(window), lr_used)


def _release(acc, wrapped: nn.Module, model: nn.Module, bar: Any) -> None:
    """Close the bar; leave the model unwrapped, in eval mode, with accelerate's memory freed."""
    bar.close()
    acc.unwrap_model(wrapped, keep_fp32_wrapper=False)
    if acc.mixed_precision != "no":  # unwrap re-binds the original forward on the instance: drop it
        model.__dict__.pop("forward", None)
    model.eval()
    acc.free_memory()
