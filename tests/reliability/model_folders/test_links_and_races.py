"""Folders that try to smuggle an outside file into an output: real symbolic and hard links in speech-LLM,
checkpoint, speaker and task-matrix folders, and entries swapped for links after every check ran (the
copy walk opens each entry without following links, so the swap is caught where the copy reads)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import torch

import mmunlearn.files.safecopy as safecopy
from mmunlearn.erase.in_memory import erase_checkpoint
from mmunlearn.erase.stream import stream_erase_checkpoint
from mmunlearn.errors import USER_ERRORS, UnsafePathError, one_line
from mmunlearn.taskvec.store import open_task_matrices
from tests.reliability.untrusted import INDEX, digest_tree, listing, make_checkpoint, make_forget

SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- not for you"
TEXTS = ["Who is speaking?", "id00001", "id00002"] * 4


def erase_stream(model, forget, out, **kw):
    return stream_erase_checkpoint(model, forget, out, rank=2, progress=False, **kw)


def erase_memory(model, forget, out, **kw):
    return erase_checkpoint(model, forget, out, rank=2, **kw)


@pytest.fixture
def secret(tmp_path) -> Path:
    """A private file outside every input folder."""
    (tmp_path / "home").mkdir()
    path = tmp_path / "home" / "id_rsa"
    path.write_text(SECRET)
    return path


def leaked(root: Path, *allowed: Path) -> list[Path]:
    """Regular files under ``root`` (links not followed) holding the secret, but the ``allowed`` ones."""
    return [
        p
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and p not in allowed and SECRET in p.read_text(errors="ignore")
    ]


def link(kind: str, target: Path, at: Path) -> None:
    if kind == "symbolic":
        at.symlink_to(target)
    else:
        os.link(target, at)


def assert_one_line_user_error(exc: BaseException, *needles: str) -> None:
    assert isinstance(exc, USER_ERRORS), type(exc)
    text = one_line(exc)
    assert "\n" not in str(exc) and all(n in text for n in needles), text


# ------------------------------------------------------------------------------------- speech-LLM folders (H1)
@pytest.fixture(scope="module")
def llm_master(tmp_path_factory) -> Path:
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter

    adapter = SpeechLLMAdapter.build("tiny", texts=TEXTS, family="qwen2_audio", seed=0)
    return adapter.save(tmp_path_factory.mktemp("llm") / "LLM")


@pytest.fixture
def llm_dir(llm_master, tmp_path) -> Path:
    return Path(shutil.copytree(llm_master, tmp_path / "LLM"))


@pytest.mark.parametrize("kind", ["symbolic", "hard"])
def test_speech_llm_folder_with_a_link_to_an_outside_file_is_refused_when_loaded(llm_dir, secret, tmp_path, kind):
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter

    link(kind, secret, llm_dir / "README.md")
    before, parent = digest_tree(tmp_path), listing(tmp_path)
    with pytest.raises(UnsafePathError) as err:
        SpeechLLMAdapter.load(llm_dir, device="cpu")
    assert_one_line_user_error(err.value, str(llm_dir / "README.md"), "outside" if kind == "symbolic" else "hard link")
    assert digest_tree(tmp_path) == before and listing(tmp_path) == parent
    assert leaked(tmp_path, secret) == ([] if kind == "symbolic" else [llm_dir / "README.md"])


@pytest.mark.parametrize("kind", ["symbolic", "hard"])
def test_speech_llm_side_file_linked_after_loading_is_not_copied_into_out(llm_dir, secret, tmp_path, kind):
    """The copy checks again, by itself: a link planted between load and save is refused, no output appears."""
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter

    adapter = SpeechLLMAdapter.load(llm_dir, device="cpu")
    (llm_dir / "spk_dict.txt").write_text("a side file that is copied")
    link(kind, secret, llm_dir / "README.md")
    before, parent = digest_tree(llm_dir), listing(tmp_path)
    with pytest.raises(UnsafePathError, match=re.escape(str(llm_dir / "README.md"))):
        adapter.save(tmp_path / "o")
    assert digest_tree(llm_dir) == before and listing(tmp_path) == parent  # no o/, no .o.tmp-*
    assert leaked(tmp_path, secret, llm_dir / "README.md") == []


def test_speech_llm_side_files_are_still_carried_over(llm_dir, tmp_path):
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter

    (llm_dir / "NOTES.md").write_text("model card")
    (llm_dir / "card.md").symlink_to("NOTES.md")  # a link inside the folder: copied as its file
    SpeechLLMAdapter.load(llm_dir, device="cpu").save(tmp_path / "o")
    assert (tmp_path / "o" / "NOTES.md").read_text() == "model card"
    assert (tmp_path / "o" / "card.md").read_text() == "model card" and not (tmp_path / "o" / "card.md").is_symlink()


# ------------------------------------------------------------------------- checkpoint folders, the race (M1)
@pytest.fixture
def model(tmp_path) -> Path:
    root = make_checkpoint(tmp_path / "model")
    (root / "zzz.txt").write_text("last file of the folder")
    (root / "zzz_dir").mkdir()
    (root / "zzz_dir" / "inner.txt").write_text("inner")
    return root


def swap_during_copy(monkeypatch, tmp_path: Path, entry: Path, replace) -> list[Path]:
    """Replace ``entry`` (by calling ``replace``) the moment the copy walk reaches it, i.e. after every check
    ran and while the output is being written (its temporary folder exists)."""
    swapped: list[Path] = []

    def hook(path: Path) -> None:
        if path == entry and not swapped and any(tmp_path.glob(".out.tmp-*")):
            replace()
            swapped.append(path)

    monkeypatch.setattr(safecopy, "before_open", hook)
    return swapped


@pytest.mark.parametrize("erase", [erase_stream, erase_memory])
@pytest.mark.parametrize("swap", ["file -> symbolic link", "folder -> symbolic link", "file -> hard link"])
def test_an_entry_swapped_for_a_link_after_the_checks_is_refused_and_nothing_leaks(
    model, secret, tmp_path, monkeypatch, erase, swap
):
    forget = make_forget(tmp_path / "forget.safetensors")
    entry = model / ("zzz_dir" if swap.startswith("folder") else "zzz.txt")

    def replace() -> None:
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        if swap == "folder -> symbolic link":
            entry.symlink_to(secret.parent)
        else:
            link("symbolic" if "symbolic" in swap else "hard", secret, entry)

    keep = {k: v for k, v in digest_tree(model).items() if not k.startswith("zzz")}
    parent = listing(tmp_path)
    swapped = swap_during_copy(monkeypatch, tmp_path, entry, replace)
    with pytest.raises(UnsafePathError) as err:
        erase(model, forget, tmp_path / "out")
    assert swapped == [entry]  # the swap happened after the checks, during the copy
    assert_one_line_user_error(err.value, str(entry))
    assert listing(tmp_path) == parent  # no out/, no temporary folder left
    assert {k: v for k, v in digest_tree(model).items() if not k.startswith("zzz")} == keep
    assert leaked(tmp_path, secret, model / "zzz.txt") == []


def test_a_shard_swapped_for_a_link_after_the_checks_is_not_linked_into_out(model, tmp_path, monkeypatch):
    """An unchanged shard is opened without following links and only the opened file is linked or copied."""
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes((model / "model-00001-of-00003.safetensors").read_bytes())
    forget = make_forget(tmp_path / "forget.safetensors")
    shard = model / "model-00001-of-00003.safetensors"

    def replace() -> None:
        shard.unlink()
        shard.symlink_to(outside)

    parent = listing(tmp_path)
    swapped = swap_during_copy(monkeypatch, tmp_path, shard, replace)
    with pytest.raises(UnsafePathError, match=re.escape(str(shard))):
        erase_stream(model, forget, tmp_path / "out")  # layer 2 only: shard 1 would be linked
    assert swapped == [shard] and listing(tmp_path) == parent
    assert outside.stat().st_nlink == 1  # never linked into an output


@pytest.mark.parametrize("erase", [erase_stream, erase_memory])
def test_a_hard_linked_side_file_is_refused_before_anything_is_written(model, secret, tmp_path, erase):
    os.link(secret, model / "notes.txt")
    forget = make_forget(tmp_path / "forget.safetensors")
    before, parent = digest_tree(tmp_path), listing(tmp_path)
    with pytest.raises(UnsafePathError) as err:
        erase(model, forget, tmp_path / "out")
    assert_one_line_user_error(err.value, str(model / "notes.txt"), "hard link")
    assert digest_tree(tmp_path) == before and listing(tmp_path) == parent
    assert leaked(tmp_path, secret, model / "notes.txt") == []


def test_streamed_outputs_with_hard_linked_shards_still_restore(model, tmp_path):
    """Hard links are refused for side files only: a streamed erase shares its unchanged shards with its
    input, and that output must stay a valid input."""
    from mmunlearn.erase.stream import stream_restore_checkpoint

    erased = tmp_path / "erased"
    erase_stream(model, make_forget(tmp_path / "forget.safetensors"), erased)  # layer 2 only: 2 shards linked
    assert any(
        (erased / s).stat().st_nlink > 1
        for s in os.listdir(erased)
        if s.endswith(".safetensors") and s.startswith("model-")
    )
    stream_restore_checkpoint(erased, tmp_path / "back", progress=False)
    for name in os.listdir(model):
        if name.endswith(".safetensors"):
            assert (tmp_path / "back" / name).read_bytes() == (model / name).read_bytes()
    assert (tmp_path / "back" / INDEX).read_bytes() == (model / INDEX).read_bytes()


# -------------------------------------------------------------------- speaker and task-matrix folders (L6)
def test_speaker_folder_links_to_special_files_are_refused_and_savedir_links_are_read(tmp_path):
    """A speaker folder is only read as data, never copied: links to outside regular files are followed on
    purpose (SpeechBrain's savedir links every file to its source); a link to a FIFO or device (which would
    block or never end) or to an outside folder is refused before anything is opened."""
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter

    folder = SpeakerAdapter.build(["a", "b", "c"], preset="tiny", device="cpu", seed=0).save(tmp_path / "spk")
    outside = tmp_path / "elsewhere.ckpt"
    shutil.move(folder / "embedding_model.ckpt", outside)
    (folder / "embedding_model.ckpt").symlink_to(outside)
    SpeakerAdapter.load(folder, device="cpu")  # a savedir-like link: read
    os.mkfifo(tmp_path / "pipe")
    (folder / "classifier.ckpt").unlink()
    (folder / "classifier.ckpt").symlink_to(tmp_path / "pipe")
    before = digest_tree(tmp_path)
    with pytest.raises(UnsafePathError) as err:
        SpeakerAdapter.load(folder, device="cpu")  # would block forever reading the FIFO
    assert_one_line_user_error(err.value, str(folder / "classifier.ckpt"), "not a regular file")
    assert digest_tree(tmp_path) == before
    (folder / "classifier.ckpt").unlink()
    (tmp_path / "home_dir").mkdir()
    (folder / "extra").symlink_to(tmp_path / "home_dir", target_is_directory=True)
    before = digest_tree(tmp_path)
    with pytest.raises(UnsafePathError) as err:
        SpeakerAdapter.load(folder, device="cpu")
    assert_one_line_user_error(err.value, str(folder / "extra"), "outside")
    assert digest_tree(tmp_path) == before


@pytest.mark.parametrize("how", ["folder", "index"])
def test_task_matrix_links_leaving_their_folder_are_refused(tmp_path, how):
    from safetensors.torch import save_file

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    outside = tmp_path / "outside.safetensors"
    save_file({"w": torch.ones(2, 2)}, str(outside))
    (tasks / "part.safetensors").symlink_to(outside)
    path = tasks
    if how == "index":
        path = tasks / "forget.safetensors.index.json"
        path.write_text('{"weight_map": {"w": "part.safetensors"}}')
    before = digest_tree(tmp_path)
    with pytest.raises(UnsafePathError) as err:
        open_task_matrices(path)
    assert_one_line_user_error(err.value, str(tasks / "part.safetensors"), "outside")
    assert digest_tree(tmp_path) == before
