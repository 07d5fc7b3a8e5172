"""Untrusted model folders: hostile shard names in an index, symbolic links leaving the folder, special
files, pickled weights. Each case is refused before anything is read or written, names the offending
file, leaves the inputs byte-identical and writes nothing outside (or at) the output folder."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mmunlearn.erase.in_memory import erase_checkpoint, restore_checkpoint
from mmunlearn.erase.stream import stream_erase_checkpoint, stream_restore_checkpoint
from mmunlearn.errors import UnsafePathError
from mmunlearn.files.checkpoint import MARKER, copy_extra_files, load_checkpoint
from mmunlearn.files.paths import check_tree, plain_name
from mmunlearn.taskvec.store import open_task_matrices
from tests.reliability.untrusted import (
    INDEX,
    ROOT,
    digest_tree,
    listing,
    make_checkpoint,
    make_forget,
    weight_names,
    write_pickle_bomb,
)


def erase_stream(model, forget, out, **kw):
    return stream_erase_checkpoint(model, forget, out, rank=2, progress=False, **kw)


def erase_memory(model, forget, out, **kw):
    return erase_checkpoint(model, forget, out, rank=2, **kw)


ERASERS = [erase_stream, erase_memory]
RESTORERS = [lambda m, o: stream_restore_checkpoint(m, o, progress=False), restore_checkpoint]


def hostile_index(tmp_path: Path, shard: str) -> Path:
    """A checkpoint folder whose index sends layer 2's tensors to ``shard``."""
    model = make_checkpoint(tmp_path / "model")
    index = json.loads((model / INDEX).read_text())
    for name in index["weight_map"]:
        if ".layers.2." in name:
            index["weight_map"][name] = shard
    (model / INDEX).write_text(json.dumps(index))
    return model


@pytest.fixture
def victim(tmp_path):
    """A valid safetensors file outside the model folder, holding layer 2's tensors: what an escaping
    shard name would read and (before the fix) overwrite with edited weights."""
    ref = make_checkpoint(tmp_path / "ref")
    path = tmp_path / "escape.safetensors"
    path.write_bytes((ref / "model-00003-of-00003.safetensors").read_bytes())
    return path


@pytest.mark.parametrize("erase", ERASERS)
@pytest.mark.parametrize("kind", ["relative", "absolute"])
def test_index_shard_outside_the_folder_is_refused_before_anything_is_written(tmp_path, victim, erase, kind):
    shard = "../escape.safetensors" if kind == "relative" else str(victim)
    model = hostile_index(tmp_path, shard)
    forget = make_forget(tmp_path / "forget.safetensors")
    before, victim_bytes, parent = digest_tree(model), victim.read_bytes(), listing(tmp_path)
    with pytest.raises(UnsafePathError, match=re.escape(str(model / INDEX))) as err:
        erase(model, forget, tmp_path / "out")
    assert repr(shard) in str(err.value) and "plain file names" in str(err.value)
    assert victim.read_bytes() == victim_bytes  # not rewritten in place
    assert digest_tree(model) == before and listing(tmp_path) == parent  # no output, no temp folder


@pytest.mark.parametrize("restore", RESTORERS)
def test_restore_refuses_an_index_shard_outside_the_folder(tmp_path, victim, restore):
    erased = tmp_path / "erased"
    erase_stream(make_checkpoint(tmp_path / "model"), make_forget(tmp_path / "forget.safetensors"), erased)
    index = json.loads((erased / INDEX).read_text())
    index["weight_map"] = {
        n: "../escape.safetensors" if ".layers.2." in n else s for n, s in index["weight_map"].items()
    }
    (erased / INDEX).write_text(json.dumps(index))
    before, victim_bytes, parent = digest_tree(erased), victim.read_bytes(), listing(tmp_path)
    with pytest.raises(UnsafePathError, match="escape.safetensors"):
        restore(erased, tmp_path / "back")
    assert victim.read_bytes() == victim_bytes and digest_tree(erased) == before and listing(tmp_path) == parent


@pytest.mark.parametrize(
    "name", ["../x.safetensors", "/etc/passwd", "sub/x.safetensors", "..", ".", "", "a\\b.safetensors", 3, None]
)
def test_plain_name_rejects_everything_but_a_bare_file_name(name):
    with pytest.raises(UnsafePathError, match="index.json"):
        plain_name(name, "folder/model.safetensors.index.json")
    assert plain_name("model-00001-of-00002.safetensors", "i") == "model-00001-of-00002.safetensors"


def test_task_matrix_index_naming_a_file_outside_is_refused(tmp_path, victim):
    index = tmp_path / "tasks" / "forget.safetensors.index.json"
    index.parent.mkdir()
    index.write_text(json.dumps({"weight_map": {weight_names()[0]: "../escape.safetensors"}}))
    with pytest.raises(UnsafePathError, match="forget.safetensors.index.json"):
        open_task_matrices(index)


@pytest.mark.parametrize("erase", ERASERS)
@pytest.mark.parametrize("target", ["file", "folder"])
def test_link_leaving_the_model_folder_is_refused_and_nothing_is_copied(tmp_path, erase, target):
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "id_rsa").write_text("PRIVATE KEY")
    model = make_checkpoint(tmp_path / "model")
    link = model / ("tokenizer.json" if target == "file" else "keys")
    link.symlink_to(secrets / "id_rsa" if target == "file" else secrets)
    forget = make_forget(tmp_path / "forget.safetensors")
    before, parent = digest_tree(model), listing(tmp_path)
    with pytest.raises(UnsafePathError, match=re.escape(str(link))):
        erase(model, forget, tmp_path / "out")
    assert digest_tree(model) == before and listing(tmp_path) == parent
    assert not any(
        "PRIVATE KEY" in p.read_text(errors="ignore")
        for p in tmp_path.rglob("*")
        if p.is_file() and not p.is_symlink() and p != secrets / "id_rsa"
    )


def test_a_link_to_a_shard_outside_is_refused_even_when_the_index_is_plain(tmp_path, victim):
    model = make_checkpoint(tmp_path / "model")
    shard = model / "model-00003-of-00003.safetensors"
    shard.unlink()
    shard.symlink_to(victim)
    with pytest.raises(UnsafePathError, match=re.escape(str(shard))):
        load_checkpoint(model)


def test_links_inside_the_folder_are_copied_as_what_they_point_to(tmp_path):
    model = make_checkpoint(tmp_path / "model")
    (model / "tok").mkdir()
    (model / "tok" / "vocab.txt").write_text("a b c")
    (model / "tokenizer.json").symlink_to("config.json")  # a file link inside
    (model / "tok" / "again").symlink_to("..")  # a folder link inside (a loop if followed)
    out = tmp_path / "out"
    erase_stream(model, make_forget(tmp_path / "forget.safetensors"), out)
    assert (out / "tokenizer.json").is_file() and not (out / "tokenizer.json").is_symlink()
    assert (out / "tokenizer.json").read_bytes() == (model / "config.json").read_bytes()
    assert (out / "tok" / "again").is_symlink() and (out / "tok" / "again").resolve() == out.resolve()
    assert (out / "tok" / "vocab.txt").read_text() == "a b c"


def test_hugging_face_cache_snapshot_links_into_its_blobs_are_allowed(tmp_path):
    repo = tmp_path / "models--org--tiny"
    snap = make_checkpoint(repo / "snapshots" / "abc123", sharded=False)
    (repo / "blobs").mkdir()
    blob = repo / "blobs" / "0123abcd"
    (snap / "config.json").rename(blob)
    (snap / "config.json").symlink_to(Path("..") / ".." / "blobs" / "0123abcd")
    check_tree(snap)  # no error
    out = tmp_path / "out"
    erase_memory(snap, make_forget(tmp_path / "forget.safetensors"), out)
    assert (out / "config.json").read_bytes() == blob.read_bytes() and not (out / "config.json").is_symlink()


def test_broken_link_and_fifo_are_refused_by_name(tmp_path):
    model = make_checkpoint(tmp_path / "model")
    (model / "dangling.json").symlink_to("missing.json")
    with pytest.raises(FileNotFoundError, match="dangling.json"):
        check_tree(model)
    (model / "dangling.json").unlink()
    os.mkfifo(model / "pipe")
    with pytest.raises(UnsafePathError, match="pipe"):  # never opened: a copy would block forever
        erase_stream(model, make_forget(tmp_path / "forget.safetensors"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_copy_extra_files_skips_the_input_marker_and_checks_links(tmp_path):
    model = make_checkpoint(tmp_path / "model")
    (model / MARKER).write_text("{}")  # the model was itself written by mmunlearn
    dst = tmp_path / "dst"
    dst.mkdir()
    copy_extra_files(model, dst, skip={INDEX})
    assert MARKER not in listing(dst) and "config.json" in listing(dst) and INDEX not in listing(dst)
    (model / "evil").symlink_to(tmp_path)
    with pytest.raises(UnsafePathError, match="evil"):
        copy_extra_files(model, tmp_path / "dst2")


# ------------------------------------------------------------------------------------ pickles
def test_pickled_weights_are_never_unpickled(tmp_path):
    """A .bin / .pt pickle whose unpickling would create a file: only safetensors are read, so every loader
    of a user folder leaves it alone (refused as 'no safetensors', left out of the output, or ignored)."""
    marker = tmp_path / "PWNED"
    # a folder with only pickled weights: refused, with a hint
    only_pickle = tmp_path / "pickle_model"
    only_pickle.mkdir()
    write_pickle_bomb(only_pickle / "pytorch_model.bin", marker)
    forget = make_forget(tmp_path / "forget.safetensors")
    for erase in ERASERS:
        with pytest.raises(FileNotFoundError, match="pytorch_model.bin.*safetensors"):
            erase(only_pickle, forget, tmp_path / "o1")
    # a pickle next to safetensors weights is never loaded, and left out of the output (it may hold weights)
    model = make_checkpoint(tmp_path / "model")
    write_pickle_bomb(model / "training_args.bin", marker)
    out = tmp_path / "out"
    erase_stream(model, forget, out)
    assert (model / "training_args.bin").is_file() and not (out / "training_args.bin").exists()
    stream_restore_checkpoint(out, tmp_path / "back", progress=False)
    restore_checkpoint(out, tmp_path / "back2")
    # a pickle in a task-matrix folder is not a task-matrix file; a pickle given as one is refused
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    save_file({weight_names()[0]: torch.ones(8, 6)}, str(tasks / "a.safetensors"))
    write_pickle_bomb(tasks / "b.pt", marker)
    assert list(open_task_matrices(tasks)) == [weight_names()[0]]
    with pytest.raises(ValueError, match="b.pt"):
        open_task_matrices(tasks / "b.pt")
    # a pickle given as the undo patch
    with pytest.raises(ValueError, match="evil_patch.pt"):
        stream_restore_checkpoint(
            out, tmp_path / "back3", patch=write_pickle_bomb(tmp_path / "evil_patch.pt", marker), progress=False
        )
    assert not marker.exists()


def test_no_torch_load_without_weights_only_in_the_checkpoint_code():
    files = [
        "mmunlearn/files/checkpoint.py",
        "mmunlearn/erase/in_memory.py",
        "mmunlearn/files/paths.py",
        "mmunlearn/files/atomic.py",
        "mmunlearn/errors.py",
        "mmunlearn/erase/stream.py",
        "mmunlearn/erase/apply.py",
        "mmunlearn/erase/patch.py",
        "mmunlearn/erase/report.py",
        "mmunlearn/taskvec/store.py",
        "mmunlearn/cli/__init__.py",
    ]
    for f in files:
        for call in re.findall(r"torch\.load\([^)]*\)", (ROOT / f).read_text()):
            assert "weights_only=True" in call, (f, call)
        assert "pickle.load" not in (ROOT / f).read_text(), f
