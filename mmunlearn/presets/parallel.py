"""The target and retain models built at once: the base first, then the retain model in a process of its own while
this one builds the target, each with one torch thread (on a 2-core CPU, both cores; two threads in one process
were measured slower than one, ``recipes.tofu.config``'s ``threads``).

Both builds go through :func:`mmunlearn.presets.build.build_models` with the same options, so each lands in the
cache under the key it would have had built in one process; a stopped parallel build resumes like any other, and
a sequential run afterwards reuses both models.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from mmunlearn.presets.build import BuiltModels, build_models


def build_models_parallel(
    preset: str | os.PathLike,
    data: Any,
    forget_split: str = "forget10",
    authors: int | None = None,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    device: str = "auto",
    *,
    parallel: bool = True,
    progress: bool = True,
    overrides: Mapping[str, Any] | None = None,
    pretrain_overrides: Mapping[str, Any] | None = None,
    checkpoint_every: int | None | str = "auto",
) -> BuiltModels:
    """Base, target and retain models as :func:`~mmunlearn.presets.build.build_models` builds them; with
    ``parallel`` the retain model is trained in a spawned process (one torch thread) while this process trains the
    target (one torch thread), after the base is built here. ``data`` must pickle (a folder, ``synthetic:...`` or a
    mapping of splits). A failure in either build raises here."""
    options = dict(
        seed=seed,
        cache_dir=cache_dir,
        device=device,
        overrides=overrides,
        pretrain_overrides=pretrain_overrides,
        checkpoint_every=checkpoint_every,
    )
    if not parallel:
        return build_models(preset, data, forget_split, authors, progress=progress, **options)
    build_models(preset, data, forget_split, authors, progress=progress, roles=(), **options)  # the base, once
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch state forked from this one
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        retain = pool.submit(
            build_models,
            os.fspath(preset) if isinstance(preset, os.PathLike) else preset,
            data,
            forget_split,
            authors,
            progress=False,
            roles=("retain",),
            threads=1,
            **options,
        )
        build_models(preset, data, forget_split, authors, progress=progress, roles=("target",), threads=1, **options)
        retain.result()  # its error, if any, raised here
    return build_models(preset, data, forget_split, authors, progress=False, **options)  # both cached: their logs
