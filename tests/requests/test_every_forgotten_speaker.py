"""Every forgotten speaker meets the speaker rule, not only their pooled utterances: a tiny ECAPA trained on 7 espeak
speakers, 3 forgotten, unlearned by ``mmunlearn.unlearn``'s default rule, as one request and as a batch of three."""

import pytest
import torch

from mmunlearn.api.unlearn import unlearn
from mmunlearn.data.utterances import split_rows
from mmunlearn.eval.speaker import forgotten_counts, forgotten_error_rate, forgotten_rates, score_rows
from tests.speech_corpus import one_thread, three_forgotten_manifests  # noqa: F401  (fixtures)

HEAD_WEIGHT = "classifier.weight"  # the SpeakerAdapter's head_weight


@pytest.fixture(scope="module")
def trained(three_forgotten_manifests, tmp_path_factory):
    from mmunlearn.adapters.speaker.training import train_speaker_classifier, training_rows

    rows, speakers = training_rows(three_forgotten_manifests, "speaker")
    adapter, _ = train_speaker_classifier(
        rows, speakers=speakers, preset="tiny", epochs=6, lr=5e-3, batch_size=8, device="cpu", progress=False
    )
    path = tmp_path_factory.mktemp("every_speaker") / "original"
    adapter.save(path)
    return path


@pytest.fixture(scope="module")
def parts(three_forgotten_manifests):
    forget = split_rows(three_forgotten_manifests, "spk_forget_train")
    return forget, split_rows(three_forgotten_manifests, "spk_retain_train")


def _per_speaker(adapter, rows):
    return forgotten_counts(score_rows(adapter, rows, desc=None))["per_speaker"]


def _judged_per_speaker(report, adapter, forget):
    """The rule's forget value is the worst forgotten speaker's, measured on the returned model, and the verdict
    says "rule met" exactly when every speaker's share predicted as any forgotten speaker is at most 1/C."""
    rule = report["rule"]
    assert rule["forget_measure"] == "worst_speaker_error_rate" and next(iter(report)) == "verdict"
    after = _per_speaker(adapter, forget)
    assert len(after) == 3
    assert rule["forget"] == pytest.approx(min(1.0 - v["any_forgotten"] for v in after.values()))
    allowed = 1.0 - rule["forget_target"]
    every = all(v["any_forgotten"] <= allowed + 1e-9 for v in after.values())
    within = rule["retain"] - rule["base_retain"] <= rule["retain_bound"]
    assert report["target_reached"] == (every and within)
    assert report["verdict"].startswith("rule met" if every and within else "RULE NOT MET")
    return after


def test_the_measure_is_the_worst_speakers(trained, parts):
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter

    forget, _ = parts
    original = SpeakerAdapter.load(trained, device="cpu")
    rates = forgotten_rates(original, forget)
    assert len(rates) == 3 and forgotten_error_rate(original, forget) == min(rates.values())
    pooled = 1.0 - forgotten_counts(score_rows(original, forget, desc=None))["any_forgotten"]
    assert min(rates.values()) <= pooled <= max(rates.values())
    assert all(v["acc"] >= 0.5 for v in _per_speaker(original, forget).values())  # the model knows all three


def test_every_forgotten_row_is_turned_away_from_every_forgotten_speaker(trained, parts):
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter
    from mmunlearn.methods.head_rows import forgotten_rows, speaker_directions
    from mmunlearn.taskvec.extract import ExtractConfig, extract_task_matrices

    forget, _ = parts
    adapter = SpeakerAdapter.load(trained, device="cpu")
    adapter.scope = "head"
    cfg = ExtractConfig(kind="gradient", lr=1.0)
    union = extract_task_matrices(adapter, forget, cfg, progress=False)
    edited = forgotten_rows(adapter, forget, union, cfg)
    assert edited.meta["forgotten_rows"] == sorted({r["spk_id"] for r in forget})
    rows = edited[HEAD_WEIGHT].double()
    weight = adapter.model.classifier.weight.detach().double()
    dirs = speaker_directions(adapter, forget)
    assert all(float(d.norm()) == pytest.approx(1.0) for d in dirs.values())
    u = sum(dirs.values())
    u = u / u.norm()
    forgotten = sorted(adapter.index[s] for s in dirs)
    for k in range(weight.shape[0]):
        if k not in forgotten:
            assert float(rows[k].abs().max()) == 0.0  # retained speakers' rows are left alone
        else:  # as long as the row, against the forgotten speakers' mean direction
            assert torch.allclose(rows[k], weight[k].norm() * u, atol=1e-6)
    assert torch.linalg.matrix_rank(rows, rtol=1e-5).item() == 1  # one direction for every forgotten row

    def worst_cosine(a: float) -> float:  # the forgotten rows' highest cosine with a forgotten speaker's direction
        after = torch.nn.functional.normalize(weight - a * rows, dim=1)[forgotten]
        return float((after @ torch.stack(list(dirs.values()), 1)).max())

    cosines = [worst_cosine(a) for a in (0.0, 1.0, 4.0, 16.0, 64.0)]
    assert cosines == sorted(cosines, reverse=True) and cosines[-1] < 0 < cosines[0]  # monotone, then against all
    finetuned = ExtractConfig(kind="finetune", steps=1)
    assert forgotten_rows(adapter, forget, union, finetuned) is union  # gradient task vectors only
    one = [r for r in forget if r["spk_id"] == forget[0]["spk_id"]]
    assert forgotten_rows(adapter, one, union, cfg) is union  # one speaker: its own direction is enough


def test_one_request_and_a_batch_are_judged_speaker_by_speaker(trained, parts):
    forget, retain = parts
    res = unlearn(
        trained, forget=forget, retain=retain, method="qr-erase", scope="head", out=None, device="cpu", progress=False
    )  # the default rule: "auto"
    _judged_per_speaker(res.report, res.adapter, forget)
    assert res.report["verdict"].startswith("rule met")  # every forgotten speaker, not only the pooled audio
    assert res.report["config"]["sweep_max_relative"] == pytest.approx(32.768)  # a cosine head needs edits > its norm
    sets = [[r for r in forget if r["spk_id"] == s] for s in sorted({r["spk_id"] for r in forget})]
    batch = unlearn(
        trained,
        forget=sets,
        batch=True,
        retain=retain,
        method="qr-erase",
        scope="head",
        out=None,
        device="cpu",
        progress=False,
    )
    assert batch.report["batch"]["union_items"] == len(forget)
    _judged_per_speaker(batch.report, batch.adapter, forget)
    assert batch.report["verdict"].startswith("rule met")


def test_speakers_forgotten_earlier_count_as_forgotten(trained, parts):
    import numpy as np

    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter

    forget, _ = parts
    original = SpeakerAdapter.load(trained, device="cpu")
    first = forget[0]["spk_id"]
    mine = [r for r in forget if r["spk_id"] == first]
    pred = score_rows(original, mine, desc=None).predictions
    for earlier in ([], [s for s in original.speakers if s != first][:2]):
        measure = forgotten_error_rate.with_earlier(earlier)
        gone = [original.index[first]] + [original.index[s] for s in earlier]
        assert measure(original, mine) == pytest.approx(float(np.mean(~np.isin(pred, gone))))
    assert forgotten_error_rate.with_earlier([first]).__name__ == "worst_speaker_error_rate"
    with pytest.raises(ValueError, match="not classes of the model"):
        forgotten_rates(original, mine, also_forgotten=["no-such-speaker"])


def test_a_later_request_is_judged_with_the_speakers_earlier_requests_forgot(trained, parts, tmp_path):
    from mmunlearn.eval.speaker import WorstSpeakerErrorRate
    from mmunlearn.methods.rule import SweepRule
    from mmunlearn.requests import read_history, widened_rule

    forget, retain = parts
    a, b, c = sorted({r["spk_id"] for r in forget})
    gone = [r for r in forget if r["spk_id"] in (a, c)]  # request 1: two speakers (their rows, see above)
    first = unlearn(
        trained,
        forget=gone,
        retain=retain,
        method="qr-erase",
        scope="head",
        out=tmp_path / "r1",
        device="cpu",
        progress=False,
    )
    assert "earlier_forgotten_speakers" not in first.report and first.report["verdict"].startswith("rule met")
    every_other = [s for s in first.adapter.speakers if s not in (a, c)]
    assert forgotten_error_rate(first.adapter, gone) >= first.report["rule"]["forget_target"]  # their audio elsewhere
    assert forgotten_error_rate.with_earlier(every_other)(first.adapter, gone) == 0.0  # ... on speakers now gone
    second_rows = [r for r in forget if r["spk_id"] == b]
    second = unlearn(
        tmp_path / "r1",
        forget=second_rows,
        retain=retain,
        method="qr-erase",
        scope="head",
        out=tmp_path / "r2",
        device="cpu",
        progress=False,
    )
    assert second.report["earlier_forgotten_speakers"] == [a, c]
    assert second.report["earlier_directions"] == [a, c]  # their original rows, from r1's undo patch
    history = read_history(tmp_path / "r2")
    assert [r["forget_speakers"] for r in history.requests] == [[a, c], [b]]
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter
    from mmunlearn.requests.history import original_tensor

    now = second.adapter.model.classifier.weight.detach()
    before = SpeakerAdapter.load(trained, device="cpu").model.classifier.weight.detach()
    assert not torch.equal(now, before)
    assert torch.equal(original_tensor(history, HEAD_WEIGHT, now), before)  # walked back through both patches
    assert original_tensor(history, HEAD_WEIGHT, before) is None  # not the weights the last request wrote
    wide = forgotten_rates(second.adapter, second_rows, also_forgotten=[a, c])
    assert second.report["rule"]["forget"] == pytest.approx(min(wide.values()))  # measured with speaker a gone
    rule = SweepRule(forget_target=0.5, retain_bound=0.1, forget_measure=forgotten_error_rate)
    widened = widened_rule(rule, [a])
    assert isinstance(widened.forget_measure, WorstSpeakerErrorRate) and widened.forget_measure.also_forgotten == (a,)
    assert rule.forget_measure.also_forgotten == ()  # the caller's rule is left as it was
    other = SweepRule(forget_target=0.5, retain_bound=0.1)  # a rule of the caller's own measures stays as given
    assert widened_rule(other, [a]) is other and widened_rule(None, [a]) is None and widened_rule(rule, []) is rule


def test_rows_of_speakers_forgotten_earlier_are_turned_away_from_this_requests_audio(trained, parts):
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter
    from mmunlearn.methods.head_rows import forgotten_rows, speaker_directions
    from mmunlearn.taskvec.extract import ExtractConfig, extract_task_matrices

    forget, _ = parts
    adapter = SpeakerAdapter.load(trained, device="cpu")
    adapter.scope = "head"
    a, b, c = sorted({r["spk_id"] for r in forget})
    mine = [r for r in forget if r["spk_id"] == b]
    cfg = ExtractConfig(kind="gradient", lr=1.0)
    tf = extract_task_matrices(adapter, mine, cfg, progress=False)
    assert forgotten_rows(adapter, mine, tf, cfg) is tf  # one speaker and nobody forgotten before: its own direction
    weight = adapter.model.classifier.weight.detach().double()
    own = speaker_directions(adapter, mine)[b]
    stand_in = weight[adapter.index[a]] * 3.0  # any length: only its direction joins u
    for earlier, u in (
        ([a, c, b], own),  # names only: this request's audio gives u
        ({a: stand_in, c: None}, own + stand_in / stand_in.norm()),
    ):
        edited = forgotten_rows(adapter, mine, tf, cfg, earlier=earlier)
        assert edited.meta["forgotten_rows"] == [a, b, c]
        assert edited.meta["earlier_directions"] == ([a] if isinstance(earlier, dict) else [])
        u = u / u.norm()
        rows = edited[HEAD_WEIGHT].double()
        for k in range(weight.shape[0]):
            if adapter.speakers[k] in (a, b, c):
                assert torch.allclose(rows[k], weight[k].norm() * u, atol=1e-6)
            else:
                assert float(rows[k].abs().max()) == 0.0
    with pytest.raises(ValueError, match="not classes of the model"):
        forgotten_rows(adapter, mine, tf, cfg, earlier=["no-such-speaker"])


def test_a_history_whose_forget_speakers_are_not_speaker_ids_is_refused(tmp_path):
    from mmunlearn.requests.history import History
    from mmunlearn.requests.service import earlier_speakers

    good = History(tmp_path, [{"index": 1, "forget_speakers": ["b", "a"]}, {"index": 2}])  # an older record: none
    assert earlier_speakers(good) == ["a", "b"] and earlier_speakers(None) == []
    for bad in ("ab", [1, 2], {"a": 1}):
        with pytest.raises(ValueError, match="forget_speakers is not a list"):
            earlier_speakers(History(tmp_path, [{"index": 1, "forget_speakers": bad}]))
