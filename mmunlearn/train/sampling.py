"""Epoch-seeded example order for the training loop, and pairing with a second (cycled) dataset.

The order of epoch ``e`` is a pure function of ``(seed, e)``, so a run resumed mid-epoch replays
exactly the batches an uninterrupted run would see, and every process of a multi-GPU run draws the
same permutation (accelerate then gives each process its share of the batches).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset, Sampler, default_collate


def _permutation(n: int, seed: int, stream: int, index: int) -> np.ndarray:
    return np.random.default_rng([seed, stream, index]).permutation(n)


class EpochSampler(Sampler):
    """Indices ``0..n-1`` (shuffled per epoch when ``shuffle``); with ``n2``, pairs ``(i, j)``.

    In paired mode the ``k``-th example drawn overall (``k = epoch * n + position``) is matched with
    ``j = perm_c[k mod n2]`` where ``perm_c`` is a fresh permutation of the second dataset for each
    cycle ``c = k // n2``: the second dataset is walked through completely, in a new order each
    cycle, however its size compares with the first one's.
    """

    def __init__(self, n: int, seed: int = 0, shuffle: bool = True, n2: int | None = None):
        if n < 1:
            raise ValueError(f"cannot sample from an empty dataset (n={n})")
        if n2 is not None and n2 < 1:
            raise ValueError(f"the second dataset is empty (n2={n2})")
        self.n, self.seed, self.shuffle, self.n2 = n, seed, shuffle, n2
        self.epoch = 0
        self._cycle: tuple[int, np.ndarray] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def _second(self, k: int) -> int:
        cycle, pos = divmod(k, self.n2)  # type: ignore[operator]
        if self._cycle is None or self._cycle[0] != cycle:
            perm = _permutation(self.n2, self.seed, 2, cycle) if self.shuffle else np.arange(self.n2)
            self._cycle = (cycle, perm)
        return int(self._cycle[1][pos])

    def __iter__(self) -> Iterator[Any]:
        order = _permutation(self.n, self.seed, 1, self.epoch) if self.shuffle else np.arange(self.n)
        if self.n2 is None:
            yield from (int(i) for i in order)
            return
        first = self.epoch * self.n
        for pos, i in enumerate(order):
            yield int(i), self._second(first + pos)


class PairedDataset(Dataset):
    """``dataset[(i, j)] == (data[i], data2[j])``; its length is the first dataset's."""

    def __init__(self, data: Sequence, data2: Sequence):
        self.data, self.data2 = data, data2

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: tuple[int, int]) -> tuple[Any, Any]:
        i, j = index
        return self.data[i], self.data2[j]


class PairCollate:
    """Collate a list of ``(a, b)`` pairs into ``(collate(as), collate2(bs))``; None means torch's
    ``default_collate``."""

    def __init__(self, collate: Callable[[list], Any] | None, collate2: Callable[[list], Any] | None):
        self.collate = collate or default_collate
        self.collate2 = collate2 or default_collate

    def __call__(self, pairs: list[tuple[Any, Any]]) -> tuple[Any, Any]:
        return self.collate([a for a, _ in pairs]), self.collate2([b for _, b in pairs])
