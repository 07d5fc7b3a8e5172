"""Undo records and request histories carried from one output to the next: links, special files, bad values."""
