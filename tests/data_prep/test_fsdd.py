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
    return prepare_fsdd(
        FSDD, out, speakers=3, max_utterances=10, forget_speakers=1, forget_fraction=0.2, progress=False, jobs=2
    )


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
    assert (
        all(
            (r["spk_id"], r["ID"].split("--")[1]) not in train_videos
            for n in ("spk_forget_test", "spk_retain_test")
            for r in rows[n]
        )
        and test_videos
    )
    again = prepare_fsdd(
        FSDD, fsdd_slice.out, speakers=3, max_utterances=10, forget_speakers=1, forget_fraction=0.2, progress=False
    )
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

    from mmunlearn.adapters.speaker.training import train_speaker_classifier, training_rows

    torch.set_num_threads(1)
    rows, speakers = training_rows(fsdd_slice.out)
    adapter, _ = train_speaker_classifier(
        rows, speakers=speakers, preset="tiny", epochs=6, batch_size=8, lr=1e-2, device="cpu", progress=False
    )
    with torch.no_grad():
        alone = torch.cat([torch.softmax(adapter.logits(adapter.collate([r])), -1) for r in rows])
        shuffled = torch.randperm(len(rows), generator=torch.Generator().manual_seed(0))
        in_batches = torch.empty_like(alone)
        for chunk in shuffled.split(7):
            in_batches[chunk] = torch.softmax(adapter.logits(adapter.collate([rows[i] for i in chunk])), -1)
    assert (in_batches - alone).abs().max() < 1e-3
    sb = EncoderClassifier.from_hparams(
        source=str(adapter.save(tmp_path / "model")), savedir=str(tmp_path / "sb"), run_opts={"device": "cpu"}
    )
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
        prepare_corpus(root, tmp_path / "n", pattern=r"(?P<spk>[^/]+)/(?P<utt>[^/]+/[^/]+)\.wav", progress=False)
    with pytest.raises(ValueError, match="needs a named group"):
        compile_pattern(r"(?P<speaker>[^/]+)/.*")
    shutil.rmtree(tmp_path / "m")


def _noise_corpus(root: Path, speakers, seconds: dict, sessions=("s1", "s2")) -> None:
    import numpy as np
    import soundfile as sf

    rng = np.random.default_rng(0)
    for spk in speakers:
        for session in sessions:
            for k, sec in enumerate(seconds[spk]):
                path = root / spk / session / f"u{k}.wav"
                path.parent.mkdir(parents=True, exist_ok=True)
                sf.write(path, (0.1 * rng.standard_normal(int(sec * 16000))).astype("float32"), 16000)


def test_segment_seconds_cuts_long_files_and_reports_the_dropped_audio(tmp_path):
    from typer.testing import CliRunner

    from data_prep.fsdd import app

    speakers = ("ann", "bob", "cy", "dee", "eve")
    _noise_corpus(tmp_path / "c", speakers, {s: (7.5, 2.0) for s in speakers})  # 7.5 s -> 2 x 3 s + 1.5 dropped
    res = CliRunner().invoke(
        app,
        [
            "--root",
            str(tmp_path / "c"),
            "--out",
            str(tmp_path / "m"),
            "--corpus",
            "pattern",
            "--segment-seconds",
            "3",
            "--forget-speakers",
            "1",
            "--forget-fraction",
            "0",
        ],
    )
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "m" / "prepare_report.json").read_text())
    rows = (
        read_manifest(tmp_path / "m" / "train.csv")
        + read_manifest(tmp_path / "m" / "spk_retain_test.csv")
        + read_manifest(tmp_path / "m" / "spk_forget_test.csv")
    )
    long_rows = [r for r in rows if r["ID"].split("--")[2].startswith("u0")]
    assert len(long_rows) == 2 * 10 and all(r["stop"] - r["start"] == 48000 for r in long_rows)
    assert sum(1 for r in rows if r["ID"].split("--")[2].startswith("u1")) == 10  # a 2 s file stays whole
    assert rep["segments"]["dropped_seconds"] == pytest.approx(10 * 1.5, abs=0.01)  # 1.5 s of each 7.5 s file
    assert rep["segments"]["dropped_fraction"] == pytest.approx(15 / 95, abs=1e-3)
    assert "15.0 s of audio dropped" in res.output and rep["warnings"] == []


def test_category_folders_and_few_speakers_draw_a_warning(tmp_path, caplog):
    from data_prep.voxceleb2 import speaker_warnings

    _noise_corpus(
        tmp_path / "c", ("female_audio", "male_audio"), {"female_audio": (1.0,) * 3, "male_audio": (1.0,) * 3}
    )
    res = prepare_corpus(tmp_path / "c", tmp_path / "m", forget_speakers=1, forget_fraction=0.0, progress=False)
    warnings = res.report["warnings"]
    assert len(warnings) == 2 and "only 2 speaker(s)" in warnings[0] and "female_audio" in warnings[1]
    assert "look like category folders" in caplog.text
    assert speaker_warnings(["id00012", "id00015", "theo", "jackson", "nicolas"]) == []
    assert len(speaker_warnings(["train", "p1", "p2", "p3", "p4"])) == 1  # a category name among five


def test_the_report_records_that_the_original_training_set_depends_on_the_forget_speakers(tmp_path):
    speakers = ("ann", "bob", "cy", "dee", "eve")
    _noise_corpus(tmp_path / "c", speakers, {s: (1.0,) * 4 for s in speakers})
    one = prepare_corpus(tmp_path / "c", tmp_path / "a", forget_speakers=["ann"], progress=False).report
    two = prepare_corpus(tmp_path / "c", tmp_path / "b", forget_speakers=["bob"], progress=False).report
    train = {n: {r["ID"] for r in read_manifest(tmp_path / n / "train.csv")} for n in ("a", "b")}
    assert train["a"] != train["b"]  # the holdout comes from retained speakers only ...
    for report, name in ((one, "a"), (two, "b")):
        assert report["original_training"]["depends_on_forget_speakers"] is True  # ... and the report says so
        assert report["original_training"]["utterances"] == len(train[name])
