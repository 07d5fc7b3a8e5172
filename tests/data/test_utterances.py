"""Tests of mmunlearn.data.waveforms and mmunlearn.data.utterances: waveform cache, crops and segments,
the utterance dataset, manifest splits."""

import doctest

import numpy as np
import pytest
import torch

import mmunlearn.data.utterances
import mmunlearn.data.waveforms
from mmunlearn.adapters.speaker.training import training_rows
from mmunlearn.data.manifest import read_manifest
from mmunlearn.data.utterances import UtteranceDataset, split_rows
from mmunlearn.data.waveforms import AudioCache, crop, example_waveform, segments
from tests.speech_corpus import one_thread, speaker_manifests  # noqa: F401  (fixtures)


@pytest.mark.parametrize("module", [mmunlearn.data.waveforms, mmunlearn.data.utterances])
def test_doctests(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def _rows(n=3, length=32000):
    return [
        {"ID": f"u{i}", "spk_id": f"s{i % 2}", "wav": torch.arange(length, dtype=torch.float32) + 1000 * i}
        for i in range(n)
    ]


def test_crops_are_seeded_fresh_per_read_and_inside_the_utterance():
    rows = _rows()
    a, b = UtteranceDataset(rows, crop_seconds=0.5, seed=3), UtteranceDataset(rows, crop_seconds=0.5, seed=3)
    first = [a[i]["wav"] for i in range(3)]
    assert all(torch.equal(x, b[i]["wav"]) for i, x in enumerate(first))  # same seed, same reads
    again = a[0]["wav"]
    assert not torch.equal(again, first[0])  # a second read draws a new crop
    for i, w in enumerate(first):
        assert w.numel() == 8000
        offset = int(w[0]) - 1000 * i
        assert torch.equal(w, torch.arange(offset, offset + 8000, dtype=torch.float32) + 1000 * i)
    other = UtteranceDataset(rows, crop_seconds=0.5, seed=4)
    assert not all(torch.equal(other[i]["wav"], first[i]) for i in range(3))
    a.reset_crops()
    assert torch.equal(a[0]["wav"], first[0])


def test_short_utterances_come_whole_and_rows_are_not_modified():
    rows = _rows(1, length=100)
    ds = UtteranceDataset(rows, crop_seconds=1.0)
    assert ds[0]["wav"].numel() == 100 and ds[0]["ID"] == "u0" and ds[0]["spk_id"] == "s0"
    assert set(rows[0]) == {"ID", "spk_id", "wav"} and rows[0]["wav"].numel() == 100
    assert UtteranceDataset(_rows(), crop_seconds=None)[1]["wav"].numel() == 32000


def test_crop_and_segment_edges():
    rng = np.random.default_rng(0)
    assert crop(torch.ones(5), 5, rng).numel() == 5
    with pytest.raises(ValueError, match="crop length"):
        crop(torch.ones(5), 0, rng)
    assert [s.numel() for s in segments(torch.zeros(10), 4)] == [4, 4]
    with pytest.raises(ValueError, match="segment length"):
        segments(torch.zeros(3), 0)


def test_dataset_and_waveform_validation():
    with pytest.raises(ValueError, match="no rows"):
        UtteranceDataset([])
    with pytest.raises(ValueError, match="row 0 needs"):
        UtteranceDataset([{"wav": torch.zeros(3)}])
    with pytest.raises(ValueError, match="crop_seconds"):
        UtteranceDataset(_rows(), crop_seconds=0)
    with pytest.raises(ValueError, match="non-empty 1-D"):
        example_waveform({"wav": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match="'wav' entry"):
        example_waveform({"spk_id": "a"})


def test_audio_cache_decodes_once_and_respects_its_budget(speaker_manifests):
    row = read_manifest(speaker_manifests / "train.csv")[0]
    cache = AudioCache()
    w1 = example_waveform(row, cache)
    assert example_waveform(row, cache) is w1 and len(cache) == 1
    assert cache.bytes == w1.numel() * 4 and w1.numel() == row["stop"] - row["start"]
    empty = AudioCache(max_bytes=0)
    assert torch.equal(example_waveform(row, empty), w1) and len(empty) == 0
    with pytest.raises(ValueError, match="max_bytes"):
        AudioCache(-1)


def test_training_rows_pick_the_partitions_and_keep_the_full_label_space(speaker_manifests):
    full, speakers = training_rows(speaker_manifests, "speaker")
    assert speakers == sorted({r["spk_id"] for r in full}) and len(speakers) == 4
    forget_spk = {r["spk_id"] for r in split_rows(speaker_manifests, "spk_forget_train")}
    retain, speakers_r = training_rows(speaker_manifests, "speaker", retain_only=True)
    assert speakers_r == speakers and not forget_spk & {r["spk_id"] for r in retain}
    sample, _ = training_rows(speaker_manifests, "sample", retain_only=True)
    forgotten = {r["ID"] for r in split_rows(speaker_manifests, "sample_forget")}
    assert forgotten and not forgotten & {r["ID"] for r in sample}
    assert len(sample) == len(full) - len(forgotten)
    with pytest.raises(ValueError, match="level"):
        training_rows(speaker_manifests, "word")
    with pytest.raises(FileNotFoundError, match="no 'train' manifest"):
        split_rows({"x": speaker_manifests / "train.csv"}, "train")
    assert split_rows({"train": [{"ID": "a"}]}, "train") == [{"ID": "a"}]
