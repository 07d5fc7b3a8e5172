"""The subspaces QR-Erase removes: a task matrix's dominant column space (basis.py: CPQR, sketched CPQR, SVD; cpqr.py:
truncated column-pivoted QR through LAPACK or torch), the part of it the retain task does not use (discriminate.py),
and the forgotten classes' mean-embedding directions of a classifier (centroid.py)."""
