"""FSDD (real speech, read from ../shared/data/fsdd beside the repository; skipped when absent) and pattern corpora."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from data_prep.fsdd import FOLDER_PATTERN, compile_pattern, prepare_corpus, prepare_fsdd, scan_pattern
from data_prep.voxceleb2 import ShortfallError
from mmunlearn.data.manifest import read_manifest

FSDD = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "fsdd"
needs_fsdd = pytest.mark.skipif(not (FSDD / "recordings").is_dir(), reason="FSDD not found at ../shared/data/fsdd")


@pytest.fixture(scope="module")
def fsdd_slice(tmp_path_factory):
    """3 speakers x 10 drawn files of FSDD, prepared with 1 forget speaker."""
    out = tmp_path_factory.mktemp("fsdd") / "m"
    return prepare_fsdd(FSDD, out, speakers=3, max_utterances=10, forget_speakers=1, forget_fraction=0.2,
                        progress=False, jobs=2)


@needs_fsdd
def test_fsdd_slice_splits_by_take_group_and_reruns_skip(fsdd_slice):
    rep = fsdd_slice.report
    assert rep["files_selected"] == 30 and rep["too_short"] == [] and rep["shortfalls"] == []
    assert set(rep["per_speaker"]) <= {"george", "jackson", "lucas", "nicolas", "theo", "yweweler"}
    assert all(c["files"] == 10 for c in rep["per_speaker"].values())
    rows = {n: read_manifest(p) for n, p in fsdd_slice.manifests.items()}
    for r in rows["train"]:  # 16 kHz copies of the 8 kHz originals, one take group per "video"
        spk, video, utt = r["ID"].split("--")
        digit, name, take = utt.split("_")
        assert name == spk == r["spk_id"] and video == f"takes{int(take) // 10:02d}"
        assert r["text"] == ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")[int(digit)]
        assert r["stop"] == round(r["duration"] * 16000) or abs(r["stop"] / 16000 - r["duration"]) < 1e-3
    test_videos = {r["ID"].split("--")[1] for n in ("spk_forget_test", "spk_retain_test") for r in rows[n]}
    train_videos = {(r["spk_id"], r["ID"].split("--")[1]) for r in rows["train"]}
    assert all((r["spk_id"], r["ID"].split("--")[1]) not in train_videos
               for n in ("spk_forget_test", "spk_retain_test") for r in rows[n]) and test_videos
    again = prepare_fsdd(FSDD, fsdd_slice.out, speakers=3, max_utterances=10, forget_speakers=1,
                         forget_fraction=0.2, progress=False)
    assert again.skipped and again.report == json.loads((fsdd_slice.out / "prepare_report.json").read_text())


@needs_fsdd
def test_shortfalls_stop_unless_allowed(tmp_path):
    with pytest.raises(ShortfallError, match="7 speakers asked for, 6 found"):
        prepare_fsdd(FSDD, tmp_path / "a", speakers=7, max_utterances=4, progress=False)
    with pytest.raises(ShortfallError, match="shorter than 5.0 s"):  # VoxCeleb-style filters drop nearly all
        prepare_fsdd(FSDD, tmp_path / "b", speakers=2, max_utterances=4, min_duration=5.0, progress=False)
    assert not (tmp_path / "a" / "train.csv").exists()
    res = prepare_fsdd(FSDD, tmp_path / "a", speakers=7, max_utterances=4, progress=False, allow_fewer=True)
    assert res.report["shortfalls"][0] == "7 speakers asked for, 6 found" and len(res.report["per_speaker"]) == 6


@needs_fsdd
def test_a_classifier_trained_on_real_speech_scores_alike_alone_in_batches_and_in_speechbrain(fsdd_slice, tmp_path):
    from speechbrain.inference.speaker import EncoderClassifier

    from mmunlearn.speech.speaker_training import train_speaker_classifier, training_rows

    torch.set_num_threads(1)
    rows, speakers = training_rows(fsdd_slice.out)
    adapter, _ = train_speaker_classifier(rows, speakers=speakers, preset="tiny", epochs=6, batch_size=8, lr=1e-2,
                                          device="cpu", progress=False)
    with torch.no_grad():
        alone = torch.cat([torch.softmax(adapter.logits(adapter.collate([r])), -1) for r in rows])
        shuffled = torch.randperm(len(rows), generator=torch.Generator().manual_seed(0))
        in_batches = torch.empty_like(alone)
        for chunk in shuffled.split(7):
            in_batches[chunk] = torch.softmax(adapter.logits(adapter.collate([rows[i] for i in chunk])), -1)
    assert (in_batches - alone).abs().max() < 1e-3
    sb = EncoderClassifier.from_hparams(source=str(adapter.save(tmp_path / "model")), savedir=str(tmp_path / "sb"),
                                        run_opts={"device": "cpu"})
    for i in range(0, len(rows), 6):  # SpeechBrain decodes the saved 16 kHz file itself
        _, _, _, label = sb.classify_file(rows[i]["wav"])
        assert label == adapter.speaker_of([int(alone[i].argmax())])


def test_pattern_corpus_folders_per_speaker(tmp_path):
    import numpy as np
    import soundfile as sf

    root = tmp_path / "corpus"
    rng = np.random.default_rng(0)
    for spk in ("ann", "bob", "cy"):
        for session in ("s1", "s2"):
            for k in range(3):
                path = root / spk / session / f"u{k}.wav"
                path.parent.mkdir(parents=True, exist_ok=True)
                sf.write(path, (0.1 * rng.standard_normal(8000 + 800 * k)).astype("float32"), 16000)
    (root / "bob" / "notes.txt").write_text("not audio")
    sources = scan_pattern(root, FOLDER_PATTERN)
    assert len(sources) == 18 and {s.video for s in sources} == {"s1", "s2"}
    res = prepare_corpus(root, tmp_path / "m", forget_speakers=["cy"], progress=False)
    assert res.report["forget_speakers"] == ["cy"] and res.report["counts"]["spk_forget_test"]["utterances"] == 3
    with pytest.raises(ShortfallError, match="single video"):  # no sessions: nothing to test on
        prepare_corpus(root, tmp_path / "n", pattern=r"(?P<spk>[^/]+)/(?P<utt>[^/]+/[^/]+)\.wav",
                       progress=False)
    with pytest.raises(ValueError, match="needs a named group"):
        compile_pattern(r"(?P<speaker>[^/]+)/.*")
    shutil.rmtree(tmp_path / "m")
