"""Copy the side files of an untrusted folder (config, tokenizer, README, ...) in one walk that never follows a link.

A model folder may be writable by someone else (a shared upload folder), who could replace an entry by a
link to a file outside it (``~/.ssh/id_rsa``) after a check and before a copy. So there is no separate
check: :func:`copy_side_files` walks the folder once and opens every entry relative to its parent
folder's descriptor with ``O_NOFOLLOW`` (folders also with ``O_DIRECTORY``), then ``fstat`` s what it
opened and copies from that descriptor. What is checked is what is copied:

* a regular file is copied only when it has one name (``st_nlink == 1``): a hard link may be a file
  from anywhere on the same file system, and nothing inside the folder tells which;
* a folder is walked through its own descriptor; FIFOs, sockets and devices are refused (a file is
  opened with ``O_NONBLOCK``, so a FIFO swapped in is refused, not waited on);
* a symbolic link is read (``readlink``) and its target resolved *as text* against the folder's real
  path; it must stay inside the folder (or, for a Hugging Face cache snapshot ``<repo>/snapshots/<rev>``,
  lie in ``<repo>/blobs``). Its target is then opened one path component at a time, again without
  following links: a file link is copied as the file, a folder link inside the folder stays a relative
  link (copying through it could loop), a link to a link is refused.

An entry replaced by a link (or by a hard link, a FIFO, a folder) between the listing and the open
makes the open fail or the ``fstat`` disagree, and the copy stops with
:class:`~mmunlearn.errors.UnsafePathError` naming the entry; the caller's output is a temporary folder
that is then removed. :func:`check_side_files` runs the same walk without writing (a check when a
folder is loaded, so a bad folder fails before any work). Copies get ordinary permissions (0o666
minus the umask) and the source's modification time. One named file (a request's undo records,
``undo_history/request-0001.json``) is opened the same way by :func:`open_inside` and copied from that
descriptor by :func:`copy_inside`.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from mmunlearn.errors import UnsafePathError, writing
from mmunlearn.files.held_weights import held_in, weight_like
from mmunlearn.files.layout import MARKER

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_CHUNK = 1 << 20

#: Called with each entry's path after its folder was listed and before the entry is opened. None in
#: normal use; tests set it to replace an entry at the worst moment (the race the walk closes).
before_open: Callable[[Path], None] | None = None


def _swapped(path: Path, exc: OSError | None = None) -> UnsafePathError:
    why = f" ({exc.strerror})" if exc is not None and exc.strerror else ""
    return UnsafePathError(
        f"{path} was replaced (by a link or a different kind of file) while it was being "
        f"read{why}: refusing to read or copy it"
    )


def _hard_link(path: Path, links: int) -> UnsafePathError:
    return UnsafePathError(
        f"{path} is a hard link ({links} names for one file): it may be a file from outside "
        "the folder, so it is neither read nor copied (replace it by a copy of the file)"
    )


def _open(dir_fd: int, name: str, path: Path, folder: bool) -> int:
    """``name`` in ``dir_fd``, opened without following a link; its descriptor."""
    try:
        return os.open(name, _DIR_FLAGS if folder else _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK, errno.ENXIO, errno.EISDIR):
            raise _swapped(path, exc) from None
        raise


def _checked_file(fd: int, path: Path, hard_links: bool) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise _swapped(path)
    if st.st_nlink != 1 and not hard_links:
        raise _hard_link(path, st.st_nlink)
    return st


def _write_copy(fd: int, st: os.stat_result, dst: Path) -> None:
    """The content of the open file ``fd`` into the new file ``dst`` (never an existing one, never a link)."""
    out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o666)
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        while True:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                break
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view) :]
        os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(out)


class _Walk:
    """One walk of ``root``: the folder's descriptor, its real path and where its links may point."""

    def __init__(self, root: str | os.PathLike, drop_weights: bool = False):
        self.root = Path(root)
        # leave out what may hold weights (mmunlearn.files.held_weights), listed in dropped
        self.drop_weights = drop_weights
        self.dropped: list[str] = []
        try:
            self.real = os.path.realpath(self.root, strict=True)
        except (OSError, RuntimeError) as exc:
            raise FileNotFoundError(f"folder not found or not resolvable: {self.root} ({exc})") from None
        self.fd = os.open(self.real, _DIR_FLAGS)  # the last component of a real path is no link
        self.anchors = [self.real]
        snapshots = os.path.dirname(self.real)
        blobs = os.path.join(os.path.dirname(snapshots), "blobs")
        if os.path.basename(snapshots) == "snapshots" and os.path.isdir(blobs) and not os.path.islink(blobs):
            self.anchors.append(blobs)

    def close(self) -> None:
        os.close(self.fd)

    def entries(
        self,
        dir_fd: int,
        rel: str,
        skip: set[str],
        select: Callable[[str], bool] | None,
        folders: bool,
        dst: Path | None,
    ) -> None:
        for name in sorted(os.listdir(dir_fd)):
            if not rel and (name in skip or (select is not None and not select(name))):
                continue
            path = self.root / rel / name
            if self.drop_weights and weight_like(os.path.join(rel, name)):
                self.dropped.append(os.path.join(rel, name))
                continue
            target = dst / name if dst is not None else None
            if before_open is not None:
                before_open(path)
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                raise FileNotFoundError(f"{path} disappeared while the folder was being read") from None
            if stat.S_ISLNK(st.st_mode):
                self.link(dir_fd, name, rel, path, target, folders or bool(rel))
            elif stat.S_ISDIR(st.st_mode):
                if not folders and not rel:
                    continue
                sub = _open(dir_fd, name, path, folder=True)
                try:
                    if target is not None:
                        with writing(target):
                            os.mkdir(target, 0o777)
                    self.entries(sub, os.path.join(rel, name), skip, select, folders, target)
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                self.file(dir_fd, name, path, target)
            else:
                raise UnsafePathError(
                    f"{path} is not a regular file or folder (a FIFO, socket or device): refusing to read or copy it"
                )

    def file(self, dir_fd: int, name: str, path: Path, target: Path | None) -> None:
        fd = _open(dir_fd, name, path, folder=False)
        try:
            st = _checked_file(fd, path, hard_links=False)
            rel = str(path.relative_to(self.root))
            if self.drop_weights and held_in(rel, os.pread(fd, 64, 0)):  # stored tensors under another name
                self.dropped.append(rel)
                return
            if target is not None:
                with writing(target):
                    _write_copy(fd, st, target)
        finally:
            os.close(fd)

    def resolve(self, dir_fd: int, name: str, rel: str, path: Path) -> tuple[str, str]:
        """(anchor, target) of the link ``name``: its target as text, inside one of the anchors."""
        text = os.readlink(name, dir_fd=dir_fd)
        target = os.path.normpath(os.path.join(self.real, rel, text))
        for anchor in self.anchors:
            if target == anchor or target.startswith(anchor.rstrip(os.sep) + os.sep):
                return anchor, target
        raise UnsafePathError(
            f"{path} is a symbolic link to {target}, outside {self.root}: refusing to read or "
            "copy it (replace the link by the file itself)"
        )

    def parent_of_target(
        self, dir_fd: int, name: str, rel: str, path: Path
    ) -> tuple[str, str, int, str | None, list[int]]:
        """Where the link ``name`` points: (anchor, target, descriptor of the target's folder, the target's name
        in it or None for an anchor itself, descriptors to close); every folder on the way opened without links."""
        anchor, real_target = self.resolve(dir_fd, name, rel, path)
        parts = [p for p in os.path.relpath(real_target, anchor).split(os.sep) if p not in ("", ".")]
        fd = self.fd
        opened: list[int] = []
        try:
            if anchor != self.real:
                try:
                    fd = os.open(anchor, _DIR_FLAGS)
                except OSError as exc:
                    raise _swapped(path, exc) from None
                opened.append(fd)
            for part in parts[:-1]:
                fd = _open(fd, part, path, folder=True)
                opened.append(fd)
        except BaseException:
            for d in opened:
                os.close(d)
            raise
        return anchor, real_target, fd, (parts[-1] if parts else None), opened

    def link(self, dir_fd: int, name: str, rel: str, path: Path, target: Path | None, folders: bool) -> None:
        anchor, real_target, fd, last, opened = self.parent_of_target(dir_fd, name, rel, path)
        try:
            if last is None:  # a link to the folder itself (or to the blobs folder)
                kind = stat.S_IFDIR
            else:
                try:
                    kind = stat.S_IFMT(os.stat(last, dir_fd=fd, follow_symlinks=False).st_mode)
                except FileNotFoundError:
                    raise FileNotFoundError(f"{path} is a broken symbolic link (to {real_target})") from None
            if kind == stat.S_IFLNK:
                raise UnsafePathError(
                    f"{path} is a symbolic link to another link ({real_target}): refusing to "
                    "follow it (link the file itself)"
                )
            if kind == stat.S_IFDIR:
                if anchor != self.real:
                    raise UnsafePathError(
                        f"{path} is a symbolic link to the folder {real_target}, outside "
                        f"{self.root}: refusing to copy it"
                    )
                if last is not None:
                    os.close(_open(fd, last, path, folder=True))  # a folder, reached without links
                if folders and target is not None:
                    with writing(target):
                        os.symlink(os.path.relpath(real_target, os.path.join(self.real, rel)), target)
                return
            if kind != stat.S_IFREG:
                raise UnsafePathError(
                    f"{path} links to {real_target}, which is not a regular file or folder: refusing to read or copy it"
                )
            self.file(fd, last, path, target)
        finally:
            for d in opened:
                os.close(d)


def _walk(
    root: str | os.PathLike,
    dst: str | os.PathLike | None,
    skip: Iterable[str],
    select: Callable[[str], bool] | None,
    folders: bool,
    drop_weights: bool = False,
) -> list[str]:
    walk = _Walk(root, drop_weights)
    try:
        walk.entries(walk.fd, "", set(skip) | {MARKER}, select, folders, Path(dst) if dst is not None else None)
    finally:
        walk.close()
    return walk.dropped


def copy_side_files(
    root: str | os.PathLike,
    dst: str | os.PathLike,
    skip: Iterable[str] = (),
    *,
    select: Callable[[str], bool] | None = None,
    folders: bool = True,
    drop_weights: bool = False,
) -> list[str]:
    """Copy the entries of ``root`` into the existing folder ``dst`` in one no-follow walk (module notes).

    ``skip``: top-level names not copied (the weight files a caller writes itself; :data:`MARKER` always);
    ``select``: when given, a top-level name is copied only if it returns True; ``folders=False`` copies
    only the top-level files (and file links); ``drop_weights``: entries at any depth that may hold weights
    (:mod:`mmunlearn.files.held_weights`: by name, or a file by its first bytes) are left out. Returns what was left out
    (paths relative to ``root``). Raises :class:`~mmunlearn.errors.UnsafePathError` naming the
    entry for a link leaving the folder, a hard link, a special file or an entry replaced while read.
    """
    return _walk(root, dst, skip, select, folders, drop_weights)


def check_side_files(
    root: str | os.PathLike,
    skip: Iterable[str] = (),
    *,
    select: Callable[[str], bool] | None = None,
    folders: bool = True,
) -> None:
    """The walk of :func:`copy_side_files` without writing anything: refuses what it would refuse."""
    _walk(root, None, skip, select, folders)


def open_inside(root: str | os.PathLike, name: str, *, hard_links: bool = True) -> int:
    """A read-only descriptor of the file ``name`` of ``root`` (a top-level name, or ``sub/name`` in a folder
    of ``root`` that is no link), opened as :func:`copy_side_files` opens entries (a link followed only inside
    the folder or the snapshot's blobs, each component opened without following a link). Hard links are
    allowed by default (streamed outputs share their unchanged shards with their input); ``hard_links=False``
    refuses them (a file that is copied into an output). The caller closes it."""
    *folders, last = name.split("/")
    if not last or any(p in ("", ".", "..") for p in folders) or last in (".", ".."):
        raise ValueError(f"{name!r} is not a plain file name (inside {root})")
    walk = _Walk(root)
    path = walk.root / name
    dir_fd, opened = walk.fd, []
    try:
        for i, part in enumerate(folders):
            here = walk.root.joinpath(*folders[: i + 1])
            try:
                st = os.stat(part, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                raise FileNotFoundError(f"{here} not found") from None
            if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
                raise UnsafePathError(
                    f"{here} is a symbolic link or not a folder: the files in it are copied into "
                    f"outputs, so it must be a real folder inside {walk.root}"
                )
            dir_fd = _open(dir_fd, part, here, folder=True)
            opened.append(dir_fd)
        if before_open is not None:
            before_open(path)
        try:
            st = os.stat(last, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} not found") from None
        if not stat.S_ISLNK(st.st_mode):
            fd = _open(dir_fd, last, path, folder=False)
        else:
            _, real_target, parent, target, more = walk.parent_of_target(dir_fd, last, "/".join(folders), path)
            try:
                if target is None:
                    raise UnsafePathError(f"{path} links to the folder {real_target}, not a file")
                fd = _open(parent, target, path, folder=False)
            finally:
                for d in more:
                    os.close(d)
        try:
            _checked_file(fd, path, hard_links=hard_links)
        except BaseException:
            os.close(fd)
            raise
        return fd
    finally:
        for d in opened:
            os.close(d)
        walk.close()


def copy_inside(root: str | os.PathLike, name: str, dst: str | os.PathLike) -> None:
    """Copy the file ``name`` of ``root`` (:func:`open_inside`, no hard link) into the new file ``dst``, from
    the descriptor it opened: what was checked is what is copied."""
    fd = open_inside(root, name, hard_links=False)
    try:
        with writing(dst):
            copy_from_fd(fd, dst)
    finally:
        os.close(fd)


def read_inside(root: str | os.PathLike, name: str, limit: int) -> bytes:
    """The bytes of the file ``name`` of ``root`` (:func:`open_inside`, no hard link); a file larger than
    ``limit`` bytes is refused, naming it."""
    fd = open_inside(root, name, hard_links=False)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise ValueError(f"{Path(root) / name} is {size} bytes, more than the {limit} such a file may have")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(_CHUNK, left))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise ValueError(f"{Path(root) / name} grew past {limit} bytes while it was read")
        return data
    finally:
        os.close(fd)


def copy_from_fd(fd: int, dst: str | os.PathLike) -> None:
    """Copy the open regular file ``fd`` (from :func:`open_inside`) into the new file ``dst`` (the caller names
    the file in a full-disk error, :func:`mmunlearn.errors.writing`)."""
    _write_copy(fd, os.fstat(fd), Path(dst))
