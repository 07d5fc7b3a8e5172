"""A user's forget and retain sets in the formats users have: files, lists and datasets read into items that name
their file and row (files.py), text rows (sets.py: read_text_rows, overlap, split_held_out) and speech rows
(speech.py: read_speech_rows, HF Audio columns written as WAV)."""
