"""--out and the undo folder may not be, hold or lie inside an input of any role: the forget and retain set files, the
model's own undo folder and the audio clips a manifest names are inputs like the model. Each refusal comes before
anything is read or written: the inputs stay byte-identical and nothing appears outside --out."""

import json
import shutil

import pytest

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.api.unlearn import unlearn
from mmunlearn.errors import UnsafePathError
from mmunlearn.files.layout import MARKER
from mmunlearn.files.paths import check_holds_none
from tests.reliability.untrusted import digest_tree, run_cli_here
from tests.tiny import tiny_causal_lm, tiny_tokenizer


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("apart") / "model"
    TextLLMAdapter(tiny_causal_lm(layers=1, seed=1), tiny_tokenizer()).save(root)
    return root


def _earlier_output(folder):
    """A folder mmunlearn wrote earlier (its marker) that now also holds the user's forget and retain files."""
    folder.mkdir()
    (folder / MARKER).write_text(json.dumps({"tool": "mmunlearn"}))
    for name, n in (("forget.jsonl", 2), ("retain.jsonl", 4)):
        (folder / name).write_text(
            "".join(json.dumps({"question": f"q{name}{i}?", "answer": f"a{i}"}) + "\n" for i in range(n))
        )
    return folder


def _snapshot(root):
    return {p.name: digest_tree(p) for p in root.iterdir() if p.is_dir()}, sorted(p.name for p in root.iterdir())


@pytest.mark.parametrize("role", ["out", "undo"])
def test_an_output_holding_the_forget_and_retain_files_is_refused(model, tmp_path, role):
    data = _earlier_output(tmp_path / "D")
    before = _snapshot(tmp_path)
    model_before = digest_tree(model)
    target = {"out": data} if role == "out" else {"out": tmp_path / "new", "undo": data}
    with pytest.raises(UnsafePathError, match=r"contains the input .*forget\.jsonl"):
        unlearn(
            model,
            forget=data / "forget.jsonl",
            retain=data / "retain.jsonl",
            method="grad_diff",
            overwrite=True,
            progress=False,
            **target,
        )
    assert _snapshot(tmp_path) == before  # the files are still there, nothing new beside them
    assert digest_tree(model) == model_before


def test_the_inputs_own_undo_folder_is_not_replaced(model, tmp_path):
    own_undo = tmp_path / "model_out.undo"
    own_undo.mkdir()
    (own_undo / MARKER).write_text("{}")
    (own_undo / "undo.json").write_text(json.dumps({"id": "abc", "output": "model_out"}))
    (own_undo / "undo_patch.safetensors").write_bytes(b"original weights")
    edited = tmp_path / "model_out"
    shutil.copytree(model, edited)
    (edited / "unlearn_report.json").write_text(
        json.dumps({"method": "grad_diff", "undo": {"folder": own_undo.name, "id": "abc"}})
    )
    forget = tmp_path / "forget.jsonl"
    forget.write_text(json.dumps({"question": "q?", "answer": "a"}) + "\n")
    retain = tmp_path / "retain.jsonl"
    retain.write_text(json.dumps({"question": "r?", "answer": "b"}) + "\n")
    before = _snapshot(tmp_path)
    with pytest.raises(UnsafePathError, match=f"is the input .*{own_undo.name}"):
        unlearn(
            edited, forget=forget, retain=retain, out=tmp_path / "again", undo=own_undo, overwrite=True, progress=False
        )
    assert _snapshot(tmp_path) == before


def test_an_output_holding_audio_clips_of_the_sets_is_refused(tmp_path):
    clips = tmp_path / "clips"
    (clips / "spk1").mkdir(parents=True)
    wav = clips / "spk1" / "a.wav"
    wav.write_bytes(b"RIFF")
    for out in (clips, tmp_path):  # the clip's folder, and a folder above it
        with pytest.raises(UnsafePathError, match="audio clips"):
            check_holds_none(out, [wav], "audio clips of the forget/retain sets")
    check_holds_none(clips / "spk1" / "out", [wav], "audio clips")  # inside their folder: nothing is deleted
    assert wav.read_bytes() == b"RIFF"


def test_the_command_says_it_in_one_line_and_exits_2(model, tmp_path):
    data = _earlier_output(tmp_path / "D")
    before = _snapshot(tmp_path)
    done = run_cli_here(
        "unlearn",
        "--model",
        str(model),
        "--forget",
        str(data / "forget.jsonl"),
        "--retain",
        str(data / "retain.jsonl"),
        "--out",
        str(data),
        "--overwrite",
    )
    assert done.returncode == 2 and done.stderr.startswith("error: ") and "forget.jsonl" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert _snapshot(tmp_path) == before


def test_prepare_retain_refuses_an_out_holding_the_retain_file(model, tmp_path):
    from mmunlearn.api.unlearn import prepare_retain

    state = tmp_path / "state"
    state.mkdir()
    retain = state / "retain.jsonl"
    retain.write_text(json.dumps({"question": "r?", "answer": "b"}) + "\n")
    before = _snapshot(tmp_path)
    with pytest.raises(UnsafePathError, match=r"contains the input .*retain\.jsonl"):
        prepare_retain(model, retain, state, progress=False)
    assert _snapshot(tmp_path) == before


def test_an_audio_dir_inside_the_output_is_refused_before_any_wav_is_written(tmp_path):
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter

    model = tmp_path / "speaker"
    SpeakerAdapter.build(["s1", "s2"], preset="tiny", device="cpu", seed=0).save(model)
    out = tmp_path / "out"
    rows = [{"audio": {"array": [0.1, -0.1] * 800, "sampling_rate": 16000}, "speaker": "s1"}]
    with pytest.raises(UnsafePathError, match="audio_dir"):
        unlearn(model, forget=rows, retain=rows, out=out, audio_dir=out / "wavs", progress=False)
    assert not out.exists()
