"""``tofu compare --jobs N`` (and ``ctofu compare``'s): the methods' stages run N at a time, each in a process of
its own.

Each job is ``tofu run`` (``ctofu run``) on the comparison's settings with one ``method`` and ``out =
<out>/<method>`` (written as a YAML config under ``<out>/jobs/``, its output in ``<out>/jobs/<method>.log``). The job
computes the same stage key as ``compare`` (:func:`recipes.runner.stage_key`), so the comparison then finds every
stage finished and reuses it: the table, plots and audits are made in the parent exactly as without ``--jobs``. A job
that fails is reported with its log and run again in the parent, where its error shows. On a CPU each job uses
``threads`` torch threads (default 1): on this project's 2-core machine one thread per process was 1.6-6.5x faster
than two threads in one process, so two jobs use both cores where one comparison used one.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from mmunlearn.errors import UnsafePathError
from mmunlearn.files.atomic import write_text_atomic
from recipes.runner import finished_rows, stage_key
from recipes.tofu.config import RUN_EXCLUDES, RecipeConfig

#: ``<out>/JOBS_DIR``: the jobs' configs and logs.
JOBS_DIR = "jobs"


def run_settings(cfg: RecipeConfig, method: str) -> dict[str, Any]:
    """The settings of the ``tofu run`` job of ``method``: every field ``run`` takes, as plain YAML values."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        if f.name in RUN_EXCLUDES or f.name in ("jobs",):
            continue
        value = getattr(cfg, f.name)
        if value is None:
            continue
        if isinstance(value, Path):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        values[f.name] = value
    values.update(method=method, out=str(Path(cfg.out) / method), resume=True)
    return values


def pending(cfg: RecipeConfig, ctx: Any, methods: Sequence[str], rule: Any) -> list[str]:
    """The methods whose stage is not finished with the key the comparison computes (all of them without resume)."""
    if not cfg.resume:
        return list(methods)
    out = Path(cfg.out)
    return [
        m
        for m in methods
        if finished_rows(
            out / m,
            stage_key(
                m, ctx, cfg.knobs(), rule, cfg.base, cfg.method_options.get(m), overrides=cfg.method_overrides(m)
            ),
            ctx,
        )
        is None
    ]


def _command(config: Path, benchmark: str) -> list[str]:
    return [sys.executable, "-m", "mmunlearn.cli", benchmark, "run", "--config", str(config)]


def _fresh_log(path: Path):
    """A new, empty ``path`` open for writing, never through what was there: a link or hard link planted at that
    name loses the name (its target is left alone), then the file is created with ``O_EXCL | O_NOFOLLOW``."""
    if os.path.lexists(path) and not (path.is_symlink() or path.is_file()):
        raise UnsafePathError(f"{path} exists and is not a file: remove it to run the jobs")
    path.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(path, flags, 0o666), "w")


def run_jobs(
    cfg: RecipeConfig,
    methods: Sequence[str],
    jobs: int,
    say: Callable[[str], None] = print,
    poll_seconds: float = 1.0,
    benchmark: str = "tofu",
) -> dict[str, int]:
    """Run ``<benchmark> run`` (``tofu``, ``ctofu``) for each of ``methods``, at most ``jobs`` at a time; the exit
    status of each."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    folder = Path(cfg.out) / JOBS_DIR
    if folder.is_symlink():
        raise UnsafePathError(
            f"{folder} is a symbolic link: the jobs' configs and logs are written only into a "
            "folder of the output itself"
        )
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    threads = str(cfg.threads or 1)
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    queue, running, status = list(methods), {}, {}
    start = time.perf_counter()
    while queue or running:
        while queue and len(running) < jobs:
            method = queue.pop(0)
            config = folder / f"{method}.yaml"
            # a fresh temporary file renamed over the name: a link planted there is replaced, never written through
            write_text_atomic(config, yaml.safe_dump(run_settings(cfg, method), sort_keys=True))
            log = _fresh_log(folder / f"{method}.log")  # closed when the job ends
            proc = subprocess.Popen(_command(config, benchmark), stdout=log, stderr=subprocess.STDOUT, env=env)
            running[method] = (proc, log, time.perf_counter())
            say(f"[jobs] {method}: started ({len(running)} running, {len(queue)} waiting); log {folder / method}.log")
        for method, (proc, log, t0) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[method]
            status[method] = proc.returncode
            took = time.perf_counter() - t0
            say(
                f"[jobs] {method}: "
                + (
                    f"finished in {took:.0f} s"
                    if proc.returncode == 0
                    else f"FAILED (exit {proc.returncode}) after {took:.0f} s: see "
                    f"{folder / method}.log; it runs again in this process"
                )
                + f"; elapsed {time.perf_counter() - start:.0f} s"
            )
        if running:
            time.sleep(poll_seconds)
    return status


__all__ = ["JOBS_DIR", "pending", "run_jobs", "run_settings"]
