"""Model cache for the preset builder: content-hash keys, the cache folder, and training logs on disk.

A model's key hashes everything its weights depend on (preset, training data content, seed,
hyperparameters, parent model), so a re-run with the same options finds it and any change builds a
new one. Models are written atomically (:func:`mmunlearn.files.checkpoint.atomic_dir`), so a folder that
exists is complete, and built under a per-model file lock, so concurrent runs train each model once.

What the cache is trusted with (docs/untrusted-input.md): a cache folder is reused only when it is this
user's and no one else can write it (:func:`mmunlearn.files.paths.check_private`, from the cache root down to the
model and its files; folders the builder creates are 0700 and a finished model is made read-only to group and
others), and a cached model only when its files still have the SHA-256 recorded in ``train_log.json`` when it
was written (:func:`content_digest`). The digest catches a swapped or damaged file; it is no defence against
someone who may write the cache (they could rewrite the log too): the ownership check is.
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

from mmunlearn.data.qa import QAItem
from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.files.layout import MARKER
from mmunlearn.files.paths import check_private, make_private_dirs
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


#: A cached model's subfolder of evaluations, written after the build (recipes cache their evaluations there): not
#: the model, so not in its digest.
EVALS_DIR = "evals"


def content_digest(model_dir: str | os.PathLike) -> str:
    """SHA-256 of every file of a model folder (relative names and bytes, in name order), but its train log, output
    marker and :data:`EVALS_DIR`; links are not followed (a link is digested by its target's name)."""
    root, h = Path(model_dir), hashlib.sha256()
    for path in sorted(
        p
        for p in root.rglob("*")
        if (p.name not in (LOG_FILE, MARKER) or p.parent != root) and p.relative_to(root).parts[0] != EVALS_DIR
    ):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            h.update(f"L {rel} {os.readlink(path)}\0".encode())
        elif path.is_file():
            h.update(f"F {rel} {path.stat().st_size}\0".encode())
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


def write_log(model_dir: Path, log: Mapping[str, Any]) -> None:
    """Write ``train_log.json`` atomically with the folder's :func:`content_digest` (a NaN loss is written as
    ``NaN``, not refused), after making the folder and its files unwritable by group and others."""
    model_dir = Path(model_dir)
    for path in [model_dir, *model_dir.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, path.stat().st_mode & ~0o022)
    entry = {**log, "content_sha256": content_digest(model_dir)}
    write_text_atomic(model_dir / LOG_FILE, json.dumps(entry, indent=1, default=str))
    os.chmod(model_dir / LOG_FILE, (model_dir / LOG_FILE).stat().st_mode & ~0o022)


def check_cache_path(root: str | os.PathLike, path: str | os.PathLike) -> None:
    """:func:`~mmunlearn.files.paths.check_private` on ``root``, every folder from it down to ``path``, and everything
    under ``path``: the cache's contents are reused only when no other user can have written them."""
    root, path = Path(root), Path(path)
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        parts = (path.name,)
        root = path.parent
    chain = [root, *(root.joinpath(*parts[: i + 1]) for i in range(len(parts)))]
    check_private(*chain)
    if path.is_dir() and not path.is_symlink():
        check_private(*path.rglob("*"))


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
    make_private_dirs(model_dir.parent)
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


def is_built(model_dir: Path, key: str, root: str | os.PathLike | None = None) -> bool:
    """Whether ``model_dir`` holds a finished model built with ``key``, its files as they were written.

    The folders from ``root`` (the cache folder; default the model's parent) down to the model and its files
    must be private (:func:`check_cache_path`); a model whose files no longer match the digest in its train log
    is an error naming it; one without a digest (an older mmunlearn built it) is rebuilt.
    """
    model_dir = Path(model_dir)
    log = read_log(model_dir)
    if log is None or log.get("key") != key or not (model_dir / "config.json").is_file():
        return False
    check_cache_path(root if root is not None else model_dir.parent, model_dir)
    recorded = log.get("content_sha256")
    if recorded is None:
        logging.getLogger(__name__).info(
            "%s has no content digest (built by an older mmunlearn): rebuilding it", model_dir
        )
        return False
    if recorded != content_digest(model_dir):
        raise ValueError(
            f"{model_dir}: its files changed since it was built (the SHA-256 recorded in {LOG_FILE} "
            "does not match): delete the folder to rebuild it"
        )
    return True
