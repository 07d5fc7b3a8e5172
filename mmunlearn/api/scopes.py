"""``scope="sweep"`` of ``mmunlearn.unlearn``: which weights of a classifier an erasure edits, chosen by the rule.

The head (the class rows) is tried first: on FSDD it met the speaker rule in seconds where the embedding scope moved
no forgotten speaker at 40x the cost (docs/speakers.md, speakers_fsdd3_scopes). Only when the head misses is every
weight (``all``) tried, and the rule's choice among the tries is kept (:func:`mmunlearn.methods.rule.choose`). Each
try writes its folder under a private staging folder beside ``out``; the chosen one is renamed into ``out``, so
``out`` appears whole or not at all, as any output does.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mmunlearn.files.checkpoint import check_output_dir
from mmunlearn.files.layout import UNLEARN_REPORT
from mmunlearn.files.undo_store import UNDO_KEY, default_undo_dir, move_undo
from mmunlearn.methods import get
from mmunlearn.methods.harness import Outcome
from mmunlearn.methods.rule import SweepPoint, choose

#: The scopes ``sweep`` tries, in order (the embedding scope only when named: see the module doc).
SWEEP_SCOPES: tuple[str, ...] = ("head", "all")
#: What ``scope`` may be in ``mmunlearn.unlearn``.
API_SCOPES: tuple[str, ...] = ("sweep", "all", "head", "embedding")


def scopes_to_try(scope: str, method: str, is_classifier: bool, swept: bool) -> tuple[str, ...]:
    """The scopes a call runs: ``sweep`` gives :data:`SWEEP_SCOPES` for an erasure of a classifier under a rule, else
    ``all``; any other value itself (only a classifier takes one but ``all``)."""
    if scope not in API_SCOPES:
        raise ValueError(f"scope must be one of {API_SCOPES}, got {scope!r}")
    if scope == "sweep":
        erasure = "task_vectors" in get(method).needs
        return SWEEP_SCOPES if (is_classifier and erasure and swept) else ("all",)
    if scope != "all" and not is_classifier:
        raise ValueError(
            f"scope={scope!r} applies to classifiers (the class rows or the model below them); this model is not one"
        )
    return (scope,)


def _best(tried: Sequence[tuple[str, Outcome]]) -> int:
    rules = [o.report["rule"] for _, o in tried]
    points = [SweepPoint(i, 0.0, r["forget"], r["retain"]) for i, r in enumerate(rules)]
    first = rules[0]
    return choose(
        points, first["base_forget"], first["base_retain"], first["forget_target"], first["retain_bound"]
    ).rank


def _promote(
    staged: Path,
    out: Path,
    inputs: Sequence[Any],
    overwrite: bool,
    report: dict[str, Any],
    undo: str | os.PathLike | None,
) -> Path:
    """Rename the chosen try ``staged`` into ``out`` (replacing an earlier output only with ``overwrite``) and its undo
    folder to ``undo`` (default ``<out>.undo``), its report's paths made ``out``'s."""
    final = out.resolve()
    if UNDO_KEY in report:
        move_undo(default_undo_dir(staged), final, overwrite, report, undo, inputs=tuple(inputs))
    text = json.dumps(report, indent=2).replace(json.dumps(str(staged.resolve()))[1:-1], json.dumps(str(final))[1:-1])
    (staged / UNLEARN_REPORT).write_text(text)
    check_output_dir(out, *inputs, overwrite=overwrite)
    if os.path.lexists(out):
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
        os.replace(out, old / "x")
        os.replace(staged, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staged, out)
    return final


def run_scopes(
    run: Callable[[str, Path | None, bool], Outcome],
    scopes: Sequence[str],
    out: Path | None,
    inputs: Sequence[Any],
    overwrite: bool,
    undo: str | os.PathLike | None = None,
) -> Outcome:
    """``run(scope, folder, staged)`` for each scope until one meets the rule; the rule's choice, written to ``out``
    (its undo records to ``undo``), with the tries in its report (``scopes_tried``) and the chosen ``scope``."""
    if len(scopes) == 1:
        return run(scopes[0], out, False)
    if out is not None:
        check_output_dir(out, *inputs, overwrite=overwrite)
        out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.scopes-")) if out is not None else None
    try:
        tried: list[tuple[str, Outcome]] = []
        for scope in scopes:
            outcome = run(scope, staging / scope if staging is not None else None, True)
            tried.append((scope, outcome))
            if outcome.report["target_reached"]:
                break
        scope, outcome = tried[_best(tried)]
        outcome.report["scopes_tried"] = {
            s: {
                "forget": o.report["rule"]["forget"],
                "retain": o.report["rule"]["retain"],
                "target_reached": o.report["target_reached"],
                "seconds": o.report["extract_seconds"] + o.report["unlearn_seconds"],
            }
            for s, o in tried
        }
        outcome.report["scope"] = scope
        if staging is not None:
            outcome.out = _promote(staging / scope, out, inputs, overwrite, outcome.report, undo)
        return outcome
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


__all__ = ["API_SCOPES", "SWEEP_SCOPES", "run_scopes", "scopes_to_try"]
