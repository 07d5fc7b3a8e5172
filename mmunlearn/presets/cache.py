"""Model cache for the preset builder: content-hash keys, the cache folder, and training logs on disk.

A model's key hashes everything its weights depend on (preset, training data content, seed,
hyperparameters, parent model), so a re-run with the same options finds it and any change builds a
new one. Models are written atomically (:func:`mmunlearn.checkpoint.atomic_dir`), so a folder that
exists is complete, and built under a per-model file lock, so concurrent runs train each model once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mmunlearn.atomic import write_text_atomic
from mmunlearn.data.qa import QAItem
from mmunlearn.train.loop import is_main_process

log = logging.getLogger(__name__)
CACHE_ENV = "MMUNLEARN_CACHE"
LOG_FILE = "train_log.json"
# Bump when a change to the builder alters the models it produces, so stale cache entries are not reused.
BUILD_VERSION = 1


def default_cache_dir() -> Path:
    """``$MMUNLEARN_CACHE`` if set, else ``~/.cache/mmunlearn/models``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mmunlearn" / "models"


def cache_key(spec: Mapping[str, Any], length: int = 12) -> str:
    """Short SHA-256 of the canonical JSON of ``spec`` (plus the builder version)."""
    blob = json.dumps({"build_version": BUILD_VERSION, **spec}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def texts_digest(texts: Iterable[str]) -> str:
    """SHA-256 of a sequence of strings (order matters; NUL-separated so boundaries count)."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


def items_digest(items: Iterable[QAItem]) -> str:
    """Digest of what training sees of QA items: question and answer, in order."""
    return texts_digest(t for it in items for t in (it.question, it.answer))


def read_log(model_dir: Path) -> dict[str, Any] | None:
    """The ``train_log.json`` of a model folder, or None when absent or unreadable."""
    path = Path(model_dir) / LOG_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_log(model_dir: Path, log: Mapping[str, Any]) -> None:
    """Write ``train_log.json`` atomically (a NaN loss is written as ``NaN``, not refused)."""
    write_text_atomic(Path(model_dir) / LOG_FILE, json.dumps(log, indent=1, default=str))


@contextmanager
def build_lock(model_dir: Path) -> Iterator[None]:
    """Hold an inter-process lock for building ``model_dir`` (a ``.<name>.lock`` file beside it).

    Two processes asked for the same model at once would otherwise both train it and share its
    resume checkpoints; with the lock the second waits, then finds the finished model in the cache.
    Under ``accelerate launch`` only rank 0 takes it: the other ranks are part of the same build (were
    they to wait on the lock, rank 0's training would wait on them for ever).
    """
    from filelock import FileLock, Timeout  # a dependency of torch, datasets and huggingface_hub

    if not is_main_process():  # ranks of one `accelerate launch` train together; rank 0 holds the lock
        yield
        return
    model_dir = Path(model_dir)
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(model_dir.parent / f".{model_dir.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("waiting for another process that is building %s", model_dir)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def is_built(model_dir: Path, key: str) -> bool:
    """Whether ``model_dir`` holds a finished model built with ``key``."""
    log = read_log(model_dir)
    return log is not None and log.get("key") == key and (Path(model_dir) / "config.json").is_file()
