"""Deletion requests at service speed: time per request with the retain state cached, against GradDiff.

``mmunlearn bench requests`` builds (or reuses, under ``--workdir``) a speaker classifier on the built-in
espeak corpus, splits its forget speakers into one deletion request each, computes the retain state once,
then applies the requests one after another with QR-Erase (each on the model the previous one wrote, which it
writes to ``WORKDIR/requests/`` as a service would: the next request reads its history and undo patches there),
for each forget-extraction kind asked. Every request is also given to GradDiff, on the same input model
with the same rule, trained until it meets the forget criterion (or runs out of epochs). QR-Erase sweeps its
scale in units of the task vectors' size (``sweep_scales="auto"``), so gradient and fine-tuning extractions
of very different magnitudes are searched alike. Both use the
speaker rule of ``mmunlearn.unlearn`` at the chance target these records were measured with
(:func:`mmunlearn.api.rules.speaker_rule` with :func:`~mmunlearn.api.rules.chance`: the request's speaker's utterances
predicted as none of the speakers forgotten so far, this request's and the earlier ones' --
:class:`mmunlearn.eval.speaker.WorstSpeakerErrorRate`, the worst speaker's share -- at or above ``1 - 1/C``,
retain NLL rising by at most ``retain_bound`` nats), scored once an
epoch for GradDiff and once a sweep point for QR-Erase. Per request: wall time of the whole request (scoring and report
included), the method's own time (extraction + edit / training), the rule's measures, held-out accuracy of the kept
speakers, the share of the utterances (training and held-out) of every speaker forgotten so far predicted as
any forgotten speaker and the largest share of one of them sent to a single retained speaker
(:func:`mmunlearn.eval.speaker.forgotten_counts`), and the peak resident memory above the level at the start of
the request. The same two shares of the retrained model (trained on the retained speakers only, cached beside the
original) are in ``setup["retrained"]`` and the table's last row: what the last request's state should match. The rule
scores the retain measure on ``score_retain`` retain utterances spread over the set (both methods alike); the full
retain set's NLL before and after each request is in the JSON rows.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from data_prep.synth_speakers import synthesize_corpus
from data_prep.voxceleb2 import prepare
from mmunlearn.adapters.speaker.adapter import KIND as SPEAKER
from mmunlearn.adapters.speaker.adapter import SpeakerAdapter
from mmunlearn.adapters.speaker.training import DEFAULT_TRAIN, train_speaker_classifier, training_rows
from mmunlearn.api.rules import chance_error_rate, speaker_rule
from mmunlearn.data.utterances import split_rows
from mmunlearn.eval.speaker import accuracy, forgotten_counts, forgotten_rates, score_rows
from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.methods import UnlearnRequest, get, run_unlearning
from mmunlearn.methods.rule import SweepRule
from mmunlearn.report import table
from mmunlearn.requests import History, obtain_retain_state, read_history, run_request, widened_rule
from mmunlearn.train import TrainConfig
from recipes.requests.config import RequestsConfig

#: The goal of issue 18: a request with the retain state cached at least this many times faster than GradDiff.
TARGET_SPEEDUP = 10.0


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """Peak resident set size while the block runs (sampled every 5 ms), and the level when it started."""

    def __enter__(self) -> PeakMemory:
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def extra(self) -> int:
        return self.peak - self.start


@dataclass
class RequestRow:
    """One request handled by one method."""

    dataset: str
    method: str  # qr-erase (retain state cached) | grad_diff
    extract: str | None  # forget extraction of QR-Erase
    request: int  # 1-based, in order
    forget_items: int
    seconds: float  # wall time of the whole request
    method_seconds: float  # extraction + edit (QR-Erase) or training (GradDiff)
    extract_seconds: float
    forget_before: float
    forget_after: float
    forget_target: float
    retain_before: float
    retain_after: float
    retain_bound: float
    reached: bool  # forget measure at or past the target
    retain_ok: bool  # retain measure within the bound
    heldout_retain_acc: float | None = None  # kept speakers' test audio, after the request
    peak_extra_mb: float = 0.0
    peak_mb: float = 0.0
    detail: dict = field(default_factory=dict)
    #: speakers: of every speaker forgotten so far (training and held-out utterances), the share predicted as any
    #: forgotten speaker, and the largest share of one such speaker's utterances sent to one retained class
    forgotten_any: float | None = None
    forgotten_sink: float | None = None

    @property
    def meets(self) -> bool:
        return self.reached and self.retain_ok


@dataclass
class BenchResult:
    dataset: str
    setup: dict
    prepare_seconds: float  # the retain state, once
    rows: list[RequestRow]

    def summary(self) -> list[dict[str, Any]]:
        """Per method (and extraction): median time per request after the first, the speed-up over GradDiff
        on the same requests, how many met the rule, the largest retain rise and the peak memory."""
        out = []
        keys = sorted({(r.method, r.extract) for r in self.rows}, key=lambda k: (k[0] != "grad_diff", str(k[1])))
        gd = [r for r in self.rows if r.method == "grad_diff"]
        for method, extract in keys:
            rows = [r for r in self.rows if r.method == method and r.extract == extract]
            later = [r for r in rows if r.request > 1] or rows
            sec = statistics.median(r.seconds for r in later)
            msec = statistics.median(r.method_seconds for r in later)
            gd_later = [r for r in gd if r.request > 1] or gd
            gd_sec = statistics.median(r.seconds for r in gd_later) if gd_later else float("nan")
            gd_msec = statistics.median(r.method_seconds for r in gd_later) if gd_later else float("nan")
            out.append(
                {
                    "method": method,
                    "extract": extract,
                    "requests": len(rows),
                    "median_seconds_after_first": sec,
                    "median_method_seconds_after_first": msec,
                    "first_request_seconds": rows[0].seconds,
                    "speedup_vs_grad_diff": gd_sec / sec if sec > 0 else float("nan"),
                    "method_speedup_vs_grad_diff": gd_msec / msec if msec > 0 else float("nan"),
                    "met_rule": sum(r.meets for r in rows),
                    "reached_forget": sum(r.reached for r in rows),
                    "max_retain_rise": max(r.retain_after - r.retain_before for r in rows),
                    "min_heldout_retain_acc": min(
                        (r.heldout_retain_acc for r in rows if r.heldout_retain_acc is not None), default=None
                    ),
                    "max_forgotten_any": max(
                        (r.forgotten_any for r in rows if r.forgotten_any is not None), default=None
                    ),
                    "max_forgotten_sink": max(
                        (r.forgotten_sink for r in rows if r.forgotten_sink is not None), default=None
                    ),
                    "peak_extra_mb": max(r.peak_extra_mb for r in rows),
                    "peak_mb": max(r.peak_mb for r in rows),
                }
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "setup": self.setup,
            "prepare_seconds": self.prepare_seconds,
            "summary": self.summary(),
            "rows": [{**asdict(r), "meets": r.meets} for r in self.rows],
            "machine": machine(),
            "target_speedup": TARGET_SPEEDUP,
        }


def machine() -> dict[str, Any]:
    return {
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }


def spread(rows: list, n: int) -> list:
    """``n`` of ``rows`` spread evenly over them, first and last included (0, or ``n`` >= their count: all)."""
    if not n or n >= len(rows):
        return rows
    return [rows[round(i * (len(rows) - 1) / (n - 1))] for i in range(n)]


def forgotten_share(adapter, rows: Sequence[dict]) -> tuple[float, float]:
    """(share of ``rows`` predicted as any of their speakers, largest share of one speaker's rows sent to one other
    class) -- :func:`mmunlearn.eval.speaker.forgotten_counts` on the forgotten speakers' utterances."""
    counted = forgotten_counts(score_rows(adapter, list(rows), desc=None))
    return counted["any_forgotten"], counted["sink_share"]


def _speaker_model(
    workdir: Path,
    preset: str,
    speakers: int,
    utterances: int,
    videos: int,
    forget_speakers: int,
    epochs: int | None,
    progress: bool,
    manifests: Path | None = None,
) -> tuple[Path, Path, Path]:
    """Manifests (``manifests``, or the built-in corpus's), a classifier trained on them and one trained on the
    retained speakers only (the retrained model, same label space), both cached in ``workdir``."""
    import hashlib

    if manifests is None:
        root = synthesize_corpus(workdir / "corpus", speakers, utterances, videos, 0, progress=progress)
        man = prepare(
            root, workdir / "manifests", forget_speakers=forget_speakers, forget_fraction=0.1, seed=0, progress=progress
        ).out
        tag = ""
    else:
        man = Path(manifests)
        if not (man / "train.csv").is_file():
            raise FileNotFoundError(
                f"{man} holds no train.csv: pass a folder written by `voxceleb2 prepare` or `prepare-corpus`"
            )
        tag = "-" + hashlib.sha256((man / "train.csv").read_bytes()).hexdigest()[:10]  # one model per training set
    cfg = (
        TrainConfig(epochs=15, batch_size=8, lr=1e-2, schedule="onecycle", weight_decay=1e-4)
        if preset == "tiny"
        else DEFAULT_TRAIN
    )
    if epochs is not None:
        cfg = cfg.replace(epochs=epochs)
    dirs = []
    for retain_only, role in ((False, "model"), (True, "retrained")):
        model_dir = workdir / f"{role}-{preset}-e{cfg.epochs}{tag}"
        if not (model_dir / "hyperparams.yaml").is_file():
            rows, labels = training_rows(man, "speaker", retain_only=retain_only)
            if progress:
                print(
                    f"training the {preset} {role} classifier on {len(rows)} utterances of "
                    f"{len({r['spk_id'] for r in rows})} speakers ({cfg.epochs} epochs; cached in {model_dir}) ...",
                    flush=True,
                )
            adapter, _ = train_speaker_classifier(
                rows,
                speakers=labels,
                preset=preset,
                config=cfg,
                seed=0,
                device="cpu",
                progress=progress,
                desc=f"train {preset} {role}",
            )
            adapter.save(model_dir, overwrite=True)
        dirs.append(model_dir)
    return man, dirs[0], dirs[1]


def run_speaker(cfg: RequestsConfig, show: Callable[[RequestRow], None] | None = None) -> BenchResult:
    """The speaker-classifier benchmark (see the module notes) as ``cfg`` (``dataset`` speaker) sets it. ``scope``: the
    weights QR-Erase edits (``head``: class weights only, retain rank 0, embeddings reused by the scoring); GradDiff
    trains all. ``manifests``: a prepared corpus (e.g. FSDD from ``voxceleb2 prepare-corpus``) instead of the built-in
    one; each of its forget speakers is one request. ``show``: called with each request's row as it is measured."""
    from dataclasses import replace

    preset, extracts, scope, manifests = cfg.resolved_preset(), cfg.extracts(), cfg.scope, cfg.manifests
    workdir, progress = Path(cfg.workdir), cfg.progress
    workdir.mkdir(parents=True, exist_ok=True)
    man, model_dir, retrained_dir = _speaker_model(
        workdir, preset, cfg.speakers, cfg.utterances, cfg.videos, cfg.requests, cfg.train_epochs, progress, manifests
    )
    forget_rows, retain = split_rows(man, "spk_forget_train"), split_rows(man, "spk_retain_train")
    heldout = split_rows(man, "spk_retain_test")
    ids = sorted({r["spk_id"] for r in forget_rows})
    asks = [[r for r in forget_rows if r["spk_id"] == s] for s in ids]
    forget_test = split_rows(man, "spk_forget_test")
    gone = [[r for r in forget_rows + forget_test if r["spk_id"] in ids[:i]] for i in range(1, len(ids) + 1)]
    original = SpeakerAdapter.load(model_dir, device="cpu")
    scoped = original.clone()
    scoped.scope = scope  # validates it
    qr_over = {"sweep_scales": "auto", **({"retain_rank": 0} if scope == "head" else {})}
    n_classes = len(original.speakers)
    scored = spread(retain, cfg.score_retain)
    rule = replace(
        speaker_rule(n_classes, cfg.resolved_retain_bound(), chance_error_rate(n_classes)),
        retain_items=scored,
        checks_per_epoch=1,
    )
    size = SPEAKER.size_for(preset)
    accuracy(original, heldout + retain + forget_rows + forget_test, desc=None)  # decode the audio once, untimed
    retrained_row = _retrained_row(retrained_dir, original, gone[-1], heldout)
    state_dir = workdir / "retain_state"
    prepare_seconds = timed_retain_state(state_dir, scoped, retain, SPEAKER.name, size, progress)
    gd_over = {"epochs": cfg.gd_epochs or 20, **({"lr": cfg.gd_lr} if cfg.gd_lr is not None else {})}
    rows = _sequential_requests(
        workdir,
        scoped,
        asks,
        retain,
        extracts=extracts,
        ids=ids,
        gone=gone,
        rule=rule,
        size=size,
        gd_over=gd_over,
        qr_over=qr_over,
        state_dir=state_dir,
        heldout=heldout,
        progress=progress,
        show=show,
    )
    batch = None
    if cfg.batch and len(asks) > 1:  # every request at once: one edit with the union, against one by one
        batch = _batch_comparison(
            scoped,
            asks,
            retain,
            extract=extracts[0],
            qr_over=qr_over,
            rule=rule,
            size=size,
            state_dir=state_dir,
            forget_rows=forget_rows,
            gone=gone[-1],
            progress=progress,
        )
    setup = {
        "preset": preset,
        "speakers": cfg.speakers,
        "utterances": cfg.utterances,
        "videos": cfg.videos,
        "batch": batch,
        "classes": n_classes,
        "requests": len(asks),
        "retain_items": len(retain),
        "model": str(model_dir),
        "rule": rule.describe(),
        "rule_retain_items": len(scored),
        "grad_diff": {**asdict(get("grad_diff").config_for(SPEAKER.name, size)), **gd_over},
        "qr_erase": {**asdict(get("qr-erase").config_for(SPEAKER.name, size)), **qr_over},
        "extracts": list(extracts),
        "scope": scope,
        "manifests": str(man),
        "retrained": retrained_row,
    }
    name = "built-in corpus" if manifests is None else f"manifests {Path(manifests).name}"
    return BenchResult(f"speaker classifier ({name})", setup, prepare_seconds, rows)


def _retrained_row(retrained_dir: Path, original: SpeakerAdapter, gone: list[dict], heldout: list[dict]) -> dict:
    """The retrained model's two shares and held-out accuracy: what the state after the last request should match."""
    retrained = SpeakerAdapter.load(retrained_dir, device="cpu")
    if retrained.speakers != original.speakers:
        raise ValueError(f"{retrained_dir}: the retrained model's classes differ from the original's")
    re_any, re_sink = forgotten_share(retrained, gone)
    return {
        "model": str(retrained_dir),
        "forgotten_any": re_any,
        "forgotten_sink": re_sink,
        "heldout_retain_acc": accuracy(retrained, heldout, desc=None) if heldout else None,
    }


def _sequential_requests(
    workdir: Path,
    scoped: SpeakerAdapter,
    asks: list[list[dict]],
    retain: list[dict],
    *,
    extracts: Sequence[str],
    ids: list[str],
    gone: list[list[dict]],
    rule: SweepRule,
    size: str,
    gd_over: dict,
    qr_over: dict,
    state_dir: Path,
    heldout: list[dict],
    progress: bool,
    show: Callable[[RequestRow], None] | None,
) -> list[RequestRow]:
    """Per extraction, the requests one after another with QR-Erase (GradDiff beside each, for the first one)."""
    rows: list[RequestRow] = []

    def add(row: RequestRow, adapter) -> None:  # counted over every speaker forgotten so far
        row.forgotten_any, row.forgotten_sink = forgotten_share(adapter, gone[row.request - 1])
        rows.append(row)
        if show is not None:
            show(row)

    for e, extract in enumerate(extracts):
        model, history = scoped.clone(), History(workdir)
        for i, forget in enumerate(asks, 1):
            if e == 0:  # GradDiff on the same input model, with the same rule
                gd = model.clone()
                gd.scope = "all"  # GradDiff trains every weight; its own adapter, no shared embedding cache
                with PeakMemory() as mem:
                    t = time.perf_counter()
                    out = run_unlearning(
                        UnlearnRequest(
                            "grad_diff",
                            SPEAKER.name,
                            size=size,
                            overrides=gd_over,
                            rule=widened_rule(rule, ids[: i - 1]),
                            progress=progress,
                        ),
                        gd,
                        forget,
                        retain,
                    )
                    wall = time.perf_counter() - t
                add(request_row("grad_diff", None, i, forget, out.report, wall, mem, gd, heldout), gd)
            with PeakMemory() as mem:
                t = time.perf_counter()
                # each request writes its folder, as a service would: the next one reads its history from there
                # (the undo patches give the earlier speakers' original class rows: head_rows.py)
                folder = workdir / "requests" / f"qr-erase-{extract}-{i}"
                out = run_request(
                    UnlearnRequest(
                        "qr-erase",
                        SPEAKER.name,
                        size=size,
                        overrides={"extract_kind": extract, **qr_over},
                        rule=rule,
                        retain_state=state_dir,
                        out=folder,
                        overwrite=True,
                        progress=progress,
                    ),
                    model,
                    forget,
                    retain,
                    history=history,
                )
                wall = time.perf_counter() - t
            history = read_history(folder)
            row = request_row("qr-erase", extract, i, forget, out.report, wall, mem, model, heldout)
            row.detail["retain_state"] = out.report["retain_state"]["status"]
            add(row, model)
    return rows


def _batch_comparison(
    scoped: SpeakerAdapter,
    asks: list[list[dict]],
    retain: list[dict],
    *,
    extract: str,
    qr_over: dict,
    rule: SweepRule,
    size: str,
    state_dir: Path,
    forget_rows: list[dict],
    gone: list[dict],
    progress: bool,
) -> dict[str, Any]:
    """Every request at once (one QR-Erase edit with the union) against them one by one."""
    model = scoped.clone()
    t = time.perf_counter()
    out = run_request(
        UnlearnRequest(
            "qr-erase",
            SPEAKER.name,
            size=size,
            overrides={"extract_kind": extract, **qr_over},
            rule=rule,
            retain_state=state_dir,
            batch=True,
            compare_batch=True,
            progress=progress,
        ),
        model,
        asks,
        retain,
        clone=scoped.clone,
    )
    one = out.report["batch"]["one_by_one"]
    return {
        "extract": extract,
        "seconds_with_comparison": time.perf_counter() - t,
        "union_method_seconds": out.report["extract_seconds"] + out.report["unlearn_seconds"],
        "union_rule": out.report["rule"],
        "union_target_reached": out.report["target_reached"],
        "forget_error_union": forgotten_rates(model, forget_rows),
        **dict(zip(("forgotten_any_union", "forgotten_sink_union"), forgotten_share(model, gone))),
        **one,
    }


def timed_retain_state(state_dir: Path, adapter: Any, retain: list, kind: str, size: str, progress: bool) -> float:
    """Seconds to compute the retain state (QR-Erase's preset extraction) of ``adapter`` afresh into ``state_dir``."""
    t0 = time.perf_counter()
    obtain_retain_state(
        state_dir,
        adapter,
        retain,
        None,
        kind=kind,
        default_extract=get("qr-erase").config_for(kind, size).extract,
        refresh=True,
        progress=progress,
    )
    return time.perf_counter() - t0


def request_row(
    method: str,
    extract: str | None,
    index: int,
    forget: Sequence[dict],
    report: dict,
    wall: float,
    mem: PeakMemory,
    adapter,
    heldout: Sequence[dict],
    dataset: str = "speaker",
) -> RequestRow:
    """One request's row from the harness report (the rule's measures, times, memory; ``heldout``: the kept
    speakers' test audio whose accuracy is recorded, none for TOFU)."""
    rule = report["rule"]
    f_after, r_after = rule["forget"], rule["retain"]
    return RequestRow(
        dataset=dataset,
        method=method,
        extract=extract,
        request=index,
        forget_items=len(forget),
        seconds=wall,
        method_seconds=report["extract_seconds"] + report["unlearn_seconds"],
        extract_seconds=report["extract_seconds"],
        forget_before=rule["base_forget"],
        forget_after=f_after,
        forget_target=rule["forget_target"],
        retain_before=rule["base_retain"],
        retain_after=r_after,
        retain_bound=rule["retain_bound"],
        reached=f_after >= rule["forget_target"],
        retain_ok=r_after - rule["base_retain"] <= rule["retain_bound"],
        heldout_retain_acc=accuracy(adapter, heldout, desc=None) if heldout else None,
        peak_extra_mb=mem.extra / 2**20,
        peak_mb=mem.peak / 2**20,
        detail={
            "chosen": report.get("info", {}).get("chosen"),
            "steps": report.get("info", {}).get("steps"),
            "retain_nll_full": report["retain_nll"],
            "forget_nll": report["forget_nll"],
            "sweep_points": len(report.get("info", {}).get("sweep", []) or []),
        },
    )


#: the summary table's columns (cells formatted by :func:`markdown`: seconds, "x" speed-ups, "met/requests", %)
COLUMNS = tuple(
    zip(
        (
            "method",
            "forget extraction",
            "s / request (after the 1st)",
            "method s",
            "speed-up vs GradDiff",
            "met rule",
            "max retain rise (nats)",
            "min held-out retain acc %",
            "forgotten -> any forgotten % (max)",
            "largest share on one retained speaker % (max)",
            "peak extra MiB",
        ),
        (
            "method",
            "extract",
            "seconds",
            "method_seconds",
            "speedup",
            "met",
            "retain_rise",
            "retain_acc",
            "forgotten_any",
            "forgotten_sink",
            "peak_mb",
        ),
    )
)


def markdown(res: BenchResult) -> str:
    """The summary as a Markdown table (:func:`mmunlearn.report.table`; not cut to a terminal's width)."""
    pct = lambda v: None if v is None else f"{100 * v:.1f}"  # noqa: E731
    rows = [
        {
            "method": s["method"],
            "extract": s["extract"] or "n/a",
            "seconds": f"{s['median_seconds_after_first']:.2f}",
            "method_seconds": f"{s['median_method_seconds_after_first']:.2f}",
            "speedup": f"{s['speedup_vs_grad_diff']:.1f}x",
            "met": f"{s['met_rule']}/{s['requests']}",
            "retain_rise": f"{s['max_retain_rise']:.4f}",
            "retain_acc": pct(s["min_heldout_retain_acc"]),
            "forgotten_any": pct(s.get("max_forgotten_any")),
            "forgotten_sink": pct(s.get("max_forgotten_sink")),
            "peak_mb": f"{s['peak_extra_mb']:.0f}",
        }
        for s in res.summary()
    ]
    if re := res.setup.get("retrained"):  # what the state after every request should look like
        rows.append(
            {
                "method": "retrained model",
                "retain_acc": pct(re["heldout_retain_acc"]),
                "forgotten_any": pct(re["forgotten_any"]),
                "forgotten_sink": pct(re["forgotten_sink"]),
            }
        )
    return table(rows, COLUMNS)


def write_json(path: str | os.PathLike, res: BenchResult) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, json.dumps(res.to_dict(), indent=2, default=str))


__all__ = [
    "BenchResult",
    "PeakMemory",
    "RequestRow",
    "TARGET_SPEEDUP",
    "forgotten_share",
    "machine",
    "markdown",
    "request_row",
    "run_speaker",
    "write_json",
]
