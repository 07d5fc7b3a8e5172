"""The sweep rule ``mmunlearn.unlearn`` applies by default to each kind,
and the check that there is something to forget.

* Classifiers (:func:`speaker_rule`): every forgotten speaker's clips predicted as none of the forget speakers on at
  least :data:`SPEAKER_FORGET_TARGET` of them (the level of a model retrained without them), the retain NLL rising by
  at most :data:`SPEAKER_RETAIN_BOUND` nats.
* Text LLMs (:func:`text_rule`, a :class:`~mmunlearn.api.row_rule.RowRule`): judged row by row -- every forget
  row's answer NLL at least its level (the ``reference`` model's NLL on that row, the level of a model that never saw
  it; a level the user gives, in nats or as a retrained-like model; with neither, the row's NLL before the edit +
  :data:`NLL_RISE` nats, a guess the verdict names), and no greedy answer to a forget question (or a paraphrase)
  giving the forget answer; the retain NLL on held-out retain rows rising by at most :data:`NLL_RETAIN_BOUND`, and
  the original's held-out retain answers still said.
* Speech LLMs (:func:`nll_rule`, for the recipes): the forget rows' mean answer NLL raised to the reference's, or by
  :data:`NLL_RISE` nats; the retain NLL rising by at most :data:`NLL_RETAIN_BOUND`.

:func:`check_something_to_forget` refuses a forget set the model never knew: a classifier already at chance before
any edit (``1 - 1/C`` of the clips named as another class), an LLM whose forget NLL is already at its reference's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mmunlearn.api.row_rule import ForgetRows, RowRule, row_nlls, said_rows
from mmunlearn.errors import UserError
from mmunlearn.eval.speaker import forgotten_error_rate
from mmunlearn.methods import SweepRule, get, mean_nll

#: The speaker rule's bound on the retain set's mean NLL rise (nats), as the VoxCeleb2 recipe's default.
SPEAKER_RETAIN_BOUND = 0.05
#: The speaker rule's default forget target: the share of each forgotten speaker's clips predicted as none of the
#: forgotten speakers. A classifier retrained without a speaker names them on almost none of their clips (FSDD,
#: record byo_fsdd: 0 of 100 held-out clips for ECAPA and wav2vec2), so the target sits near that level, not at
#: chance (``1 - 1/C``): aimed at chance, the sweep kept the smallest edit reaching it and the ECAPA model still named
#: the forgotten speaker on 18 of 100 held-out clips. Two points of slack allow for clips the model confuses anyway.
SPEAKER_FORGET_TARGET = 0.98
#: The LLM rule's bound on the retain rows' mean answer-NLL rise (nats), as the TOFU recipe's default.
NLL_RETAIN_BOUND = 0.1
#: With no reference model, the forget NLL rise (nats) the LLM rule asks for: a stated default, not a measured level
#: (the verdict says so); pass ``reference=`` (the model it was fine-tuned from) for the level of a model that never
#: saw the forget rows.
NLL_RISE = 1.0
#: Forget NLL within this many nats of the reference's: the model holds nothing of the forget set to remove.
KNOWN_MARGIN = 0.05


class NothingToForget(UserError, ValueError):
    """The model does not know the forget set (at chance, or no better than a model that never saw it)."""


def chance_error_rate(n_classes: int) -> float:
    """The share of a speaker's clips a classifier of ``n_classes`` classes names as another class at chance."""
    if n_classes < 2:
        raise ValueError(f"a speaker rule needs >= 2 classes, got {n_classes}")
    return 1.0 - 1.0 / n_classes


def speaker_rule(
    n_classes: int, retain_bound: float = SPEAKER_RETAIN_BOUND, forget_target: float | None = None
) -> SweepRule:
    """The documented speaker-level sweep rule for a classifier of ``n_classes`` speakers: forget measure the share
    of the forget utterances predicted as none of the forget speakers, target ``forget_target`` (default
    :data:`SPEAKER_FORGET_TARGET`; :func:`chance_error_rate` for the looser level the benchmarks record), retain measure
    the mean NLL, rising by at most ``retain_bound`` nats. A request on an edited model widens it to the speakers
    earlier requests forgot (:func:`mmunlearn.requests.widened_rule`)."""
    floor = chance_error_rate(n_classes)
    target = SPEAKER_FORGET_TARGET if forget_target is None else float(forget_target)
    if not floor <= target <= 1.0:
        raise ValueError(f"a speaker rule's forget target must lie between chance ({floor:.4g}) and 1, got {target!r}")
    return SweepRule(
        forget_target=target, retain_bound=retain_bound, forget_measure=forgotten_error_rate, retain_measure=mean_nll
    )


def nll_rule(
    adapter,
    forget: Sequence[Any],
    *,
    reference=None,
    held_retain: Sequence[Any] = (),
    retain_bound: float = NLL_RETAIN_BOUND,
    rise: float = NLL_RISE,
) -> tuple[SweepRule, str]:
    """(rule, how its target was set) for an LLM: the forget NLL up to ``reference``'s on the forget rows, or up by
    ``rise`` nats without one; the retain measure on ``held_retain`` when given (rows no method trains on)."""
    before = mean_nll(adapter, forget)
    if reference is not None:
        target, source = mean_nll(reference, forget), "the reference model's forget NLL"
    else:
        target, source = before + rise, f"the forget NLL + {rise:g} nats (no reference model given)"
    return SweepRule(forget_target=target, retain_bound=retain_bound, retain_items=list(held_retain) or None), source


def text_rule(
    adapter,
    forget: Sequence[Any],
    *,
    reference=None,
    level: Any = None,
    held_retain: Sequence[Any] = (),
    retain_bound: float = NLL_RETAIN_BOUND,
    rise: float = NLL_RISE,
) -> tuple[RowRule, str]:
    """(rule, how its levels were set) for a text LLM, judged row by row (:mod:`mmunlearn.api.row_rule`).

    ``level``: what each forget row's answer NLL must reach -- a number of nats (every row), or the adapter of a
    retrained-like model (a model trained without the forget rows: its NLL on each row); default ``reference``'s NLL on
    each row, else the row's own NLL + ``rise`` (a guess). Rows the level's model (or the reference) says greedily too
    are not counted as coming out. ``held_retain``: rows no method trains on, scored for the retain bound; those the
    model says greedily are checked again on the final model."""
    rows = [dict(r) for r in forget]
    judge_model = None
    if isinstance(level, (int, float)) and not isinstance(level, bool):
        levels = [[float(level)] * len(v) for v in row_nlls(adapter, rows)]
        source, note = f"a level of {float(level):g} nats given by the user", f"level {float(level):g} nats, given"
        judge_model = reference
    elif level is not None:
        levels, judge_model = row_nlls(level, rows), level
        source = note = "the retrained-like model's NLL on each row"
    elif reference is not None:
        levels, judge_model = row_nlls(reference, rows), reference
        source = note = "the reference model's NLL on each row"
    else:
        levels = [[v + rise for v in vs] for vs in row_nlls(adapter, rows)]
        source = f"each row's NLL before the edit + {rise:g} nats (no reference model given)"
        note = (
            f"its NLL before + {rise:g} nats: a GUESS, not a measured level; pass reference= (the model it was "
            "fine-tuned from), a retrained-like model or a level in nats"
        )
    known = said_rows(judge_model, rows) if judge_model is not None else set()
    held = list(held_retain)
    retain_said = [held[i] for i in sorted(said_rows(adapter, held))] if held else []
    measure = ForgetRows(rows, levels, known)
    rule = RowRule(
        forget_target=1.0,
        retain_bound=retain_bound,
        forget_measure=measure,
        retain_items=held or None,
        retain_said=retain_said,
        target_note=note,
        mean_level=sum(ls[0] for ls in levels) / len(levels),
    )
    return rule, source


def swept_overrides(method: str, scope: str = "all") -> dict[str, Any]:
    """What a rule-driven run of ``method`` on a speaker classifier uses unless told otherwise: erasure sweeps
    edit sizes relative to the weights (``sweep_scales="auto"``), ranks 1, 2, 4, with gradient task vectors (the
    recipe's ``--sweep`` settings); in the head scope no retain subspace (it would hold the forget direction)."""
    if "task_vectors" not in get(method).needs:  # the sweep grid below is the task-vector methods'
        return {}
    return {
        "sweep_scales": "auto",
        "sweep_ranks": (1, 2, 4),
        "extract_kind": "gradient",
        **({"retain_rank": 0} if scope == "head" else {}),
    }


def check_something_to_forget(
    adapter, forget: Sequence[Any], rule: SweepRule, *, classifier: bool, reference_given: bool
) -> dict[str, Any]:
    """What the model knows of ``forget`` before any edit (for the report); :class:`NothingToForget` when it knows
    nothing: a classifier whose forget clips are already named as other classes at :func:`chance_error_rate` or more (or
    at ``rule``'s own target, when that is lower), or an LLM whose forget NLL is within :data:`KNOWN_MARGIN` of its
    reference's."""
    rows = isinstance(rule, RowRule)  # a text rule: the mean answer NLL against its rows' mean level
    value = mean_nll(adapter, forget) if rows else rule.forget_measure(adapter, forget)
    target = rule.mean_level if rows else rule.forget_target
    floor = chance_error_rate(len(adapter.speakers)) if classifier else None
    if classifier and value >= min(floor, rule.forget_target):  # at chance, or already meeting a rule of one's own
        raise NothingToForget(
            f"nothing to forget: before any edit {value:.3g} of the worst forget speaker's clips are already predicted "
            f"as none of the forget speakers (chance: {floor:.3g}); the model never learned them. Check "
            "the labels, or pass rule=None to run the method anyway"
        )
    if not classifier and reference_given and value >= target - KNOWN_MARGIN:
        raise NothingToForget(
            f"nothing to forget: the forget rows' mean NLL {value:.4g} is already at the reference model's "
            f"{target:.4g} (within {KNOWN_MARGIN}): the model knows them no better than a model that never "
            "saw them. Pass rule=None to run the method anyway"
        )
    return {
        "forget_measure_before": value,
        "forget_target": target,
        "chance": floor,
        "checked": classifier or reference_given,
    }


__all__ = [
    "KNOWN_MARGIN",
    "NLL_RETAIN_BOUND",
    "NLL_RISE",
    "NothingToForget",
    "SPEAKER_FORGET_TARGET",
    "SPEAKER_RETAIN_BOUND",
    "chance_error_rate",
    "check_something_to_forget",
    "nll_rule",
    "speaker_rule",
    "swept_overrides",
    "text_rule",
]
