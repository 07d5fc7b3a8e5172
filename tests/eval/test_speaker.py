"""Tests of the speaker metrics: EER, verification trials, scoring passes, loss-attack MIA, the recipe's evaluation."""

import doctest

import numpy as np
import pytest
import torch

import mmunlearn.eval.speaker
from mmunlearn.adapters.speaker.adapter import SpeakerAdapter
from mmunlearn.data.utterances import split_rows
from mmunlearn.eval.speaker import (
    SpeakerScores,
    accuracy,
    accuracy_of,
    cosine_trial_scores,
    eer_of,
    equal_error_rate,
    evaluate_speaker_unlearning,
    mia_loss_auc,
    score_rows,
    verification_eer,
    verification_trials,
)
from tests.speech_corpus import one_thread, speaker_manifests  # noqa: F401  (fixtures)


def test_doctests():
    result = doctest.testmod(mmunlearn.eval.speaker)
    assert result.attempted > 0 and result.failed == 0


def test_eer_hand_cases():
    # Accept when score >= threshold: 2.0 (the lowest target score) separates perfectly.
    assert equal_error_rate([3.0, 2.0, 1.0, 0.0], [True, True, False, False]) == (0.0, 2.0)
    assert equal_error_rate([0.0, 1.0, 2.0, 3.0], [True, True, False, False])[0] == 1.0
    # ROC points (fpr, miss): (0, 1) (0, 2/3) (1/2, 2/3) (1/2, 0) (1, 0): the crossing is at 1/2.
    eer, thr = equal_error_rate(torch.tensor([0.9, 0.7, 0.6, 0.5, 0.1]), [True, False, True, True, False])
    assert eer == pytest.approx(0.5) and 0.5 <= thr <= 0.7
    # Ties move together: one shared score for everything is chance.
    assert equal_error_rate([1.0] * 4, [True, False, True, False])[0] == pytest.approx(0.5)


def test_eer_of_separated_and_identical_distributions():
    rng = np.random.default_rng(0)
    same = np.r_[np.ones(2000, bool), np.zeros(3000, bool)]
    separated = np.r_[rng.uniform(0.6, 1.0, 2000), rng.uniform(-1.0, 0.5, 3000)]
    assert equal_error_rate(separated, same)[0] == 0.0
    identical = rng.normal(size=5000)
    assert equal_error_rate(identical, same)[0] == pytest.approx(0.5, abs=0.03)
    # Gaussians one unit apart: EER = Phi(-1/2) = 0.3085.
    shifted = np.r_[rng.normal(0.5, 1, 2000), rng.normal(-0.5, 1, 3000)]
    assert equal_error_rate(shifted, same)[0] == pytest.approx(0.3085, abs=0.02)


def test_eer_validation():
    with pytest.raises(ValueError, match="target and non-target"):
        equal_error_rate([0.1, 0.2], [True, True])
    with pytest.raises(ValueError, match="equal-length"):
        equal_error_rate([0.1, 0.2], [True])
    with pytest.raises(ValueError, match="NaN"):
        equal_error_rate([0.1, float("nan")], [True, False])


def test_verification_trials():
    spk = ["a", "a", "b", "c", "b"]
    i, j, same = verification_trials(spk)
    assert len(i) == 10 and np.all(i < j) and len(set(zip(i, j))) == 10
    assert same.sum() == 2 and all(same[k] == (spk[i[k]] == spk[j[k]]) for k in range(10))
    i2, j2, _ = verification_trials([str(k % 7) for k in range(300)], max_trials=500, seed=1)
    assert len(i2) == 500 and np.all(i2 < j2) and len(set(zip(i2, j2))) == 500
    i3, j3, _ = verification_trials([str(k % 7) for k in range(300)], max_trials=500, seed=1)
    assert np.array_equal(i2, i3) and np.array_equal(j2, j3)
    with pytest.raises(ValueError, match="two utterances"):
        verification_trials(["a"])


def test_cosine_scores_and_eer_of_perfect_embeddings():
    emb = np.array([[1.0, 0.0], [2.0, 0.1], [0.0, 3.0], [0.1, 1.0]])
    assert cosine_trial_scores(emb, np.array([0, 0]), np.array([1, 2])) == pytest.approx([2 / np.sqrt(4.01), 0.0])
    scores = SpeakerScores(
        ids=list("wxyz"),
        speakers=["a", "a", "b", "b"],
        labels=np.array([0, 0, 1, 1]),
        logits=np.array([[1.0, 0], [0, 1], [0, 1], [0, 1]]),
        embeddings=emb,
        nll=np.zeros(4),
    )
    assert eer_of(scores) == 0.0
    assert accuracy_of(scores) == 0.75
    scores.labels[0] = -100
    with pytest.raises(ValueError, match="not classes"):
        accuracy_of(scores)


@pytest.fixture(scope="module")
def model(speaker_manifests):
    speakers = sorted({r["spk_id"] for r in split_rows(speaker_manifests, "train")})
    return SpeakerAdapter.build(speakers, preset="tiny", device="cpu", seed=0)


def test_score_rows_keeps_row_order_and_matches_the_adapter(model):
    gen = torch.Generator().manual_seed(0)
    rows = [
        {"ID": f"u{k}", "spk_id": model.speakers[k % 4], "wav": torch.randn(8000, generator=gen) * 0.1}
        for k in range(5)
    ]
    scores = score_rows(model, rows, batch_size=2, desc=None)
    assert scores.ids == [r["ID"] for r in rows] and scores.logits.shape == (5, 4)
    with torch.no_grad():
        batch = model.collate(rows)
        logits, nll = model.logits(batch).double(), model.nll(batch).double()
    assert np.allclose(scores.logits, logits.numpy(), atol=1e-4) and np.allclose(scores.nll, nll.numpy(), atol=1e-4)
    # Segments: an utterance of two 0.25 s windows averages their logits.
    seg = score_rows(model, rows[:1], segment_seconds=0.25, desc=None)
    halves = [{**rows[0], "wav": rows[0]["wav"][k * 4000 : (k + 1) * 4000]} for k in range(2)]
    with torch.no_grad():
        expected = model.logits(model.collate(halves)).double().mean(0)
    assert np.allclose(seg.logits[0], expected.numpy(), atol=1e-4)
    unknown = score_rows(model, [{**rows[0], "spk_id": "stranger"}], desc=None)
    assert unknown.labels[0] == -100 and np.isnan(unknown.nll[0])
    assert not model.model.training
    with pytest.raises(ValueError, match="no 'spk_id'"):
        score_rows(model, [{"wav": rows[0]["wav"]}], desc=None)


def test_mia_loss_auc_hand_cases(model):
    gen = torch.Generator().manual_seed(1)
    rows = [
        {"ID": f"u{k}", "spk_id": model.speakers[k % 4], "wav": torch.randn(6000, generator=gen) * 0.1}
        for k in range(6)
    ]
    assert mia_loss_auc(model, rows, rows, desc=None) == 0.5  # same items: no membership signal
    nll = score_rows(model, rows, desc=None).nll
    low, high = np.argsort(nll)[:3], np.argsort(nll)[3:]
    # members = the three lowest losses: perfectly separated (1.0); the reverse: 0.0.
    assert mia_loss_auc(model, [rows[k] for k in low], [rows[k] for k in high], desc=None) == 1.0
    assert mia_loss_auc(model, [rows[k] for k in high], [rows[k] for k in low], desc=None) == 0.0


@pytest.mark.parametrize("level", ["speaker", "sample"])
def test_evaluate_speaker_unlearning_reports_the_recipe_numbers(model, speaker_manifests, level):
    out = evaluate_speaker_unlearning(model, speaker_manifests, level, progress=False)
    keys = {"forget_acc", "retain_acc", "test_acc", "eer"}
    keys |= (
        {"forget_test_acc", "forget_any_acc", "forget_test_any_acc", "forget_sink_share"}
        if level == "speaker"
        else {"holdout_acc", "mia_auc", "mia_auc_low", "mia_auc_high"}
    )
    per_speaker = out.pop("forget_per_speaker", None)
    groups = out.pop("mia_ci_groups", None)
    assert set(out) == keys and all(0.0 <= v <= 1.0 for v in out.values())
    if level == "speaker":  # one forgotten speaker: "any forgotten" is its accuracy; its counts listed by name
        assert out["forget_any_acc"] == out["forget_acc"] and list(per_speaker) == sorted(
            {r["spk_id"] for r in split_rows(speaker_manifests, "spk_forget_train")}
        )
    else:  # the interval resampled whole recordings (one training video per kept speaker here: 3 a side)
        assert groups == 6
    test = split_rows(speaker_manifests, "spk_retain_test")
    if level == "speaker":
        assert out["test_acc"] == pytest.approx(accuracy(model, test, desc=None))
        assert out["eer"] == pytest.approx(verification_eer(model, test, desc=None))
        assert out["forget_acc"] == accuracy(model, split_rows(speaker_manifests, "spk_forget_train"), desc=None)
    else:
        forget, holdout = (split_rows(speaker_manifests, n) for n in ("sample_forget", "sample_holdout"))
        assert out["mia_auc"] == pytest.approx(mia_loss_auc(model, forget, holdout, desc=None))
        assert out["mia_auc_low"] <= out["mia_auc"] <= out["mia_auc_high"]  # its bootstrap interval
    with pytest.raises(ValueError, match="level"):
        evaluate_speaker_unlearning(model, speaker_manifests, "word")


def _scores(labels, predictions, n_classes=5):
    from mmunlearn.eval.speaker import SpeakerScores

    logits = np.zeros((len(labels), n_classes))
    logits[np.arange(len(labels)), predictions] = 1.0
    return SpeakerScores(
        ids=[str(i) for i in range(len(labels))],
        speakers=[f"s{c}" for c in labels],
        labels=np.asarray(labels),
        logits=logits,
        embeddings=np.zeros((len(labels), 2)),
        nll=np.zeros(len(labels)),
    )


def test_forgotten_counts_see_relabelling_onto_another_forgotten_speaker_and_sinks():
    from mmunlearn.eval.speaker import accuracy_of, forgotten_counts

    # forgotten speakers 0 and 1: speaker 0 is sent to forgotten speaker 1 (3 of 4), speaker 1 all to retained 4
    s = _scores([0, 0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 2, 4, 4, 4, 4])
    counted = forgotten_counts(s)
    assert accuracy_of(s) == 0.0  # plain forget accuracy calls this perfect forgetting ...
    assert counted["any_forgotten"] == 3 / 8  # ... but 3 of 8 utterances still name a forgotten speaker
    assert counted["sink_share"] == 1.0  # every utterance of speaker 1 lands on speaker 4
    one, zero = counted["per_speaker"]["s1"], counted["per_speaker"]["s0"]
    assert (one["sink_class"], one["sink_share"], one["any_forgotten"]) == (4, 1.0, 0.0)
    assert (zero["sink_class"], zero["sink_share"], zero["any_forgotten"]) == (2, 0.25, 0.75)
    spread = forgotten_counts(_scores([0, 0, 0, 0], [2, 3, 4, 2]))
    assert spread["any_forgotten"] == 0.0 and spread["sink_share"] == 0.5
    # the forgotten classes may be given (held-out rows of one speaker, the other forgotten one predicted)
    assert forgotten_counts(_scores([0, 0], [1, 2]), [0, 1])["any_forgotten"] == 0.5
