"""Split logic and manifest I/O as plain functions: sizes by hand, invariants, seeding, and clear errors."""

import pytest

from mmunlearn.data.manifest import (
    MANIFEST_COLUMNS,
    ManifestError,
    Utterance,
    choose_forget_speakers,
    make_splits,
    read_manifest,
    segment_rows,
    select_speakers,
    write_manifest,
)


def corpus(n_spk=5, n_vid=5, n_utt=4):
    return [
        Utterance(f"id{s:05d}", f"vid{v}", f"{u:05d}", f"/a/{s}/{v}/{u}.wav", 32000)
        for s in range(n_spk)
        for v in range(n_vid)
        for u in range(n_utt)
    ]


def test_make_splits_sizes_and_invariants():
    utts = corpus()
    splits, info = make_splits(utts, ["id00001"], forget_fraction=0.25, test_video_fraction=0.2, seed=3)
    ids = {k: {u.id for u in v} for k, v in splits.items()}
    # per speaker: 1 of 5 videos is test (4 utts); 16 train utts; k = round(0.25 * 16) = 4
    assert {k: len(v) for k, v in ids.items()} == {
        "spk_forget_train": 16,
        "spk_forget_test": 4,
        "spk_retain_train": 4 * 12,
        "spk_retain_test": 4 * 4,
        "sample_holdout": 4 * 4,
        "sample_forget": 4 * 4,
        "sample_retain": 16 + 4 * 8,
        "train": 16 + 4 * 12,
    }
    primary = ["spk_forget_train", "spk_forget_test", "spk_retain_train", "spk_retain_test", "sample_holdout"]
    assert sum(len(ids[k]) for k in primary) == len(set().union(*(ids[k] for k in primary))) == len(utts)
    assert ids["sample_forget"] <= ids["spk_retain_train"]
    assert not ids["sample_holdout"] & ids["train"]
    for spk, test_videos in info["test_videos"].items():
        assert len(test_videos) == 1
        train_videos = {u.video for u in splits["train"] if u.spk_id == spk}
        assert not train_videos & set(test_videos) and len(train_videos) == 4
    for spk in ("id00000", "id00002"):  # holdout is balanced per speaker with the forget samples
        n = [sum(u.spk_id == spk for u in splits[k]) for k in ("sample_forget", "sample_holdout")]
        assert n == [4, 4]


def test_make_splits_seeded_and_edge_cases():
    utts = corpus()
    a, _ = make_splits(utts, ["id00001"], 0.25, 0.2, seed=0)
    b, _ = make_splits(utts, ["id00001"], 0.25, 0.2, seed=0)
    c, _ = make_splits(utts, ["id00001"], 0.25, 0.2, seed=1)
    assert a == b and a["sample_forget"] != c["sample_forget"]
    # one video only: no test part; tiny fraction still forgets one utterance
    one, info = make_splits(corpus(2, 1, 3), ["id00000"], forget_fraction=0.01, seed=0)
    assert info["speakers_without_test_video"] == ["id00000", "id00001"]
    assert len(one["spk_retain_test"]) == 0 and len(one["sample_forget"]) == len(one["sample_holdout"]) == 1
    with pytest.raises(ValueError, match="forget_fraction"):
        make_splits(utts, ["id00001"], forget_fraction=0.6)
    with pytest.raises(ValueError, match="no utterances"):
        make_splits(utts, ["id09999"])
    with pytest.raises(ValueError, match="not unique"):
        make_splits(utts + utts[:1], ["id00001"])


def test_speaker_choice():
    spks = [f"id{i:05d}" for i in range(10)]
    assert select_speakers(spks, 0, 0) == spks
    sub = select_speakers(spks, 4, 0, keep=["id00009"])
    assert len(sub) == 4 and "id00009" in sub and sub == select_speakers(spks, 4, 0, keep=["id00009"])
    assert len({tuple(select_speakers(spks, 4, s)) for s in range(6)}) > 1
    with pytest.raises(ValueError, match="not found"):
        select_speakers(spks, 4, 0, keep=["id99999"])
    assert len(choose_forget_speakers(spks, 3, 0)) == 3
    assert choose_forget_speakers(spks, ["id00004", "id00002"], 0) == ["id00002", "id00004"]
    with pytest.raises(ValueError, match=r"\[1, 9\]"):
        choose_forget_speakers(spks, 10, 0)
    with pytest.raises(ValueError, match="retained"):
        choose_forget_speakers(spks[:2], spks[:2], 0)


def test_segment_rows_by_hand():
    u = Utterance("id1", "v", "00001", "/x.wav", 16000 * 3 + 500, {"gender": "f"})
    assert [(r["start"], r["stop"]) for r in segment_rows(u, 16000, 1.0)] == [
        (0, 16000),
        (16000, 32000),
        (32000, 48000),
    ]
    assert segment_rows(u, 16000, 1.0)[1]["ID"] == "id1--v--00001_16000_32000"
    (whole,) = segment_rows(u, 16000, 0.0)
    assert whole == {
        "ID": "id1--v--00001",
        "duration": 3.03125,
        "wav": "/x.wav",
        "start": 0,
        "stop": 48500,
        "spk_id": "id1",
        "gender": "f",
    }
    assert [(r["start"], r["stop"]) for r in segment_rows(u, 16000, 5.0)] == [(0, 48500)]  # shorter: whole


def test_manifest_roundtrip_and_errors(tmp_path):
    rows = [
        {"ID": "a", "duration": 1.5, "wav": "/w/a.wav", "start": 0, "stop": 24000, "spk_id": "s1", "text": "hi, there"}
    ]
    path = write_manifest(tmp_path / "m.csv", rows)
    assert read_manifest(path) == rows
    assert [p.name for p in tmp_path.iterdir()] == ["m.csv"]
    with pytest.raises(ManifestError, match="lacks"):
        write_manifest(tmp_path / "n.csv", [{"ID": "a"}])
    assert not (tmp_path / "n.csv").exists()
    with pytest.raises(ManifestError, match="nope.csv: manifest not found"):
        read_manifest(tmp_path / "nope.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("ID,duration,wav,start\na,1.0,/w.wav,0\n")
    with pytest.raises(ManifestError, match=r"bad.csv: missing column\(s\) \['stop', 'spk_id'\]"):
        read_manifest(bad)
    header = ",".join(MANIFEST_COLUMNS)
    for body, msg in [
        ("a,1.0,/w.wav,zero,10,s", "'start' value 'zero' is not int"),
        ("a,1.0,/w.wav,0,10,s\na,1.0,/w.wav,0,10,s", "bad.csv:3: duplicate ID 'a'"),
        ("a,1.0,/w.wav,10,10,s", "stop 10 <= start 10"),
        ("a,1.0,/w.wav,0,10", "wrong number of fields"),
    ]:
        bad.write_text(f"{header}\n{body}\n")
        with pytest.raises(ManifestError, match=msg):
            read_manifest(bad)
