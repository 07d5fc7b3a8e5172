"""QR-Erase, QR-Erase-rows and SVD-UNLEARN: task vectors -> localise -> basis -> discriminate -> erase.

Task vectors come from a reference point: the model the target was fine-tuned from (subtracting the
forget-specific part of the update undoes that learning) or the target itself (subtracting the update
that pushes it further into the forget data pushes it away). A speaker classifier's task vectors are
taken from a copy of it, so the edited model keeps its BatchNorm statistics bit for bit. With a sweep
rule, rank x scale is chosen on the training partitions. ``sweep_scales="auto"`` works in units of the task
vectors' size: candidate edits have ||scale * T_f||_F / ||W||_F = 0.001, 0.002, 0.004, ... (an upper bound of the
relative update ||dW|| / ||W||, up to 1, an update as large as the weights), so the grid fits a 5M and a 135M
model alike; once the rule's target or bound is crossed, the crossing is bisected geometrically
(``sweep_bisections`` steps); when the grid's first size already passes the retain bound (a real checkpoint's
gradient task vectors can), the size is halved until an edit is within it, and that crossing is bisected.
Ranks are tried in order and the sweep stops at the first rank whose edit meets
the rule. Each point prints one progress line.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from mmunlearn.config import PresetConfig, opt
from mmunlearn.erase import erase, merge_erases, restore
from mmunlearn.erase.norms import sq_norm
from mmunlearn.erase.search import narrow_down, search_rank, search_rank_lazy
from mmunlearn.kinds import get_kind
from mmunlearn.methods.artefacts import ERASE_FILES
from mmunlearn.methods.base import MethodResult, RunContext, register
from mmunlearn.methods.embedding_step import erase_centroids
from mmunlearn.methods.head_rows import forgotten_rows
from mmunlearn.methods.prefix_states import PrefixReuse
from mmunlearn.methods.rule import Scorer, SweepPoint, choose, log_point
from mmunlearn.taskvec.extract import ExtractConfig, extract_task_matrices, update_task_matrices

#: ``sweep_scales="auto"``: relative edit sizes ||scale * T_f|| / ||W|| tried, doubling from 0.001 to 1.024.
AUTO_RELATIVE = tuple(0.001 * 2**i for i in range(11))
#: Speaker classifiers go on to 32.768: a cosine head only turns a class row away from its speaker once the edit of
#: that row is about twice its norm (the row's share of the matrix's norm is ~1/sqrt(classes)), and several forgotten
#: rows away from each other's audio at about 16 times (FSDD, 3 of 6 forgotten: mmunlearn/methods/head_rows.py).
SPEAKER_SWEEP_MAX = 32.768


def auto_grid(largest: float) -> tuple[float, ...]:
    """The ``"auto"`` relative edit sizes, doubling from 0.001 up to ``largest`` (inclusive, within rounding)."""
    if not largest >= AUTO_RELATIVE[0]:
        raise ValueError(f"sweep_max_relative must be >= {AUTO_RELATIVE[0]}, got {largest}")
    return tuple(0.001 * 2**i for i in range(64) if 0.001 * 2**i <= largest * (1 + 1e-9))


_SPK_SCALES = (2.0, 4.0, 6.0, 8.0, 12.0, 16.0)


#: Where task matrices come from (EraseConfig.task_matrix) and how large the edit is (EraseConfig.subtract).
TASK_MATRICES = ("extract", "update")
SUBTRACTIONS = ("swept", "own")
#: When an 'auto' sweep scores the retain measure (EraseConfig.sweep_retain; mmunlearn.erase.search).
SWEEP_RETAIN = ("every", "needed")


def _ex(kind: str = "finetune", **kw: Any) -> ExtractConfig:
    return ExtractConfig(kind=kind, **kw)


@dataclass(frozen=True)
class EraseConfig(PresetConfig):
    """Settings of a subspace-erasure method."""

    subspace: str = opt("cpqr", "Subspace method: cpqr (QR-Erase), svd (UNLEARN) or another column_basis method.")
    localize: bool = opt(True, "Edit only the layers whose forget-task energy passes the layer rule.")
    layer_rule: str = opt("mean", "Layer selection: mean (energy >= 1/|L|), top, threshold, all.")
    rank: int | None = opt(32, "Rank of the forget basis per matrix (None: by energy).")
    energy: float | None = opt(None, "With rank None: energy fraction the forget basis captures.")
    retain_rank: int | None = opt(128, "Rank of the retain basis that is protected (0/None: no retain projection).")
    row_retain_rank: int | None = opt(
        None,
        "With a rule that judges forget rows one by one (mmunlearn.unlearn's for a text LLM): the retain rank used "
        "instead of retain_rank (None: retain_rank). Every row at its level asks for a larger edit than a mean does.",
    )
    rows: bool = opt(False, "Also remove the retain task's row space from the update.")
    scale: float = opt(1.0, "Edit strength: W' = W - scale * T~ (without a sweep).")
    extract: ExtractConfig = opt(
        help="How task vectors are extracted (finetune | lora | gradient | layerwise: each block trained alone).",
        factory=ExtractConfig,
    )
    sweep_ranks: tuple[int, ...] | None = opt(None, "With a sweep rule: ranks tried (default: rank alone).")
    sweep_scales: Any = opt(
        "auto",
        "With a sweep rule: scales tried, or 'auto' (relative edit sizes doubling from "
        "0.001 of the weights' norm, then bisection of the crossing).",
    )
    sweep_max_relative: float = opt(1.024, "With 'auto' scales: the largest relative edit size tried.")
    sweep_bisections: int = opt(3, "With 'auto' scales: geometric bisection steps once the crossing is bracketed.")
    sweep_retain: str = opt(
        "every",
        "With 'auto' scales: where the retain measure is scored: at 'every' point, or where 'needed' (the forget "
        "measure alone until it reaches the target and its crossing is bisected, then the retain measure at that "
        "edit, and below it only when it is over the bound). 'needed' assumes both measures grow with the edit's "
        "size, as on a text LLM (mmunlearn.erase.search); a rule judging forget rows one by one scores every point.",
    )
    centroid: float = opt(
        0.0,
        "Speaker classifiers: after the edit, also erase the forgotten speakers' centroid "
        "directions outside the retained speakers' span from the layer that outputs the "
        "embeddings, W <- (I - a U U^T) W (0: off, 1: remove, 2: reflect; "
        "mmunlearn.methods.embedding_step).",
    )
    trained_only: bool = opt(
        False,
        "With a reference model: take task vectors only in the layers whose weights differ "
        "between the reference and the target (the layers its training changed). Off by "
        "default: on whisper-smollm2 it made the audio-side edit more selective, but the "
        "edit that forgets is in the language model, which training left frozen.",
    )
    sweep_first: float | None = opt(
        None,
        "With a sweep rule: a relative edit size ||scale * T_f|| / ||W|| tried first at "
        "the first rank (e.g. the one an earlier deletion request chose); when that edit "
        "meets the rule, halvings and a bisection find the smallest size that still does.",
    )
    task_matrix: str = opt(
        "extract",
        "Where the task matrices come from: 'extract' (the extract recipe run on the "
        "reference model when one is given, else on the model itself: what a user "
        "without a reference model gets) or 'update' (the training update: T_f = the "
        "model minus the reference it was fine-tuned from; T_r = retain_model minus the "
        "reference, else the extract recipe run on the reference with the retain data; "
        "needs a reference).",
    )
    retain_model: str | None = opt(
        None,
        "With task_matrix 'update': a model folder holding the reference fine-tuned "
        "on the retain data alone (T_r = it minus the reference).",
    )
    subtract: str = opt(
        "swept",
        "'swept': the rule sweeps the edit's size (scale x T~); 'own': QR-Erase's W' = W - T~ "
        "at the task matrix's own size (scale 1, no sweep; the rule's measures of that one "
        "edit are recorded).",
    )
    top: int | None = opt(None, "With layer_rule 'top': how many of the most energetic layer groups are edited.")
    rounds: int = opt(
        1,
        "With a rule that judges forget rows one by one (mmunlearn.unlearn's for a text LLM): up to this many edits. "
        "The first aims at round_share of the rows; each later one is extracted from the rows still out alone and "
        "aims at every row; one undo patch for all. With another rule: one edit (the report says so).",
    )
    round_share: float = opt(0.9, "With rounds > 1: the share of forget rows the first edit aims to take out.")

    def __post_init__(self) -> None:
        if self.task_matrix not in TASK_MATRICES:
            raise ValueError(f"task_matrix: choose from {', '.join(TASK_MATRICES)}, got {self.task_matrix!r}")
        if self.subtract not in SUBTRACTIONS:
            raise ValueError(f"subtract: choose from {', '.join(SUBTRACTIONS)}, got {self.subtract!r}")
        if self.top is not None and not (isinstance(self.top, int) and self.top >= 1):
            raise ValueError(f"top must be >= 1, got {self.top!r}")
        if not (isinstance(self.rounds, int) and self.rounds >= 1):
            raise ValueError(f"rounds must be an integer >= 1, got {self.rounds!r}")
        if not 0 < self.round_share <= 1:
            raise ValueError(f"round_share must be in (0, 1], got {self.round_share!r}")

    PRESETS: ClassVar[dict] = {
        ("text", "micro"): dict(rank=8, retain_rank=32, scale=2.0, extract=_ex(steps=20, lr=1e-3, batch_size=8)),
        ("text", "mini"): dict(rank=32, retain_rank=128, scale=2.0, extract=_ex(steps=40, lr=5e-4, batch_size=16)),
        # real checkpoints: the task matrices of 20 fine-tuning steps per partition from the reference (the model the
        # target was fine-tuned from), rank 128, retain rank 128, every layer. The most selective of the protocols
        # scanned on SmolLM2-135M TOFU (docs/results/tofu_smollm2_qr_protocols_swept.json: at the retain bound forget
        # +2.63 nats where one gradient pass, the earlier default, gave +0.34); it meets the TOFU rule there
        # (docs/results/tofu_smollm2_qr_default.json)
        # rounds=2: with mmunlearn.unlearn's per-row text rule, the edit that takes out the last, hardest rows
        # overshoots the rest (SmolLM2 fine-tuned on 20 private facts, examples/byo_text_llm.py: one edit left 1 row
        # below its level with the retain bound reached; a second edit of the rows the first left met the rule)
        # row_retain_rank=384: with that per-row rule, retain rank 128 kept 85 % of the retain facts said (target
        # 94 %); protecting 384 retain directions kept them within 3 points (issue 53; the rule judges a TOFU mean,
        # where the recorded runs used 128 and still do)
        ("text", "model_dir"): dict(
            rank=128,
            retain_rank=128,
            row_retain_rank=384,
            scale=1.0,
            localize=False,
            layer_rule="all",
            extract=_ex("finetune", steps=20, lr=1e-4, batch_size=8),
            rounds=2,
            round_share=0.9,
            # the retain rows (60 on TOFU) are most of the rule's scoring: scored where the choice needs them
            sweep_retain="needed",
        ),
        ("speaker", "tiny"): dict(
            rank=1,
            retain_rank=4,
            scale=8.0,
            sweep_ranks=(1,),
            sweep_scales=_SPK_SCALES,
            sweep_max_relative=SPEAKER_SWEEP_MAX,
            extract=_ex(steps=4, lr=1e-3, batch_size=8),
        ),
        ("speaker", "small"): dict(
            rank=1,
            retain_rank=32,
            scale=8.0,
            sweep_ranks=(1, 2),
            sweep_scales=_SPK_SCALES,
            sweep_max_relative=SPEAKER_SWEEP_MAX,
            extract=_ex(steps=20, lr=1e-3, batch_size=16),
        ),
        ("speaker", "large"): dict(
            rank=4,
            retain_rank=128,
            scale=4.0,
            sweep_ranks=(2, 4, 8),
            sweep_scales=_SPK_SCALES,
            sweep_max_relative=SPEAKER_SWEEP_MAX,
            extract=_ex(steps=40, lr=2e-4, batch_size=16),
        ),
        ("speech-llm", "tiny"): dict(rank=8, retain_rank=32, scale=1.0, extract=_ex(steps=30, lr=1e-3, batch_size=16)),
        ("speech-llm", "mini"): dict(rank=8, retain_rank=32, scale=1.0, extract=_ex(steps=30, lr=1e-3, batch_size=16)),
        ("speech-llm", "model_dir"): dict(
            rank=16, retain_rank=64, scale=1.0, extract=_ex(steps=30, lr=1e-4, batch_size=8)
        ),
    }


def task_vectors(
    adapter,
    forget: Sequence[Any],
    retain: Sequence[Any],
    cfg: ExtractConfig,
    progress: bool = True,
    layers: Sequence[str] | None = None,
):
    """Forget and retain task matrices from the same recipe and settings (``layers``: only those, default all)."""
    return (
        extract_task_matrices(adapter, forget, cfg, layers=layers, progress=progress),
        extract_task_matrices(adapter, retain, cfg, layers=layers, progress=progress),
    )


def training_update(
    adapter,
    reference,
    retain: Sequence[Any],
    cfg: EraseConfig,
    extract: ExtractConfig,
    kind: str,
    *,
    layers: Sequence[str] | None = None,
    retain_task: Any = None,
    progress: bool = True,
):
    """``task_matrix='update'``: T_f = the model minus ``reference`` (the model it was fine-tuned from); T_r =
    ``cfg.retain_model`` minus the reference, else ``extract`` run on the reference with ``retain`` (a retain state's
    matrices, ``retain_task``, when given)."""
    if reference is None:
        raise ValueError(
            "task_matrix 'update' erases the model's training update (the model minus the model it was "
            "fine-tuned from): name that model (reference=, --reference, tofu --base DIR)"
        )
    tf = update_task_matrices(adapter, reference, layers=layers)
    if retain_task is not None:
        return tf, retain_task
    if cfg.retain_model is not None:
        device = str(next(adapter.model.parameters()).device)
        retained = get_kind(kind).load(cfg.retain_model, device=device)
        return tf, update_task_matrices(retained, reference, layers=list(tf), what="retain model")
    return tf, extract_task_matrices(reference, retain, extract, layers=list(tf), progress=progress)


def trained_layers(reference, target) -> list[str] | None:
    """The layers of ``target`` whose weights differ from ``reference``'s (bit for bit): the ones the target's training
    changed. None when every layer differs or none does (the reference is the target itself, or a copy of it):
    then every layer is used. A speech LLM trained with its towers frozen (whisper-smollm2: the projector alone)
    gives the projector, where the paper's fine-tuning task vectors would also move the frozen encoder
    (docs/speakers.md, "Forgetting on whisper-smollm2")."""
    theirs = {lw.name: lw.weight for lw in reference.layers()}
    ours = {lw.name: lw.weight for lw in target.layers()}
    if set(theirs) != set(ours):
        raise ValueError(
            f"the reference's layers are not the target's ({len(theirs)} against {len(ours)}): "
            "task vectors need the model the target was trained from"
        )
    changed = []
    for name, w in ours.items():
        r = theirs[name]
        if r.shape != w.shape:
            raise ValueError(f"layer {name}: reference shape {tuple(r.shape)}, target {tuple(w.shape)}")
        if not torch.equal(r.detach().cpu(), w.detach().cpu()):
            changed.append(name)
    return changed if 0 < len(changed) < len(ours) else None


def batchnorm_safe(extract: ExtractConfig, *sizes: int) -> ExtractConfig:
    """Fine-tuning batches that never hold a single utterance (ECAPA's BatchNorm cannot train on one): the
    largest batch size up to the configured one leaving no partition of ``sizes`` with a last batch of one."""
    if extract.kind == "gradient":  # one pass in eval mode: any batch size works
        return extract
    if min(sizes) < 2:
        raise ValueError(
            f"fine-tuning task vectors need at least 2 utterances per partition (BatchNorm), got "
            f"{min(sizes)}; use the gradient extraction"
        )
    size = next(b for b in range(extract.batch_size, 0, -1) if b == 1 or all(n % b != 1 for n in sizes))
    if size == 1:
        raise ValueError(
            f"no batch size <= {extract.batch_size} splits partitions of {sizes} utterances without "
            "a batch of one; use the gradient extraction"
        )
    return replace(extract, batch_size=size)


def _apply(model, tf, tr, cfg: EraseConfig, rank, scale, groups, factors: dict | None = None):
    common = dict(
        method=cfg.subspace,
        localize=cfg.localize,
        rule=cfg.layer_rule,
        scale=scale,
        rows=cfg.rows,
        groups=groups,
        top=cfg.top if cfg.layer_rule == "top" else None,
        factors=factors,
    )
    if rank is None:
        return erase(model, tf, tr, energy=cfg.energy or 0.9, retain_energy=cfg.energy or 0.9, **common)
    retain = tr if cfg.retain_rank else None
    return erase(model, tf, retain, rank=rank, retain_rank=cfg.retain_rank, clamp_ranks=True, **common)


def relative_unit(model, tf) -> float:
    """||T_f||_F / ||W||_F over the weights that have forget task matrices: an edit of scale s changes them by
    at most s times this fraction of their norm (the projections only shrink T_f)."""
    weights = dict(model.named_parameters())
    t_sq = sum(sq_norm(t) for t in tf.values())
    w_sq = sum(float(weights[n].detach().double().pow(2).sum()) for n in tf if n in weights)
    if not (t_sq > 0 and w_sq > 0):
        raise ValueError("the forget task matrices (or the weights they edit) are all zero: nothing to erase")
    return (t_sq / w_sq) ** 0.5


def _sweep(
    target,
    tf,
    tr,
    cfg: EraseConfig,
    scorer: Scorer,
    groups,
    progress: bool,
    past_bound: bool = False,
    factors: dict | None = None,
) -> tuple[list[SweepPoint], SweepPoint]:
    """Score candidate (rank, scale) edits (each applied, measured and undone); the rule's choice.

    ``past_bound``: an edit over the retain bound that has not reached the forget target does not end the search;
    larger edits are tried until one meets the rule (then the crossing is bisected from below). A speaker head's
    forgotten rows turning away (:mod:`mmunlearn.methods.head_rows`) raise the retain loss on their way and lower it
    again (FSDD, 3 of 6 forgotten: +0.055 nats at an edit of 1x the rows, +0.010 at 16x)."""
    points: list[SweepPoint] = []
    auto = cfg.sweep_scales == "auto"
    if cfg.sweep_retain not in SWEEP_RETAIN:
        raise ValueError(f"sweep_retain must be one of {SWEEP_RETAIN}, got {cfg.sweep_retain!r}")
    # a rule judging forget rows one by one (mmunlearn.unlearn's) keeps every point scored: its share of rows gone
    # was never measured to grow with the edit's size, and its record (byo_text_llm) scored every point
    lazy = auto and not past_bound and cfg.sweep_retain == "needed" and not _judges_rows(scorer.rule)
    unit = relative_unit(target.model, tf)
    factors = {} if factors is None else factors  # each rank's bases, computed once: the scale only multiplies them
    reuse = PrefixReuse(target)  # the blocks below the edited ones: their states computed once per batch

    def score(r, s, retain: bool = True) -> tuple[bool, bool | None]:
        p = next((p for p in points if p.rank == r and p.scale == s), None)
        if p is None or (retain and p.retain_nll is None):  # a new size, or the retain measure of one scored before
            rep = _apply(target.model, tf, tr, cfg, r, s, groups, factors)
            with reuse.during(rep):
                if p is None:
                    p = SweepPoint(r, s, *scorer.score(target, retain=retain), relative=s * unit)
                    points.append(p)
                else:
                    p.retain_nll = scorer.score_retain(target)
            restore(target.model, rep)
            log_point(
                "erase",
                {"rank": r, "scale": s, "relative": p.relative, "forget_nll": p.forget_nll, "retain_nll": p.retain_nll},
                scorer,
                progress,
            )
        return scorer.reached(p.forget_nll), None if p.retain_nll is None else scorer.over(p.retain_nll)

    full = auto_grid(cfg.sweep_max_relative)
    grid, start = full, None
    if cfg.sweep_first:
        first_rank = (cfg.sweep_ranks or (cfg.rank,))[0]
        reached, over = score(first_rank, cfg.sweep_first / unit)
        if scorer.point_meets(points[-1]):  # down to the smallest size that still meets it, not a size past it
            narrow_down(score, first_rank, cfg.sweep_first / unit, cfg.sweep_bisections, retain=not lazy)
            return points, _choice(points, scorer)
        # the auto grid continues from there: up when the edit fell short, down when it went too far
        under = not (reached or over)
        grid = tuple(u for u in full if (u > cfg.sweep_first if under else u < cfg.sweep_first))
        start = cfg.sweep_first / unit if under else None
    for i, r in enumerate(cfg.sweep_ranks or (cfg.rank,)):
        good = start if i == 0 else None
        if not auto:
            for s in cfg.sweep_scales:
                score(r, s)
        elif lazy:
            search_rank_lazy(score, r, [u / unit for u in (grid if i == 0 else full)], cfg.sweep_bisections, good)
        else:
            scales = [u / unit for u in (grid if i == 0 else full)]
            search_rank(score, r, scales, cfg.sweep_bisections, past_bound, good)
        if any(scorer.point_meets(p) for p in points if p.rank == r):
            break  # the smallest rank whose edit meets the rule
    return points, _choice(points, scorer)


def _choice(points: list[SweepPoint], scorer: Scorer) -> SweepPoint:
    """The sweep rule's choice among ``points`` (:func:`mmunlearn.methods.rule.choose`)."""
    rule = scorer.rule
    return choose(points, scorer.base_forget, scorer.base_retain, rule.forget_target, rule.retain_bound)


def _judges_rows(rule) -> bool:
    """Whether ``rule`` judges forget rows one by one (its forget measure names the rows still out)."""
    return rule is not None and hasattr(rule.forget_measure, "details")


def _for_rule(cfg: EraseConfig, rule) -> EraseConfig:
    """``cfg`` with ``row_retain_rank`` as its retain rank when given and ``rule`` judges forget rows one by one."""
    return (
        replace(cfg, retain_rank=cfg.row_retain_rank) if cfg.row_retain_rank is not None and _judges_rows(rule) else cfg
    )


def _first_round_rule(rule, cfg: EraseConfig):
    """What the first edit aims at: with ``rounds`` > 1 and a rule that judges forget rows one by one,
    ``round_share`` of the rows; else the rule itself."""
    return replace(rule, forget_target=cfg.round_share) if cfg.rounds > 1 and _judges_rows(rule) else rule


def _later_rounds(
    adapter, forget, retain, tf, tr, cfg: EraseConfig, ctx: RunContext, groups, report, info, reference, extract
):
    """Rounds 2.. of ``cfg.rounds``: while forget rows are still out after the edits so far, task matrices of those
    rows alone (from the reference, else the edited model) and a sweep on top of the edits aiming at every row, the
    retain bound counted from the unedited model; the edits merged into one (:func:`mmunlearn.erase.merge_erases`).
    ``info["rounds"]``: each round's rows still out before it and its choice."""
    measure = ctx.rule.forget_measure
    if not _judges_rows(ctx.rule):
        info["rounds"] = [{"note": "one edit: the rule judges no forget rows one by one, so rounds do not apply"}]
        return report
    rows = list(forget)
    info["rounds"] = [{"rows": len(rows), **info["chosen"], "relative": info["relative"], "met": info["round_met"]}]
    for _ in range(cfg.rounds - 1):
        out = measure.details(adapter, greedy=False, items=rows)["out"]
        if not out or not info["rounds"][-1]["met"]:  # all out, or the last edit missed its aim: no more edits
            break
        still = [rows[i] for i in out]
        source = reference or adapter
        tf_more = extract_task_matrices(source, still, extract, layers=list(tf), progress=ctx.progress)
        scorer = Scorer(ctx.rule, adapter, rows, retain, base=tuple(info["unedited"]))
        points, best = _sweep(adapter, tf_more, tr, cfg, scorer, groups, ctx.progress)
        more = _apply(adapter.model, tf_more, tr, cfg, best.rank, best.scale, groups)
        report = merge_erases(adapter.model, report, more)
        info["rounds"].append(
            {
                "rows": len(still),
                "rank": best.rank,
                "scale": best.scale,
                "relative": best.relative,
                "met": scorer.point_meets(best),
                "points": len(points),
            }
        )
    return report


def run(adapter, forget: Sequence[Any], retain: Sequence[Any], cfg: EraseConfig, ctx: RunContext) -> MethodResult:
    """Erase ``forget`` from ``adapter.model`` in place (sweeping rank x scale when ``ctx.rule`` is set)."""
    cfg = _for_rule(cfg, ctx.rule)
    groups = adapter.groups()
    extract = cfg.extract
    reference = ctx.reference
    cached = ctx.retain_task is not None  # a retain state: only the forget side is extracted
    kind = get_kind(ctx.kind)
    if kind.has_batchnorm:
        extract = batchnorm_safe(extract, len(forget), *(() if cached else (len(retain),)))
        reference = reference or adapter.clone()  # fine-tuning moves BatchNorm statistics: do it on a copy
    if cfg.retain_model is not None and cfg.task_matrix != "update":
        raise ValueError("retain_model is read with task_matrix 'update' only")
    t0 = time.perf_counter()
    layers = trained_layers(reference, adapter) if cfg.trained_only and ctx.reference is not None else None
    if cfg.task_matrix == "update":
        tf, tr = training_update(
            adapter,
            ctx.reference,
            retain,
            cfg,
            extract,
            ctx.kind,
            layers=layers,
            retain_task=ctx.retain_task,
            progress=ctx.progress,
        )
    elif cached:
        tf = extract_task_matrices(reference or adapter, forget, extract, layers=layers, progress=ctx.progress)
        tr = ctx.retain_task
    else:
        tf, tr = task_vectors(reference or adapter, forget, retain, extract, ctx.progress, layers=layers)
    if kind.is_classifier:
        # the speakers earlier deletion requests forgot, with stand-ins for their directions (requests/service.py)
        tf = forgotten_rows(reference or adapter, forget, tf, extract, earlier=ctx.earlier_forgotten or {})
    extract_seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    rank, scale, info = cfg.rank, cfg.scale, {"retain_rank": cfg.retain_rank}
    factors: dict = {}  # the sweep's bases, reused by the final edit
    if cfg.subtract == "own":  # the task matrix's own size: one edit, judged by the harness's rule measures
        scale = 1.0
        info["subtract"] = "own"
        info["relative"] = relative_unit(adapter.model, tf)
    elif ctx.rule is not None:
        head_only = kind.is_classifier and set(tf) == {adapter.head_weight} and "forgotten_rows" in tf.meta
        scorer = Scorer(_first_round_rule(ctx.rule, cfg), adapter, forget, retain)
        points, best = _sweep(adapter, tf, tr, cfg, scorer, groups, ctx.progress, past_bound=head_only, factors=factors)
        rank, scale = best.rank, best.scale
        info["sweep"] = [vars(p) for p in points]
        info["unedited"] = [scorer.base_forget, scorer.base_retain]  # the rule's measures before any edit
        info["round_met"] = scorer.point_meets(best)
        info["relative"] = best.relative
        info["sweep_seconds"] = time.perf_counter() - t1  # of the unlearn time: every candidate edit, scored
    info["chosen"] = {"rank": rank, "scale": scale}
    if layers is not None:
        info["trained_layers"] = layers
    report = _apply(adapter.model, tf, tr, cfg, rank, scale, groups, factors)
    info.update(selected_layers=report.selected, energies=report.energies)
    if cfg.rounds > 1 and ctx.rule is not None and cfg.subtract != "own":
        report = _later_rounds(adapter, forget, retain, tf, tr, cfg, ctx, groups, report, info, reference, extract)
    if cfg.centroid:
        if not kind.is_classifier:
            raise ValueError(f"centroid applies to speaker classifiers, not to a {ctx.kind!r} model")
        entries, info["centroid"] = erase_centroids(adapter, forget, retain, cfg.centroid)
        report.patch.entries.extend(entries)  # one undo patch for both edits
    return MethodResult(adapter, extract_seconds, time.perf_counter() - t1, info, erase_report=report)


register(
    "qr-erase",
    EraseConfig,
    run,
    needs=("task_vectors",),
    artefacts=ERASE_FILES,
    help="Localised CPQR erasure of the forget task's column space, projected off the retain subspace.",
)
register(
    "qr-erase-rows",
    EraseConfig,
    run,
    defaults={"rows": True},
    needs=("task_vectors",),
    artefacts=ERASE_FILES,
    help="QR-Erase that also removes the retain task's row space from the update.",
)
register(
    "svd-unlearn",
    EraseConfig,
    run,
    defaults={"subspace": "svd", "localize": False},
    needs=("task_vectors",),
    artefacts=ERASE_FILES,
    help="UNLEARN baseline: full SVD of every layer's forget task matrix, no localisation.",
)
