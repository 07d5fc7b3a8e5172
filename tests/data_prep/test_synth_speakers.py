"""The built-in espeak-ng corpus: VoxCeleb2 layout, meta/transcripts, byte-identical per seed,
distinct voices, re-runnable."""

import csv
import hashlib
import os
import re

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from data_prep.synth_speakers import STAMP_NAME, app, make_sentence, synthesize_corpus


def digests(root):
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def wav_digests(root):
    return {k: v for k, v in digests(root).items() if k.endswith(".wav")}


def median_f0(x: np.ndarray, sr: int = 16000) -> float:
    """Autocorrelation pitch of the loud 40 ms frames, 60-400 Hz."""
    n, lo, hi, f0 = int(0.04 * sr), sr // 400, sr // 60, []
    for i in range(0, len(x) - n, n // 2):
        fr = x[i : i + n] - x[i : i + n].mean()
        if np.sqrt(np.mean(fr**2)) < 0.03 * np.abs(x).max():
            continue
        ac = np.correlate(fr, fr, "full")[n - 1 :]
        lag = lo + int(np.argmax(ac[lo:hi]))
        if ac[lag] > 0.5 * ac[0]:
            f0.append(sr / lag)
    return float(np.median(f0))


def test_layout_meta_and_transcripts(corpus):
    wavs = sorted(corpus.glob("dev/aac/*/*/*.wav"))
    assert len(wavs) == 4 * 6
    for w in wavs:
        spk, video, name = w.parts[-3:]
        assert re.fullmatch(r"id\d{5}", spk) and re.fullmatch(r"[A-Za-z0-9_-]{11}", video)
        assert re.fullmatch(r"\d{5}\.wav", name)
    per_spk = {s.name: sorted(v.name for v in s.iterdir()) for s in (corpus / "dev/aac").iterdir()}
    assert sorted(per_spk) == ["id00001", "id00002", "id00003", "id00004"]
    assert all(len(v) == 2 for v in per_spk.values())
    for video in (corpus / "dev/aac/id00001").iterdir():  # 6 utterances over 2 videos: 3 + 3
        assert sorted(p.name for p in video.iterdir()) == ["00001.wav", "00002.wav", "00003.wav"]
    info = sf.info(wavs[0])
    assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
    assert 1.0 < info.duration < 8.0

    with open(corpus / "vox2_meta.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert [h.strip() for h in rows[0]] == ["VoxCeleb2 ID", "VGGFace2 ID", "Gender", "Set"]
    assert rows[0][0] != rows[0][0].strip()  # the real file's stray spaces are kept
    assert [(r[0].strip(), r[2].strip(), r[3].strip()) for r in rows[1:]] == [
        ("id00001", "m", "dev"),
        ("id00002", "f", "dev"),
        ("id00003", "m", "dev"),
        ("id00004", "f", "dev"),
    ]

    with open(corpus / "transcripts.csv", newline="") as fh:
        trans = list(csv.DictReader(fh))
    assert len(trans) == 24 and len({t["ID"] for t in trans}) == 24
    assert {(corpus / t["wav"]) for t in trans} == set(wavs)
    for t in trans:
        assert t["ID"] == f"{t['spk_id']}--{t['video']}--{t['utterance']}"
        assert t["text"][0].isupper() and t["text"].endswith(".") and len(t["text"].split()) >= 6


def test_same_seed_identical_bytes_other_seed_differs_and_rebuild_in_place(corpus, tmp_path):
    again = synthesize_corpus(tmp_path / "b", 4, 6, 2, seed=0, jobs=1, progress=False)
    assert digests(again) == digests(corpus)  # a fresh process per speaker: byte-identical, any jobs

    synthesize_corpus(tmp_path / "b", 4, 6, 2, seed=1, progress=False)  # other options: rebuilt in place
    other = wav_digests(tmp_path / "b")
    assert len(other) == 24 and not set(other.values()) & set(wav_digests(corpus).values())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no temp or old folders left behind

    stamp = tmp_path / "b" / STAMP_NAME
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "b").rglob("*") if p.is_file()}
    synthesize_corpus(tmp_path / "b", 4, 6, 2, seed=1, progress=False)  # same options: skipped
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "b").rglob("*") if p.is_file()} == before
    assert '"seed": 1' in stamp.read_text()


def test_voices_differ_between_speakers_and_hold_within(corpus):
    f0 = {
        spk: [median_f0(sf.read(p)[0]) for p in sorted((corpus / "dev/aac" / spk).rglob("*.wav"))]
        for spk in ("id00001", "id00002")
    }  # id00001 is a male voice, id00002 a female one
    assert np.median(f0["id00002"]) > 1.5 * np.median(f0["id00001"])
    for values in f0.values():  # a speaker's pitch is stable across utterances and videos
        assert max(values) < 1.3 * min(values)


def test_sentences_are_seeded():
    import random

    a = [make_sentence(random.Random(3)) for _ in range(2)]
    assert a[0] == a[1]
    assert len({make_sentence(random.Random(s)) for s in range(20)}) > 15


def test_refuses_foreign_folder_and_bad_options(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="refusing"):
        synthesize_corpus(tmp_path / "mine", 1, 1, 1, progress=False)
    assert (tmp_path / "mine" / "thesis.txt").read_text() == "keep me"
    with pytest.raises(ValueError, match="must be >= videos"):
        synthesize_corpus(tmp_path / "x", 2, 2, 3, progress=False)
    with pytest.raises(ValueError, match="speakers must be >= 1"):
        synthesize_corpus(tmp_path / "x", 0, 2, 1, progress=False)
    assert not (tmp_path / "x").exists()


def test_cli_help_and_run(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0
    for opt in ("--out", "--speakers", "--utterances", "--videos", "--seed", "--jobs"):
        assert opt in res.output
    args = ["--out", str(tmp_path / "c"), "--speakers", "1", "--utterances", "2", "--videos", "1", "--seed", "5"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "written" in res.output and len(list((tmp_path / "c").rglob("*.wav"))) == 2
    res = runner.invoke(app, args)
    assert res.exit_code == 0 and "up to date" in res.output
    assert os.path.isfile(tmp_path / "c" / STAMP_NAME)
