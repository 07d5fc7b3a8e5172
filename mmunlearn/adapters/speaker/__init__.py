"""The SpeechBrain speaker-classifier family (kind ``speaker``, ECAPA-TDNN): its adapter and kind (adapter.py), the
model built from a spec (model.py), a folder read and written (io.py; hyperparams.yaml parsed without running what it
names: hparams.py, written from the parsed data: write_hparams.py), its trainer (training.py), and what both
classifier families share: the per-utterance scores (batches.py: ClassifierScores) and the embedding cache of the head
scope (cache.py)."""
