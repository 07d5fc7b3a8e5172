"""The second hostile-input audit (issue 23): shard names that collide with output files, hyperparams.yaml
sizes that would allocate gigabytes, deep JSON, float8/complex tensors, full disks, long --out names,
SIGTERM, odd audio and side files. Each is one error naming the file and what is wrong; the inputs stay
byte-identical and nothing is written outside (or at) the output folder."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from mmunlearn.adapters.speaker.io import HPARAMS, read_speaker_dir
from mmunlearn.erase.in_memory import erase_checkpoint
from mmunlearn.erase.patch import UndoPatch
from mmunlearn.erase.stream import stream_erase_checkpoint
from mmunlearn.errors import USER_ERRORS, WriteError, one_line
from mmunlearn.files import layout
from mmunlearn.files.undo_store import default_undo_dir, undo_dir_of
from mmunlearn.taskvec.store import open_task_matrices
from tests.reliability.untrusted import INDEX, ROOT, digest_tree, listing, make_checkpoint, make_forget


def erase_stream(model, forget, out, **kw):
    return stream_erase_checkpoint(model, forget, out, rank=2, progress=False, **kw)


def erase_memory(model, forget, out, **kw):
    return erase_checkpoint(model, forget, out, rank=2, **kw)


ERASERS = [erase_stream, erase_memory]


def user_error(exc: BaseException, *needles: str) -> str:
    """``exc`` is shown by the CLI as one ``error:`` line holding every needle."""
    assert isinstance(exc, USER_ERRORS), type(exc)
    text = one_line(exc)
    for needle in needles:
        assert needle in text, (needle, text)
    return text


# ------------------------------------------------------------------------ M3: shards named like outputs
@pytest.mark.parametrize("erase", ERASERS)
@pytest.mark.parametrize("name", sorted(layout.RESERVED - {layout.TILT_DIR, layout.HISTORY_DIR}))
def test_a_shard_named_like_an_output_file_is_refused_before_anything_is_written(tmp_path, erase, name):
    model = make_checkpoint(tmp_path / "model")
    os.replace(model / "model-00003-of-00003.safetensors", model / name)
    index = json.loads((model / INDEX).read_text())
    index["weight_map"] = {
        k: name if v == "model-00003-of-00003.safetensors" else v for k, v in index["weight_map"].items()
    }
    (model / INDEX).write_text(json.dumps(index))
    forget = make_forget(tmp_path / "forget.safetensors")
    before, parent = digest_tree(tmp_path), listing(tmp_path)
    with pytest.raises(ValueError) as err:
        erase(model, forget, tmp_path / "out")
    user_error(err.value, str(model / INDEX), repr(name), "rename the shard")
    assert digest_tree(tmp_path) == before and listing(tmp_path) == parent


def test_the_writers_take_their_names_from_the_layout_module():
    from mmunlearn.erase import apply, in_memory, stream
    from mmunlearn.files.paths import MARKER
    from mmunlearn.methods import artefacts, harness
    from mmunlearn.requests.history import HISTORY_DIR

    assert (
        apply.PATCH_NAME,
        apply.REPORT_NAME,
        in_memory.PLOT_NAME,
        harness.REPORT_NAME,
        artefacts.TILT_DIR,
        MARKER,
        HISTORY_DIR,
    ) == (
        layout.PATCH_NAME,
        layout.ERASE_REPORT,
        layout.PLOT_NAME,
        layout.UNLEARN_REPORT,
        layout.TILT_DIR,
        layout.MARKER,
        layout.HISTORY_DIR,
    )
    assert set(harness.restore_leftovers()) == {
        layout.PATCH_NAME,
        layout.UNLEARN_REPORT,
        layout.ERASE_REPORT,
        layout.PLOT_NAME,
        layout.TILT_DIR,
    }
    assert set(stream.LEFTOVERS) | {layout.MARKER, layout.HISTORY_DIR} == set(layout.RESERVED)


# ----------------------------------------------------------------- M2: hyperparams.yaml sizes out of range
@pytest.fixture(scope="module")
def speaker_master(tmp_path_factory):
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter

    return SpeakerAdapter.build(["a", "b", "c"], preset="tiny", device="cpu", seed=0).save(
        tmp_path_factory.mktemp("spk") / "model"
    )


FBANK_ARGS = "    sample_rate: 16000\n    n_mels: 24\n"
BOMBS = {  # replacement of Fbank's arguments -> the key the error names
    "sample_rate 10^12": ("    sample_rate: 1000000000000\n    n_mels: 24\n", "compute_features[sample_rate]"),
    "sample_rate 1 Hz": ("    sample_rate: 1\n    n_mels: 24\n", "compute_features[sample_rate]"),
    "sample_rate 10 MHz": ("    sample_rate: 10000000\n    n_mels: 24\n", "compute_features[sample_rate]"),
    "sample_rate 1e308": ("    sample_rate: 1.0e+308\n    n_mels: 24\n", "compute_features[sample_rate]"),
    "n_fft 2^31": (FBANK_ARGS + "    n_fft: 2147483648\n", "compute_features[n_fft]"),
    "win_length 10^9 ms": (FBANK_ARGS + "    win_length: 1000000000\n", "compute_features[win_length]"),
    "n_mels 10^7": ("    sample_rate: 16000\n    n_mels: 10000000\n", "compute_features[n_mels]"),
}


@pytest.mark.parametrize("case", sorted(BOMBS))
def test_hyperparams_sizes_out_of_range_are_refused_before_anything_is_built(speaker_master, tmp_path, case):
    folder = Path(shutil.copytree(speaker_master, tmp_path / "model"))
    text = (folder / HPARAMS).read_text()
    assert FBANK_ARGS in text
    replacement, key = BOMBS[case]
    (folder / HPARAMS).write_text(text.replace(FBANK_ARGS, replacement))
    before = digest_tree(tmp_path)
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        read_speaker_dir(folder)
    user_error(err.value, f"{folder / HPARAMS}: {key}", "refused")
    assert time.perf_counter() - start < 30  # nothing of the asked size was allocated or filled
    assert digest_tree(tmp_path) == before


@pytest.mark.parametrize("value", ["1", "10000000", ".nan"])
def test_the_top_level_sample_rate_must_be_a_plausible_audio_rate(speaker_master, tmp_path, value):
    folder = Path(shutil.copytree(speaker_master, tmp_path / "model"))
    text = (folder / HPARAMS).read_text()
    (folder / HPARAMS).write_text(text.replace("sample_rate: 16000\naam", f"sample_rate: {value}\naam", 1))
    with pytest.raises(ValueError) as err:
        read_speaker_dir(folder)
    user_error(err.value, str(folder / HPARAMS), "sample_rate", "1000..192000")


# ----------------------------------------------------------------------- L1: deep JSON, float8 / complex
DEEP = "[" * 150_000 + "]" * 150_000


@pytest.mark.parametrize("erase", ERASERS)
def test_an_index_nested_150000_levels_deep_is_one_error(tmp_path, erase):
    model = make_checkpoint(tmp_path / "model")
    (model / INDEX).write_text('{"weight_map": ' + DEEP + "}")
    forget = make_forget(tmp_path / "forget.safetensors")
    before, parent = digest_tree(tmp_path), listing(tmp_path)
    with pytest.raises(ValueError) as err:
        erase(model, forget, tmp_path / "out")
    user_error(err.value, str(model / INDEX), "nested too deeply")
    assert digest_tree(tmp_path) == before and listing(tmp_path) == parent


def test_undo_patch_metadata_nested_deeply_is_one_error(tmp_path):
    from safetensors.torch import save_file

    from mmunlearn.erase.patch import FORMAT

    patch = tmp_path / "undo_patch.safetensors"
    save_file({"0.A": torch.zeros(1)}, str(patch), metadata={"format": FORMAT, "entries": DEEP})
    with pytest.raises(ValueError) as err:
        UndoPatch.load(patch)
    user_error(err.value, str(patch), "nested too deeply")


@pytest.mark.parametrize("erase", ERASERS)
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.complex64])
def test_float8_and_complex_weights_are_refused_by_name(tmp_path, erase, dtype):
    model = make_checkpoint(tmp_path / "model", dtype=dtype)
    forget = make_forget(tmp_path / "forget.safetensors")
    before, parent = digest_tree(tmp_path), listing(tmp_path)
    with pytest.raises(ValueError) as err:
        erase(model, forget, tmp_path / "out")
    user_error(err.value, "model parameter", str(model), "expected floating point")
    assert digest_tree(tmp_path) == before and listing(tmp_path) == parent


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.complex64])
def test_float8_and_complex_forget_matrices_are_refused(tmp_path, dtype):
    """complex64 used to pass, its imaginary part dropped with only a ComplexWarning (L2)."""
    forget = make_forget(tmp_path / "forget.safetensors", dtype=dtype)
    before = digest_tree(tmp_path)
    with pytest.raises(ValueError) as err:
        open_task_matrices(forget)
    user_error(err.value, str(forget), str(dtype).replace("torch.", ""), "expected floating point")
    assert digest_tree(tmp_path) == before


# ---------------------------------------------------------------- L1 / L5: full disk, file-size limit
@pytest.fixture
def big_model(tmp_path):
    """One 256 x 256 float32 shard per layer (256 kB), a small config."""
    from safetensors.torch import save_file

    root = tmp_path / "model"
    root.mkdir()
    (root / "config.json").write_text("{}")
    g = torch.Generator().manual_seed(0)
    weight_map, forget = {}, {}
    for i in range(2):
        name = f"model.layers.{i}.mlp.up_proj.weight"
        shard = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({name: torch.randn(256, 256, generator=g)}, str(root / shard))
        weight_map[name] = shard
        forget[name] = (4.0 if i else 0.1) * torch.randn(256, 256, generator=g)
    (root / INDEX).write_text(json.dumps({"weight_map": weight_map}))
    from mmunlearn.taskvec import save_task_matrices

    return root, save_task_matrices(tmp_path / "forget.safetensors", forget)


@pytest.fixture
def file_size_limit():
    """``ulimit -f 64`` (64 kB per file) for the block; Python ignores SIGXFSZ, so writes fail with EFBIG."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.mark.parametrize("hardlink", [True, False])
def test_a_file_size_limit_during_shard_writes_names_the_output_file(big_model, tmp_path, file_size_limit, hardlink):
    model, forget = big_model
    before, parent = digest_tree(tmp_path), listing(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(WriteError) as err:
        erase_stream(model, forget, out, hardlink=hardlink)
    text = user_error(err.value, "cannot write", str(out / "model-0000"), "File too large")
    assert str(model) not in text  # the output is named, not the input it was copied from (L5)
    assert digest_tree(tmp_path) == before and listing(tmp_path) == parent


def test_a_file_size_limit_in_memory_erase_names_the_output_file(big_model, tmp_path, file_size_limit):
    model, forget = big_model
    before, parent = digest_tree(tmp_path), listing(tmp_path)
    with pytest.raises(WriteError) as err:
        erase_memory(model, forget, tmp_path / "out")
    user_error(err.value, "cannot write", "model-0000", "File too large")
    assert digest_tree(tmp_path) == before and listing(tmp_path) == parent


# ------------------------------------------------------------ L3: modes; L4: long names; L10: SIGTERM
@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_rewritten_shards_get_ordinary_permissions(tmp_path, mask):
    model = make_checkpoint(tmp_path / "model")
    forget = make_forget(tmp_path / "forget.safetensors")
    old = os.umask(mask)
    try:
        for i, erase in enumerate(ERASERS):
            out = tmp_path / f"out{i}"
            erase(model, forget, out, hardlink=False) if erase is erase_stream else erase(model, forget, out)
            for p in out.iterdir():
                if p.is_file():
                    assert p.stat().st_mode & 0o777 == 0o666 & ~mask, (p, oct(p.stat().st_mode))
    finally:
        os.umask(old)


def test_an_out_name_of_255_characters_works(tmp_path):
    model = make_checkpoint(tmp_path / "model")
    forget = make_forget(tmp_path / "forget.safetensors")
    out = tmp_path / ("o" * 255)
    erase_stream(model, forget, out)
    erase_stream(model, forget, out, overwrite=True)  # the swap-out folder of an old output too
    undo = default_undo_dir(out)  # the name shortened to fit one file name, as the report names it
    assert not (out / layout.PATCH_NAME).exists() and (undo / layout.PATCH_NAME).is_file()
    assert len(os.fsencode(undo.name)) <= 255 and undo_dir_of(out) == undo
    assert listing(tmp_path) == {"model", "forget.safetensors", out.name, undo.name}


def test_sigterm_while_an_output_is_written_leaves_no_temporary_folder(tmp_path):
    script = (
        "import sys, time\n"
        "from mmunlearn.files.checkpoint import atomic_dir\n"
        "with atomic_dir(sys.argv[1]) as tmp:\n"
        "    (tmp / 'big.bin').write_bytes(b'x' * 1_000_000)\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
    )
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", script, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert len(list(tmp_path.glob(".out.tmp-*"))) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM  # still ends by the signal, as asked
    finally:
        proc.kill()
    assert listing(tmp_path) == set()  # no out, no hidden .out.tmp-*


# ------------------------------------------------------------------ L7: speech LLM with pickled weights only
def test_speech_llm_folder_with_only_pytorch_model_bin_gets_the_safetensors_hint(tmp_path):
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter
    from tests.reliability.untrusted import write_pickle_bomb

    folder = tmp_path / "LLM"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2_audio"}))
    marker = tmp_path / "PWNED"
    write_pickle_bomb(folder / "pytorch_model.bin", marker)
    before = digest_tree(tmp_path)
    with pytest.raises(FileNotFoundError) as err:
        SpeechLLMAdapter.load(folder, device="cpu")
    user_error(err.value, str(folder), "pytorch_model.bin", "convert to safetensors")
    assert not marker.exists() and digest_tree(tmp_path) == before


# ------------------------------------------------------------------ L1 / L8 / L9: audio and manifests
def test_a_zero_byte_wav_is_a_user_error_naming_it(tmp_path):
    from mmunlearn.data.audio import AudioError, read_audio

    wav = tmp_path / "empty.wav"
    wav.write_bytes(b"")
    with pytest.raises(AudioError) as err:
        read_audio(wav)
    user_error(err.value, str(wav))


def test_a_1_hz_wav_is_refused_by_the_manifest_checks(tmp_path):
    from mmunlearn.data.manifest import ManifestError, check_rows

    slow = tmp_path / "slow.wav"
    sf.write(slow, np.zeros(16, dtype=np.float32), 1)
    fine = tmp_path / "fine.wav"
    sf.write(fine, np.zeros(1600, dtype=np.float32), 8000)
    rows = [{"ID": "a", "wav": str(slow), "spk_id": "s"}, {"ID": "b", "wav": str(fine), "spk_id": "s"}]
    before = digest_tree(tmp_path)
    with pytest.raises(ManifestError) as err:
        check_rows(rows, "forget items")
    text = user_error(err.value, "row 0 (ID 'a')", str(slow), "sample rate of 1 Hz")
    assert "fine.wav" not in text and digest_tree(tmp_path) == before


def test_a_large_manifest_shows_its_row_count_and_progress(capsys):
    """A million rows is VoxCeleb2's real size, so it is not refused (deliberate); the checks say how many."""
    from mmunlearn.data.manifest import PROGRESS_ROWS, check_rows

    check_rows([{"ID": str(i), "duration": 1.0} for i in range(PROGRESS_ROWS)], "big.csv")
    assert f"checking {PROGRESS_ROWS} rows of big.csv" in capsys.readouterr().err
    check_rows([{"ID": "x", "duration": 1.0}], "small.csv")
    assert "checking" not in capsys.readouterr().err


# ------------------------------------------------------------------------------- L1: data_prep side files
def _prepare_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("MMUNLEARN_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "data_prep.voxceleb2", "prepare", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize("case", ["meta /dev/zero", "out is root"])
def test_voxceleb2_prepare_bad_side_file_or_out_is_one_error_line(tmp_path, case):
    root = tmp_path / "vox2"
    wav = root / "dev" / "aac" / "id00001" / "vid" / "00001.wav"
    wav.parent.mkdir(parents=True)
    sf.write(wav, np.zeros(16000, dtype=np.float32), 16000)
    before = digest_tree(tmp_path)
    if case == "meta /dev/zero":
        res = _prepare_cli("--root", str(root), "--out", str(tmp_path / "out"), "--meta", "/dev/zero")
        needles = ["/dev/zero", "not a regular file"]
    else:
        res = _prepare_cli("--root", str(root), "--out", str(root))
        needles = [str(root), "must differ from --root"]
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert all(n in lines[0] for n in needles), lines[0]
    assert digest_tree(tmp_path) == before and listing(tmp_path) == {"vox2"}
    assert not re.search(r"Traceback", res.stderr)
