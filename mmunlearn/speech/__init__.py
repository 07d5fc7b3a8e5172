"""Speech data helpers for the speaker recipes: waveform loading and caching, crops, and a manifest-backed dataset."""

from mmunlearn.speech.audio import AudioCache, crop, example_waveform, segments
from mmunlearn.speech.dataset import Manifests, UtteranceDataset, durations, manifest_paths, rows_by_speaker, split_rows

__all__ = ["AudioCache", "Manifests", "UtteranceDataset", "crop", "durations", "example_waveform", "manifest_paths",
           "rows_by_speaker", "segments", "split_rows"]
