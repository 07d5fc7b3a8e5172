"""One deletion request (or a batch of them) through the harness, with a cached retain state and a history.

``run_request(adapter, forget, retain, kind=..., retain_state=folder, history=read_history(model_dir))``
is :func:`~mmunlearn.methods.harness.run_unlearning` plus what a service needs: the retain side of the
erasure methods loaded from ``folder`` when its fingerprints match (else computed, stored and reported),
and the output folder carrying the earlier requests' undo records. ``forget`` may be several sets (a
batch): they are edited once with their union, and ``compare_batch=True`` also applies them one by one
to a copy and reports how far the two results lie apart.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mmunlearn.kinds import get_kind
from mmunlearn.methods import get, needing
from mmunlearn.methods.harness import REPORT_NAME, Outcome, run_unlearning
from mmunlearn.methods.head_rows import forgotten_speakers
from mmunlearn.methods.rule import SweepRule, mean_nll
from mmunlearn.requests.history import History, carry_history, original_tensor, record
from mmunlearn.requests.state import RetainState, data_fingerprint, model_fingerprint, obtain_retain_state
from mmunlearn.taskvec.extract import ExtractConfig


#: Largest relative edit size ||scale * T_f|| / ||W|| a history's last request may hand the next sweep as its start:
#: a thousand times the weights (explicit sweep scales reach tens on tiny models; nothing useful lies beyond).
MAX_REUSED_EDIT = 1000.0
log = logging.getLogger(__name__)


def union(sets: Sequence[Sequence[Any]]) -> list[Any]:
    """The items of several forget sets, each once (rows with an ``ID`` by ID, others by value), in order."""
    seen, out = set(), []
    for items in sets:
        for item in items:
            key = item.get("ID") if isinstance(item, Mapping) and item.get("ID") is not None else repr(item)
            if key not in seen:
                seen.add(key)
                out.append(item)
    if not out:
        raise ValueError("the forget sets are empty")
    return out


def earlier_speakers(history: History | None) -> list[str]:
    """The speakers the requests of ``history`` forgot (recorded as ``forget_speakers`` since that field exists;
    an older history's requests add none)."""
    if history is None:
        return []
    out: set[str] = set()
    for r in history.requests:
        speakers = r.get("forget_speakers") or []
        if not isinstance(speakers, list) or not all(isinstance(s, str) for s in speakers):
            raise ValueError(f"{history.folder}: request {r.get('index')}'s forget_speakers is not a list of "
                             f"speaker IDs: {speakers!r:.200}")
        out.update(speakers)
    return sorted(out)


def check_earlier(classes: Mapping[str, int] | None, history: History, earlier: Sequence[str],
                  retain: Sequence[Any]) -> None:
    """Refuse a history whose ``forget_speakers`` name speakers that are not among ``classes`` (a classifier adapter's
    ``index``; None for a model of another kind: not checked), or every speaker of the ``retain`` rows (each would
    count as forgotten by the speaker rule: nothing is retained)."""
    where = history.folder / REPORT_NAME
    unknown = sorted(set(earlier) - set(classes)) if classes is not None else []
    if unknown:
        raise ValueError(f"{where}: earlier requests' forget_speakers name {len(unknown)} speaker(s) the model has no "
                         f"class for ({', '.join(unknown[:5])}): the history belongs to another model")
    kept = set(forgotten_speakers(retain))
    if kept and kept <= set(earlier):
        raise ValueError(f"{where}: earlier requests' forget_speakers name every speaker of the retain set "
                         f"({len(kept)}): the retain set must hold speakers no request forgot")


def reusable_edit(history: History, last: Mapping[str, Any]) -> float | None:
    """The previous request's ``relative_edit`` as the next sweep's first size when it is a number in
    (0, :data:`MAX_REUSED_EDIT`]; anything else (negative, NaN, absurd, a string) is ignored with a warning naming
    the history's report: the sweep then starts from its own grid."""
    value = last.get("relative_edit")
    if value is None or (type(value) in (int, float) and value == 0):  # none recorded, or no edit was made
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_REUSED_EDIT:
        return float(value)
    log.warning("%s: the last request's relative_edit %.80r is not in (0, %g]: ignored (the sweep starts from its "
                "own sizes)", history.folder / REPORT_NAME, value, MAX_REUSED_EDIT)
    return None


def earlier_directions(adapter, history: History | None, speakers: Sequence[str]) -> dict[str, Any]:
    """Each speaker of ``speakers`` (forgotten by the requests of ``history``) with its class row as it was before
    those requests (from their undo patches, :func:`~mmunlearn.requests.history.original_tensor`): a cosine
    classifier's row points along its speaker's embeddings, so it stands in for the audio a later request does not
    have. None for every speaker when the patches are not at hand (a history kept in memory, a folder edited
    since). Only for a classifier (its ``head_weight`` names the class rows)."""
    head = dict(adapter.model.named_parameters()).get(adapter.head_weight)
    original = original_tensor(history, adapter.head_weight, head) if history is not None and head is not None else None
    index = adapter.index
    return {s: (original[index[s]].clone() if original is not None and s in index else None) for s in speakers}


def widened_rule(rule: SweepRule | None, earlier: Sequence[str]) -> SweepRule | None:
    """``rule`` with the speakers of earlier requests counted as forgotten by its forget measure, when that
    measure is the speaker rule's (:class:`~mmunlearn.eval.speaker.WorstSpeakerErrorRate`): otherwise a request
    could meet its rule by sending its speaker's audio to a speaker forgotten before. Other rules as they are."""
    from mmunlearn.eval.speaker import WorstSpeakerErrorRate  # deferred: speech metrics load audio libraries

    if rule is None or not earlier or not isinstance(rule.forget_measure, WorstSpeakerErrorRate):
        return rule
    from dataclasses import replace

    return replace(rule, forget_measure=rule.forget_measure.with_earlier(earlier))


def _is_erasure(method: str) -> bool:
    """Whether ``method`` works from task vectors (a retain state can then supply their retain side)."""
    return "task_vectors" in get(method).needs


def _config(method: str, kind: str, config: Any, size: str | None, overrides: Mapping[str, Any] | None):
    spec = get(method, kind)
    cfg = config if config is not None else spec.config_for(kind, size, **dict(overrides or {}))
    return spec, cfg


def run_request(adapter, forget: Sequence[Any] | Sequence[Sequence[Any]], retain: Sequence[Any], *, kind: str,
                method: str = "qr-erase", config: Any = None, size: str | None = None,
                overrides: Mapping[str, Any] | None = None, reference=None, rule: SweepRule | None = None,
                out: str | os.PathLike | None = None, inputs: Sequence[str | os.PathLike] = (),
                overwrite: bool = False, progress: bool = True, meta: Mapping[str, Any] | None = None,
                retain_state: str | os.PathLike | None = None, use_retain_state: bool | None = None,
                refresh_retain: bool = False, retain_extract: ExtractConfig | None = None,
                history: History | None = None, batch: bool = False, compare_batch: bool = False,
                clone=None, reuse_edit_size: bool = True, undo_dir: str | os.PathLike | None = None) -> Outcome:
    """Unlearn one request (``batch=True``: ``forget`` is a list of forget sets, edited once with their union).

    Args:
        retain_state: folder of the retain state (erasure methods): loaded when its fingerprints match,
            else computed and written there. ``use_retain_state=True`` with no folder computes it in memory.
        refresh_retain: recompute the retain state even when it matches.
        overrides: the method's settings; with a retain state and a rule, a kind with a
            ``request_extract`` (:class:`~mmunlearn.kinds.Kind`) and no ``extract_*`` / ``sweep_scales`` given, the
            forget side uses that extraction and auto sweep scales (relative edit sizes: the extraction's scale
            does not matter).
        retain_extract: how the retain state must be extracted (default: as the stored state was; a state
            computed now uses the method preset's extraction: ``overrides`` only change the forget side).
        history: the requests already applied to the model (``read_history(model_dir)``); the output carries
            their undo records and the report lists them all.
        compare_batch: with ``batch``, also apply the sets one by one to ``clone()`` (a fresh copy of the
            input model) and report the difference (``report["batch"]["one_by_one"]``).
        reuse_edit_size: with a rule, an erasure method first tries the relative edit size the previous
            request of the same method chose (``sweep_first``); the sweep ends there when it meets the rule.
    The rest as :func:`~mmunlearn.methods.harness.run_unlearning`.
    """
    t_start = time.perf_counter()
    sets, items = _forget_sets(forget, batch)
    want_state = use_retain_state if use_retain_state is not None else retain_state is not None
    overrides = _request_overrides(overrides, want_state=want_state, rule=rule, config=config, kind=kind,
                                   method=method)
    spec, cfg = _config(method, kind, config, size, overrides)
    if want_state and "task_vectors" not in spec.needs:
        raise ValueError(f"a retain state applies to the methods that work from task vectors "
                         f"({', '.join(needing('task_vectors'))}), not to {method}")
    before = model_fingerprint(adapter.model)
    state = (_obtain_state(retain_state, adapter, retain, retain_extract, reference=reference, history=history,
                           before=before, kind=kind, spec=spec, size=size, refresh=refresh_retain,
                           progress=progress, inputs=inputs) if want_state else None)
    report_meta = _request_meta(meta, state, sets, items, batch)
    previous = history if history is not None and history.requests else None
    rule, stand_ins = _earlier_requests(adapter, previous, retain, report_meta, kind=kind, method=method, rule=rule)
    cfg = _first_edit_size(cfg, previous, method=method, rule=rule) if reuse_edit_size else cfg
    add_history, extra = _history_hooks(adapter, previous, items, before=before, t_start=t_start,
                                        batch_sets=len(sets) if batch else None)
    outcome = run_unlearning(method, adapter, items, retain, kind=kind, config=cfg, reference=reference, rule=rule,
                             out=out, inputs=inputs, overwrite=overwrite, progress=progress, meta=report_meta,
                             retain_task=state.task if state is not None else None, extra=extra,
                             earlier_forgotten=stand_ins, undo_dir=undo_dir)
    if out is None:
        add_history(outcome.report)
    if batch and compare_batch:
        outcome.report["batch"]["one_by_one"] = _compare_batch(
            outcome.adapter, clone, sets, retain, kind=kind, method=method, cfg=cfg, reference=reference, rule=rule,
            state=state)
    return outcome


def _forget_sets(forget: Sequence[Any] | Sequence[Sequence[Any]], batch: bool) -> tuple[list[list[Any]], list[Any]]:
    """The request's forget sets (one unless ``batch``) and the items to forget (their union in a batch)."""
    sets = [list(s) for s in forget] if batch else [list(forget)]
    if batch and not sets:
        raise ValueError("a batch needs at least one forget set")
    return sets, (union(sets) if batch else sets[0])


def _request_overrides(overrides: Mapping[str, Any] | None, *, want_state: bool, rule: SweepRule | None,
                       config: Any, kind: str, method: str) -> dict[str, Any]:
    """``overrides`` with the kind's ``request_extract`` and auto sweep scales put first when they apply."""
    overrides = dict(overrides or {})
    extract = get_kind(kind).request_extract
    if (want_state and rule is not None and config is None and extract is not None and _is_erasure(method)
            and not any(k.startswith(("extract", "sweep_scales")) for k in overrides)):
        overrides = {"extract_kind": extract, "sweep_scales": "auto", **overrides}
    return overrides


def _obtain_state(retain_state: str | os.PathLike | None, adapter, retain: Sequence[Any],
                  retain_extract: ExtractConfig | None, *, reference, history: History | None, before: str, kind: str,
                  spec: Any, size: str | None, refresh: bool, progress: bool,
                  inputs: Sequence[str | os.PathLike]) -> RetainState:
    """The retain state, from ``reference`` when given, else from the model (with the history's lineage)."""
    source = reference if reference is not None else adapter
    lineage = history.lineage(before) if (history is not None and reference is None) else []
    return obtain_retain_state(retain_state, source, retain, retain_extract, kind=kind,
                               default_extract=spec.config_for(kind, size).extract, lineage=lineage,
                               refresh=refresh, progress=progress, inputs=inputs)


def _request_meta(meta: Mapping[str, Any] | None, state: RetainState | None, sets: list[list[Any]], items: list[Any],
                  batch: bool) -> dict[str, Any]:
    """The report's meta: the caller's, the retain state's description and a batch's sets."""
    report_meta: dict[str, Any] = dict(meta or {})
    if state is not None:
        report_meta["retain_state"] = state.describe()
    if batch:
        report_meta["batch"] = {"sets": [{"items": len(s), "fingerprint": data_fingerprint(s)} for s in sets],
                                "union_items": len(items)}
    return report_meta


def _earlier_requests(adapter, previous: History | None, retain: Sequence[Any], report_meta: dict[str, Any], *,
                      kind: str, method: str, rule: SweepRule | None) -> tuple[SweepRule | None, dict[str, Any] | None]:
    """Check the earlier requests' speakers, note them in ``report_meta``; return the widened rule and stand-ins."""
    earlier = earlier_speakers(previous)
    classifier = bool(earlier) and get_kind(kind).is_classifier
    if earlier:
        check_earlier(adapter.index if classifier else None, previous, earlier, retain)
    rule = widened_rule(rule, earlier)
    # the undo patches are read only for a method that can use them (an erasure of a classifier's head)
    stand_ins = (earlier_directions(adapter, previous, earlier)
                 if earlier and _is_erasure(method) and classifier else None)
    if earlier:
        report_meta["earlier_forgotten_speakers"] = earlier
        report_meta["earlier_directions"] = sorted(k for k, v in (stand_ins or {}).items() if v is not None)
    return rule, stand_ins


def _first_edit_size(cfg: Any, previous: History | None, *, method: str, rule: SweepRule | None) -> Any:
    """``cfg`` whose sweep first tries the previous request's edit size, when that request used ``method``."""
    last = previous.requests[-1] if previous is not None else {}
    if (rule is not None and getattr(cfg, "sweep_first", "absent") is None
            and last.get("method") == method and reusable_edit(previous, last) is not None):
        from dataclasses import replace

        return replace(cfg, sweep_first=reusable_edit(previous, last))
    return cfg


def _history_hooks(adapter, previous: History | None, items: list[Any], *, before: str, t_start: float,
                   batch_sets: int | None) -> tuple[Callable[[dict], None], Callable[[Path, dict], None]]:
    """``add_history(report)`` (this request's record) and the harness's ``extra`` (with the earlier records)."""

    def add_history(report: dict[str, Any]) -> None:
        more = {"model_before": before, "model_after": model_fingerprint(adapter.model),
                "forget_fingerprint": data_fingerprint(items), "seconds": time.perf_counter() - t_start,
                "relative_edit": (report.get("info") or {}).get("relative")}
        if batch_sets is not None:
            more["batch_sets"] = batch_sets
        speakers = forgotten_speakers(items)
        if speakers:
            more["forget_speakers"] = speakers
        report["requests"] = record(previous.requests if previous else [], report, **more)

    def extra(staging: Path, report: dict[str, Any]) -> None:
        if previous is not None:
            carry_history(previous, staging)
        add_history(report)

    return add_history, extra


def _compare_batch(edited, clone, sets: list[list[Any]], retain: Sequence[Any], *, kind: str, method: str, cfg: Any,
                   reference, rule: SweepRule | None, state: RetainState | None) -> dict[str, Any]:
    """:func:`compare_one_by_one` for a batch, refused without ``clone``."""
    if clone is None:
        raise ValueError("compare_batch needs clone: a function returning a fresh copy of the input model")
    return compare_one_by_one(edited, clone, sets, retain, kind=kind, method=method, cfg=cfg, reference=reference,
                              rule=rule, retain_task=state.task if state is not None else None)


def compare_one_by_one(edited, clone, sets: Sequence[Sequence[Any]], retain: Sequence[Any], *, kind: str,
                       method: str, cfg: Any, reference=None, rule: SweepRule | None = None,
                       retain_task: Any = None) -> dict[str, Any]:
    """Apply ``sets`` one after another to ``clone()`` and compare with ``edited`` (the union's edit): the
    largest relative difference of a weight tensor, and each set's forget NLL under both."""
    import torch

    seq = clone()
    for s in sets:
        run_unlearning(method, seq, list(s), retain, kind=kind, config=cfg, reference=reference, rule=rule,
                       progress=False, retain_task=retain_task)
    a, b = edited.model.state_dict(), seq.model.state_dict()
    rel = 0.0
    for name, t in a.items():
        if t.is_floating_point() and not torch.equal(t, b[name]):
            norm = float(torch.linalg.vector_norm(t.double())) or 1.0
            rel = max(rel, float(torch.linalg.vector_norm((t - b[name].to(t.device)).double())) / norm)
    return {"identical": rel == 0.0, "max_relative_weight_difference": rel,
            "forget_nll_union": [mean_nll(edited, list(s)) for s in sets],
            "forget_nll_one_by_one": [mean_nll(seq, list(s)) for s in sets],
            "retain_nll_union": mean_nll(edited, retain), "retain_nll_one_by_one": mean_nll(seq, retain)}


__all__ = ["compare_one_by_one", "run_request", "union"]
