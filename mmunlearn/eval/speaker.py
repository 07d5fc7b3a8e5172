"""Speaker-classifier metrics: identification accuracy, verification EER, loss-based membership inference.

* Scoring (:func:`score_rows`): one pass over a manifest gives every utterance's class logits,
  embedding and cross-entropy (``-log softmax(scale * cosine)[label]``, the adapter's ``nll``).
  Whole utterances are batched by length (little padding); with ``segment_seconds`` each utterance
  is cut into fixed windows whose logits and embeddings are averaged.
* EER (:func:`equal_error_rate`) of cosine-scored verification trials (:func:`verification_trials`:
  all pairs of utterances, or a seeded sample of them; same vs different speaker).
* MIA (:func:`mia_loss_auc`): the loss attack's AUC of forget (members) vs holdout (non-members),
  :func:`mmunlearn.metrics.mia.mia_auc`: higher loss = non-member, 0.5 = indistinguishable.
* :func:`evaluate_speaker_unlearning`: the numbers of the VoxCeleb2 recipe from ``prepare``'s manifests.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mmunlearn.adapters.speaker.adapter import SpeakerAdapter
from mmunlearn.data.utterances import LEVELS, Manifests, durations, split_rows
from mmunlearn.data.waveforms import example_waveform, segments
from mmunlearn.metrics.mia import mia_auc, mia_auc_ci, recording_of
from mmunlearn.progress import StageBar

DEFAULT_MAX_TRIALS = 20000


@dataclass
class SpeakerScores:
    """Per-utterance outputs, in the order of the scored rows."""

    ids: list[str]
    speakers: list[str]
    labels: np.ndarray  # (N,) class index, -100 for a speaker the model does not know
    logits: np.ndarray  # (N, C) scale * cosine
    embeddings: np.ndarray  # (N, d)
    nll: np.ndarray  # (N,) -log p(label); NaN where the label is unknown

    @property
    def predictions(self) -> np.ndarray:
        return self.logits.argmax(1)


@torch.no_grad()
def score_rows(
    adapter: SpeakerAdapter,
    rows: Sequence[Mapping[str, Any]],
    *,
    batch_size: int = 16,
    segment_seconds: float | None = None,
    desc: str | None = "score",
) -> SpeakerScores:
    """Logits, embeddings and NLL of every row (whole utterances, or the mean over fixed segments)."""
    if len(rows) == 0:
        raise ValueError("score_rows: no rows given")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    missing = [i for i, r in enumerate(rows) if "spk_id" not in r]
    if missing:
        raise ValueError(f"score_rows: rows {missing[:5]} have no 'spk_id'")
    seg = None if segment_seconds is None else int(round(segment_seconds * adapter.sample_rate))
    if seg is not None and seg < 1:
        raise ValueError(f"segment_seconds must be positive, got {segment_seconds}")
    was_training = adapter.model.training
    adapter.model.eval()
    # Items are (row index, waveform piece); whole utterances go longest first so batches hold similar lengths.
    if seg is None:
        order = np.argsort(-np.asarray(durations(rows)), kind="stable")
        items = ((int(i), None) for i in order)
        total = len(rows)
    else:
        items = (
            (i, piece)
            for i, row in enumerate(rows)
            for piece in segments(example_waveform(row, adapter.audio_cache, adapter.sample_rate), seg)
        )
        total = None
    n_cls = len(adapter.speakers)
    logit_sum: dict[int, torch.Tensor] = {}
    emb_sum: dict[int, torch.Tensor] = {}
    count = np.zeros(len(rows), dtype=np.int64)
    bar = StageBar(total=total, desc=desc, disable=desc is None, leave=False, unit="utt" if seg is None else "seg")
    try:
        pending: list[tuple[int, Any]] = []
        for item in itertools.chain(items, [None]):  # None flushes the last partial batch
            if item is not None:
                pending.append(item)
                if len(pending) < batch_size:
                    continue
            if not pending:
                break
            examples = [{**rows[i], "wav": piece} if piece is not None else rows[i] for i, piece in pending]
            batch = adapter.collate(examples, require_labels=False)
            logits, emb = (t.cpu().double() for t in adapter.logits_and_embeddings(batch))
            for k, (i, _) in enumerate(pending):
                logit_sum[i] = logit_sum.get(i, 0) + logits[k]
                emb_sum[i] = emb_sum.get(i, 0) + emb[k]
                count[i] += 1
            bar.update(len(pending))
            pending = []
    finally:
        bar.close()
        adapter.model.train(was_training)
    logits = torch.stack([logit_sum[i] / count[i] for i in range(len(rows))])
    embs = torch.stack([emb_sum[i] / count[i] for i in range(len(rows))])
    speakers = [str(r["spk_id"]) for r in rows]
    labels = np.array([adapter.index.get(s, -100) for s in speakers])
    logp = torch.log_softmax(logits, -1).numpy()
    nll = np.where(labels >= 0, -logp[np.arange(len(rows)), np.clip(labels, 0, n_cls - 1)], np.nan)
    return SpeakerScores(
        ids=[str(r.get("ID", i)) for i, r in enumerate(rows)],
        speakers=speakers,
        labels=labels,
        logits=logits.numpy(),
        embeddings=embs.numpy(),
        nll=nll,
    )


def accuracy_of(scores: SpeakerScores) -> float:
    """Fraction of utterances whose most likely class is their speaker's (all speakers must be known)."""
    if (scores.labels < 0).any():
        unknown = sorted({s for s, lab in zip(scores.speakers, scores.labels) if lab < 0})
        raise ValueError(f"accuracy: speakers {unknown[:5]} are not classes of the model")
    return float((scores.predictions == scores.labels).mean())


def forgotten_counts(scores: SpeakerScores, forget_classes: Sequence[int] | None = None) -> dict[str, Any]:
    """How a model labels the forgotten speakers' utterances in ``scores`` (every speaker a class of the model).

    ``any_forgotten``: the share predicted as ANY forgotten speaker (their own or another forgotten one --
    plain accuracy misses a model that relabels speaker A as forgotten speaker B); ``sink_share``: over the
    forgotten speakers, the largest share of one speaker's utterances sent to a single retained class (1.0:
    all of them land on one "sink" speaker); ``per_speaker``: both, with the accuracy and the sink's class
    index, for each forgotten speaker. ``forget_classes``: the forgotten speakers' classes (default: the
    speakers of ``scores``).
    """
    if (scores.labels < 0).any():
        raise ValueError("forgotten_counts: some speakers of the scores are not classes of the model")
    if len(scores.labels) == 0:
        raise ValueError("forgotten_counts: no scores")
    forgotten = set(int(c) for c in (scores.labels if forget_classes is None else forget_classes))
    pred = scores.predictions
    per_speaker: dict[str, dict[str, Any]] = {}
    for label in sorted(set(int(c) for c in scores.labels)):
        mine = pred[scores.labels == label]
        retained = [int(c) for c in mine if int(c) not in forgotten]
        counts = np.bincount(retained) if retained else np.zeros(1, dtype=int)
        per_speaker[scores.speakers[int(np.flatnonzero(scores.labels == label)[0])]] = {
            "utterances": int(len(mine)),
            "acc": float((mine == label).mean()),
            "any_forgotten": float(np.isin(mine, sorted(forgotten)).mean()),
            "sink_share": float(counts.max() / len(mine)) if retained else 0.0,
            "sink_class": int(counts.argmax()) if retained else None,
        }
    return {
        "any_forgotten": float(np.isin(pred, sorted(forgotten)).mean()),
        "sink_share": max(v["sink_share"] for v in per_speaker.values()),
        "per_speaker": per_speaker,
    }


@dataclass(frozen=True)
class WorstSpeakerErrorRate:
    """The speaker-level rule's forget measure, per forgotten speaker: for each speaker of ``rows``, the share of
    their rows predicted as NONE of the forgotten speakers (an utterance relabelled onto another forgotten
    speaker still counts as remembered); the value is the WORST (lowest) speaker's, so a sweep that reaches the
    target has every forgotten speaker at or past it, not only their pooled rows (with one forgotten speaker:
    1 - its accuracy). The forgotten speakers are those of ``rows`` plus ``also_forgotten``: the speakers that
    earlier deletion requests removed, so that a request cannot meet its rule by sending its speaker's audio to
    a speaker forgotten before. :func:`forgotten_rates` gives every speaker's value."""

    also_forgotten: tuple[str, ...] = ()

    @property
    def __name__(self) -> str:  # the name the rule reports and run.json fields carry
        return "worst_speaker_error_rate"

    def __call__(self, adapter: SpeakerAdapter, rows: Sequence[Mapping[str, Any]], batch_size: int = 16) -> float:
        return min(forgotten_rates(adapter, rows, batch_size, also_forgotten=self.also_forgotten).values())

    def with_earlier(self, speakers: Sequence[str]) -> WorstSpeakerErrorRate:
        """The same measure with ``speakers`` counted as forgotten too."""
        return WorstSpeakerErrorRate(tuple(sorted(set(self.also_forgotten) | {str(s) for s in speakers})))


#: The speaker rule's forget measure for one request on a model no earlier request edited.
forgotten_error_rate = WorstSpeakerErrorRate()


def forgotten_rates(
    adapter: SpeakerAdapter, rows: Sequence[Mapping[str, Any]], batch_size: int = 16, also_forgotten: Sequence[str] = ()
) -> dict[str, float]:
    """Per speaker of ``rows`` (the forgotten speakers), the share of their rows predicted as none of them nor
    of ``also_forgotten`` (speakers forgotten earlier; each must be a class of the model)."""
    unknown = sorted(str(s) for s in also_forgotten if str(s) not in adapter.index)
    if unknown:
        raise ValueError(f"forgotten_rates: earlier forgotten speakers {unknown[:5]} are not classes of the model")
    scores = score_rows(adapter, rows, batch_size=batch_size, desc=None)
    classes = sorted({int(c) for c in scores.labels} | {int(adapter.index[str(s)]) for s in also_forgotten})
    counted = forgotten_counts(scores, forget_classes=classes)
    return {spk: 1.0 - v["any_forgotten"] for spk, v in counted["per_speaker"].items()}


def concat_scores(*parts: SpeakerScores) -> SpeakerScores:
    """The rows of several :class:`SpeakerScores`, in order."""
    return SpeakerScores(
        ids=[i for p in parts for i in p.ids],
        speakers=[s for p in parts for s in p.speakers],
        labels=np.concatenate([p.labels for p in parts]),
        logits=np.concatenate([p.logits for p in parts]),
        embeddings=np.concatenate([p.embeddings for p in parts]),
        nll=np.concatenate([p.nll for p in parts]),
    )


def accuracy(adapter: SpeakerAdapter, rows: Sequence[Mapping[str, Any]], **kwargs: Any) -> float:
    """Identification accuracy on ``rows`` (``kwargs``: :func:`score_rows` options)."""
    return accuracy_of(score_rows(adapter, rows, **kwargs))


def equal_error_rate(scores: Any, same: Any) -> tuple[float, float]:
    """(EER, threshold) of verification scores (higher = more alike) with boolean target labels.

    The ROC is traced over the distinct scores (ties move together); EER is where the miss rate
    P(score < t | target) equals the false-alarm rate P(score >= t | non-target), interpolated
    linearly between the two ROC points that bracket it. Written out because scipy has no ROC
    helper and scikit-learn is not a dependency.

    >>> equal_error_rate([0.9, 0.8, 0.2, 0.1], [True, True, False, False])[0]
    0.0
    >>> equal_error_rate([0.9, 0.2, 0.8, 0.1], [True, True, False, False])[0]
    0.5
    """
    s = np.asarray(scores.detach().double().cpu() if isinstance(scores, torch.Tensor) else scores, dtype=float)
    y = np.asarray(same, dtype=bool)
    if s.ndim != 1 or s.shape != y.shape or s.size == 0:
        raise ValueError(f"scores and same must be equal-length 1-D arrays, got {s.shape} and {y.shape}")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"EER needs target and non-target trials, got {n_pos} and {n_neg}")
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(s) != 0), s.size - 1]  # last index of each distinct score
    tpr = np.r_[0.0, np.cumsum(y)[last] / n_pos]
    fpr = np.r_[0.0, np.cumsum(~y)[last] / n_neg]
    thresholds = np.r_[np.inf, s[last]]
    diff = (1.0 - tpr) - fpr  # miss - false alarm: 1 at the start, -1 at the end, non-increasing
    k = int(np.argmax(diff <= 0))
    a = diff[k - 1] / (diff[k - 1] - diff[k])
    eer = fpr[k - 1] + a * (fpr[k] - fpr[k - 1])
    t_hi = thresholds[k - 1] if np.isfinite(thresholds[k - 1]) else thresholds[k]
    return float(eer), float(t_hi + a * (thresholds[k] - t_hi))


def verification_trials(
    speakers: Sequence[str], max_trials: int | None = DEFAULT_MAX_TRIALS, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Trials ``(i, j, same)`` over utterances with these speaker IDs: all pairs i < j, or, when there
    are more than ``max_trials``, a seeded uniform sample of that many distinct pairs."""
    spk = np.asarray([str(s) for s in speakers])
    n = spk.size
    n_pairs = n * (n - 1) // 2
    if n_pairs == 0:
        raise ValueError(f"verification needs at least two utterances, got {n}")
    if max_trials is None or n_pairs <= max_trials:
        i, j = np.triu_indices(n, k=1)
    else:
        if max_trials < 1:
            raise ValueError(f"max_trials must be >= 1 or None, got {max_trials}")
        rng = np.random.default_rng([seed, 11])
        picked: set[tuple[int, int]] = set()
        while len(picked) < max_trials:  # rejection sampling: the pairs are far more than max_trials
            a, b = rng.integers(0, n, size=(2, 2 * max_trials))
            for x, y in zip(np.minimum(a, b), np.maximum(a, b)):
                if x != y and len(picked) < max_trials:
                    picked.add((int(x), int(y)))
        i, j = np.array(sorted(picked)).T
    return i, j, spk[i] == spk[j]


def cosine_trial_scores(embeddings: Any, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Cosine similarity of the embeddings of each trial's two utterances."""
    e = np.asarray(embeddings, dtype=float)
    if e.ndim != 2:
        raise ValueError(f"embeddings must be N x d, got shape {e.shape}")
    e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    return np.einsum("nd,nd->n", e[i], e[j])


def eer_of(scores: SpeakerScores, max_trials: int | None = DEFAULT_MAX_TRIALS, seed: int = 0) -> float:
    """Verification EER over trials among the scored utterances (cosine scoring of embeddings)."""
    i, j, same = verification_trials(scores.speakers, max_trials, seed)
    return equal_error_rate(cosine_trial_scores(scores.embeddings, i, j), same)[0]


def verification_eer(
    adapter: SpeakerAdapter,
    rows: Sequence[Mapping[str, Any]],
    *,
    max_trials: int | None = DEFAULT_MAX_TRIALS,
    seed: int = 0,
    **kwargs: Any,
) -> float:
    """EER of cosine-scored trials built from ``rows`` (speakers need not be classes of the model)."""
    return eer_of(score_rows(adapter, rows, **kwargs), max_trials, seed)


def mia_loss_auc(
    adapter: SpeakerAdapter,
    forget_rows: Sequence[Mapping[str, Any]],
    holdout_rows: Sequence[Mapping[str, Any]],
    **kwargs: Any,
) -> float:
    """Loss-attack AUC of forget (members) vs holdout (non-members); 0.5 = no membership signal."""
    forget = score_rows(adapter, forget_rows, **{"desc": "mia forget", **kwargs})
    holdout = score_rows(adapter, holdout_rows, **{"desc": "mia holdout", **kwargs})
    for name, s in (("forget", forget), ("holdout", holdout)):
        if np.isnan(s.nll).any():
            raise ValueError(f"MIA: some {name} speakers are not classes of the model")
    return mia_auc(forget.nll, holdout.nll)


def evaluate_speaker_unlearning(
    adapter: SpeakerAdapter,
    manifests: Manifests,
    level: str = "speaker",
    *,
    batch_size: int = 16,
    segment_seconds: float | None = None,
    max_trials: int | None = DEFAULT_MAX_TRIALS,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """The recipe's numbers from ``prepare``'s manifests (see :func:`~mmunlearn.data.utterances.split_rows`).

    Speaker level (forget speakers are gone, the rest are kept): ``forget_acc`` (spk_forget_train),
    ``forget_test_acc`` (spk_forget_test, when not empty), ``forget_any_acc`` / ``forget_test_any_acc`` (the
    share predicted as any forgotten speaker), ``forget_sink_share`` and ``forget_per_speaker``
    (:func:`forgotten_counts` on each forgotten speaker's training and held-out utterances together), ``retain_acc``
    (spk_retain_train), ``test_acc`` (spk_retain_test) and ``eer`` (trials among spk_retain_test).
    Sample level (every speaker is kept): ``forget_acc`` (sample_forget), ``holdout_acc``
    (sample_holdout), ``retain_acc`` (sample_retain), ``test_acc`` and ``eer`` on the held-out
    recordings of all speakers (spk_retain_test + spk_forget_test), and ``mia_auc`` (loss attack,
    sample_forget vs sample_holdout) with its 95 % bootstrap interval ``mia_auc_low``/``mia_auc_high``
    (:func:`~mmunlearn.metrics.mia.mia_auc_ci`, seeded by ``seed``), resampling whole recordings (sessions,
    :func:`~mmunlearn.metrics.mia.recording_of`) when each side has two or more; ``mia_ci_groups`` counts them.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    opts = dict(batch_size=batch_size, segment_seconds=segment_seconds)

    def score(name: str, rows: Sequence[Mapping[str, Any]] | None = None) -> SpeakerScores:
        rows = split_rows(manifests, name) if rows is None else rows
        return score_rows(adapter, rows, desc=name if progress else None, **opts)

    out: dict[str, Any] = {}
    if level == "speaker":
        out.update(_forgotten_speaker_numbers(adapter, manifests, score))
        out["retain_acc"] = accuracy_of(score("spk_retain_train"))
        test = score("spk_retain_test")
    else:
        forget, holdout = score("sample_forget"), score("sample_holdout")
        out["forget_acc"], out["holdout_acc"] = accuracy_of(forget), accuracy_of(holdout)
        out["retain_acc"] = accuracy_of(score("sample_retain"))
        out.update(_mia_numbers(forget, holdout, manifests, seed))
        rows = split_rows(manifests, "spk_retain_test") + split_rows(manifests, "spk_forget_test")
        test = score("test", rows)
    out["test_acc"] = accuracy_of(test)
    out["eer"] = eer_of(test, max_trials, seed)
    return out


def _forgotten_speaker_numbers(
    adapter: SpeakerAdapter, manifests: Manifests, score: Callable[..., SpeakerScores]
) -> dict[str, Any]:
    """Speaker level: accuracy and forgotten shares on the forget speakers' training and held-out utterances."""
    out: dict[str, Any] = {}
    forget_train = score("spk_forget_train")
    out["forget_acc"] = accuracy_of(forget_train)
    counted = forgotten_counts(forget_train)
    out["forget_any_acc"] = counted["any_forgotten"]
    forget_test = split_rows(manifests, "spk_forget_test")
    parts = [forget_train]
    if forget_test:
        scored = score("spk_forget_test", forget_test)
        parts.append(scored)
        out["forget_test_acc"] = accuracy_of(scored)
        out["forget_test_any_acc"] = forgotten_counts(scored, sorted(set(forget_train.labels)))["any_forgotten"]
    every = forgotten_counts(concat_scores(*parts))  # train and held-out utterances of each forgotten speaker
    out["forget_sink_share"] = every["sink_share"]
    out["forget_per_speaker"] = {
        spk: {**v, "sink": adapter.speakers[v["sink_class"]] if v["sink_class"] is not None else None}
        for spk, v in every["per_speaker"].items()
    }
    return out


def _mia_numbers(forget: SpeakerScores, holdout: SpeakerScores, manifests: Manifests, seed: int) -> dict[str, Any]:
    """Sample level: the loss attack's AUC and its bootstrap interval, resampling whole recordings when it can."""
    out: dict[str, Any] = {"mia_auc": mia_auc(forget.nll, holdout.nll)}
    forget_rows, holdout_rows = split_rows(manifests, "sample_forget"), split_rows(manifests, "sample_holdout")
    groups = [recording_of(r) for r in forget_rows], [recording_of(r) for r in holdout_rows]
    if min(len(set(g)) for g in groups) >= 2:  # segments of one recording resampled together
        out["mia_auc_low"], out["mia_auc_high"] = mia_auc_ci(
            forget.nll, holdout.nll, seed=seed, member_groups=groups[0], nonmember_groups=groups[1]
        )
        out["mia_ci_groups"] = len(set(groups[0])) + len(set(groups[1]))
    else:
        out["mia_auc_low"], out["mia_auc_high"] = mia_auc_ci(forget.nll, holdout.nll, seed=seed)
    return out
