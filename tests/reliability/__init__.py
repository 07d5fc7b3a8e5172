"""Reliability tests: untrusted folders, bad input, interrupted runs (issue 13)."""
