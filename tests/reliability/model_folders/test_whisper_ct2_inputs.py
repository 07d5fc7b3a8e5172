"""``python -m data_prep.whisper`` on a hostile CTranslate2 folder: a 26 KB ``model.bin`` declaring a
``[10^8, 0]`` embedding is refused from its sizes before anything is built; a truncated file, an unknown dtype, a
``config.json`` nested 100,000 deep, ``--out`` equal to ``--ct2`` and an existing ``--out`` that is not a
conversion (without ``--force``) each give one ``error:`` line and exit 2; the source stays byte-identical and
nothing is written. ``data_prep.whisper_smollm2 --window-seconds -1`` is refused before any work."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from data_prep.whisper import main
from mmunlearn.errors import run_main
from tests.presets.test_whisper_ct2 import ct2_variables, tiny_whisper, write_ct2, write_folder
from tests.reliability.untrusted import digest_tree, listing


@pytest.fixture(scope="module")
def tiny():
    return tiny_whisper()


def _run(capsys, *argv):
    with pytest.raises(SystemExit) as stop:
        run_main(main, list(argv))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    return err


def test_a_huge_declared_embedding_is_refused_before_anything_is_built(tmp_path, tiny, capsys):
    variables = ct2_variables(tiny)
    variables["decoder/embeddings/weight"] = (np.zeros((10**8, 0), np.float32), "float32")
    src = write_folder(tmp_path / "ct2", tiny, variables=variables)
    before = digest_tree(src)
    tracemalloc.start()
    try:
        err = _run(capsys, "--ct2", str(src), "--out", str(tmp_path / "hf"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "vocab is 100000000, outside 1..60000" in err or "d_model is 0" in err, err
    assert peak < 64 << 20
    assert digest_tree(src) == before and listing(tmp_path) == {"ct2"}


@pytest.mark.parametrize(
    "damage, needle",
    [
        ("truncate", "truncated CTranslate2 model"),
        ("dtype", "unknown data type id 9"),
        ("rank", "truncated CTranslate2 model (reading shape of w"),
        ("unterminated", "is not a NUL-terminated string"),
        ("config", "nested too deeply"),
        ("same", "is the input"),
        ("existing", "pass --force"),
    ],
)
def test_each_bad_input_is_one_error_line(tmp_path, tiny, capsys, damage, needle):
    src = write_folder(tmp_path / "ct2", tiny)
    out = tmp_path / "hf"
    if damage == "truncate":
        (src / "model.bin").write_bytes((src / "model.bin").read_bytes()[:-100])
    elif damage == "dtype":
        write_ct2(src / "model.bin", {"w": (np.ones((2, 2), np.float32), "float32")})
        data = bytearray((src / "model.bin").read_bytes())
        at = data.index(b"w\0") + 2 + 1 + 8  # after the name, the rank byte and two dimensions
        data[at] = 9
        (src / "model.bin").write_bytes(bytes(data))
    elif damage in ("rank", "unterminated"):
        write_ct2(src / "model.bin", {"w": (np.ones((2, 2), np.float32), "float32")})
        data = bytearray((src / "model.bin").read_bytes())
        at = data.index(b"w\0")
        if damage == "rank":
            data[at + 2] = 100  # the rank byte after the name: 100 dimensions the file does not hold
        else:
            data[at + 1] = ord("x")  # the name's terminating NUL gone
        (src / "model.bin").write_bytes(bytes(data))
    elif damage == "config":
        (src / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "same":
        out = src
    else:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    before = {p.name: digest_tree(p) for p in tmp_path.iterdir()}
    err = _run(capsys, "--ct2", str(src), "--out", str(out))
    assert needle in err, err
    assert {p.name: digest_tree(p) for p in tmp_path.iterdir()} == before


def test_whisper_smollm2_refuses_a_negative_window_before_any_work(tmp_path, capsys):
    from data_prep.whisper_smollm2 import main as smollm2_main

    with pytest.raises(SystemExit) as stop:
        smollm2_main(["--window-seconds", "-1", "--manifests", str(tmp_path), "--out", str(tmp_path / "run")])
    assert stop.value.code == 2 and "--window-seconds must be 1..30" in capsys.readouterr().err
    assert listing(tmp_path) == set()


def test_whisper_smollm2_checks_the_manifests_before_assembling_anything(tmp_path):
    from mmunlearn.data.manifest import ManifestError
    from mmunlearn.presets.whisper_smollm2 import train_preset

    manifests = tmp_path / "manifests"
    manifests.mkdir()
    header = "ID,duration,wav,start,stop,spk_id\n"
    (manifests / "train.csv").write_text(header + "a,1.0,../../../../etc/passwd.wav,0,16000,s1\n")
    for split in ("spk_retain_test", "spk_forget_test"):
        (manifests / f"{split}.csv").write_text(header)
    before = digest_tree(manifests)
    with pytest.raises(ManifestError, match="passwd"):
        train_preset(manifests, tmp_path / "run", cache_dir=tmp_path / "cache", log=lambda s: None)
    assert listing(tmp_path) == {"manifests"} and digest_tree(manifests) == before  # no run folder, no cache
