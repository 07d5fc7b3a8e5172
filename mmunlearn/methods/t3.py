"""T3 (temper-then-tilt) as a plug-in: the base stays frozen; a low-rank head on cached hidden states
estimates P(retain | x, y) and decoding samples from softmax(log p(y|x) / T + lambda log f(x, y)); lambda = 1 is
the paper's T3, a smaller tilt strength lambda weakens the tilt.

With a sweep rule, candidates are tried from the weakest intervention up: tilt strengths ascending at T = 1,
then temperatures ascending at full strength. By default (``sweep_pick="utility"``) every candidate is scored and,
among those that meet the rule (forget measure at the target, retain within the bound), the weakest whose held-out
retain NLL is within ``sweep_retain_tolerance`` of the lowest is applied: the most utility kept, without the
overshoot a stronger tilt brings for a retain gain below the tolerance (on SmolLM2 TOFU, 20 authors, full strength
kept the retain NLL 3e-4 nats lower than half strength while its forget NLL overshot the target fourfold and the
forget quality fell from the retain model's side to 0.014); ``sweep_pick="first"`` stops at the first candidate
meeting the rule (fewer scoring passes). With ``sweep_refine`` a strength so picked is then refined by bisection
towards the strongest tilt tried below it, so the tilt applied is the weakest meeting the rule to a finer step than
the grid's. If none meets it, the rule's choice among the tried ones is
taken and the report says so. The returned adapter wraps the base with the head
(:class:`mmunlearn.tilt.TiltedCausalLM`); the harness writes the head beside the unchanged base.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from mmunlearn.config import PresetConfig, opt
from mmunlearn.methods.artefacts import TILT_FILES
from mmunlearn.methods.base import MethodResult, RunContext, register
from mmunlearn.methods.rule import Scorer, SweepPoint, choose, log_point

_SMALL = dict(head_rank=8, head_epochs=60, head_lr=2e-2)
#: A real text checkpoint: the words already in the text spared and left out of the head's training, the strength
#: refined between the grid's steps (SmolLM2 TOFU, 20 authors, record tofu_smollm2_20_t3_unseen: forget ROUGE-L at
#: the retain model's, the author's name restated, utility kept; the plain tilt garbled the name the question gives).
_REAL_TEXT = dict(spare_seen=True, fit_unseen=True, sweep_refine=2)


@dataclass(frozen=True)
class T3Config(PresetConfig):
    """Settings of T3's tilt head and decoding."""

    head_rank: int = opt(20, "Rank of the tilt head.")
    head_epochs: int = opt(100, "Full-batch epochs of head training on the cached states.")
    head_lr: float = opt(1e-2, "Learning rate of the head.")
    temperature: float = opt(1.0, "Decoding temperature T >= 1 (without a sweep).")
    strength: float = opt(1.0, "Tilt strength lambda in [0, 1] (without a sweep): 1 is T3, smaller weakens the tilt.")
    sweep_strengths: tuple[float, ...] = opt(
        (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0), "With a sweep rule: tilt strengths tried at T = 1, weakest first."
    )
    sweep_temperatures: tuple[float, ...] = opt(
        (1.25, 1.5, 2.0), "With a sweep rule: temperatures tried next, at full strength."
    )
    sweep_refine: int = opt(
        0,
        "With a sweep rule: bisection steps between the tilt strength applied and the strength tried below it, "
        "each midpoint kept when it meets the rule as the sweep's pick did: the weakest tilt to 1/2^n of that gap "
        "(0: the grid's pick; on SmolLM2 TOFU, 20 authors, 2 steps kept the grid's 1/2, at 2 more scoring points).",
    )
    sweep_pick: str = opt(
        "utility",
        "With a sweep rule: 'utility' scores every candidate and applies, among those "
        "meeting the rule, the weakest whose held-out retain NLL is within "
        "sweep_retain_tolerance of the lowest (the most utility kept); 'first' stops "
        "at the first candidate meeting it (faster).",
    )
    sweep_retain_tolerance: float = opt(
        0.01,
        "With sweep_pick 'utility': retain NLLs (nats) within this of the "
        "lowest count as equal, and the weakest of them is applied.",
    )
    spare_seen: bool = opt(
        False,
        "Spare the tokens already in the text (the question, the answer so far): each penalised no more than at "
        "even odds (log f floored at log 1/2, about a token the head never saw), scored and generated alike, so "
        "restating a name the question gives is not steered away from.",
    )
    fit_unseen: bool = opt(
        False,
        "Train the head on the answer tokens not already in the text only (not on copies of the question's words or "
        "of the answer so far): the tokens spare_seen leaves alone, so the head's rank goes to the ones it tilts.",
    )
    pooling: str = opt(
        "last",
        "What the head reads: 'last' (the final hidden state of the position being extended, "
        "the T3 paper's head) or 'cummean' (the mean of the final states up to it, as "
        "open-unlearning's T3 port).",
    )

    def __post_init__(self) -> None:
        from mmunlearn.tilt.head import check_pooling  # deferred: tilt imports transformers, kept out of CLI start

        check_pooling(self.pooling)
        if self.sweep_retain_tolerance < 0:
            raise ValueError(f"t3: sweep_retain_tolerance must be >= 0, not {self.sweep_retain_tolerance}")
        if not (isinstance(self.sweep_refine, int) and self.sweep_refine >= 0):
            raise ValueError(f"t3: sweep_refine must be an integer >= 0, not {self.sweep_refine!r}")
        if self.sweep_pick not in ("utility", "first"):
            raise ValueError(f"t3: sweep_pick must be 'utility' or 'first', not {self.sweep_pick!r}")

    PRESETS: ClassVar[dict] = {
        ("text", "micro"): _SMALL,
        ("text", "model_dir"): _REAL_TEXT,
        ("speech-llm", "tiny"): _SMALL,
        ("speech-llm", "mini"): _SMALL,
    }


def weakest_keeping_retain(meeting: Sequence[SweepPoint], tolerance: float) -> SweepPoint | None:
    """Of the points meeting the rule (weakest first), the first whose retain NLL is within ``tolerance`` of the
    lowest; None when there are none."""
    if not meeting:
        return None
    lowest = min(p.retain_nll for p in meeting)
    return next(p for p in meeting if p.retain_nll <= lowest + tolerance)


def _refine(adapter, head, candidates, points, best, scorer: Scorer, cfg: T3Config, tried: list, progress) -> float:
    """Bisect between ``best``'s strength (meeting the rule) and the strongest tilt tried below it: a midpoint is
    kept when it meets the rule with its retain NLL within the tolerance of the lowest met so far ('utility'), else
    it becomes the lower end. The weakest strength kept; each midpoint is added to ``tried``."""
    hi = next(lam for (_, lam), p in zip(candidates, points) if p is best)
    below = [lam for (t, lam), _ in zip(candidates, points) if t == 1.0 and lam < hi]
    if not below:
        return hi
    lo = max(below)
    lowest = min(p.retain_nll for p in points if scorer.point_meets(p))
    tolerance = cfg.sweep_retain_tolerance if cfg.sweep_pick == "utility" else float("inf")
    for _ in range(cfg.sweep_refine):
        mid = (lo + hi) / 2
        tilted = _tilted(adapter, head, 1.0, mid, cfg.spare_seen)
        point = SweepPoint(None, 1.0, *scorer.score(tilted))
        tilted.model.tap.remove()
        tried.append(
            {"temperature": 1.0, "strength": mid, "forget_nll": point.forget_nll, "retain_nll": point.retain_nll}
        )
        log_point("t3", {**tried[-1], "refine": True}, scorer, progress, total=len(candidates) + cfg.sweep_refine)
        if scorer.point_meets(point) and point.retain_nll <= lowest + tolerance:
            hi = mid
        else:
            lo = mid
    return hi


def _tilted(adapter, head, temperature: float, strength: float = 1.0, spare_seen: bool = False):
    from mmunlearn.tilt import TiltedCausalLM  # deferred: tilt imports transformers, kept out of CLI start

    return adapter.with_model(
        TiltedCausalLM(adapter.model, head, temperature, strength=strength, spare_seen=spare_seen)
    )


def run(adapter, forget: Sequence[Any], retain: Sequence[Any], cfg: T3Config, ctx: RunContext) -> MethodResult:
    """Fit the head on the frozen model's states; wrap the model (temperature swept with ``ctx.rule``)."""
    from mmunlearn.tilt.train import train_tilt  # deferred: tilt imports transformers, kept out of CLI start

    fit = train_tilt(
        adapter,
        retain,
        forget,
        rank=cfg.head_rank,
        epochs=cfg.head_epochs,
        lr=cfg.head_lr,
        cache_dir=ctx.cache_dir,
        progress=ctx.progress,
        pooling=cfg.pooling,
        unseen_only=cfg.fit_unseen,
    )
    info: dict = {
        "train_accuracy": fit.train_accuracy,
        "head_parameters": fit.parameters,
        "head_fraction": fit.fraction,
        "cache_reused": fit.cache_reused,
        "fit_unseen": cfg.fit_unseen,
    }
    temperature, strength = cfg.temperature, cfg.strength
    if ctx.rule is not None and (cfg.sweep_strengths or cfg.sweep_temperatures):  # none: its settings as they are
        t_sweep = time.perf_counter()
        scorer = Scorer(ctx.rule, adapter, forget, retain)
        candidates = [(1.0, lam) for lam in sorted(cfg.sweep_strengths)] + [
            (t, 1.0) for t in sorted(cfg.sweep_temperatures) if t > 1.0
        ]
        points, tried = [], []
        for t, lam in candidates:
            tilted = _tilted(adapter, fit.head, t, lam, cfg.spare_seen)
            points.append(SweepPoint(None, t, *scorer.score(tilted)))
            tilted.model.tap.remove()
            tried.append(
                {
                    "temperature": t,
                    "strength": lam,
                    "forget_nll": points[-1].forget_nll,
                    "retain_nll": points[-1].retain_nll,
                }
            )
            log_point("t3", tried[-1], scorer, ctx.progress, total=len(candidates) + cfg.sweep_refine)
            if cfg.sweep_pick == "first" and scorer.point_meets(points[-1]):
                break  # the weakest intervention meeting the rule
        rule = ctx.rule
        best = choose(points, scorer.base_forget, scorer.base_retain, rule.forget_target, rule.retain_bound)
        best = weakest_keeping_retain([p for p in points if scorer.point_meets(p)], cfg.sweep_retain_tolerance) or best
        temperature, strength = next((c for c, p in zip(candidates, points) if p is best))
        if cfg.sweep_refine and temperature == 1.0 and scorer.point_meets(best):
            strength = _refine(adapter, fit.head, candidates, points, best, scorer, cfg, tried, ctx.progress)
        info["sweep"] = tried
        info["sweep_seconds"] = time.perf_counter() - t_sweep
    info["temperature"], info["strength"], info["spare_seen"] = temperature, strength, cfg.spare_seen
    # the unlearn time: the head's training and, with a rule, the sweep (the state cache is the extraction)
    return MethodResult(
        _tilted(adapter, fit.head, temperature, strength, cfg.spare_seen),
        fit.cache_seconds,
        fit.train_seconds + info.get("sweep_seconds", 0.0),
        info,
    )


register(
    "t3",
    T3Config,
    run,
    kinds=("text", "speech-llm"),
    edits_weights=False,
    needs=("hidden_states",),
    artefacts=TILT_FILES,
    help="Temper-then-tilt: frozen base, low-rank head estimating P(retain | x, y), tilted decoding.",
)
#: open-unlearning's T3 port, as its configuration reads: a token-level head on cumulatively mean-pooled last-layer
#: states, rank 32 (its range: 20-50), base temperature 2.5, full tilt, trained with the same class-balanced BCE on
#: retain-vs-forget answer tokens; no sweep (the rule only judges it), so it is compared as configured.
PORT_SETTINGS = {
    "pooling": "cummean",
    "head_rank": 32,
    "temperature": 2.5,
    "strength": 1.0,
    "sweep_strengths": (),
    "sweep_temperatures": (),
    "spare_seen": False,
    "fit_unseen": False,
    "sweep_refine": 0,
}
register(
    "t3-port",
    T3Config,
    run,
    kinds=("text", "speech-llm"),
    edits_weights=False,
    needs=("hidden_states",),
    artefacts=TILT_FILES,
    defaults=PORT_SETTINGS,
    help="T3 as open-unlearning's port configures it: cumulative-mean pooled states, rank 32, T = 2.5, no sweep.",
)
