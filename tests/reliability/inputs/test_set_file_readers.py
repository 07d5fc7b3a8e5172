"""Forget/retain set files are read a line at a time and capped before they allocate: a bad first line of a large
JSONL is refused before the rest is read, an over-long line, a FIFO or a link to /dev/zero, JSON nested 100,000
deep and a 100,000-digit number each give one error naming the file (and line); the file is left as it was."""

from __future__ import annotations

import hashlib
import json
import os
import tracemalloc

import pytest

from mmunlearn.data.user.files import MAX_LINE
from mmunlearn.data.user.sets import DataFormatError, read_text_rows


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_large_jsonl_with_a_bad_first_line_is_refused_before_the_rest_is_read(tmp_path):
    path = tmp_path / "forget.jsonl"
    row = json.dumps({"question": "q" * 200, "answer": "a" * 200}) + "\n"
    with open(path, "w") as fh:
        fh.write("{not json\n")
        fh.write(row * 60_000)  # ~25 MB
    before = _digest(path)
    tracemalloc.start()
    try:
        with pytest.raises(DataFormatError, match=rf"{path.name}:1: not a JSON value"):
            read_text_rows(path, "forget")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{peak:,} bytes allocated to refuse line 1"
    assert _digest(path) == before and os.listdir(tmp_path) == ["forget.jsonl"]


def test_an_over_long_line_is_refused_naming_it(tmp_path):
    path = tmp_path / "forget.jsonl"
    path.write_text(
        json.dumps({"question": "q", "answer": "x"})
        + "\n"
        + json.dumps({"question": "q2", "answer": "a" * (MAX_LINE + 10)})
        + "\n"
    )
    with pytest.raises(DataFormatError, match=rf"{path.name}:2: a line over"):
        read_text_rows(path, "forget")


@pytest.mark.parametrize("make", ["fifo", "zero"])
def test_a_fifo_or_a_link_to_a_device_is_refused_without_waiting(tmp_path, make):
    path = tmp_path / "forget.jsonl"
    if make == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)
    with pytest.raises(DataFormatError, match="not a regular file"):
        read_text_rows(path, "forget")


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_deep_nesting_and_huge_numbers_name_the_file(tmp_path, suffix):
    deep = tmp_path / f"deep{suffix}"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(DataFormatError, match=rf"{deep.name}.*nested too deeply"):
        read_text_rows(deep, "forget")
    big = tmp_path / f"big{suffix}"
    row = '{"question": "q", "answer": ' + "9" * 100_000 + "}"
    big.write_text(f"[{row}]" if suffix == ".json" else row + "\n")
    with pytest.raises(DataFormatError, match=rf"{big.name}"):
        read_text_rows(big, "forget")


def test_an_audio_path_with_a_nul_byte_names_its_row(tmp_path):
    from mmunlearn.data.user.speech import read_speech_rows

    path = tmp_path / "forget.jsonl"
    path.write_text(json.dumps({"audio": "clips/a\u0000.wav", "speaker": "s1"}) + "\n")
    with pytest.raises(DataFormatError, match=rf"{path.name}:1: the audio path holds a NUL byte"):
        read_speech_rows(path, "forget")


def test_voxceleb2_subset_never_overwrites_a_folder_it_did_not_write(tmp_path):
    from data_prep.manifest_subset import subset_manifests

    src = tmp_path / "manifests"
    src.mkdir()
    (src / "train.csv").write_text("ID,duration,wav,start,stop,spk_id\n")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "train.csv").write_text("my own file\n")
    with pytest.raises(ValueError, match=r"holds files this command did not write"):
        subset_manifests(src, out, 5)
    assert (out / "train.csv").read_text() == "my own file\n" and os.listdir(out) == ["train.csv"]


@pytest.mark.parametrize("given", ["json", "list"])
def test_a_ten_megabyte_answer_is_refused_naming_its_row(tmp_path, given):
    rows = [{"question": "q1?", "answer": "a"}, {"question": "q2?", "answer": "x" * 10_000_000}]
    if given == "json":
        source = tmp_path / "forget.json"
        source.write_text(json.dumps(rows))
        where = rf"{source.name} row 1"
    else:
        source, where = rows, r"forget\[1\]"
    with pytest.raises(DataFormatError, match=rf"{where}: a row of 10,000,00\d characters"):
        read_text_rows(source, "forget")
