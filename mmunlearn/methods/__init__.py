"""Unlearning methods behind one interface (QR-Erase, SVD-UNLEARN, the baselines, T3), for the recipes."""
