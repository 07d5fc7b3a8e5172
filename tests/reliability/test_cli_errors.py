"""Errors a person can read: a user error is one line ``error: ...`` naming the file, exit status 2, the
inputs untouched and nothing written next to them; ``--debug`` / ``MMUNLEARN_DEBUG=1`` give the traceback.

Most cases run the console entry point :func:`mmunlearn.cli.main` in-process; a few run
``python -m mmunlearn.cli`` in a subprocess, as a person would."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mmunlearn.adapters.base import resolve_device
from mmunlearn.cli import main
from mmunlearn.errors import UserError, check_threads, set_threads
from mmunlearn.taskvec import save_task_matrices
from tests.reliability.untrusted import (
    INDEX,
    ROOT,
    digest_tree,
    listing,
    make_checkpoint,
    make_forget,
    run_cli,
    weight_names,
)


def run_main(capsys, *args: str) -> tuple[int, str]:
    """Exit status and stderr of ``mmunlearn ARGS`` through the console entry point."""
    with pytest.raises(SystemExit) as done:
        main([str(a) for a in args])
    return done.value.code, capsys.readouterr().err


def assert_one_line(err: str, *needles: str) -> str:
    """The error is one line of its own (progress of the work done before it aside: a live bar, or the line a stage
    writes to a log, ``<stage>: 2/3 shards in 00:01``)."""
    lines = [
        ln
        for ln in err.strip().splitlines()
        if ln.strip() and not re.search(r"\d+%\|.*\|", ln) and not re.fullmatch(r"[^:]+: \d+(/\d+)? \w+ (in|\d).*", ln)
    ]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def work(tmp_path):
    model = make_checkpoint(tmp_path / "model")
    forget = make_forget(tmp_path / "forget.safetensors")
    return tmp_path, model, forget


def erase_args(model, forget, out, *extra):
    return ("erase", "--model", model, "--forget", forget, "--out", out, "--rank", "2", *extra)


def _bad_index(model: Path) -> str:
    (model / INDEX).write_text("{not json")
    return str(model / INDEX)


def _corrupt_shard(model: Path) -> str:
    shard = model / "model-00002-of-00003.safetensors"
    shard.write_bytes(b"\x01\x00")  # SafetensorError: invalid header length
    return str(shard)


CASES = {  # name -> (break the inputs, return the file the message must name, and a phrase of it)
    "bad index JSON": (_bad_index, "is not a valid safetensors index"),
    "corrupt shard": (_corrupt_shard, "cannot read shard"),
}


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
@pytest.mark.parametrize("case", list(CASES))
def test_broken_model_files_are_one_line_naming_the_file(work, capsys, stream, case):
    tmp_path, model, forget = work
    breaker, phrase = CASES[case]
    named = breaker(model)
    before, parent = digest_tree(model), listing(tmp_path)
    code, err = run_main(capsys, *erase_args(model, forget, tmp_path / "out", stream))
    assert code == 2
    assert_one_line(err, named, phrase)
    assert digest_tree(model) == before and listing(tmp_path) == parent


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_missing_model_shape_mismatch_int_task_matrix_and_existing_out(work, capsys, stream):
    tmp_path, model, forget = work
    before, parent = digest_tree(model), listing(tmp_path)
    code, err = run_main(capsys, *erase_args(tmp_path / "nope", forget, tmp_path / "out", stream))
    assert code == 2 and assert_one_line(err, f"model directory not found: {tmp_path / 'nope'}")
    wrong = save_task_matrices(tmp_path / "wrong.safetensors", {weight_names()[0]: torch.zeros(3, 3)})
    code, err = run_main(capsys, *erase_args(model, wrong, tmp_path / "out", stream))
    assert code == 2 and assert_one_line(err, "has shape (3, 3)", str(wrong), str(model))
    ints = tmp_path / "ints.safetensors"
    save_file({weight_names()[0]: torch.ones(8, 6, dtype=torch.int64)}, str(ints))
    code, err = run_main(capsys, *erase_args(model, ints, tmp_path / "out", stream))
    assert code == 2 and assert_one_line(
        err, f"task matrix {weight_names()[0]} in {ints} has dtype int64; expected floating point"
    )
    (tmp_path / "out").mkdir()
    code, err = run_main(capsys, *erase_args(model, forget, tmp_path / "out", stream))
    assert code == 2 and assert_one_line(err, f"output directory already exists: {tmp_path / 'out'}")
    code, err = run_main(capsys, *erase_args(model, forget, tmp_path, stream, "--overwrite"))
    assert code == 2 and assert_one_line(err, f"output folder {tmp_path} contains the input {model}")
    code, err = run_main(capsys, *erase_args(model, forget, tmp_path / "o2", stream, "--scale", "1e40"))
    assert code == 2 and assert_one_line(err, f"erase of {model}", "NaN or Inf", "lower the scale")
    assert digest_tree(model) == before and listing(tmp_path) == parent | {
        "wrong.safetensors",
        "ints.safetensors",
        "out",
    }
    assert listing(tmp_path / "out") == set()


@pytest.fixture
def erased(work):
    tmp_path, model, forget = work
    out = tmp_path / "erased"
    with pytest.raises(SystemExit) as done:
        main(["erase", "--model", str(model), "--forget", str(forget), "--out", str(out), "--rank", "2"])
    assert done.value.code == 0
    return tmp_path, out


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_restore_errors_name_the_folder_or_patch(erased, capsys, stream):
    tmp_path, out = erased
    code, err = run_main(capsys, "restore", "--model", tmp_path / "missing", "--out", tmp_path / "back", stream)
    assert code == 2 and assert_one_line(err, "model", f"not found: {tmp_path / 'missing'}")
    assert "undo patch" not in err
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\xff" * 16)
    no_entries = tmp_path / "no_entries.safetensors"
    save_file({"0.A": torch.zeros(1, 1)}, str(no_entries), metadata={"format": "mmunlearn-undo-1"})
    before, parent = digest_tree(out), listing(tmp_path)
    for patch, phrase in ((garbage, "not a valid safetensors file"), (no_entries, "'entries' is missing")):
        code, err = run_main(capsys, "restore", "--model", out, "--out", tmp_path / "back", "--patch", patch, stream)
        assert code == 2 and assert_one_line(err, str(patch), phrase)
    code, err = run_main(capsys, "restore", "--model", out, "--out", out, "--overwrite", stream)
    assert code == 2 and assert_one_line(err, "must differ")
    assert digest_tree(out) == before and listing(tmp_path) == parent


def test_option_values_are_checked_before_any_work(work, capsys):
    tmp_path, model, forget = work
    for extra in (("--rank", "0"), ("--energy", "1.5"), ("--scale", "nan"), ("--top", "0")):
        args = ["erase", "--model", model, "--forget", forget, "--out", tmp_path / "out", *extra]
        code, err = run_main(capsys, *args)
        assert code == 2 and extra[0] in err, (extra, err)  # click's usage error names the option
    assert not (tmp_path / "out").exists()


def test_debug_flag_and_environment_give_the_traceback(work, capsys, monkeypatch):
    tmp_path, model, forget = work
    args = erase_args(tmp_path / "nope", forget, tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="model directory not found"):
        main(["--debug", *map(str, args)])
    monkeypatch.setenv("MMUNLEARN_DEBUG", "1")
    with pytest.raises(FileNotFoundError, match="model directory not found"):
        main(list(map(str, args)))
    monkeypatch.setenv("MMUNLEARN_DEBUG", "0")
    code, err = run_main(capsys, *args)
    assert code == 2 and assert_one_line(err, "model directory not found")


def test_device_and_threads_are_validated():
    with pytest.raises(ValueError, match=r"unknown device 'bogus'; use auto, cpu, cuda, cuda:N or mps"):
        resolve_device("bogus")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda:0")
    assert resolve_device("cpu").type == "cpu"
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(UserError, match=re.escape(f"--threads must be an integer >= 1, got {bad!r}")):
            set_threads(bad)
    before = torch.get_num_threads()
    try:
        set_threads(2)
        assert torch.get_num_threads() == 2
        set_threads(None)
        assert torch.get_num_threads() == 2 and check_threads(None) is None
    finally:
        torch.set_num_threads(before)


def test_the_console_script_is_the_error_wrapper():
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["mmunlearn"] == "mmunlearn.cli:main"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX paths")
def test_real_process_one_line_error_and_cleanup_notice_on_stderr(work):
    tmp_path, model, forget = work
    res = run_cli(*map(str, erase_args(tmp_path / "nope", forget, tmp_path / "out")))
    assert res.returncode == 2 and res.stdout == ""
    assert_one_line(res.stderr, f"model directory not found: {tmp_path / 'nope'}")
    # a successful run: the leftover of a killed run is removed and a large edit is warned about, on stderr
    (tmp_path / ".out.tmp-a1b2c3d4").mkdir()
    res = run_cli(*map(str, erase_args(model, forget, tmp_path / "out", "--scale", "30")))
    assert res.returncode == 0, res.stderr
    assert "removed 1 temporary folder(s)" in res.stderr and ".out.tmp-a1b2c3d4" in res.stderr
    assert "warning: update larger than 0.5" in res.stderr and "model.layers.2" in res.stderr
    assert listing(tmp_path) == {"model", "forget.safetensors", "out", "out.undo"}  # the patch is kept apart
    assert json.loads((tmp_path / "out" / "erase_report.json").read_text())["large_update_layers"] == ["model.layers.2"]
