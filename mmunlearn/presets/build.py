"""Target and retain models for the TOFU harness: pretrain a base, then fine-tune on ``full`` and ``retainRR``.

Protocol (a built preset such as ``micro`` or ``mini``):

1. a byte-level BPE is trained on the pretraining corpus plus every text field of every split of the
   evaluated data (so each script the data uses is covered);
2. a ``base`` Llama is pretrained on :func:`mmunlearn.data.corpus.pretrain_corpus`: fictitious authors
   disjoint from the evaluated ones, plus the data's real-authors and world-facts QA (the knowledge
   model utility measures, which must exist before any unlearning);
3. the TARGET is fine-tuned from the base on ``full`` and the RETAIN model on ``retainRR`` (matching
   the forget split), with the same seed and hyperparameters: they differ only by the data seen.
   Built presets (``replay_facts``) mix the real-authors and world-facts QA into both fine-tuning
   sets: without this rehearsal a small model forgets them while memorising TOFU (measured on
   ``mini``: facts answer NLL 0.38 after pretraining, 7.4 after 22 epochs on 40 authors), and model
   utility would measure nothing.

A model directory (a real checkpoint) is its own base and keeps its tokenizer. Losses are over
answer tokens only. Every model lands in a cache keyed by a hash of what it depends on (see
:mod:`mmunlearn.presets.cache`) with a ``train_log.json`` beside its weights; a model trained on rows of
forget authors (the target, or ``full`` / ``forgetPP`` through :func:`finetune`) also records the
answer NLL of those rows after training (``forget_answer_nll``), a cheap check that it memorised them.

Stopped builds resume: a resumable training state is saved every ``checkpoint_every`` optimizer steps
(``auto``: :data:`CHECKPOINT_EVERY_BUILT` for built presets, :data:`CHECKPOINT_EVERY_MODEL_DIR` for
model directories, whose steps are slow on a CPU) under ``<cache>/.resume`` and picked up by the next
run with the same options. The per-model build lock is an OS lock (``flock``) that dies with its
process: a lock file a killed build left behind does not block the next run.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.adapters.text.tokenizer import train_bpe
from mmunlearn.data.tofu import QAItem, split_info
from mmunlearn.errors import check_threads
from mmunlearn.eval.scoring import generate_answers
from mmunlearn.files.checkpoint import atomic_dir
from mmunlearn.metrics.rouge import rouge_l_recall
from mmunlearn.presets.cache import (
    LOG_FILE,
    build_lock,
    cache_key,
    check_cache_path,
    default_cache_dir,
    is_built,
    items_digest,
    read_log,
    texts_digest,
    write_log,
)
from mmunlearn.presets.items import base_corpus, fact_items, forget_rows, source_texts, training_items
from mmunlearn.presets.models import Preset, get_preset, parameter_count
from mmunlearn.train import TrainConfig, causal_lm_loss, train
from mmunlearn.train.config import resolve_mixed_precision
from mmunlearn.train.loop import is_main_process, wait_for_everyone

log = logging.getLogger(__name__)
#: ``checkpoint_every="auto"`` for a built preset: optimizer steps between resumable states (its steps take
#: well under a second, so a shorter interval would spend more time saving than a stop could lose).
CHECKPOINT_EVERY_BUILT = 200
#: ``checkpoint_every="auto"`` for a model directory: a 135M-parameter checkpoint takes ~40-80 s per step
#: on a CPU, so a stopped run loses at most a few minutes (a state is the float32 weights plus the AdamW
#: moments, ~3x the weights on disk; only the latest is kept).
CHECKPOINT_EVERY_MODEL_DIR = 5
#: The training option that is not a :class:`TrainConfig` field: at most this many optimizer steps.
MAX_STEPS = "max_steps"


@dataclass
class BuiltModels:
    """Folders of the three models (each loadable by ``TextLLMAdapter.from_pretrained``) and their logs.

    ``target`` / ``retain`` are None only when :func:`build_models` was asked not to build them (``roles``).
    """

    base: Path
    target: Path | None
    retain: Path | None
    logs: dict[str, dict[str, Any]]


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` intra-op torch threads (None: leave the setting alone), then restore it.

    On a small shared machine one thread can be many times faster for these small models than two.
    """
    if n is None:
        yield
        return
    check_threads(n)
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------- training one model
def resume_started(resume_dir: Path | None) -> bool:
    """Whether a stopped run left a resumable state there (the weights are no longer the pretrained ones)."""
    return resume_dir is not None and resume_dir.is_dir() and any(resume_dir.glob("step_*"))


def planned_steps(cfg: TrainConfig, n_examples: int) -> int:
    """Optimizer steps a run of ``cfg`` over ``n_examples`` takes (as :func:`mmunlearn.train.train`
    counts them: an epoch's micro-batches split over the processes, then grouped by ``grad_accum``)."""
    if cfg.steps is not None:
        return cfg.steps
    dist = torch.distributed
    procs = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    batches = -(-n_examples // cfg.batch_size)  # ceiling divisions
    micro = -(-batches // procs)
    return cfg.epochs * -(-micro // cfg.grad_accum)


def _resolved(
    cfg: TrainConfig, seed: int, device: str, overrides: Mapping[str, Any] | None, n_examples: int | None = None
) -> TrainConfig:
    """The preset's config with ``overrides`` (TrainConfig fields, plus ``max_steps`` N: when the run
    would take more than N optimizer steps it becomes an N-step run, its schedule fitted to them)."""
    overrides = dict(overrides or {})
    max_steps = overrides.pop(MAX_STEPS, None)
    cfg = cfg.replace(seed=seed, **overrides)
    if max_steps is not None:
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
        if n_examples is None:
            raise ValueError("max_steps needs the number of training examples")
        if planned_steps(cfg, n_examples) > max_steps:
            cfg = cfg.replace(steps=max_steps)
    dev_type = "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu"
    return cfg.replace(mixed_precision=resolve_mixed_precision(cfg.mixed_precision, dev_type))


def _mean_nll(adapter, items: Sequence[QAItem]) -> float | None:
    if not items:
        return None
    return float(adapter.answer_nll(items, batch_size=32).mean())


def forget_check(adapter, forget: Sequence[QAItem], generate: bool = True) -> dict[str, Any]:
    """The forget rows' answer NLL, mean answer probability (mean of exp(-NLL) per row, TOFU's Prob) and,
    with ``generate``, ROUGE-L recall of greedy answers (lean length: the gold answer's tokens plus a
    margin): what the recipes' memorisation rule reads. Empty when there are no forget rows."""
    if not forget:
        return {}
    nll = adapter.answer_nll(forget, batch_size=32)
    out = {"forget_answer_nll": float(nll.mean()), "forget_prob": float(torch.exp(-nll).mean())}
    if generate:
        with adapter.bf16_generation():
            gens = generate_answers(
                adapter, [it.question for it in forget], max_new_tokens="auto", gold=[it.answer for it in forget]
            )
        out["forget_rouge"] = float(rouge_l_recall(gens, [it.answer.strip() for it in forget]).mean())
    return out


def _fit_and_save(
    model,
    tokenizer,
    items: list[QAItem],
    cfg: TrainConfig,
    out: Path,
    info: dict[str, Any],
    *,
    max_length: int,
    device: str,
    progress: bool,
    desc: str,
    resume_dir: Path | None,
    checkpoint_every: int | None,
    facts: Sequence[QAItem],
    replay: Sequence[QAItem] = (),
    save_dtype: torch.dtype | None = None,
    forget: Sequence[QAItem] = (),
    full_check: bool = True,
    cache_root: Path | None = None,
) -> dict[str, Any]:
    """Train on ``items`` (+ ``replay``, mixed in) with the answer-token loss, then write weights,
    tokenizer and train_log.json to ``out``. The log holds the ``forget`` rows' check (:func:`forget_check`)
    before (``pretrained_forget_*``) and after training; with ``full_check`` also the answer NLL of all
    ``items`` and of ``facts`` (cheap for the built presets; a real checkpoint skips them: minutes on a CPU)."""
    if resume_dir is not None and cache_root is not None:
        check_cache_path(cache_root, resume_dir)  # training state is resumed only from a private cache
    precision = "bf16" if cfg.mixed_precision == "bf16" else "no"
    adapter = TextLLMAdapter(model, tokenizer, max_length=max_length, precision=precision)
    before = forget_check(adapter, forget, generate=False) if forget and not resume_started(resume_dir) else {}
    result = train(
        model,
        causal_lm_loss,
        list(items) + list(replay),
        adapter.collate,
        cfg,
        device=device,
        progress=progress,
        desc=desc,
        checkpoint_dir=resume_dir if checkpoint_every else None,
        checkpoint_every=checkpoint_every,
        resume=bool(checkpoint_every),
    )
    t0 = time.perf_counter()
    per_epoch = max(1, round(result.steps / max(result.epochs, 1e-9)))
    epoch_losses = [
        sum(c) / len(c) for c in (result.losses[i : i + per_epoch] for i in range(0, len(result.losses), per_epoch))
    ]
    answer_nll = _mean_nll(adapter, items) if full_check else None  # eval mode, after training
    check = forget_check(adapter, forget)
    train_log = {
        **info,
        "final_loss": answer_nll if answer_nll is not None else result.final_loss,
        "answer_nll": answer_nll,
        "facts_answer_nll": _mean_nll(adapter, facts) if full_check else None,
        "forget_answer_nll": check.get("forget_answer_nll"),
        "forget_prob": check.get("forget_prob"),
        "forget_rouge": check.get("forget_rouge"),
        "pretrained_forget_prob": before.get("forget_prob"),
        "pretrained_forget_answer_nll": before.get("forget_answer_nll"),
        "forget_examples": len(forget),
        "train_loss": result.final_loss,
        "epoch_losses": epoch_losses,
        "seconds": result.seconds,
        "steps": result.steps,
        "epochs": result.epochs,
        "resumed_from_step": result.resumed_from,
        "n_examples": len(items),
        "replay_examples": len(replay),
        "parameters": parameter_count(model),
        "config": cfg.to_dict(),
        "device": str(adapter.device),
        "torch_threads": torch.get_num_threads(),
    }
    train_log["eval_seconds"] = time.perf_counter() - t0
    if save_dtype is not None:
        model.to(save_dtype)
    if is_main_process():  # under `accelerate launch` every rank holds the same weights: one writes
        with atomic_dir(out, overwrite=True) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            write_log(tmp, train_log)
        if resume_dir is not None:
            shutil.rmtree(resume_dir, ignore_errors=True)
    wait_for_everyone()
    log.info(
        "%s: final loss %.4f after %d steps (%.1f s) -> %s",
        desc,
        train_log["final_loss"],
        result.steps,
        result.seconds,
        out,
    )
    return train_log


# ---------------------------------------------------------------------- base
def build_base(
    preset: str | os.PathLike | Preset,
    data: str | os.PathLike,
    *,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    device: str = "auto",
    progress: bool = True,
    overrides: Mapping[str, Any] | None = None,
    checkpoint_every: int | None = CHECKPOINT_EVERY_BUILT,
) -> tuple[Path, dict[str, Any]]:
    """The pretrained base of a built preset for ``data`` (from the cache when already built).

    For a model-directory preset the base is that directory itself. ``overrides`` change the
    preset's pretraining hyperparameters (e.g. ``{"epochs": 2}``, ``{"max_steps": 50}``). Returns
    (folder, train log).
    """
    p = preset if isinstance(preset, Preset) else get_preset(preset)
    if p.is_model_dir:
        return p.model_dir, {"model": "base", "preset": p.name, "cached": True, "path": str(p.model_dir)}
    corpus = base_corpus(data, p.corpus_authors, seed)
    cfg = _resolved(p.pretrain, seed, device, overrides, len(corpus))
    tok_texts = [t for it in corpus for t in (it.question, it.answer)] + source_texts(data)
    spec = {
        "kind": "base",
        "arch": p.to_dict()["arch"],
        "corpus_authors": p.corpus_authors,
        "max_length": p.max_length,
        "pretrain": cfg.to_dict(),
        "seed": seed,
        "corpus": items_digest(corpus),
        "tokenizer_texts": texts_digest(tok_texts),
    }
    key = cache_key(spec)
    group = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = group / f"{p.name}-{key}" / "base"
    if is_built(out, key, group):
        log.info("base: reusing %s", out)
        return out, {**read_log(out), "cached": True, "path": str(out)}
    with build_lock(out):
        if is_built(out, key, group):  # built by another process while this one waited
            return out, {**read_log(out), "cached": True, "path": str(out)}
        tokenizer = train_bpe(tok_texts, vocab_size=p.arch.vocab_size)
        model = p.arch.build(tokenizer, seed=seed)
        info = {
            "model": "base",
            "key": key,
            "preset": p.name,
            "data": str(data),
            "seed": seed,
            "tokenizer_size": len(tokenizer),
            "corpus_examples": len(corpus),
        }
        train_log = _fit_and_save(
            model,
            tokenizer,
            corpus,
            cfg,
            out,
            info,
            max_length=p.max_length,
            device=device,
            progress=progress,
            desc=f"{p.name} base",
            resume_dir=group / ".resume" / f"base-{key}",
            checkpoint_every=checkpoint_every,
            facts=fact_items(data),
            cache_root=group,
        )
    return out, {**train_log, "cached": False, "path": str(out)}


# ---------------------------------------------------------------------- fine-tuning
def _load_parent(p: Preset, base: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    save_dtype = None
    if p.is_model_dir:  # keep the checkpoint's own dtype on disk (trained in float32 + autocast)
        cfg = json.loads((base / "config.json").read_text())
        name = cfg.get("dtype") or cfg.get("torch_dtype")
        save_dtype = getattr(torch, name) if isinstance(name, str) and hasattr(torch, name) else None
    return model, tokenizer, save_dtype


def _finetune_into(
    p: Preset,
    base: Path,
    base_key: str,
    data,
    split: str,
    items: list[QAItem],
    out: Path | None,
    group: Path,
    *,
    role: str,
    authors: int | None,
    seed: int,
    device: str,
    progress: bool,
    overrides: Mapping[str, Any] | None,
    checkpoint_every: int | None,
    overwrite: bool,
    forget: Sequence[QAItem] = (),
) -> tuple[Path, dict[str, Any]]:
    facts = fact_items(data)
    replay = facts if p.replay_facts else []
    cfg = _resolved(p.finetune, seed, device, overrides, len(items) + len(replay))
    spec = {
        "kind": "finetune",
        "parent": base_key,
        "split": split,
        "data": items_digest(items),
        "replay": items_digest(replay),
        "finetune": cfg.to_dict(),
        "max_length": p.max_length,
        "seed": seed,
    }
    key = cache_key(spec)
    tag = f"{split}-a{authors}" if authors is not None else split
    target = out if out is not None else group / f"{tag}-{key}"
    root = group.parent if out is None else None  # the cache folder: every folder from it down must be private
    if is_built(target, key, root):
        log.info("%s: reusing %s", role, target)
        return target, {**read_log(target), "cached": True, "path": str(target)}
    with build_lock(target):
        if is_built(target, key, root):  # built by another process while this one waited
            return target, {**read_log(target), "cached": True, "path": str(target)}
        if out is not None and out.exists() and not overwrite:
            raise FileExistsError(
                f"{out} exists and holds another model (no {LOG_FILE} with this build's key); "
                f"pass overwrite=True to replace it"
            )
        model, tokenizer, save_dtype = _load_parent(p, base)
        info = {
            "model": role,
            "key": key,
            "preset": p.name,
            "data": str(data),
            "split": split,
            "authors": authors,
            "seed": seed,
            "base": str(base),
        }
        train_log = _fit_and_save(
            model,
            tokenizer,
            items,
            cfg,
            target,
            info,
            max_length=p.max_length,
            device=device,
            progress=progress,
            desc=f"{p.name} {role} ({tag})",
            resume_dir=group / ".resume" / f"{tag}-{key}",
            checkpoint_every=checkpoint_every,
            facts=facts,
            replay=replay,
            save_dtype=save_dtype,
            forget=forget,
            full_check=not p.is_model_dir,
            cache_root=group.parent,
        )
    return target, {**train_log, "cached": False, "path": str(target)}


def _prepare(preset, data, seed, cache_dir, device, progress, pretrain_overrides, checkpoint_every):
    p = preset if isinstance(preset, Preset) else get_preset(preset)
    if checkpoint_every == "auto":
        every = CHECKPOINT_EVERY_MODEL_DIR if p.is_model_dir else CHECKPOINT_EVERY_BUILT
    elif checkpoint_every is None or (
        isinstance(checkpoint_every, int) and not isinstance(checkpoint_every, bool) and checkpoint_every >= 1
    ):
        every = checkpoint_every
    else:
        raise ValueError(f"checkpoint_every must be a positive integer, None or 'auto', got {checkpoint_every!r}")
    base, base_log = build_base(
        p,
        data,
        seed=seed,
        cache_dir=cache_dir,
        device=device,
        progress=progress,
        overrides=pretrain_overrides,
        checkpoint_every=every,
    )
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if p.is_model_dir:
        base_key = cache_key({"kind": "model_dir", "preset": p.to_dict()})
        group = root / f"{p.name}-{base_key}"
    else:
        base_key, group = base_log["key"], base.parent
    return p, base, base_key, base_log, group, every


def build_models(
    preset: str | os.PathLike,
    data: str | os.PathLike,
    forget_split: str = "forget10",
    authors: int | None = None,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    device: str = "auto",
    *,
    progress: bool = True,
    overrides: Mapping[str, Any] | None = None,
    pretrain_overrides: Mapping[str, Any] | None = None,
    checkpoint_every: int | None | str = "auto",
    threads: int | None = None,
    roles: Collection[str] = ("target", "retain"),
) -> BuiltModels:
    """Base, target (fine-tuned on ``full``) and retain (on ``retainRR`` for ``forgetPP``) models.

    ``preset``: ``micro``, ``mini`` or a model directory; ``data``: a TOFU folder or ``synthetic[:...]``;
    ``authors`` N: a world of N authors (the first retain authors plus forget authors in proportion,
    :func:`mmunlearn.data.tofu.author_subset`). ``overrides`` / ``pretrain_overrides`` change the
    preset's fine-tuning / pretraining hyperparameters (part of the cache key; TrainConfig fields
    plus ``max_steps``, see :func:`planned_steps`). Long runs save a resumable training state every
    ``checkpoint_every`` steps (``auto``: :data:`CHECKPOINT_EVERY_BUILT` steps for built presets,
    :data:`CHECKPOINT_EVERY_MODEL_DIR` for model directories) under ``<cache>/.resume``, so an
    interrupted build picks up where it stopped. ``threads``: torch threads while building (None:
    unchanged). ``roles``: which of ``target`` and ``retain`` to build (the other is None; the base
    is always built). The target's log holds ``forget_answer_nll``, the answer NLL of its
    ``forget_split`` rows after training.
    """
    unknown = set(roles) - {"target", "retain"}
    if unknown:
        raise ValueError(f"roles: unknown role(s) {sorted(unknown)}; choose from 'target' and 'retain'")
    with torch_threads(threads):
        return _build_models(
            preset,
            data,
            forget_split,
            authors,
            seed,
            cache_dir,
            device,
            progress,
            overrides,
            pretrain_overrides,
            checkpoint_every,
            set(roles),
        )


def _build_models(
    preset,
    data,
    forget_split,
    authors,
    seed,
    cache_dir,
    device,
    progress,
    overrides,
    pretrain_overrides,
    checkpoint_every,
    roles: set[str],
) -> BuiltModels:
    info = split_info(forget_split)
    if info.family != "forget" or forget_split.endswith("_perturbed"):
        raise ValueError(f"forget_split must be a forget split such as 'forget10', got {forget_split!r}")
    retain_split = f"retain{100 - info.forget_pct:02d}"
    full_items = training_items(data, "full", authors, info.forget_pct)
    forget_items = training_items(data, forget_split, authors, info.forget_pct)
    retain_items = training_items(data, retain_split, authors, None)
    p, base, base_key, base_log, group, every = _prepare(
        preset, data, seed, cache_dir, device, progress, pretrain_overrides, checkpoint_every
    )
    common = dict(
        authors=authors,
        seed=seed,
        device=device,
        progress=progress,
        overrides=overrides,
        checkpoint_every=every,
        overwrite=False,
    )
    # with an author subset the target's `full` depends on the forget share: name it apart
    full_name = "full" if authors is None else f"full-f{info.forget_pct:02d}"
    logs: dict[str, dict[str, Any]] = {"base": base_log}
    target = retain = None
    if "target" in roles:
        target, logs["target"] = _finetune_into(
            p, base, base_key, data, full_name, full_items, None, group, role="target", forget=forget_items, **common
        )
    if "retain" in roles:
        retain, logs["retain"] = _finetune_into(
            p, base, base_key, data, retain_split, retain_items, None, group, role="retain", **common
        )
    return BuiltModels(base=base, target=target, retain=retain, logs=logs)


def finetune(
    preset_or_model_dir: str | os.PathLike,
    data: str | os.PathLike,
    split: str = "full",
    authors: int | None = None,
    out: str | os.PathLike | None = None,
    *,
    forget_pct: float = 10,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    device: str = "auto",
    progress: bool = True,
    overrides: Mapping[str, Any] | None = None,
    pretrain_overrides: Mapping[str, Any] | None = None,
    checkpoint_every: int | None | str = "auto",
    overwrite: bool = False,
    threads: int | None = None,
) -> Path:
    """One fine-tuned model (``mmunlearn tofu finetune``): the preset's base (built or reused from the
    cache; a model directory is its own base) fine-tuned on ``split`` of ``data``, written to ``out``
    (default: the cache) with its ``train_log.json``. With ``authors`` N and ``split='full'``,
    ``forget_pct`` says how many of the N authors are forget authors (default 10, as for forget10).
    Re-running with the same options into the same ``out`` reuses the model found there.
    ``overrides``: fine-tuning hyperparameters (TrainConfig fields plus ``max_steps``); stopped runs
    resume (``checkpoint_every``, as for :func:`build_models`). ``threads``: torch threads while
    training (None: unchanged). The log holds ``forget_answer_nll`` (:func:`forget_rows`; None when
    the split has no forget authors).
    """
    split_info(split)
    items = training_items(data, split, authors, forget_pct)
    forget = forget_rows(data, split, authors, forget_pct)
    with torch_threads(threads):
        p, base, base_key, _, group, every = _prepare(
            preset_or_model_dir, data, seed, cache_dir, device, progress, pretrain_overrides, checkpoint_every
        )
        name = split if authors is None or split != "full" else f"full-f{int(forget_pct):02d}"
        path, _ = _finetune_into(
            p,
            base,
            base_key,
            data,
            name,
            items,
            Path(out) if out is not None else None,
            group,
            role="finetuned",
            authors=authors,
            seed=seed,
            device=device,
            progress=progress,
            overrides=overrides,
            checkpoint_every=every,
            overwrite=overwrite,
            forget=forget,
        )
    return path
