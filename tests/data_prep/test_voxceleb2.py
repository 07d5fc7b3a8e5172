"""VoxCeleb2 prepare on a tiny tree of m4a + wav files: disjoint splits in the promised sizes,
report of bad files, skip/rebuild."""

import csv
import shutil

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from data_prep.voxceleb2 import ShortfallError, app, prepare, read_vox_meta, scan_voxceleb
from mmunlearn.data.audio import read_audio
from mmunlearn.data.manifest import MANIFEST_COLUMNS, SPLIT_NAMES, read_manifest
from tests.data_prep.audio_files import write_m4a

PRIMARY = ("spk_forget_train", "spk_forget_test", "spk_retain_train", "spk_retain_test", "sample_holdout")


@pytest.fixture(scope="module")
def tree(corpus, tmp_path_factory):
    """The synthetic corpus with id00001/id00002 as m4a (like VoxCeleb2), plus a corrupt m4a and a silent wav."""
    root = tmp_path_factory.mktemp("vox2") / "vox2"
    shutil.copytree(corpus, root)
    for wav in sorted(root.glob("dev/aac/id0000[12]/*/*.wav")):
        audio, sr = sf.read(wav, dtype="float32")
        write_m4a(wav.with_suffix(".m4a"), audio, sr)
        wav.unlink()
    video = sorted((root / "dev/aac/id00003").iterdir())[0]
    (video / "00099.m4a").write_bytes(b"this is not an mp4 file" * 40)
    sf.write(sorted((root / "dev/aac/id00004").iterdir())[1] / "00098.wav", np.zeros(32000, np.float32), 16000)
    return root


def ids(rows):
    return {r["ID"] for r in rows}


def load(res):
    return {name: read_manifest(path) for name, path in res.manifests.items()}


def test_scan_and_meta(tree):
    sources, dups = scan_voxceleb(tree)
    assert len(sources) == 26 and dups == 0
    assert {s.path.rsplit(".", 1)[1] for s in sources if s.spk_id in ("id00001", "id00002")} == {"m4a"}
    meta = read_vox_meta(tree / "vox2_meta.csv")
    assert meta["id00002"] == {"vggface2_id": "n000002", "gender": "f", "set": "dev"}
    bad = tree.parent / "bad_meta.csv"
    bad.write_text("Speaker ,Gender \nid00001 ,m \n")
    with pytest.raises(ValueError, match="bad_meta.csv: no 'VoxCeleb2 ID' column"):
        read_vox_meta(bad)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        scan_voxceleb(tree / "nope")


def test_prepare_splits_are_disjoint_and_sized(tree, tmp_path):
    res = prepare(tree, tmp_path / "out", forget_speakers=1, forget_fraction=0.34, seed=0, progress=False)
    m = load(res)
    rep = res.report
    assert sorted(f["path"].rsplit("/", 1)[1] for f in rep["failed"]) == ["00098.wav", "00099.m4a"]
    reasons = " ".join(f["reason"] for f in rep["failed"])
    assert "unreadable" in reasons and "silent" in reasons
    (forget,) = rep["forget_speakers"]
    retain = set(rep["retain_speakers"])
    assert retain == {"id00001", "id00002", "id00003", "id00004"} - {forget}

    # the five primary splits partition the 24 good utterances
    for i, a in enumerate(PRIMARY):
        for b in PRIMARY[i + 1 :]:
            assert not ids(m[a]) & ids(m[b]), (a, b)
    assert len(set().union(*(ids(m[n]) for n in PRIMARY))) == 24
    # 3 utterances per video, 2 videos: 1 train + 1 test video; k = round(0.34 * 3) = 1
    sizes = {n: len(m[n]) for n in SPLIT_NAMES}
    assert sizes == {
        "spk_forget_train": 3,
        "spk_forget_test": 3,
        "spk_retain_train": 6,
        "spk_retain_test": 9,
        "sample_holdout": 3,
        "sample_forget": 3,
        "sample_retain": 6,
        "train": 9,
    }
    assert {n: c["utterances"] for n, c in rep["counts"].items()} == sizes

    def videos(rows):
        return {(r["spk_id"], r["ID"].split("--")[1]) for r in rows}

    assert not videos(m["spk_forget_test"]) & videos(m["train"]) and not videos(m["spk_retain_test"]) & videos(
        m["train"]
    )
    assert {r["spk_id"] for r in m["spk_forget_train"] + m["spk_forget_test"]} == {forget}
    for name in ("spk_retain_train", "spk_retain_test", "sample_forget", "sample_holdout"):
        assert {r["spk_id"] for r in m[name]} == retain, name
    assert ids(m["sample_forget"]) <= ids(m["spk_retain_train"])
    assert not ids(m["sample_holdout"]) & (ids(m["train"]) | ids(m["sample_retain"]))
    assert ids(m["train"]) == ids(m["spk_forget_train"]) | ids(m["spk_retain_train"])
    assert ids(m["sample_retain"]) == ids(m["train"]) - ids(m["sample_forget"])
    # holdout comes from the same (training) videos as the forget samples
    assert videos(m["sample_holdout"]) <= videos(m["train"])

    rows = [r for n in PRIMARY for r in m[n]]
    with open(tree / "transcripts.csv", newline="") as fh:
        text = {t["ID"]: t["text"] for t in csv.DictReader(fh)}
    for r in rows:
        assert (
            r["wav"].startswith("/") and r["start"] == 0 and r["duration"] == pytest.approx(r["stop"] / 16000, abs=1e-4)
        )
        assert r["gender"] == ("m" if r["spk_id"] in ("id00001", "id00003") else "f")
        assert r["text"] == text[r["ID"]]
        if r["spk_id"] in ("id00001", "id00002"):  # m4a: converted once under out/wav
            assert r["wav"].startswith(str(tmp_path / "out" / "wav")) and r["wav"].endswith(".wav")
        else:  # 16 kHz mono wav: used in place
            assert r["wav"].startswith(str(tree))
    r = next(r for r in rows if r["spk_id"] == "id00001")
    assert read_audio(r["wav"]).size == r["stop"]
    with open(res.manifests["train"], newline="") as fh:
        assert next(csv.reader(fh)) == [*MANIFEST_COLUMNS, "gender", "text"]


def test_rerun_skips_and_new_options_rebuild_reusing_decodes(tree, tmp_path):
    out = tmp_path / "out"
    first = prepare(tree, out, forget_speakers=1, forget_fraction=0.34, progress=False)
    converted = {p: p.stat().st_mtime_ns for p in (out / "wav").rglob("*.wav")}
    assert len(converted) == 12
    stamp = (out / "prepare_stamp.json").read_text()
    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("*.csv")}
    again = prepare(tree, out, forget_speakers=1, forget_fraction=0.34, progress=False)
    assert again.skipped and not first.skipped
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.csv")} == mtimes

    changed = prepare(tree, out, forget_speakers=1, forget_fraction=0.0, progress=False)
    assert not changed.skipped and (out / "prepare_stamp.json").read_text() != stamp
    m = load(changed)
    assert m["sample_forget"] == [] and m["sample_holdout"] == [] and len(m["spk_retain_train"]) == 9
    assert {p: p.stat().st_mtime_ns for p in (out / "wav").rglob("*.wav")} == converted  # cache hit

    (tree / "dev/aac/id00003").joinpath("extra").mkdir()
    try:  # a new input file also invalidates the stamp
        shutil.copy(next((tree / "dev/aac/id00003").rglob("00001.wav")), tree / "dev/aac/id00003/extra/00001.wav")
        assert not prepare(tree, out, forget_speakers=1, forget_fraction=0.0, progress=False).skipped
    finally:
        shutil.rmtree(tree / "dev/aac/id00003/extra")


def test_speaker_subset_cap_explicit_forget_and_segments(tree, tmp_path):
    with pytest.raises(ShortfallError, match="fewer than --max-utterances 4 usable files: id00003 3, id00004 3"):
        prepare(
            tree,
            tmp_path / "o",
            speakers=3,
            forget_speakers=["id00004"],
            max_utterances=4,
            segment_seconds=1.0,
            forget_fraction=0.25,
            progress=False,
        )
    assert not (tmp_path / "o" / "train.csv").exists()
    res = prepare(
        tree,
        tmp_path / "o",
        speakers=3,
        forget_speakers=["id00004"],
        max_utterances=4,
        segment_seconds=1.0,
        forget_fraction=0.25,
        progress=False,
        allow_fewer=True,
    )
    assert res.report["shortfalls"] and res.report["per_speaker"]["id00004"]["files"] == 4
    m = load(res)
    assert res.report["forget_speakers"] == ["id00004"]
    assert res.report["files_selected"] == 3 * 4  # the cap applies before decoding
    spk = {r["spk_id"] for n in PRIMARY for r in m[n]}
    assert len(spk) == 3 and "id00004" in spk
    utts = {}
    for n in PRIMARY:
        for r in m[n]:
            assert r["stop"] - r["start"] == 16000 and r["start"] % 16000 == 0 and r["duration"] == 1.0
            assert "text" not in r  # no transcript for a segment
            utts.setdefault(r["ID"].rsplit("_", 2)[0], []).append(r)
    per_spk = {}
    for segs in utts.values():
        assert len(segs) == read_audio(segs[0]["wav"]).size // 16000
        per_spk[segs[0]["spk_id"]] = per_spk.get(segs[0]["spk_id"], 0) + 1
    assert all(v <= 4 for v in per_spk.values())
    # segments of one recording never straddle two splits
    owner = {}
    for n in PRIMARY:
        for r in m[n]:
            assert owner.setdefault(r["ID"].rsplit("_", 2)[0], n) == n


def test_cli_prepare_reports_bad_files(tree, tmp_path):
    runner = CliRunner()
    assert "--forget-speakers" in runner.invoke(app, ["prepare", "--help"]).output
    args = ["prepare", "--root", str(tree), "--out", str(tmp_path / "o"), "--forget-speakers", "id00001,id00003"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "00099.m4a" in res.output and "silent" in res.output and "'id00001', 'id00003'" in res.output
    assert "up to date" in runner.invoke(app, args).output
    bad = runner.invoke(
        app, ["prepare", "--root", str(tree), "--out", str(tmp_path / "p"), "--forget-speakers", "id09999"]
    )
    assert bad.exit_code != 0 and "id09999" in str(bad.exception)


def test_output_inside_root_is_not_rescanned(tree):
    out = tree / "prepared"
    try:
        first = prepare(tree, out, forget_speakers=1, progress=False)
        second = prepare(tree, out, forget_speakers=2, progress=False)  # out/wav/idNNNNN/... now exists
        assert (out / "wav").is_dir() and not second.skipped
        assert first.report["files_found"] == second.report["files_found"] == 26
    finally:
        shutil.rmtree(out)
