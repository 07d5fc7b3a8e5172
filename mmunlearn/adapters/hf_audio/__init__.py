"""The Hugging Face audio-classifier family (kind ``hf-audio``: wav2vec2, HuBERT, WavLM): its adapter and kind
(adapter.py) and its trainer (training.py)."""
