"""Which edit sizes an erasure sweep scores: a doubling grid, halvings below the retain bound, geometric bisection
of a crossing, the narrowing of a first size that met the rule and, with ``lazy``, the retain measure scored only
where the search needs it.

Everything is driven by one callback, ``score(rank, scale, retain) -> (reached, over)``: it applies the edit of
that size, scores the rule's forget measure (and the retain measure when ``retain`` is true; ``over`` is None when
it was not scored), undoes the edit and records the point. Asked again with ``retain`` for a scale it scored without
it, the callback scores only the retain measure. The search itself holds no model and no measure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Score = Callable[[Any, float, bool], tuple[bool, bool | None]]

#: When the smallest edit tried already passes the retain bound: at most this many halvings down to an edit within
#: the bound (the bisection then narrows the crossing between the two).
MAX_HALVINGS = 8


def below_the_bound(score: Score, rank: Any, scale: float) -> float | None:
    """Halve ``scale`` until an edit keeps the retain measure within the bound (at most :data:`MAX_HALVINGS`
    times); that scale, or None when none did. A real checkpoint's gradient task vectors can pass the bound at
    the grid's first size (0.001 of the weights' norm: SmolLM2 on TOFU, retain NLL +0.16)."""
    for _ in range(MAX_HALVINGS):
        scale /= 2
        _, over = score(rank, scale, True)
        if not over:
            return scale
    return None


def bisect(
    score: Score,
    rank: Any,
    lo: float,
    hi: float,
    steps: int,
    upper: Callable[[bool, bool | None], bool],
    retain: bool = True,
) -> tuple[float, float]:
    """Geometric bisection of the scale in [lo, hi], ``steps`` times; ``upper(reached, over)``: mid becomes hi.
    The bracket it ends with."""
    for _ in range(steps):
        mid = (lo * hi) ** 0.5
        reached, over = score(rank, mid, retain)
        lo, hi = (lo, mid) if upper(reached, over) else (mid, hi)
    return lo, hi


def narrow_down(score: Score, rank: Any, scale: float, bisections: int, retain: bool = False) -> None:
    """``scale`` met the rule (an earlier request's size, tried first): the smallest size that still reaches the
    forget target, as a search from the grid's bottom would find it. Halve until the forget measure falls short (at
    most :data:`MAX_HALVINGS` times; the smallest halving tried, when every one reaches it), bisect that crossing
    (the forget measure alone unless ``retain``), then score the retain measure at the smallest size that reached
    the target. Without this, a size that overshoots is kept: on SmolLM2 TOFU a second request's first size raised
    the forget NLL to 7.3 nats for a target of 2.6 (retain +4.0 nats, within a bound of 100)."""
    hi = scale
    for _ in range(MAX_HALVINGS):
        reached, _ = score(rank, hi / 2, retain)
        if not reached:
            hi = bisect(score, rank, hi / 2, hi, bisections, lambda reached, over: reached, retain=retain)[1]
            break
        hi /= 2
    score(rank, hi, True)


def search_rank(
    score: Score, rank: Any, scales: Sequence[float], bisections: int, past_bound: bool, good: float | None
) -> None:
    """Every point scored with both measures: up the grid ``scales`` until the forget target is reached or the retain
    bound passed, then bisect that crossing from the last edit below both (``good``: one already known).
    ``past_bound``: an edit over the bound that has not reached the target does not end the search; larger edits are
    tried until one meets the rule (then the crossing is bisected from below)."""
    past, prev = False, None
    for s in scales:
        reached, over = score(rank, s, True)
        if past_bound and (past or (over and not reached)):
            if reached and not over:  # meets the rule beyond a stretch over the bound: narrow it from below
                bisect(score, rank, prev, s, bisections, lambda reached, over: reached and not over)
                return
            past, prev = True, s
            continue
        if over and good is None:  # the smallest size tried is already over the bound
            good = below_the_bound(score, rank, s)
        if reached or over:  # larger scales only go further past the target or the bound
            if good is not None:
                bisect(score, rank, good, s, bisections, lambda reached, over: reached or over)
            return
        good = s


def search_rank_lazy(
    score: Score, rank: Any, scales: Sequence[float], bisections: int, good: float | None = None
) -> None:
    """The forget measure alone up the grid ``scales`` until it reaches the target, its crossing bisected; then the
    retain measure at the smallest edit that reached it (or, when none did, the largest tried). Only when that edit
    is over the bound is the retain measure scored below it: a binary search over the sizes already scored for the
    largest within the bound, then the crossing bisected with both measures. It assumes both measures grow with the
    edit's size, as on a text LLM; where they do, it chooses what :func:`search_rank` chooses at a fraction of the
    retain scoring (on TOFU the retain rows scored are 60, the forget rows 20-40). ``good``: a size already scored
    with both measures, within the bound and short of the target."""
    tried = [] if good is None else [good]
    top = None
    for s in scales:
        reached, _ = score(rank, s, False)
        if reached:
            top = s
            break
        tried.append(s)
    if top is None:
        if not tried:  # nothing to search (a first size from an earlier request at the grid's bottom)
            return
        top = tried.pop()
    elif tried:
        lo, top = bisect(score, rank, tried[-1], top, bisections, lambda reached, over: reached, retain=False)
        tried.append(lo)
    _, over = score(rank, top, True)
    if not over:
        return
    below = sorted(set(tried))  # every size scored below ``top``, each short of the forget target
    lo_i, hi_i = -1, len(below)  # below[lo_i] within the bound (-1: none known), below[hi_i] over it (len: top)
    while hi_i - lo_i > 1:
        mid = (lo_i + hi_i) // 2
        _, over = score(rank, below[mid], True)
        lo_i, hi_i = (lo_i, mid) if over else (mid, hi_i)
    over_scale = below[hi_i] if hi_i < len(below) else top
    inside = below[lo_i] if lo_i >= 0 else below_the_bound(score, rank, over_scale)
    if inside is not None:
        bisect(score, rank, inside, over_scale, bisections, lambda reached, over: reached or over)
