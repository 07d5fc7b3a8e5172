"""Bad manifests fail before any training: one error naming the file and listing the bad rows; no audio is opened."""

import os

import numpy as np
import pytest
import soundfile as sf

from mmunlearn.adapters.speaker.training import training_rows
from mmunlearn.data.manifest import MANIFEST_COLUMNS, ManifestError, check_rows, read_manifest, write_manifest
from mmunlearn.data.utterances import split_rows
from tests.reliability.untrusted import digest_tree


def _wav(path, seconds=0.5):
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, 0.1 * np.sin(np.arange(int(16000 * seconds)) / 7.0).astype(np.float32), 16000)
    return path


def _row(i, wav, spk="s1", start=0, stop=8000, duration=0.5):
    return {"ID": f"u{i}", "duration": duration, "wav": str(wav), "start": start, "stop": stop, "spk_id": spk}


@pytest.fixture
def no_audio(monkeypatch):
    """Fail the test if anything decodes audio (the checks must come first)."""
    import mmunlearn.data.audio
    import mmunlearn.data.waveforms

    def refuse(*_a, **_k):
        raise AssertionError("audio was opened before the manifest was checked")

    monkeypatch.setattr(mmunlearn.data.audio, "read_audio", refuse)
    monkeypatch.setattr(mmunlearn.data.waveforms, "load_audio", refuse)


def test_bad_rows_are_listed_in_one_error_before_training(tmp_path, no_audio, monkeypatch):
    data = tmp_path / "data"
    good = _wav(data / "s1" / "a.wav")
    _wav(data / "s2" / "b.wav")
    (data / "folder.wav").mkdir()
    (data / "notes.txt").write_text("not audio")
    outside = _wav(tmp_path / "elsewhere" / "c.wav")
    (data / "link.wav").symlink_to(outside)
    man = tmp_path / "manifests"
    rows = [
        _row(0, good),
        _row(1, data / "s2" / "b.wav", spk="s2"),
        _row(2, "../../../../../../../../etc/passwd"),
        _row(3, data / "missing.wav"),
        _row(4, data / "folder.wav"),
        _row(5, data / "notes.txt"),
        _row(6, data / "link.wav"),
    ]
    write_manifest(man / "train.csv", rows)
    with open(man / "train.csv", "a", encoding="utf-8") as fh:
        fh.write(f"u7,abc,{good},0,8000,s1\nu8,0.5,{good},900,100,s1\nu0,0.5,{good},0,8000,s1\n")
    before = digest_tree(tmp_path)
    with pytest.raises(ManifestError) as err:
        split_rows(man, "train", root=data)
    msg = str(err.value)
    assert msg.startswith(f"{man / 'train.csv'}: 8 bad row(s) of 10; nothing was run")
    for line, what in [
        (4, "'../../../../../../../../etc/passwd' is not an audio file name"),
        (5, "missing.wav' does not exist"),
        (6, "folder.wav' is not a regular file"),
        (7, "notes.txt' is not an audio file name"),
        (8, f"resolves to {outside}, outside the data folder {data}"),
        (9, "column 'duration' value 'abc' is not float"),
        (10, "stop 100 <= start 900"),
        (11, "duplicate ID 'u0'"),
    ]:
        if line != 8:
            assert f"{man / 'train.csv'}:{line}: " in msg and what in msg, (line, what)
    assert f"{man / 'train.csv'}:8: 'wav'" in msg and "outside the data folder" in msg
    assert msg.count("\n  ") == 8  # one line per problem
    # the same manifest through the training entry point: refused before any model or audio work
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ManifestError, match="bad row"):
        training_rows(man)
    assert digest_tree(tmp_path) == before  # inputs byte-identical, nothing written anywhere


def test_only_the_first_ten_are_listed_and_the_rest_counted(tmp_path, no_audio):
    rows = [_row(i, tmp_path / f"gone{i}.wav") for i in range(25)]
    path = write_manifest(tmp_path / "m.csv", rows)
    with pytest.raises(ManifestError) as err:
        read_manifest(path, check_files=True)
    msg = str(err.value)
    assert "25 bad row(s) of 25" in msg and "... and 15 more" in msg
    assert "gone9.wav" in msg and "gone10.wav" not in msg
    assert read_manifest(path) == rows  # without check_files the reader does not look at the audio


def test_good_manifests_pass_and_relative_paths_are_checked_as_opened(tmp_path, monkeypatch):
    wav = _wav(tmp_path / "audio" / "a.wav")
    path = write_manifest(tmp_path / "m" / "train.csv", [_row(0, "audio/a.wav")])
    monkeypatch.chdir(tmp_path)  # the loader opens a relative wav from the working directory
    assert split_rows(tmp_path / "m", "train") == [_row(0, "audio/a.wav")]
    monkeypatch.chdir(tmp_path / "m")
    with pytest.raises(ManifestError, match=r"'audio/a.wav' does not exist"):
        read_manifest(path, check_files=True)
    assert wav.is_file()


def test_rows_given_in_memory_are_checked_too(tmp_path, no_audio):
    wav = _wav(tmp_path / "a.wav")
    check_rows(
        [{"ID": "x", "wav": str(wav), "spk_id": "s"}, {"ID": "y", "wav": np.zeros(10), "spk_id": "s"}],
        "forget items",
        required=("wav", "spk_id"),
    )
    with pytest.raises(ManifestError) as err:
        check_rows(
            [
                {"ID": "x", "wav": "/etc/passwd", "spk_id": "s"},
                {"wav": str(wav)},
                {"ID": "z", "wav": str(wav), "spk_id": "s", "start": "0", "stop": "-5"},
                "not a row",
            ],
            "forget items",
            required=("wav", "spk_id"),
        )
    msg = str(err.value)
    assert msg.startswith("forget items: 4 bad row(s) of 4")
    assert "row 0 (ID 'x'): 'wav' '/etc/passwd' is not an audio file name" in msg
    assert "row 1: missing 'spk_id'" in msg and "row 2 (ID 'z'): stop -5 <= start 0" in msg
    assert "row 3: expected a mapping, got str" in msg
    with pytest.raises(ManifestError, match=r"'train' rows: 1 bad row\(s\)"):
        split_rows({"train": [{"ID": "a", "wav": str(tmp_path / "nope.wav"), "spk_id": "s"}]}, "train")


def test_unreadable_and_non_utf8_manifests_name_the_file(tmp_path):
    bad = tmp_path / "latin1.csv"
    bad.write_bytes((",".join(MANIFEST_COLUMNS) + "\nu\xe9,1.0,/a.wav,0,10,s\n").encode("latin-1"))
    with pytest.raises(ManifestError, match=rf"{bad}: not UTF-8 text"):
        read_manifest(bad)
    if os.geteuid() != 0:  # root reads anything
        wav = _wav(tmp_path / "locked.wav")
        wav.chmod(0)
        with pytest.raises(ManifestError, match="is not readable"):
            check_rows([_row(0, wav)], "rows")
