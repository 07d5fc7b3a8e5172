"""Training of the speech LLMs: spoken-QA tasks (spoken_qa) and a frozen audio tower's outputs cached per clip
(tower_cache). A speaker classifier's trainer sits beside its adapter (mmunlearn/adapters/speaker/training.py).

The data side (manifests, waveforms, utterance datasets) lives in :mod:`mmunlearn.data`.
"""
