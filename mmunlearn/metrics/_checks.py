"""Input validation shared by the metric functions: array-likes in, clear ValueErrors out.

Every public metric converts its inputs here, so the rules are the same everywhere: numbers come
as sequences, numpy arrays or torch tensors (any device, any float dtype incl. bfloat16); empty
inputs, NaN, wrong ranks and mismatched lengths raise ``ValueError`` naming the argument. Inputs
are never modified (conversion copies or views read-only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# Average NLLs are >= 0 up to float round-off; anything clearly below zero is almost surely a
# log-probability passed by mistake.
_NLL_TOLERANCE = 1e-4


def to_numpy(x: Any) -> np.ndarray:
    """Convert a torch tensor (duck-typed, so torch need not be imported) or array-like to numpy."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        t = x.detach().cpu()
        if t.is_floating_point():
            t = t.double()  # bfloat16 / float16 have no numpy dtype
        return t.numpy()
    return np.asarray(x)


def float_array(x: Any, name: str, ndims: tuple[int, ...] = (1,)) -> np.ndarray:
    """``x`` as a float64 array of one of the ranks in ``ndims``; non-empty, NaN-free (inf allowed)."""
    try:
        arr = np.asarray(to_numpy(x), dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: expected numbers, got {type(x).__name__} ({exc})") from None
    if arr.ndim not in ndims:
        ranks = " or ".join(f"{d}-D" for d in ndims)
        raise ValueError(f"{name}: expected a {ranks} array, got shape {tuple(arr.shape)}")
    if arr.size == 0:
        raise ValueError(f"{name}: empty input (shape {tuple(arr.shape)})")
    if np.isnan(arr).any():
        where = tuple(int(i) for i in np.argwhere(np.isnan(arr))[0])
        raise ValueError(f"{name}: NaN at index {where if len(where) > 1 else where[0]}")
    return arr


def vector(x: Any, name: str) -> np.ndarray:
    """A non-empty, NaN-free 1-D float64 array."""
    return float_array(x, name, (1,))


def nll(x: Any, name: str, ndims: tuple[int, ...] = (1,)) -> np.ndarray:
    """Average negative log-likelihoods: like ``float_array`` and also >= 0 (up to round-off)."""
    arr = float_array(x, name, ndims)
    if (arr < -_NLL_TOLERANCE).any():
        raise ValueError(
            f"{name}: negative average NLL {float(arr.min()):.4g}; pass negative log-likelihoods "
            "(>= 0), not log-probabilities"
        )
    return arr


def ragged(x: Any, name: str) -> list[np.ndarray]:
    """Per-item 1-D float arrays of possibly different lengths (a list, or the rows of a 2-D array)."""
    if hasattr(x, "ndim") and not (x.ndim == 1 and getattr(x, "dtype", None) == np.dtype(object)):
        if x.ndim != 2:
            raise ValueError(
                f"{name}: expected per-item 1-D arrays (a list, or a 2-D array of equal-length "
                f"rows), got an array of shape {tuple(x.shape)}"
            )
        rows = list(to_numpy(x))
    elif isinstance(x, (str, bytes)) or not isinstance(x, (Sequence, np.ndarray)):
        raise ValueError(f"{name}: expected a sequence of per-item 1-D arrays, got {type(x).__name__}")
    else:
        rows = list(x)
    if not rows:
        raise ValueError(f"{name}: empty input (no items)")
    return [vector(row, f"{name}[{i}]") for i, row in enumerate(rows)]


def bool_rows(x: Any, name: str) -> list[np.ndarray]:
    """Per-item 1-D boolean arrays (bools or 0/1 numbers), possibly of different lengths."""
    rows = ragged(x, name)
    out = []
    for i, row in enumerate(rows):
        if not np.isin(row, (0.0, 1.0)).all():
            raise ValueError(f"{name}[{i}]: expected booleans (or 0/1), got values {np.unique(row)[:5]}")
        out.append(row.astype(bool))
    return out


def strings(x: Any, name: str) -> list[str]:
    """A non-empty list of str."""
    if isinstance(x, (str, bytes)):
        raise ValueError(f"{name}: expected a sequence of strings, got a single {type(x).__name__}")
    items = list(x)
    if not items:
        raise ValueError(f"{name}: empty input (no items)")
    for i, s in enumerate(items):
        if not isinstance(s, str):
            raise ValueError(f"{name}[{i}]: expected str, got {type(s).__name__}")
    return items


def same_length(**named: Any) -> int:
    """The common length of the named inputs; ValueError listing every length when they differ."""
    lengths = {k: len(v) for k, v in named.items()}
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{k}={n}" for k, n in lengths.items())
        raise ValueError(f"mismatched numbers of items: {shown}")
    return next(iter(lengths.values()))


def index_keys(indices: Sequence[int] | None, n: int, name: str = "indices") -> list[str]:
    """The ``value_by_index`` keys: ``"0".."n-1"`` by default, else the given unique indices as str."""
    if indices is None:
        return [str(i) for i in range(n)]
    keys = [str(int(i)) for i in to_numpy(indices).reshape(-1).tolist()]
    if len(keys) != n:
        raise ValueError(f"{name}: {len(keys)} indices for {n} items")
    if len(set(keys)) != n:
        raise ValueError(f"{name}: indices are not unique")
    return keys


def unit_fraction(k: float, name: str = "k") -> float:
    """A fraction in (0, 1]."""
    if not 0.0 < float(k) <= 1.0:
        raise ValueError(f"{name}: expected a fraction in (0, 1], got {k}")
    return float(k)
