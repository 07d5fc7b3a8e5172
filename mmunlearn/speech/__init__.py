"""Training of the speech models: speaker classifiers (speaker_training) and spoken-QA tasks for speech LLMs (spoken_qa).

The data side (manifests, waveforms, utterance datasets) lives in :mod:`mmunlearn.data`.
"""
