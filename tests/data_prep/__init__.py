"""Tests of the speech data preparation: synthetic espeak-ng corpus, VoxCeleb2 manifests and splits."""
