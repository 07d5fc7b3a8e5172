"""The sweep rule every method obeys, on the training partitions only, and the shared mean-NLL scorer.

Rule: raise the forget measure (default: the mean answer NLL) to ``forget_target`` while the retain
measure rises by at most ``retain_bound`` over the unedited model. Erasure sweeps rank x scale, T3 the
temperature and tilt strength, the optimisation baselines and RMU stop early; all choose with
:func:`choose` and record whether the target was reached (``target_reached``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

Measure = Callable[[Any, Sequence[Any]], float]


def mean_nll(adapter, items: Sequence[Any], batch_size: int = 16) -> float:
    """Mean per-example NLL (length-normalised) of the targets of ``items`` under ``adapter``."""
    if not items:
        raise ValueError("mean_nll: no items to score")
    return float(adapter.answer_nll(items, batch_size=batch_size).mean())  # every adapter has it (adapters.base)


@dataclass
class SweepRule:
    """What a sweep aims at (measured on the training partitions, never on evaluation metrics).

    ``forget_measure`` / ``retain_measure``: ``f(adapter, items) -> float`` (default :func:`mean_nll`);
    e.g. a classifier's forget error rate. ``retain_items``: the retain rows scored (default: the retain
    partition the method trains with).
    """

    forget_target: float
    retain_bound: float
    forget_measure: Measure = mean_nll
    retain_measure: Measure = mean_nll
    retain_items: Sequence[Any] | None = None
    checks_per_epoch: int = 4  # early-stopping methods: how often an epoch they score

    def __post_init__(self) -> None:
        if not (isinstance(self.retain_bound, (int, float)) and self.retain_bound >= 0):
            raise ValueError(f"retain_bound must be >= 0, got {self.retain_bound!r}")
        if not math.isfinite(self.forget_target):
            raise ValueError(f"forget_target must be finite, got {self.forget_target!r}")

    def describe(self) -> dict:
        return {
            "forget_target": self.forget_target,
            "retain_bound": self.retain_bound,
            "forget_measure": measure_name(self.forget_measure),
            "retain_measure": measure_name(self.retain_measure),
        }

    def judge(self, adapter, forget: Sequence[Any]) -> dict[str, Any] | None:
        """Checks the rule makes of the final model beyond its two measures (None: none; a rule with some returns a
        dict whose ``met`` joins the verdict, e.g. :class:`~mmunlearn.api.row_rule.RowRule`'s greedy checks)."""
        return None

    def verdict(
        self, method: str, forget: float, retain_rise: float, met: bool, judged: dict[str, Any] | None = None
    ) -> str:
        """One line that says whether ``method`` met the rule, naming each measure, its direction and its bound."""
        head = f"rule met by {method}" if met else f"RULE NOT MET by {method}"
        return (
            f"{head}: forget set: {measure_label(self.forget_measure)} {forget:.4g} (target >= "
            f"{self.forget_target:.4g}; higher = more forgotten); retain set: {measure_label(self.retain_measure)} "
            f"rose {retain_rise:+.4g} (bound <= {self.retain_bound:.4g})"
        )


#: What each forget / retain measure the rules use means, for the verdict line (by the measure's name).
MEASURE_LABELS = {
    "mean_nll": "mean NLL (nats)",
    "forget_rows_gone": "share of forget rows gone (each answer's NLL at its level, and no greedy answer giving it)",
    "worst_speaker_error_rate": "share of the worst forgotten speaker's clips predicted as none of the forgotten "
    "speakers",
    "log_loss_gap": "forget minus retain mean log-NLL",
}


def measure_name(measure: Any) -> str:
    """The name a rule reports for ``measure`` (its ``__name__``, else its type's)."""
    return getattr(measure, "__name__", type(measure).__name__)


def measure_label(measure: Any) -> str:
    """What ``measure`` measures, in words (:data:`MEASURE_LABELS`, else its name)."""
    return MEASURE_LABELS.get(measure_name(measure), measure_name(measure))


@dataclass
class SweepPoint:
    """One setting tried by a sweep and what the rule's measures gave."""

    rank: int | None
    scale: float  # erasure scale, T3 temperature, or training step
    forget_nll: float
    retain_nll: float | None  # None: not scored (an erasure sweep scoring the retain measure where needed)
    relative: float | None = None  # erasure: the scale in units of ||W||_F / ||T_f||_F (upper bound of ||dW|| / ||W||)


class Scorer:
    """The rule's two measures on one adapter, with the unedited model's values as reference."""

    def __init__(
        self,
        rule: SweepRule,
        adapter,
        forget: Sequence[Any],
        retain: Sequence[Any],
        base: tuple[float, float] | None = None,
    ):
        """``base``: the unedited model's (forget, retain) measures when ``adapter`` already holds an edit (a later
        round of an erasure); by default they are measured on ``adapter``."""
        self.rule, self.forget = rule, list(forget)
        self.retain = list(rule.retain_items or retain)
        self.seconds, self.scored = 0.0, 0  # time spent scoring (the unedited model included): the rule's own cost
        self.started = time.perf_counter()  # the progress lines' elapsed time counts from here
        self.base_forget, self.base_retain = self.score(adapter) if base is None else base
        self.scored, self.points_from = 0, time.perf_counter()  # points scored after the unedited model, and since when

    def score(self, adapter, retain: bool = True) -> tuple[float, float | None]:
        """The forget measure and (``retain``; else None) the retain measure of ``adapter``."""
        t0 = time.perf_counter()
        try:
            forget = self.rule.forget_measure(adapter, self.forget)
            return forget, self.rule.retain_measure(adapter, self.retain) if retain else None
        finally:
            self.seconds += time.perf_counter() - t0
            self.scored += 1

    def score_retain(self, adapter) -> float:
        """The retain measure alone (of a point whose forget measure was scored before)."""
        t0 = time.perf_counter()
        try:
            return self.rule.retain_measure(adapter, self.retain)
        finally:
            self.seconds += time.perf_counter() - t0

    def per_point(self) -> float | None:
        """Wall seconds per point scored since the unedited model (the edit, its scoring and undoing it), or None
        before the first."""
        return (time.perf_counter() - self.points_from) / self.scored if self.scored else None

    def reached(self, forget_value: float) -> bool:
        return forget_value >= self.rule.forget_target

    def over(self, retain_value: float) -> bool:
        return retain_value - self.base_retain > self.rule.retain_bound

    def point_meets(self, p: SweepPoint) -> bool:
        """Whether ``p`` meets the rule (never when its retain measure was not scored)."""
        return p.retain_nll is not None and self.reached(p.forget_nll) and not self.over(p.retain_nll)


def span(seconds: float) -> str:
    """A duration as a progress line says it: ``42 s``, ``3 min 20 s``, ``1 h 05 min``."""
    seconds = max(0.0, float(seconds))
    if seconds < 59.5:
        return f"{seconds:.0f} s" if seconds >= 9.95 else f"{seconds:.1f} s"
    minutes, sec = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {sec:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def log_point(method: str, point: dict, scorer: Scorer, progress: bool = True, total: int | None = None) -> None:
    """One progress line per sweep point: the setting, both measures, whether the rule is met, the point's place
    (of ``total``, the most points the sweep may score), the sweep's elapsed time and, given ``total``, the most time
    left at the seconds a point has taken so far (a sweep that meets the rule stops sooner)."""
    if not progress:
        return
    from tqdm.auto import tqdm

    setting = ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in point.items()
        if k not in ("forget_nll", "retain_nll")
    )
    f, r = point["forget_nll"], point["retain_nll"]
    state = (
        ("forget target reached" if scorer.reached(f) else "forget below the target") + ", retain not scored"
        if r is None
        else "meets the rule"
        if scorer.reached(f) and not scorer.over(r)
        else "retain over the bound"
        if scorer.over(r)
        else "forget below the target"
    )
    n, rate = scorer.scored, scorer.per_point()
    where = f"point {n} of at most {total}" if total else f"point {n}"
    left = (
        f", at most ~{span(rate * (total - n))} left at {span(rate)} a point"
        if total and total > n and rate
        else f" ({span(rate)} a point)"
        if not total and rate
        else ""
    )
    tqdm.write(
        f"{method} sweep: {setting}: forget {f:.4g} (target {scorer.rule.forget_target:.4g}), retain rise "
        f"{'n/a' if r is None else f'{r - scorer.base_retain:+.4g}'} (bound {scorer.rule.retain_bound:.4g}): "
        f"{state}; {where}, "
        f"{span(time.perf_counter() - scorer.started)} into the sweep{left}"
    )


def _say_check(label: str, step: int, total: int | None, f: float, r: float, scorer: Scorer, elapsed: float) -> None:
    from tqdm.auto import tqdm  # deferred: as log_point

    left = f", at most ~{span(elapsed / step * (total - step))} left at this rate" if total and total > step else ""
    tqdm.write(
        f"{label} step {step}{f'/{total}' if total else ''}: forget {f:.4g} (target "
        f"{scorer.rule.forget_target:.4g}), retain rise {r - scorer.base_retain:+.4g} (bound "
        f"{scorer.rule.retain_bound:.4g}); {span(elapsed)} elapsed{left}"
    )


def choose(
    points: list[SweepPoint], base_forget: float, base_retain: float, forget_target: float, retain_bound: float
) -> SweepPoint:
    """The sweep rule: among points whose retain measure rose by at most ``retain_bound``, the one that
    reaches ``forget_target`` with the smallest retain measure; if none does, the one with the highest
    forget measure; if none keeps retain within bound, the first (smallest) edit."""
    points = [p for p in points if p.retain_nll is not None]  # a lazy sweep's forget-only points are never chosen
    if not points:
        raise ValueError("choose: the sweep scored no points with both measures")
    ok = [p for p in points if p.retain_nll - base_retain <= retain_bound]
    if not ok:
        return points[0]
    reached = [p for p in ok if p.forget_nll >= forget_target]
    if reached:
        return min(reached, key=lambda p: p.retain_nll)
    return max(ok, key=lambda p: p.forget_nll)


def early_stop(
    adapter,
    forget: Sequence[Any],
    retain: Sequence[Any],
    rule: SweepRule,
    steps_per_epoch: int,
    total_steps: int | None = None,
    label: str | None = None,
):
    """``(on_step, trajectory, scorer)`` for a training loop: a few times an epoch score the training
    partitions and stop once the forget measure reaches the target or the retain measure passes the bound.
    Before the first of those checks the steps 1, 2, 4, ... are scored too: on a real model a few steps can already
    pass the bound (whisper-smollm2's GradDiff and NPO did at their first check, step 3, with no in-bound state
    scored before it), and the early checks leave an in-bound state to return.

    The best state scored within the retain bound (highest forget measure) is kept (trainable parameters, on
    the CPU); ``on_step.restore_in_bound()`` puts it back when the run ended over the bound, so an early stop
    triggered by the bound returns the in-bound model rather than the one that crossed it.

    With ``label`` (the method's name), each check prints one line: the step (of ``total_steps``, the cap), both
    measures, the elapsed time and, at the rate so far, the most time left (an early stop ends sooner).
    """
    scorer = Scorer(rule, adapter, forget, retain)
    every = max(1, steps_per_epoch // max(1, rule.checks_per_epoch))
    trajectory: list[dict] = []
    params = [(n, p) for n, p in adapter.model.named_parameters() if p.requires_grad]
    best: dict[str, Any] = {"point": None, "state": None}
    started = time.perf_counter()

    def on_step(step: int, _loss: float) -> bool:
        if step % every and not (step < every and step & (step - 1) == 0):  # multiples of every, and 1, 2, 4, ...
            return False
        was_training = adapter.model.training
        adapter.model.eval()
        f, r = scorer.score(adapter)
        adapter.model.train(was_training)
        trajectory.append({"step": step, "forget_nll": f, "retain_nll": r})
        if label is not None:
            _say_check(label, step, total_steps, f, r, scorer, time.perf_counter() - started)
        if not scorer.over(r) and (best["point"] is None or f > best["point"]["forget_nll"]):
            best["point"] = trajectory[-1]
            best["state"] = {n: p.detach().to("cpu", copy=True) for n, p in params}
        return scorer.reached(f) or scorer.over(r)

    def restore_in_bound() -> int | None:
        """Put back the best in-bound state when the last scored one is over the bound; its step, else None."""
        if not trajectory or not scorer.over(trajectory[-1]["retain_nll"]) or best["state"] is None:
            return None
        with torch.no_grad():
            for n, p in params:
                p.copy_(best["state"][n].to(p.device))
        trajectory.append({**best["point"], "restored": True})
        return int(best["point"]["step"])

    on_step.restore_in_bound = restore_in_bound  # type: ignore[attr-defined]
    return on_step, trajectory, scorer
