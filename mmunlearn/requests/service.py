"""One deletion request (or a batch of them) through the harness, with a cached retain state and a history.

``run_request(UnlearnRequest(method, kind, retain_state=folder), adapter, forget, retain,
history=read_history(model_dir))`` is :func:`~mmunlearn.methods.harness.run_unlearning` plus what a service needs:
the retain side of the erasure methods loaded from ``folder`` when its fingerprints match (else computed, stored and
reported), and the output folder carrying the earlier requests' undo records. ``forget`` may be several sets (a
batch, ``batch=True``): they are edited once with their union, and ``compare_batch=True`` also applies them one by
one to a copy and reports how far the two results lie apart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mmunlearn.kinds import get_kind
from mmunlearn.methods import get, needing
from mmunlearn.methods.harness import REPORT_NAME, Outcome, run_unlearning
from mmunlearn.methods.head_rows import forgotten_speakers
from mmunlearn.methods.request import UnlearnRequest
from mmunlearn.methods.rule import SweepRule, mean_nll
from mmunlearn.requests.history import History, carry_history, original_tensor, record
from mmunlearn.requests.state import RetainState, data_fingerprint, model_fingerprint, obtain_retain_state

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
            raise ValueError(
                f"{history.folder}: request {r.get('index')}'s forget_speakers is not a list of "
                f"speaker IDs: {speakers!r:.200}"
            )
        out.update(speakers)
    return sorted(out)


def check_earlier(
    classes: Mapping[str, int] | None, history: History, earlier: Sequence[str], retain: Sequence[Any]
) -> None:
    """Refuse a history whose ``forget_speakers`` name speakers that are not among ``classes`` (a classifier adapter's
    ``index``; None for a model of another kind: not checked), or every speaker of the ``retain`` rows (each would
    count as forgotten by the speaker rule: nothing is retained)."""
    where = history.folder / REPORT_NAME
    unknown = sorted(set(earlier) - set(classes)) if classes is not None else []
    if unknown:
        raise ValueError(
            f"{where}: earlier requests' forget_speakers name {len(unknown)} speaker(s) the model has no "
            f"class for ({', '.join(unknown[:5])}): the history belongs to another model"
        )
    kept = set(forgotten_speakers(retain))
    if kept and kept <= set(earlier):
        raise ValueError(
            f"{where}: earlier requests' forget_speakers name every speaker of the retain set "
            f"({len(kept)}): the retain set must hold speakers no request forgot"
        )


def reusable_edit(history: History, last: Mapping[str, Any]) -> float | None:
    """The previous request's ``relative_edit`` as the next sweep's first size when it is a number in
    (0, :data:`MAX_REUSED_EDIT`]; anything else (negative, NaN, absurd, a string) is ignored with a warning naming
    the history's report: the sweep then starts from its own grid."""
    value = last.get("relative_edit")
    if value is None or (type(value) in (int, float) and value == 0):  # none recorded, or no edit was made
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_REUSED_EDIT:
        return float(value)
    log.warning(
        "%s: the last request's relative_edit %.80r is not in (0, %g]: ignored (the sweep starts from its own sizes)",
        history.folder / REPORT_NAME,
        value,
        MAX_REUSED_EDIT,
    )
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


def run_request(
    request: UnlearnRequest,
    adapter,
    forget: Sequence[Any] | Sequence[Sequence[Any]],
    retain: Sequence[Any],
    *,
    reference=None,
    history: History | None = None,
    clone=None,
) -> Outcome:
    """Unlearn one request (``request.batch``: ``forget`` is a list of forget sets, edited once with their union).

    Args:
        request: the method and its settings, the rule, the output, and the deletion request's own settings
            (:class:`~mmunlearn.methods.request.UnlearnRequest`): ``retain_state`` (erasure methods: loaded when
            its fingerprints match, else computed and written there); ``overrides`` (with a retain state and a rule,
            a kind with a ``request_extract`` (:class:`~mmunlearn.kinds.Kind`) and no ``extract_*`` /
            ``sweep_scales`` given, the forget side uses that extraction and auto sweep scales: relative edit sizes,
            the extraction's scale does not matter); ``retain_extract`` (a state computed now uses the method
            preset's extraction: ``overrides`` only change the forget side); ``reuse_edit_size`` (with a rule, an
            erasure method first tries the relative edit size the previous request of the same method chose,
            ``sweep_first``; when it meets the rule, the sweep narrows it down to the smallest size that does).
        reference: adapter the erasure methods take task vectors from (default: the target).
        history: the requests already applied to the model (``read_history(model_dir)``); the output carries
            their undo records and the report lists them all.
        clone: with ``request.compare_batch``, a function returning a fresh copy of the input model: the sets are
            also applied one by one to it and the difference reported (``report["batch"]["one_by_one"]``).
    """
    t_start = time.perf_counter()
    method, kind = request.method, request.kind
    sets, items = _forget_sets(forget, request.batch)
    spec = get(method, kind)
    cfg = (
        request.config
        if request.config is not None
        else spec.config_for(kind, request.size, **_request_overrides(request))
    )
    if request.wants_state and "task_vectors" not in spec.needs:
        raise ValueError(
            f"a retain state applies to the methods that work from task vectors "
            f"({', '.join(needing('task_vectors'))}), not to {method}"
        )
    before = model_fingerprint(adapter.model)
    state = (
        _obtain_state(request, adapter, retain, reference=reference, history=history, before=before)
        if request.wants_state
        else None
    )
    report_meta = _request_meta(request.meta, state, sets, items, request.batch)
    previous = history if history is not None and history.requests else None
    rule, stand_ins = _earlier_requests(
        adapter, previous, retain, report_meta, kind=kind, method=method, rule=request.rule
    )
    cfg = _first_edit_size(cfg, previous, method=method, rule=rule) if request.reuse_edit_size else cfg
    add_history, extra = _history_hooks(
        adapter, previous, items, before=before, t_start=t_start, batch_sets=len(sets) if request.batch else None
    )
    run = request.for_harness(cfg, rule=rule, meta=report_meta)
    outcome = run_unlearning(
        run,
        adapter,
        items,
        retain,
        reference=reference,
        retain_task=state.task if state is not None else None,
        extra=extra,
        earlier_forgotten=stand_ins,
    )
    if request.out is None:
        add_history(outcome.report)
    if request.compare_batch:  # only with batch (the request refuses it alone)
        outcome.report["batch"]["one_by_one"] = _compare_batch(
            outcome.adapter, clone, sets, retain, run, reference=reference, state=state
        )
    return outcome


def _forget_sets(forget: Sequence[Any] | Sequence[Sequence[Any]], batch: bool) -> tuple[list[list[Any]], list[Any]]:
    """The request's forget sets (one unless ``batch``) and the items to forget (their union in a batch)."""
    sets = [list(s) for s in forget] if batch else [list(forget)]
    if batch and not sets:
        raise ValueError("a batch needs at least one forget set")
    return sets, (union(sets) if batch else sets[0])


def _request_overrides(request: UnlearnRequest) -> dict[str, Any]:
    """The request's overrides with the kind's ``request_extract`` and auto sweep scales put first when they apply."""
    overrides = dict(request.overrides)
    extract = get_kind(request.kind).request_extract
    if (
        request.wants_state
        and request.rule is not None
        and request.config is None
        and extract is not None
        and _is_erasure(request.method)
        and not any(k.startswith(("extract", "sweep_scales")) for k in overrides)
    ):
        overrides = {"extract_kind": extract, "sweep_scales": "auto", **overrides}
    return overrides


def _obtain_state(
    request: UnlearnRequest, adapter, retain: Sequence[Any], *, reference, history: History | None, before: str
) -> RetainState:
    """The retain state, from ``reference`` when given, else from the model (with the history's lineage)."""
    source = reference if reference is not None else adapter
    lineage = history.lineage(before) if (history is not None and reference is None) else []
    kind = request.kind
    return obtain_retain_state(
        request.retain_state,
        source,
        retain,
        request.retain_extract,
        kind=kind,
        default_extract=get(request.method).config_for(kind, request.size).extract,
        lineage=lineage,
        refresh=request.refresh_retain,
        progress=request.progress,
        inputs=request.inputs,
    )


def _request_meta(
    meta: Mapping[str, Any] | None, state: RetainState | None, sets: list[list[Any]], items: list[Any], batch: bool
) -> dict[str, Any]:
    """The report's meta: the caller's, the retain state's description and a batch's sets."""
    report_meta: dict[str, Any] = dict(meta or {})
    if state is not None:
        report_meta["retain_state"] = state.describe()
    if batch:
        report_meta["batch"] = {
            "sets": [{"items": len(s), "fingerprint": data_fingerprint(s)} for s in sets],
            "union_items": len(items),
        }
    return report_meta


def _earlier_requests(
    adapter,
    previous: History | None,
    retain: Sequence[Any],
    report_meta: dict[str, Any],
    *,
    kind: str,
    method: str,
    rule: SweepRule | None,
) -> tuple[SweepRule | None, dict[str, Any] | None]:
    """Check the earlier requests' speakers, note them in ``report_meta``; return the widened rule and stand-ins."""
    earlier = earlier_speakers(previous)
    classifier = bool(earlier) and get_kind(kind).is_classifier
    if earlier:
        check_earlier(adapter.index if classifier else None, previous, earlier, retain)
    rule = widened_rule(rule, earlier)
    # the undo patches are read only for a method that can use them (an erasure of a classifier's head)
    stand_ins = (
        earlier_directions(adapter, previous, earlier) if earlier and _is_erasure(method) and classifier else None
    )
    if earlier:
        report_meta["earlier_forgotten_speakers"] = earlier
        report_meta["earlier_directions"] = sorted(k for k, v in (stand_ins or {}).items() if v is not None)
    return rule, stand_ins


def _first_edit_size(cfg: Any, previous: History | None, *, method: str, rule: SweepRule | None) -> Any:
    """``cfg`` whose sweep first tries the previous request's edit size, when that request used ``method``."""
    last = previous.requests[-1] if previous is not None else {}
    if (
        rule is not None
        and getattr(cfg, "sweep_first", "absent") is None
        and last.get("method") == method
        and reusable_edit(previous, last) is not None
    ):
        from dataclasses import replace

        return replace(cfg, sweep_first=reusable_edit(previous, last))
    return cfg


def _history_hooks(
    adapter, previous: History | None, items: list[Any], *, before: str, t_start: float, batch_sets: int | None
) -> tuple[Callable[[dict], None], Callable[[Path, dict], None]]:
    """``add_history(report)`` (this request's record) and the harness's ``extra`` (with the earlier records)."""

    def add_history(report: dict[str, Any]) -> None:
        more = {
            "model_before": before,
            "model_after": model_fingerprint(adapter.model),
            "forget_fingerprint": data_fingerprint(items),
            "seconds": time.perf_counter() - t_start,
            "relative_edit": (report.get("info") or {}).get("relative"),
        }
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


def _compare_batch(
    edited,
    clone,
    sets: list[list[Any]],
    retain: Sequence[Any],
    request: UnlearnRequest,
    *,
    reference,
    state: RetainState | None,
) -> dict[str, Any]:
    """:func:`compare_one_by_one` for a batch, refused without ``clone``."""
    if clone is None:
        raise ValueError("compare_batch needs clone: a function returning a fresh copy of the input model")
    return compare_one_by_one(
        edited, clone, sets, retain, request, reference=reference, retain_task=state.task if state is not None else None
    )


def compare_one_by_one(
    edited,
    clone,
    sets: Sequence[Sequence[Any]],
    retain: Sequence[Any],
    request: UnlearnRequest,
    *,
    reference=None,
    retain_task: Any = None,
) -> dict[str, Any]:
    """Apply ``sets`` one after another to ``clone()`` with ``request``'s method, config and rule (nothing written,
    no progress) and compare with ``edited`` (the union's edit): the largest relative difference of a weight
    tensor, and each set's forget NLL under both."""
    import torch

    seq = clone()
    each = UnlearnRequest(
        request.method,
        request.kind,
        config=request.config,
        size=request.size,
        overrides=request.overrides,
        rule=request.rule,
        progress=False,
    )
    for s in sets:
        run_unlearning(each, seq, list(s), retain, reference=reference, retain_task=retain_task)
    a, b = edited.model.state_dict(), seq.model.state_dict()
    rel = 0.0
    for name, t in a.items():
        if t.is_floating_point() and not torch.equal(t, b[name]):
            norm = float(torch.linalg.vector_norm(t.double())) or 1.0
            rel = max(rel, float(torch.linalg.vector_norm((t - b[name].to(t.device)).double())) / norm)
    return {
        "identical": rel == 0.0,
        "max_relative_weight_difference": rel,
        "forget_nll_union": [mean_nll(edited, list(s)) for s in sets],
        "forget_nll_one_by_one": [mean_nll(seq, list(s)) for s in sets],
        "retain_nll_union": mean_nll(edited, retain),
        "retain_nll_one_by_one": mean_nll(seq, retain),
    }


__all__ = ["compare_one_by_one", "run_request", "union"]
