"""Output folders: never an input, inside one or above one; ``overwrite`` replaces only what mmunlearn
wrote (its marker file); ordinary permissions; temporary folders of killed runs cleaned by the next run."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys

import pytest

from mmunlearn.erase.in_memory import erase_checkpoint, restore_checkpoint
from mmunlearn.erase.stream import stream_erase_checkpoint, stream_restore_checkpoint
from mmunlearn.errors import UnsafePathError
from mmunlearn.files.checkpoint import MARKER, atomic_dir, check_output_dir
from mmunlearn.files.paths import _HOST, clean_leftovers
from tests.reliability.untrusted import ROOT, digest_tree, listing, make_checkpoint, make_forget


def erase_stream(model, forget, out, **kw):
    return stream_erase_checkpoint(model, forget, out, rank=2, progress=False, **kw)


def erase_memory(model, forget, out, **kw):
    return erase_checkpoint(model, forget, out, rank=2, **kw)


def restore_stream(model, out, **kw):
    return stream_restore_checkpoint(model, out, progress=False, **kw)


ERASERS = [erase_stream, erase_memory]
RESTORERS = [restore_stream, restore_checkpoint]


@pytest.fixture
def project(tmp_path):
    """P/ holding a model, its forget matrices and an unrelated file: what `--out P` would destroy."""
    p = tmp_path / "P"
    model = make_checkpoint(p / "model")
    forget = make_forget(p / "forget.safetensors")
    (p / "notes.txt").write_text("unrelated work")
    return p, model, forget


@pytest.mark.parametrize("erase", ERASERS)
def test_out_above_the_model_is_refused_even_with_overwrite(project, erase):
    p, model, forget = project
    before, parent = digest_tree(p), listing(p.parent)
    with pytest.raises(UnsafePathError, match=f"output folder {p} contains the input {model}"):
        erase(model, forget, p, overwrite=True)
    assert digest_tree(p) == before and listing(p.parent) == parent  # P/model and P/notes.txt are intact


@pytest.mark.parametrize("erase", ERASERS)
@pytest.mark.parametrize("where", ["same", "inside", "forget"])
def test_out_equal_to_or_inside_an_input_is_refused(project, erase, where):
    p, model, forget = project
    out = {"same": model, "inside": model / "erased", "forget": forget}[where]
    before = digest_tree(p)
    with pytest.raises(UnsafePathError, match="must differ|inside the input"):
        erase(model, forget, out, overwrite=True)
    assert digest_tree(p) == before  # no folder added to the input, no temp folder copied


@pytest.mark.parametrize("restore", RESTORERS)
@pytest.mark.parametrize("where", ["same", "inside", "above"])
def test_restore_out_overlapping_its_input_is_refused(project, restore, where):
    p, model, forget = project
    erased = p / "erased"
    erase_stream(model, forget, erased)
    out = {"same": erased, "inside": erased / "back", "above": p}[where]
    before = digest_tree(p)
    with pytest.raises(UnsafePathError):
        restore(erased, out, overwrite=True)
    assert digest_tree(p) == before


def test_out_reached_through_a_link_is_compared_resolved(project, tmp_path):
    p, model, forget = project
    alias = tmp_path / "alias"
    alias.symlink_to(model)
    with pytest.raises(UnsafePathError, match="must differ"):
        check_output_dir(alias, model, overwrite=True)
    with pytest.raises(UnsafePathError, match="inside the input"):
        check_output_dir(alias / "sub", model)


@pytest.mark.parametrize("erase", ERASERS)
def test_overwrite_replaces_only_a_folder_mmunlearn_wrote(project, tmp_path, erase):
    p, model, forget = project
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff\xd8 not a model")
    before, parent = digest_tree(foreign), listing(tmp_path)
    with pytest.raises(FileExistsError, match="already exists"):
        erase(model, forget, foreign)
    with pytest.raises(UnsafePathError, match=f"{foreign} was not written by mmunlearn \\(no {MARKER}"):
        erase(model, forget, foreign, overwrite=True)
    assert digest_tree(foreign) == before and listing(tmp_path) == parent
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(UnsafePathError, match="not a folder"):
        erase(model, forget, a_file, overwrite=True)
    # an output mmunlearn wrote is replaced; so is an empty folder (nothing to lose)
    out = tmp_path / "out"
    erase(model, forget, out)
    (out / "stale.txt").write_text("from the first run")
    erase(model, forget, out, overwrite=True)
    assert not (out / "stale.txt").exists() and (tmp_path / "out.undo" / "undo_patch.safetensors").is_file()
    assert not (out / "undo_patch.safetensors").exists()  # kept apart, in out.undo (replaced with the output)
    empty = tmp_path / "empty"
    empty.mkdir()
    erase(model, forget, empty, overwrite=True)
    assert (empty / MARKER).is_file()


def test_every_output_folder_has_the_marker_and_ordinary_permissions(project, tmp_path):
    p, model, forget = project
    old = os.umask(0o022)
    try:
        erase_stream(model, forget, tmp_path / "a")
        restore_checkpoint(tmp_path / "a", tmp_path / "b")
        os.umask(0o027)
        with atomic_dir(tmp_path / "c") as tmp:
            (tmp / "x").write_text("x")
    finally:
        os.umask(old)
    for name, mode in (("a", 0o755), ("b", 0o755), ("c", 0o750)):
        assert (tmp_path / name).stat().st_mode & 0o777 == mode, name
        marker = json.loads((tmp_path / name / MARKER).read_text())
        assert marker["tool"] == "mmunlearn" and marker["version"]


def test_atomic_dir_checks_its_inputs(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "data").write_text("keep")
    for out in (src, src / "sub", tmp_path):
        with pytest.raises(UnsafePathError):
            with atomic_dir(out, overwrite=True, inputs=[src]):
                pytest.fail("the block must not run")
    assert (src / "data").read_text() == "keep" and listing(src) == {"data"}


def test_output_appearing_during_the_run_is_not_clobbered(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(FileExistsError):
        with atomic_dir(out) as tmp:
            (tmp / "new").write_text("new")
            out.mkdir()  # another process wrote `out` meanwhile
            (out / "theirs").write_text("theirs")
    assert listing(out) == {"theirs"} and listing(tmp_path) == {"out"}


# ------------------------------------------------------------------------------ leftovers
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_leftovers_of_dead_runs_are_removed_and_live_or_foreign_ones_kept(tmp_path, caplog):
    out = tmp_path / "out"
    dead, live = _dead_pid(), os.getpid()
    names = {
        f".out.tmp-{dead}-{_HOST}-0123abcd": True,  # a killed run of this host
        f".out.old-{dead}-{_HOST}-0123abcd": True,
        ".out.tmp-a1b2_c3d": True,  # an earlier version's mkdtemp name
        f".out.tmp-{live}-{_HOST}-0123abcd": False,  # a run still going
        f".out.tmp-{dead}-ffffffff-0123abcd": False,  # another host's run (shared file system)
        f".out.tmp-5.tmp-{dead}-{_HOST}-0123abcd": False,  # belongs to an output named "out.tmp-5"
        f".other.tmp-{dead}-{_HOST}-0123abcd": False,
    }
    for n in names:
        (tmp_path / n).mkdir()
        (tmp_path / n / "shard.safetensors").write_bytes(b"partial")
    with caplog.at_level(logging.WARNING, logger="mmunlearn.files.paths"):
        removed = clean_leftovers(out)
    assert {p.name for p in removed} == {n for n, stale in names.items() if stale}
    assert listing(tmp_path) == {n for n, stale in names.items() if not stale}
    assert "removed 3 temporary folder(s)" in caplog.text and str(out) in caplog.text


def test_a_run_killed_with_sigkill_leaves_a_temp_folder_the_next_run_removes(project, tmp_path, caplog):
    p, model, forget = project
    out = tmp_path / "out"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from mmunlearn.files.checkpoint import atomic_dir\n"
            f"with atomic_dir({str(out)!r}) as tmp:\n"
            "    (tmp / 'half.safetensors').write_bytes(b'x' * 100)\n"
            "    print('ready', flush=True)\n"
            "    time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    left = [q for q in tmp_path.iterdir() if q.name.startswith(".out.tmp-")]
    assert len(left) == 1 and not out.exists()  # what kill -9 leaves
    with caplog.at_level(logging.WARNING, logger="mmunlearn.files.paths"):
        erase_stream(model, forget, out)
    assert listing(tmp_path) == {"P", "out", "out.undo"} and "interrupted run" in caplog.text
    assert left[0].name in caplog.text


def test_atomic_file_writes_have_ordinary_permissions_and_leave_no_temp_file(tmp_path):
    from mmunlearn.files.atomic import write_json_atomic, write_text_atomic

    old = os.umask(0o022)
    try:
        path = write_json_atomic(tmp_path / "sub" / "r.json", {"a": 1})
        write_text_atomic(tmp_path / "t.txt", "first")
        write_text_atomic(tmp_path / "t.txt", "second")  # replaces
    finally:
        os.umask(old)
    assert json.loads(path.read_text()) == {"a": 1} and path.stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "t.txt").read_text() == "second"
    with pytest.raises(ValueError):
        write_json_atomic(tmp_path / "nan.json", {"x": float("nan")})  # strict JSON: NaN is refused
    assert listing(tmp_path) == {"sub", "t.txt"} and listing(tmp_path / "sub") == {"r.json"}
