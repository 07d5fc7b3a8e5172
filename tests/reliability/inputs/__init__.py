"""Untrusted data files: set files, manifests, audio, prepared corpora, retain logs, run JSON given to report."""
