"""The one function a recipe runs a method with: the harness on a fresh copy of the setup's target, the recipe's
evaluation, and ``<folder>/{model/, run.json}`` in one layout (``tofu``, ``ctofu`` and ``voxceleb2`` use it); and
the one comparison loop their comparisons drive (:func:`run_comparison`: each method's rows, the tables written
after each, a progress line per stage, the audit when asked, a wall-clock budget after which no method starts and,
when asked, past a method that fails).

``run.json``: ``key`` (what identifies the stage: method, options, rule, base and the setup's description; a
finished stage with the same key is reused), ``method``, ``rows`` (the recipe's rows, each with the cost columns;
``row`` too when there is one), ``cost`` (:func:`cost_columns`), ``config`` (the method's config as run), ``rule``
and ``info`` (the harness's report) and ``context`` (the setup's description); a recipe's ``unlearn`` hook may add
entries (``voxceleb2``: ``scopes_tried``).
"""

from __future__ import annotations

import hashlib
import json
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.kinds import get_kind
from mmunlearn.methods import UnlearnRequest, get, run_unlearning

RUN_JSON = "run.json"


class Setup(Protocol):
    """What a recipe's setup gives the runner (:class:`recipes.tofu.pipeline.TofuSetup`,
    :class:`recipes.ctofu.pipeline.CrossLingualSetup`)."""

    preset: str  # read only when run_method is given no ``size``
    built: Any  # BuiltModels: base, target, retain folders
    forget: list
    retain: list
    cache_dir: Path | None  # T3's hidden-state cache (None: T3's default)

    def adapter(self, path: Path, device: str) -> Any:
        """A model folder loaded as the recipe evaluates it."""

    def evaluate(self, adapter: Any, folder: Path, method: str) -> list[dict]:
        """The recipe's rows of an unlearned model, its logs written under ``folder``."""

    def evaluated(self, folder: Path) -> bool:
        """Whether ``folder`` holds a finished evaluation."""

    def describe(self) -> dict:
        """What identifies the setup (models, data, evaluation settings)."""


class Harness(Protocol):
    """The harness as ``run_method`` binds it for one method (its data, config, rule, reference and source folder):
    what a recipe's ``unlearn`` hook calls, once per candidate, instead of ``run_unlearning``."""

    def __call__(
        self, target: Any, out: Path, overrides: Mapping[str, Any] | None = None, meta: Mapping[str, Any] | None = None
    ) -> Any:
        """Unlearn ``target`` (an adapter) into the folder ``out``; ``overrides`` over the method's, ``meta`` added
        to the report; the harness's :class:`~mmunlearn.methods.harness.Outcome`."""


@dataclass
class Unlearned:
    """What a recipe's ``unlearn`` hook gives ``run_method``: the harness's ``outcome`` of the model now in
    ``folder/model``; ``columns`` every row gets (over a cost column of the same name, in ``cost`` too); ``record``:
    entries of ``run.json`` added to, or replacing, the runner's."""

    outcome: Any
    columns: dict[str, Any] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)


def stage_key(
    method: str,
    setup: Setup,
    options: Mapping[str, Any],
    rule: Any,
    base: str,
    method_options: Mapping[str, Any] | None = None,
    *,
    kind: str = "text",
    size: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> str:
    """What identifies one method's stage: a finished stage with this key is reused. ``options``: the knobs shared
    by every method; ``method_options``: this method's own settings (left out of the key when empty). The key also
    holds the method's config as it resolves today (its preset for ``kind`` and ``size`` with ``overrides``), so a
    stage run before a default changed is run again, not reused with the old default's numbers."""
    size = size or get_kind(kind).size_for(setup.preset)
    spec = {
        "method": method,
        "options": {k: v for k, v in sorted(options.items()) if v is not None},
        "rule": rule.describe() if rule is not None else None,
        "base": base,
        "context": setup.describe(),
        "config": asdict(get(method).config_for(kind, size, **dict(overrides or {}))),
    }
    if method_options:
        spec["method_options"] = dict(sorted(method_options.items()))
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def finished_rows(folder: Path, key: str, setup: Setup) -> list[dict] | None:
    """The rows of a stage finished in ``folder`` with ``key`` (run.json, model and evaluation all written), each
    marked ``reused`` with the ``stage_seconds`` its run recorded (when it did)."""
    run = folder / RUN_JSON
    if not (run.is_file() and (folder / "model").is_dir() and setup.evaluated(folder)):
        return None
    try:
        saved = json.loads(run.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if saved.get("key") != key:
        return None
    rows = saved.get("rows", [saved["row"]] if "row" in saved else None)  # "row" alone: written before the runner
    if not isinstance(rows, list):
        return None
    took = saved.get("stage_seconds")
    took = {"stage_seconds": float(took)} if isinstance(took, (int, float)) else {}
    return [{**r, "reused": True, **took} for r in rows]


def cost_columns(report: Mapping[str, Any]) -> dict[str, Any]:
    """The cost and training-partition columns of a harness report, the same for every recipe."""
    info = report.get("info") or {}
    sweep = info.get("sweep_seconds", info.get("rule_seconds"))
    df = report["forget_nll"]["after"] - report["forget_nll"]["before"]
    dr = report["retain_nll"]["after"] - report["retain_nll"]["before"]
    return {
        "extract_seconds": report["extract_seconds"],
        "unlearn_seconds": report["unlearn_seconds"],
        "sweep_seconds": sweep,
        "edit_seconds": report["unlearn_seconds"] - (sweep or 0.0),
        "total_seconds": report["unlearn_seconds"] + report["extract_seconds"],
        "changed_fraction": report["changed_fraction"],
        # training partitions: how much more the forget answers' NLL rose than the retain answers'
        "forget_nll_rise": df,
        "retain_nll_rise": dr,
        "selectivity": df / dr if dr > 1e-6 else None,
        "target_reached": report["target_reached"],
    }


def reference_for(setup: Setup, base: str, device: str) -> Any:
    """The task-vector reference of the erasure methods: None for ``target``, the setup's base model for ``base``,
    else the model folder ``base``."""
    if base == "target":
        return None
    if base == "base" and setup.built.base is None:
        raise ValueError(
            "--base base: the given target names no base model (no train_log.json with an existing "
            "'base'); pass --base DIR or --base target"
        )
    return setup.adapter(setup.built.base if base == "base" else Path(base), device)


def run_method(
    method: str,
    setup: Setup,
    folder: Path,
    *,
    options: Mapping[str, Any],
    overrides: Mapping[str, Any],
    rule: Any,
    base: str,
    device: str,
    resume: bool = True,
    size: str | None = None,
    method_options: Mapping[str, Any] | None = None,
    kind: str = "text",
    unlearn: Callable[[Harness], Unlearned] | None = None,
    progress: bool = True,
) -> list[dict]:
    """Unlearn the setup's forget rows with ``method`` through the harness (``folder/model``, restorable by
    ``mmunlearn restore``), evaluate it (the recipe's logs under ``folder``), write ``folder/run.json``; the rows.

    ``overrides``: the method's config overrides; ``options`` and ``method_options``: what the key records of them
    (:func:`stage_key`); ``size``: the method preset (default: the setup's preset size); ``kind``: the model kind.
    ``unlearn``: the recipe's own unlearning step (default: the harness once on the setup's target into
    ``folder/model``), given the bound :class:`Harness`; ``voxceleb2`` runs it once per scope and keeps the rule's
    choice. With ``resume`` a stage finished with the same key is not redone: its rows come back with ``reused``: True.
    """
    key = stage_key(method, setup, options, rule, base, method_options, kind=kind, size=size, overrides=overrides)
    if resume and (rows := finished_rows(folder, key, setup)) is not None:
        return rows
    t_stage = time.perf_counter()
    rule_retain = getattr(setup, "rule_retain", None)
    if rule is not None and rule_retain is not None:
        rule = replace(rule, retain_items=rule_retain)
    reference = reference_for(setup, base, device)
    source, method_overrides = setup.built.target, dict(overrides)

    def harness(
        target: Any, out: Path, overrides: Mapping[str, Any] | None = None, meta: Mapping[str, Any] | None = None
    ) -> Any:
        request = UnlearnRequest(
            method,
            kind,
            size=size or get_kind(kind).size_for(setup.preset),
            overrides={**method_overrides, **dict(overrides or {})},
            rule=rule,
            out=out,
            inputs=[source],
            overwrite=True,
            cache_dir=setup.cache_dir,
            progress=progress,
            meta={"model_dir": str(source), **dict(meta or {})},
        )
        return run_unlearning(request, target, setup.forget, setup.retain, reference=reference)

    if unlearn is None:
        done = Unlearned(harness(setup.adapter(source, device), folder / "model"))
    else:
        done = unlearn(harness)
    t_eval = time.perf_counter()
    evaluated = setup.evaluate(done.outcome.adapter, folder, method)
    eval_seconds = time.perf_counter() - t_eval
    rep = done.outcome.report
    cost = cost_columns(rep)
    rows = [{**row, **cost, "eval_seconds": eval_seconds, **done.columns} for row in evaluated]
    record: dict[str, Any] = {"key": key, "method": method, "rows": rows}
    if len(rows) == 1:
        record["row"] = rows[0]
    cost = {**cost, "eval_seconds": eval_seconds, **{k: v for k, v in done.columns.items() if k in cost}}
    record.update(
        {
            "cost": cost,
            "config": rep.get("config"),
            "rule": rep.get("rule"),
            "info": rep["info"],
            "context": setup.describe(),
            **done.record,
            "stage_seconds": time.perf_counter() - t_stage,
        }
    )
    write_text_atomic(folder / RUN_JSON, json.dumps(record, indent=2, default=str))
    return rows


class Stages:
    """One progress line per finished stage of a comparison (``say``: where the line goes): its time, the elapsed
    time and an estimate of what remains (the mean of the stages run so far, reused ones and the models' setup not
    counted, times those left)."""

    def __init__(self, total: int, start: float, say: Callable[[str], Any] = print):
        self.total, self.start, self.finished, self.times, self.say = total, start, 0, [], say
        self.log: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []  # stages not run or not finished: {"stage", "why"}

    def elapsed(self) -> float:
        """Seconds since the comparison started (its models' setup included)."""
        return time.perf_counter() - self.start

    def skip(self, name: str, why: str, seconds: float | None = None) -> None:
        """Say that stage ``name`` was not run (the budget) or failed after ``seconds`` (``why``: the error), and list
        it in :meth:`timing`'s ``skipped``."""
        self.skipped.append({"stage": name, "why": why, **({"seconds": seconds} if seconds is not None else {})})
        self.finished += 1
        self.say(
            f"[stage {self.finished}/{self.total}] {name}: "
            + (f"FAILED after {seconds:.0f} s: {why}" if seconds is not None else f"skipped: {why}")
            + f"; elapsed {self.elapsed():.0f} s"
        )

    def done(
        self, name: str, seconds: float, reused: bool = False, setup: bool = False, recorded: float | None = None
    ) -> None:
        """Say that stage ``name`` finished after ``seconds`` (``reused``: from an earlier run, which took
        ``recorded`` seconds when it ran, if known)."""
        self.log.append(
            {
                "stage": name,
                "seconds": recorded if reused else seconds,
                "reused": reused,
                **({"setup": True} if setup else {}),
            }
        )
        self.finished += 1
        if not reused and not setup:  # the models' build is no guide to a method's time
            self.times.append(seconds)
        left = self.total - self.finished
        estimate = (sum(self.times) / len(self.times) * left) if self.times and left else 0.0
        self.say(
            f"[stage {self.finished}/{self.total}] {name}: "
            + (
                f"reused (finished earlier{f' in {recorded:.0f} s' if recorded is not None else ''})"
                if reused
                else f"{seconds:.0f} s"
            )
            + f"; elapsed {time.perf_counter() - self.start:.0f} s"
            + (f"; about {estimate / 60:.0f} min left" if left and self.times else "")
        )

    def timing(self, built: Any = None) -> dict[str, Any]:
        """What a comparison's record states of its time: this invocation's wall seconds and each stage's seconds
        when it ran (a reused stage: the time its run recorded; None where it was not recorded), the stages skipped
        or failed with why (``skipped``), so a resumed run
        does not pass its own short wall time off as the whole run's; with ``built`` (BuiltModels) also the training
        seconds each of its model folders records (``train_log.json``), whenever they were built."""
        out: dict[str, Any] = {
            "wall_seconds": time.perf_counter() - self.start,
            "stages": list(self.log),
            "skipped": list(self.skipped),
        }
        if built is not None:
            out["model_builds"] = {
                role: took
                for role in ("base", "target", "retain")
                if (took := _train_seconds(getattr(built, role, None))) is not None
            }
        return out


def _train_seconds(folder: Any) -> float | None:
    """The training seconds a built model folder's ``train_log.json`` records (None: no folder, log or figure)."""
    log = Path(folder) / "train_log.json" if folder is not None else None
    if log is None or not log.is_file():
        return None
    value = json.loads(log.read_text()).get("seconds")
    return float(value) if isinstance(value, (int, float)) else None


@dataclass
class Comparison:
    """One benchmark's comparison as :func:`run_comparison` drives it: ``rows(method)`` runs a method (through
    :func:`run_method`) and gives its rows; ``write(rows)`` writes the tables of the rows so far (after every method:
    nothing is lost if the run stops); ``audit(method)`` audits a method's model, ``write_audit(audits)`` the audit
    table so far (``audit`` None: no audit)."""

    methods: list[str]
    rows: Callable[[str], list[dict]]
    write: Callable[[list[dict]], Any]
    audit: Callable[[str], dict] | None = None
    write_audit: Callable[[list[dict]], Any] | None = None


def run_comparison(
    comparison: Comparison, stages: Stages, *, budget: float | None = None, keep_going: bool = False
) -> tuple[list[dict], list[dict]]:
    """Run every method of ``comparison`` in order: a line as it starts, its rows, the tables so far, a progress line
    (``stages``), its audit; the methods' rows and audits.

    ``budget``: seconds of wall time (from ``stages.start``: the models' setup counts) after which no method starts:
    one whose start plus the longest method stage run so far would pass it is skipped, and every skipped one is
    listed (``stages.skipped``, in the timing the tables get). ``keep_going``: a method that raises is listed as
    failed with its error and the next one runs (default: the error stops the comparison)."""
    rows: list[dict] = []
    audits: list[dict] = []
    for i, name in enumerate(comparison.methods, 1):
        longest = max(stages.times, default=0.0)
        if budget is not None and stages.elapsed() + longest > budget:
            stages.skip(
                name,
                f"budget: {stages.elapsed():.0f} s elapsed + {longest:.0f} s (the longest method "
                f"stage so far) > {budget:.0f} s",
            )
            comparison.write(rows)
            continue
        stages.say(f"running {name} ({i}/{len(comparison.methods)}) ...")
        t0 = time.perf_counter()
        try:
            new = comparison.rows(name)
        except Exception as e:  # noqa: BLE001 - keep_going: one method's failure must not cost the others their row
            if not keep_going:
                raise
            stages.say(traceback.format_exc().rstrip())
            stages.skip(name, f"{type(e).__name__}: {e}"[:500], seconds=time.perf_counter() - t0)
            comparison.write(rows)
            continue
        rows += new
        reused = bool(new and new[-1].get("reused"))
        stages.done(
            name, time.perf_counter() - t0, reused=reused, recorded=new[-1].get("stage_seconds") if reused else None
        )
        comparison.write(rows)  # after the stage is logged: the last write's timing holds every stage
        if comparison.audit is not None:
            stages.say(f"auditing {name} ...")
            audits.append(comparison.audit(name))
            if comparison.write_audit is not None:
                comparison.write_audit(audits)
    return rows, audits
