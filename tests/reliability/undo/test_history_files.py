"""Issue 33, H1 + M1 + M2: the undo records a deletion request carries into its output (``undo_patch.safetensors``,
``unlearn_report.json``, ``undo_history/request-*``) are opened without following a link out of the folder,
refused when hard-linked, and copied from the descriptor that was checked: for every kind (speaker, hf-audio,
speech-LLM, text), by ``mmunlearn.unlearn`` and by ``mmunlearn restore``. Each case: the error names the file,
the input stays byte-identical, and no output (nor temporary folder) is written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import mmunlearn.files.safecopy as safecopy
from mmunlearn.api.restore import restore_folder
from mmunlearn.api.unlearn import unlearn
from mmunlearn.errors import USER_ERRORS, UnsafePathError, one_line
from mmunlearn.files.layout import HISTORY_DIR, PATCH_NAME, UNLEARN_REPORT
from mmunlearn.requests.history import carry_history, read_history, step_back
from tests.reliability.untrusted import digest_tree, listing

SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- not for you"
SPEAKERS = ["id00001", "id00002", "id00003"]
RECORD = f"{HISTORY_DIR}/request-0001.safetensors"


def _speaker(path: Path) -> None:
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter

    SpeakerAdapter.build(SPEAKERS, preset="tiny", device="cpu", seed=0).save(path)


def _hf_audio(path: Path) -> None:
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor

    from mmunlearn.adapters.hf_audio.adapter import HFAudioAdapter

    cfg = Wav2Vec2Config(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        conv_dim=(8, 8),
        conv_kernel=(10, 5),
        conv_stride=(10, 5),
        num_conv_pos_embeddings=4,
        num_conv_pos_embedding_groups=2,
        classifier_proj_size=8,
    )
    fe = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True)
    HFAudioAdapter.build(cfg, SPEAKERS, fe, device="cpu").save(path)


def _speech_llm(path: Path) -> None:
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter

    SpeechLLMAdapter.build("tiny", texts=["Who is speaking?", *SPEAKERS] * 4, family="qwen2_audio", seed=0).save(path)


def _text(path: Path) -> None:
    from tests.tiny import tiny_causal_lm

    tiny_causal_lm(layers=1).save_pretrained(path)


BUILDERS = {"speaker": _speaker, "hf-audio": _hf_audio, "speech-llm": _speech_llm, "text": _text}


@pytest.fixture(scope="module")
def masters(tmp_path_factory) -> dict[str, Path]:
    """One tiny model folder per kind, made an output of two requests: a report listing them, its undo patch
    and request 1's records in undo_history/ (the contents are never read: the checks come first)."""
    out = {}
    for kind, build in BUILDERS.items():
        folder = tmp_path_factory.mktemp(kind.replace("-", "_")) / "model"
        build(folder)
        (folder / UNLEARN_REPORT).write_text(
            json.dumps(
                {
                    "method": "grad_ascent",
                    "requests": [{"index": 1, "method": "grad_ascent"}, {"index": 2, "method": "grad_ascent"}],
                }
            )
        )
        (folder / PATCH_NAME).write_bytes(b"patch of request 2")
        (folder / HISTORY_DIR).mkdir()
        (folder / RECORD).write_bytes(b"patch of request 1")
        (folder / HISTORY_DIR / "request-0001.json").write_text(json.dumps({"method": "grad_ascent"}))
        out[kind] = folder
    return out


@pytest.fixture
def secret(tmp_path) -> Path:
    (tmp_path / "home").mkdir()
    path = tmp_path / "home" / "id_rsa"
    path.write_text(SECRET)
    return path


def _plant(folder: Path, case: str, secret: Path) -> str:
    """Make ``folder`` hostile as ``case`` says; the name the error must give."""
    if case == "history folder linked out":
        outside = secret.parent / "records"
        shutil.move(folder / HISTORY_DIR, outside)
        shutil.copyfile(secret, outside / "request-0001.json", follow_symlinks=True)
        (folder / HISTORY_DIR).symlink_to(outside)
        return HISTORY_DIR
    name = {"patch": PATCH_NAME, "report": UNLEARN_REPORT, "record": RECORD}[case.split()[0]]
    (folder / name).unlink()
    if case.endswith("symbolic link"):
        (folder / name).symlink_to(secret)
    else:
        os.link(secret, folder / name)
    return name


def _leaked(root: Path, secret: Path) -> list[Path]:
    """Files under ``root`` holding the secret, but those planted (the input ``model/``, the outside ``home/``)."""
    return [
        p
        for p in root.rglob("*")
        if p.is_file()
        and not p.is_symlink()
        and p.relative_to(root).parts[0] not in ("model", "home")
        and SECRET in p.read_text(errors="ignore")
    ]


CASES = [
    "patch symbolic link",
    "patch hard link",
    "report symbolic link",
    "report hard link",
    "record symbolic link",
    "record hard link",
    "history folder linked out",
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_a_history_file_that_is_a_link_or_a_hard_link_is_refused_by_unlearn_and_restore(
    masters, kind, case, secret, tmp_path
):
    folder = Path(shutil.copytree(masters[kind], tmp_path / "model"))
    name = _plant(folder, case, secret)
    before, outside = digest_tree(folder), digest_tree(secret.parent)
    calls = [lambda out: restore_folder(folder, out, progress=False)]
    if kind != "text":  # mmunlearn.unlearn takes speech models; a text model's requests are undone by restore
        calls.append(
            lambda out: unlearn(
                folder,
                forget=[("a.wav", SPEAKERS[0])],
                retain=[("b.wav", SPEAKERS[1])],
                method="grad_ascent",
                out=out,
                device="cpu",
                progress=False,
                rule=None,
            )
        )
    for call in calls:
        with pytest.raises(UnsafePathError) as err:
            call(tmp_path / "out")
        assert isinstance(err.value, USER_ERRORS) and "\n" not in str(err.value)
        assert str(folder / name) in one_line(err.value), one_line(err.value)
        assert listing(tmp_path) == {"model", "home"}  # no --out, no temporary folder beside it
    assert digest_tree(folder) == before and digest_tree(secret.parent) == outside
    assert _leaked(tmp_path, secret) == []


def test_regular_history_files_are_carried_and_stepped_back_byte_for_byte(masters, tmp_path):
    folder = masters["text"]
    history = read_history(folder)
    assert history.depth == 2  # the control: the same folder without links is read
    (tmp_path / "staging").mkdir()
    carry_history(history, tmp_path / "staging")
    carried = tmp_path / "staging" / HISTORY_DIR
    assert (carried / "request-0002.safetensors").read_bytes() == (folder / PATCH_NAME).read_bytes()
    assert (carried / "request-0002.json").read_bytes() == (folder / UNLEARN_REPORT).read_bytes()
    assert (carried / "request-0001.safetensors").read_bytes() == (folder / RECORD).read_bytes()
    (tmp_path / "restored").mkdir()
    step_back(folder, tmp_path / "restored")
    assert (tmp_path / "restored" / PATCH_NAME).read_bytes() == (folder / RECORD).read_bytes()


RACES = [
    ("carry", PATCH_NAME),
    ("carry", UNLEARN_REPORT),
    ("carry", RECORD),
    ("step back", RECORD),
    ("step back", f"{HISTORY_DIR}/request-0001.json"),
]


@pytest.mark.parametrize(("step", "name"), RACES)
def test_a_history_file_swapped_for_a_link_after_the_checks_is_not_copied(
    masters, secret, tmp_path, step, name, monkeypatch
):
    """M2: the folder passes read_history's checks; the file becomes a link to the secret just before the copy
    opens it (the race of a shared upload folder); the copy, reading from the descriptor it opened, refuses."""
    folder = Path(shutil.copytree(masters["speech-llm"], tmp_path / "model"))
    history = read_history(folder)
    target, opens = folder / name, []
    copy_open = 1 if step == "carry" else 2  # step_back reads the history (one check open) before it copies

    def swap(path: Path) -> None:
        if path == target:
            opens.append(path)
            if len(opens) == copy_open:
                path.unlink()
                path.symlink_to(secret)

    monkeypatch.setattr(safecopy, "before_open", swap)
    (tmp_path / "staging").mkdir()
    with pytest.raises(UnsafePathError, match="link") as err:
        if step == "carry":
            carry_history(history, tmp_path / "staging")
        else:
            step_back(folder, tmp_path / "staging")
    assert str(target) in one_line(err.value) and len(opens) == copy_open  # refused by the copy's own open
    assert _leaked(tmp_path, secret) == []
