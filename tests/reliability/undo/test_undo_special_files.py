"""An undo folder's ``undo.json`` that is a FIFO (or any file that is not regular) is refused, naming it, by
``restore`` and by ``unlearn --model OUT`` (the request history): never waited on. The folders are left as they
were and nothing is written."""

from __future__ import annotations

import os
import shutil

import pytest

from mmunlearn.erase.in_memory import erase_checkpoint
from mmunlearn.errors import UnsafePathError
from mmunlearn.requests import read_history
from tests.reliability.untrusted import digest_tree, listing, make_checkpoint, make_forget, run_cli


@pytest.fixture
def fifo_undo(tmp_path):
    model = make_checkpoint(tmp_path / "model")
    erase_checkpoint(model, make_forget(tmp_path / "forget.safetensors"), tmp_path / "out", rank=2)
    info = tmp_path / "out.undo" / "undo.json"
    info.unlink()
    os.mkfifo(info)
    return tmp_path / "out"


def test_restore_refuses_a_fifo_undo_json(fifo_undo, tmp_path):
    before = digest_tree(fifo_undo)
    done = run_cli("restore", "--model", str(fifo_undo), "--out", str(tmp_path / "back"), timeout=60)
    assert done.returncode == 2, done.stderr
    assert "undo.json is not a regular file" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert digest_tree(fifo_undo) == before and "back" not in listing(tmp_path)


def test_the_request_history_refuses_it_too(fifo_undo, tmp_path):
    (fifo_undo / "unlearn_report.json").write_text((fifo_undo / "erase_report.json").read_text())
    with pytest.raises(UnsafePathError, match="undo.json is not a regular file"):
        read_history(fifo_undo)


@pytest.mark.parametrize("content", ["sparse", "deep"])
def test_check_release_refuses_a_huge_or_deep_report_naming_it(tmp_path, content):
    from typer.testing import CliRunner

    from mmunlearn.cli import app

    out = tmp_path / "out"
    out.mkdir()
    report = out / "unlearn_report.json"
    if content == "sparse":
        with open(report, "wb") as fh:
            fh.truncate(3 << 30)  # 3 GiB of holes: nothing is allocated unless it is read
    else:
        report.write_text("[" * 200_000 + "]" * 200_000)
    done = CliRunner().invoke(app, ["check-release", "--model", str(out)])
    assert done.exit_code != 0 and isinstance(done.exception, ValueError)
    assert "unlearn_report.json" in str(done.exception)
    assert ("more than" in str(done.exception)) == (content == "sparse")
    assert listing(out) == {"unlearn_report.json"}


def test_restore_does_not_take_a_tampered_no_change_report_on_its_word(tmp_path):
    from tests.reliability.untrusted import run_cli_here

    model = make_checkpoint(tmp_path / "model")
    erase_checkpoint(model, make_forget(tmp_path / "forget.safetensors"), tmp_path / "out", rank=2)
    out = tmp_path / "out"
    (out / "erase_report.json").unlink()  # names the undo folder: gone, as is the folder
    shutil.rmtree(tmp_path / "out.undo")
    (out / "unlearn_report.json").write_text('{"method": "qr-erase", "changed_fraction": 0.0}')
    before = digest_tree(out)
    done = run_cli_here("restore", "--model", str(out), "--out", str(tmp_path / "back"))
    assert done.returncode == 2 and "undo patch not found" in done.stderr and "says no weight changed" in done.stderr
    assert digest_tree(out) == before and listing(tmp_path) == {"model", "forget.safetensors", "out"}


def test_an_undo_folder_others_may_write_is_not_trusted(tmp_path):
    from tests.reliability.untrusted import run_cli_here

    model = make_checkpoint(tmp_path / "model")
    erase_checkpoint(model, make_forget(tmp_path / "forget.safetensors"), tmp_path / "out", rank=2)
    os.chmod(tmp_path / "out.undo", 0o777)
    before = digest_tree(tmp_path / "out.undo")
    done = run_cli_here("restore", "--model", str(tmp_path / "out"), "--out", str(tmp_path / "back"))
    assert done.returncode == 2 and "writable by its group or others (mode 777)" in done.stderr, done.stderr
    assert digest_tree(tmp_path / "out.undo") == before and "back" not in listing(tmp_path)
    os.chmod(tmp_path / "out.undo", 0o700)
    assert run_cli_here("restore", "--model", str(tmp_path / "out"), "--out", str(tmp_path / "back")).returncode == 0


@pytest.mark.parametrize("content", ["sparse", "fifo"])
def test_load_refuses_a_huge_or_special_report_naming_it(tmp_path, content):
    import mmunlearn

    model = make_checkpoint(tmp_path / "model", sharded=False)
    report = model / "unlearn_report.json"
    if content == "sparse":
        with open(report, "wb") as fh:
            fh.truncate(3 << 30)
    else:
        os.mkfifo(report)
    before = digest_tree(model)
    needle = "more than the 67108864" if content == "sparse" else "not a regular file"
    with pytest.raises((ValueError, UnsafePathError), match=rf"unlearn_report\.json (is|.*){needle}"):
        mmunlearn.load(model, device="cpu")
    assert digest_tree(model) == before


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_an_undo_folder_owned_by_another_user_is_not_trusted(tmp_path):
    from mmunlearn.files.undo_store import undo_dir_of

    model = make_checkpoint(tmp_path / "model")
    erase_checkpoint(model, make_forget(tmp_path / "forget.safetensors"), tmp_path / "out", rank=2)
    os.chown(tmp_path / "out.undo", 54321, -1)
    with pytest.raises(UnsafePathError, match=r"owned by another user \(uid 54321"):
        undo_dir_of(tmp_path / "out")
