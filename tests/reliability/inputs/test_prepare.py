"""``voxceleb2 prepare`` with bad side files or a corrupt decode cache: fails before decoding, no partial output."""

import json
import re

import numpy as np
import pytest
import soundfile as sf

import data_prep.voxceleb2_decode as vox_decode
import data_prep.voxceleb2_manifests as vox_manifests
from data_prep.voxceleb2 import prepare, read_vox_meta
from mmunlearn.data.manifest import SPLIT_NAMES, read_manifest
from tests.reliability.untrusted import digest_tree

META = "VoxCeleb2 ID ,VGGFace2 ID ,Gender ,Set \n" + "".join(
    f"id0000{i} ,n00000{i} ,{'mf'[i % 2]} ,dev \n" for i in (1, 2, 3)
)


@pytest.fixture
def tree(tmp_path):
    """3 speakers x 2 videos x 2 utterances of 1.2 s, 16 kHz mono wav (used in place, never converted)."""
    root = tmp_path / "vox2"
    gen = np.random.default_rng(0)
    for spk in ("id00001", "id00002", "id00003"):
        for video in ("vidA", "vidB"):
            for utt in ("00001", "00002"):
                path = root / "dev" / "aac" / spk / video / f"{utt}.wav"
                path.parent.mkdir(parents=True, exist_ok=True)
                sf.write(path, (0.1 * gen.standard_normal(19200)).astype(np.float32), 16000)
    (root / "vox2_meta.csv").write_text(META)
    return root


@pytest.fixture
def no_decoding(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("audio was decoded before the inputs were checked")

    monkeypatch.setattr(vox_decode, "read_audio", refuse)


def _run(tree, out, **kw):
    return prepare(tree, out, forget_speakers=1, forget_fraction=0.5, progress=False, **kw)


def test_a_meta_file_without_gender_fails_before_decoding(tree, tmp_path, no_decoding):
    meta = tree / "vox2_meta.csv"
    meta.write_text("VoxCeleb2 ID,VGGFace2 ID,Set\nid00001,n000001,dev\n")
    before = digest_tree(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(ValueError) as err:
        _run(tree, out)
    msg = str(err.value)
    assert msg.startswith(f"{meta}: no 'Gender' column (columns found: ['voxceleb2 id', 'vggface2 id', 'set'])")
    assert "--allow-no-gender" in msg
    assert not out.exists() and digest_tree(tmp_path) == before


def test_allow_no_gender_writes_no_gender_column(tree, tmp_path):
    (tree / "vox2_meta.csv").write_text("VoxCeleb2 ID,VGGFace2 ID,Set\nid00001,n000001,dev\n")
    res = _run(tree, tmp_path / "out", allow_no_gender=True)
    rows = read_manifest(res.manifests["train"], check_files=True)
    assert rows and all("gender" not in r for r in rows)
    # with a Gender column, a speaker the file does not list is reported, not silently empty
    (tree / "vox2_meta.csv").write_text("".join(line for line in META.splitlines(True) if "id00003" not in line))
    res = _run(tree, tmp_path / "out2")
    assert res.report["speakers_without_gender"] == ["id00003"]
    assert {r["spk_id"]: r["gender"] for r in read_manifest(res.manifests["train"])}["id00001"] == "f"


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"VoxCeleb2 ID,Gender\nid00001,\xe9\n", "the VoxCeleb2 meta file is not UTF-8 text"),
        (b"", "no 'VoxCeleb2 ID' column in header []"),
        (b"Speaker,Gender\nid00001,m\n", "no 'VoxCeleb2 ID' column"),
    ],
)
def test_unreadable_meta_files_name_the_file(tree, tmp_path, no_decoding, content, expected):
    meta = tree / "vox2_meta.csv"
    meta.write_bytes(content)
    before = digest_tree(tmp_path)
    with pytest.raises(ValueError, match=re.escape(f"{meta}: {expected}")):
        _run(tree, tmp_path / "out")
    with pytest.raises(ValueError, match=re.escape(expected)):
        read_vox_meta(meta)
    assert digest_tree(tmp_path) == before


def test_unknown_forget_speakers_and_bad_transcripts_fail_before_decoding(tree, tmp_path, no_decoding):
    with pytest.raises(ValueError, match="id09999"):
        prepare(tree, tmp_path / "out", forget_speakers=["id09999"], progress=False)
    with pytest.raises(ValueError, match=r"\[1, 2\]"):  # 3 speakers: at most 2 to forget
        prepare(tree, tmp_path / "out", forget_speakers=3, progress=False)
    (tree / "transcripts.csv").write_text("ID,words\nx,y\n")
    with pytest.raises(ValueError, match=rf"{tree / 'transcripts.csv'}: transcripts need columns ID and text"):
        _run(tree, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_corrupt_index_needs_force_and_force_rebuilds_it(tree, tmp_path):
    out = tmp_path / "out"
    _run(tree, out)
    index = out / "audio_index.json"
    index.write_text('{"truncated": ')
    finished = digest_tree(out)
    with pytest.raises(ValueError) as err:
        _run(tree, out, seed=1)  # other options: a rebuild that needs the cache
    msg = str(err.value)
    assert msg == (
        f"{index} is corrupt (not valid JSON: Expecting value: line 1 column 15 (char 14)); rerun with "
        "--force to discard it and decode the audio again"
    )
    assert "\n" not in msg and digest_tree(out) == finished  # the earlier output is untouched
    res = _run(tree, out, seed=1, force=True)
    assert not res.skipped and len(json.loads(index.read_text())) == 12
    assert read_manifest(res.manifests["train"], check_files=True)


def test_a_failure_while_writing_leaves_the_earlier_output_whole(tree, tmp_path, monkeypatch):
    out = tmp_path / "out"
    _run(tree, out)
    finished = digest_tree(out)
    real, calls = vox_manifests.write_manifest, []

    def fail_third(path, rows, columns=None):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(path, rows, columns)

    monkeypatch.setattr(vox_manifests, "write_manifest", fail_third)
    with pytest.raises(OSError, match="No space left"):
        _run(tree, out, seed=1)
    assert len(calls) == 3 and all(p.parent != out for p in calls)  # written beside, not in place
    after = digest_tree(out)
    assert {k: v for k, v in after.items() if k != "audio_index.json"} == {
        k: v for k, v in finished.items() if k != "audio_index.json"
    }  # only the decode cache may change
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["audio_index.json", "prepare_report.json", "prepare_stamp.json", *(f"{n}.csv" for n in SPLIT_NAMES)]
    )
    # and on a first run nothing but the decode cache is left
    fresh = tmp_path / "fresh"
    calls.clear()
    with pytest.raises(OSError):
        _run(tree, fresh)
    assert sorted(p.name for p in fresh.iterdir()) == ["audio_index.json"]
