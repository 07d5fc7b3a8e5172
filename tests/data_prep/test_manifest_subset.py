"""``voxceleb2 subset``: smaller manifests of the same clips, evenly over speakers, the source untouched."""

from __future__ import annotations

import hashlib
import json

import pytest
from typer.testing import CliRunner

from data_prep.manifest_subset import REPORT, subset_manifests
from mmunlearn.data.utterances import manifest_paths, split_rows
from tests.speech_corpus import speaker_manifests  # noqa: F401 (fixture)


def _digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_every_split_is_a_balanced_subset_of_the_source(speaker_manifests, tmp_path):
    before = _digests(speaker_manifests)
    out = subset_manifests(speaker_manifests, tmp_path / "sub", 5, seed=3)
    assert _digests(speaker_manifests) == before  # the source is only read
    assert set(manifest_paths(out)) == set(manifest_paths(speaker_manifests))
    for name in manifest_paths(speaker_manifests):
        source = {r["ID"]: r for r in split_rows(speaker_manifests, name)}
        kept = split_rows(out, name)
        assert len(kept) == min(5, len(source)) and len({r["ID"] for r in kept}) == len(kept)
        assert all(source[r["ID"]] == r for r in kept)  # the same clips, the same roles
        per_speaker = [sum(r["spk_id"] == s for r in kept) for s in {r["spk_id"] for r in kept}]
        assert max(per_speaker) - min(per_speaker) <= 1 or len(kept) == len(source)
    report = json.loads((out / REPORT).read_text())
    assert report["rows"] == 5 and report["seed"] == 3 and report["counts"]["train"]["rows"] == 5
    again = subset_manifests(speaker_manifests, tmp_path / "again", 5, seed=3)
    assert {k: v for k, v in _digests(again).items() if k != REPORT} == {
        k: v for k, v in _digests(out).items() if k != REPORT
    }  # re-runnable: same inputs, same files


def test_no_cap_keeps_every_row_and_bad_requests_are_refused(speaker_manifests, tmp_path):
    out = subset_manifests(speaker_manifests, tmp_path / "all", 0, splits=("train",))
    assert split_rows(out, "train") == split_rows(speaker_manifests, "train") and set(manifest_paths(out)) == {"train"}
    with pytest.raises(FileNotFoundError, match="nosuch"):
        subset_manifests(speaker_manifests, tmp_path / "x", 5, splits=("nosuch",))
    with pytest.raises(ValueError, match="source"):
        subset_manifests(speaker_manifests, speaker_manifests, 5)
    with pytest.raises(ValueError, match=">= 0"):
        subset_manifests(speaker_manifests, tmp_path / "y", -1)


def test_the_voxceleb2_command_writes_the_subset(speaker_manifests, tmp_path):
    from mmunlearn.cli import app

    res = CliRunner().invoke(
        app,
        ["voxceleb2", "subset", "--manifests", str(speaker_manifests), "--out", str(tmp_path / "sub"), "--rows", "4"],
    )
    assert res.exit_code == 0, res.output
    assert len(split_rows(tmp_path / "sub", "train")) == 4 and "train:" in res.output
    bad = CliRunner().invoke(
        app, ["voxceleb2", "subset", "--manifests", str(tmp_path / "missing"), "--out", str(tmp_path / "z")]
    )
    text = " ".join(bad.output.replace("│", " ").split())  # rich's box and wrapping undone
    assert bad.exit_code == 2 and "manifest directory not found" in text and not (tmp_path / "z").exists()


def test_an_empty_split_is_refused_before_anything_is_written(speaker_manifests, tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(speaker_manifests, src)
    header = (src / "train.csv").read_text().splitlines()[0]
    (src / "zz_empty.csv").write_text(header + "\n")  # sorted last: every other split would be drawn first
    with pytest.raises(ValueError, match="zz_empty"):
        subset_manifests(src, tmp_path / "out", 5)
    assert not (tmp_path / "out").exists()
