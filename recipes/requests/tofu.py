"""Deletion requests on TOFU for ``mmunlearn bench requests --dataset tofu``: one request per forget author, QR-Erase
with the retain state cached against GradDiff (the bookkeeping, rows and table are :mod:`recipes.requests.speaker`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from mmunlearn.adapters.text.adapter import KIND as TEXT
from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.data.tofu import load_split, split_info
from mmunlearn.methods import SweepRule, UnlearnRequest, get, run_unlearning
from mmunlearn.presets.build import build_models
from mmunlearn.requests import History, run_request
from recipes.requests.config import RequestsConfig
from recipes.requests.speaker import BenchResult, PeakMemory, RequestRow, request_row, spread, timed_retain_state
from recipes.tofu.settings import default_precision


def run_tofu(
    cfg: RequestsConfig, *, cache_dir: str | os.PathLike | None = None, show: Callable[[RequestRow], None] | None = None
) -> BenchResult:
    """TOFU (``cfg.dataset`` tofu): one request per forget author (target and base models built by
    :mod:`mmunlearn.presets`, cached in ``cache_dir``, default the cache); the rule's forget target is the base model's
    answer NLL on that author's questions (it never saw them), the retain measure the mean answer NLL
    (``score_retain`` retain questions spread over the set). ``show``: called with each request's row."""
    data, preset, forget_split, authors = cfg.data, cfg.resolved_preset(), cfg.forget_split, cfg.authors
    workdir, progress, extracts, retain_bound = cfg.workdir, cfg.progress, cfg.extracts(), cfg.resolved_retain_bound()
    built = build_models(preset, data, forget_split, authors, 0, cache_dir, "cpu", progress=progress, roles=("target",))
    pct = split_info(forget_split).forget_pct
    forget = load_split(data, forget_split, authors=authors, forget_pct=pct)
    retain = load_split(data, f"retain{100 - pct:02d}", authors=authors, forget_pct=pct)
    ids = sorted({it.author for it in forget})
    asks = [[it for it in forget if it.author == a] for a in ids]
    precision = default_precision(preset, "cpu")  # bf16 for the real checkpoint where it is native, as tofu's recipe
    original = TextLLMAdapter.from_pretrained(built.target, device="cpu", precision=precision)
    base = TextLLMAdapter.from_pretrained(built.base, device="cpu", precision=precision)
    targets = [float(base.answer_nll(a).mean()) for a in asks]
    scored = spread(retain, cfg.score_retain)
    size = TEXT.size_for(preset)
    state_dir = Path(workdir) / "retain_state_tofu"
    reference = base if cfg.base == "base" else None  # QR-Erase's task vectors from the pretrained model
    prepare_seconds = timed_retain_state(state_dir, reference or original, retain, TEXT.name, size, progress)
    gd_over = {"epochs": cfg.gd_epochs} if cfg.gd_epochs is not None else {}
    rows: list[RequestRow] = []

    def add(row: RequestRow) -> None:
        rows.append(row)
        if show is not None:
            show(row)

    for e, extract in enumerate(extracts):
        model, history = original.clone(), History(Path(workdir))
        for i, (ask, target) in enumerate(zip(asks, targets), 1):
            rule = SweepRule(forget_target=target, retain_bound=retain_bound, retain_items=scored, checks_per_epoch=1)
            if e == 0:
                gd = model.clone()
                with PeakMemory() as mem:
                    t = time.perf_counter()
                    out = run_unlearning(
                        UnlearnRequest(
                            "grad_diff", TEXT.name, size=size, overrides=gd_over, rule=rule, progress=progress
                        ),
                        gd,
                        ask,
                        retain,
                    )
                    wall = time.perf_counter() - t
                add(request_row("grad_diff", None, i, ask, out.report, wall, mem, gd, [], dataset="tofu"))
            with PeakMemory() as mem:
                t = time.perf_counter()
                out = run_request(
                    UnlearnRequest(
                        "qr-erase",
                        TEXT.name,
                        size=size,
                        overrides={"extract_kind": extract, "sweep_scales": "auto"},
                        rule=rule,
                        retain_state=state_dir,
                        progress=progress,
                    ),
                    model,
                    ask,
                    retain,
                    history=history,
                    reference=reference,
                )
                wall = time.perf_counter() - t
            history = History(Path(workdir), out.report["requests"])
            row = request_row("qr-erase", extract, i, ask, out.report, wall, mem, model, [], dataset="tofu")
            row.detail["retain_state"] = out.report["retain_state"]["status"]
            add(row)
    setup = {
        "preset": preset,
        "precision": precision,
        "data": str(data),
        "forget_split": forget_split,
        "authors": authors,
        "requests": len(asks),
        "forget_items": [len(a) for a in asks],
        "retain_items": len(retain),
        "rule_retain_items": len(scored),
        "forget_targets": targets,
        "retain_bound": retain_bound,
        "target": Path(built.target).name,  # the cache folder's name: no machine path in a record
        "grad_diff": {**asdict(get("grad_diff").config_for(TEXT.name, size)), **gd_over},
        "qr_erase": asdict(get("qr-erase").config_for(TEXT.name, size)),
        "extracts": list(extracts),
        "task_vectors_from": cfg.base,
    }
    return BenchResult(f"TOFU {preset} ({forget_split}, {authors} authors)", setup, prepare_seconds, rows)


__all__ = ["run_tofu"]
