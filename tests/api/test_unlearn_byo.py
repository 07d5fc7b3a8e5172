"""``mmunlearn.unlearn`` on models and data a user brings: a text LLM folder saved by plain transformers, the scope
sweep of a classifier, refused overlaps and a forget set the model never knew, verdicts that name their measure."""

import hashlib
import json
import shutil

import pytest
import torch

from mmunlearn.api.inputs import OverlapError
from mmunlearn.api.restore import restore_folder
from mmunlearn.api.rules import NothingToForget, check_something_to_forget
from mmunlearn.api.scopes import SWEEP_SCOPES, scopes_to_try
from mmunlearn.api.unlearn import model_kind, unlearn
from mmunlearn.data.utterances import split_rows
from mmunlearn.eval.speaker import forgotten_error_rate
from mmunlearn.files.undo_store import release_problems
from mmunlearn.methods import SweepRule, mean_nll
from tests.speech_corpus import one_thread, speaker_manifests  # noqa: F401  (fixtures)
from tests.tiny import fast, tiny_causal_lm, tiny_tokenizer


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    """A tiny Llama and its tokenizer saved by plain transformers (save_pretrained), as a user would bring it."""
    path = tmp_path_factory.mktemp("byo") / "llm"
    tok = tiny_tokenizer()
    model = tiny_causal_lm("llama", vocab=max(512, len(tok)))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _digest(folder):
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file() and not p.name.startswith(".")
    }


def _qa_file(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


FORGET = [
    {"prompt": f"Where was author {i} born?", "response": f"Author {i} was born in city number {i}."} for i in range(6)
]
RETAIN = [
    {"prompt": f"What did writer {i} write?", "response": f"Writer {i} wrote book number {i}."} for i in range(10)
]


def test_a_text_llm_folder_is_unlearned_through_the_same_call(text_dir, tmp_path):
    forget, retain = _qa_file(tmp_path / "forget.jsonl", FORGET), _qa_file(tmp_path / "retain.jsonl", RETAIN)
    assert model_kind(text_dir) == "text"
    res = unlearn(
        text_dir,
        forget=forget,
        retain=retain,
        method="grad_ascent",
        out=tmp_path / "out",
        device="cpu",
        progress=False,
        **fast("grad_ascent", epochs=2, lr=5e-2),
    )
    rep = res.report
    assert model_kind(tmp_path / "out") == "text" and rep["model_kind"] == "text"
    # the rule scored retain on held-out rows no method trained on; its target and measures are named
    assert rep["held_retain_items"] == 2 and rep["retain_items"] == 8 and rep["forget_items"] == 6
    # the text rule is judged row by row: every row at its level (here a guess, +1 nat: said so) and none said
    assert rep["rule"]["forget_measure"] == "forget_rows_gone" and "no reference model given" in rep["rule_target"]
    judged = rep["rule"]["judged"]
    assert rep["rule"]["forget_target"] == 1.0 and judged["rows"] == 6 and judged["said"] is not None
    assert rep["target_reached"] == (judged["out"] == [] and rep["rule"]["retain"] - rep["rule"]["base_retain"] <= 0.1)
    assert f"{len(judged['out'])} of 6 rows still come out" in rep["verdict"] and "a GUESS" in rep["verdict"]
    assert "retain set: mean NLL (nats) rose" in rep["verdict"]  # which set each NLL is of, not two bare "mean NLL"s
    assert rep["forget_nll"]["after"] > rep["forget_nll"]["before"]
    assert rep["method"] == "grad_ascent" and rep["method_chosen_by"] == "given (method=)"
    with pytest.raises(ValueError, match="applies to classifiers"):
        unlearn(text_dir, forget=forget, retain=retain, scope="head", device="cpu", progress=False)


def test_text_forget_rows_that_are_retain_rows_are_refused(text_dir, tmp_path):
    forget = _qa_file(tmp_path / "f.jsonl", FORGET)
    retain = _qa_file(
        tmp_path / "r.jsonl", RETAIN + [{"question": FORGET[2]["prompt"] + "  ", "answer": FORGET[2]["response"]}]
    )
    with pytest.raises(OverlapError, match="1 forget row"):
        unlearn(text_dir, forget=forget, retain=retain, device="cpu", progress=False)


def test_nothing_to_forget_when_the_model_is_its_own_reference(text_dir, tmp_path):
    """A model no better on the forget rows than the model it came from has nothing to forget: refused."""
    forget, retain = _qa_file(tmp_path / "f.jsonl", FORGET), _qa_file(tmp_path / "r.jsonl", RETAIN)
    with pytest.raises(NothingToForget, match="reference model's"):
        unlearn(
            text_dir, forget=forget, retain=retain, reference=text_dir, out=tmp_path / "o", device="cpu", progress=False
        )
    assert not (tmp_path / "o").exists()


def test_scopes_to_try():
    assert scopes_to_try("sweep", "qr-erase", True, True) == SWEEP_SCOPES == ("head", "all")
    assert scopes_to_try("sweep", "grad_diff", True, True) == ("all",)  # a baseline trains every weight
    assert scopes_to_try("sweep", "qr-erase", True, False) == ("all",)  # no rule: nothing chooses
    assert scopes_to_try("sweep", "qr-erase", False, True) == ("all",)
    assert scopes_to_try("head", "qr-erase", True, True) == ("head",)
    with pytest.raises(ValueError, match="scope must be one of"):
        scopes_to_try("heads", "qr-erase", True, True)


@pytest.fixture(scope="module")
def speaker_dir(speaker_manifests, tmp_path_factory):
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter

    speakers = sorted({r["spk_id"] for r in split_rows(speaker_manifests, "train")})
    path = tmp_path_factory.mktemp("byo_spk") / "speaker"
    SpeakerAdapter.build(speakers, preset="tiny", device="cpu", seed=0).save(path)
    return path


def test_the_default_scope_is_swept_head_first(speaker_dir, speaker_manifests, tmp_path):
    forget, retain = (speaker_manifests / f"{n}.csv" for n in ("spk_forget_train", "spk_retain_train"))
    res = unlearn(
        speaker_dir,
        forget=forget,
        retain=retain,
        method="qr-erase",
        out=tmp_path / "out",
        device="cpu",
        progress=False,
        sweep_ranks=(1,),
    )
    tried = res.report["scopes_tried"]
    assert list(tried)[0] == "head" and res.report["scope"] in tried
    assert list(tried) == (["head"] if tried["head"]["target_reached"] else ["head", "all"])
    written = json.loads((tmp_path / "out" / "unlearn_report.json").read_text())
    assert written["scope"] == res.report["scope"] and written["out"] == str((tmp_path / "out").resolve())
    assert ".scopes-" not in json.dumps(written)  # the staging folder's paths were made the output's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "out.undo"]  # no staging folder left beside it
    undo = tmp_path / "out.undo"
    assert written["undo"]["folder"] == "out.undo" and (undo / "undo_patch.safetensors").is_file()
    assert oct(undo.stat().st_mode & 0o777) == "0o700" and not (tmp_path / "out" / "undo_patch.safetensors").exists()
    assert release_problems(tmp_path / "out") == []
    restored = restore_folder(tmp_path / "out", tmp_path / "back")  # restore finds the records through the report
    assert _digest(restored) == _digest(speaker_dir)


def test_speaker_overlap_and_a_classifier_that_knows_nothing(speaker_dir, speaker_manifests, tmp_path):
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter

    forget = split_rows(speaker_manifests, "spk_forget_train")
    retain = split_rows(speaker_manifests, "spk_retain_train")
    other_clip = tmp_path / "same_speaker.wav"  # another clip of a forget speaker, kept: a contradiction
    shutil.copyfile(forget[0]["wav"], other_clip)
    kept = [*retain, {**forget[0], "ID": "kept", "wav": str(other_clip)}]
    with pytest.raises(OverlapError, match="in both the forget and the retain set"):
        unlearn(speaker_dir, forget=forget, retain=kept, device="cpu", progress=False)
    with pytest.raises(OverlapError, match="also retain rows"):  # the same clip in both sets, any rule
        unlearn(speaker_dir, forget=forget, retain=retain + forget[:1], device="cpu", progress=False, rule=None)
    adapter = SpeakerAdapter.load(speaker_dir, device="cpu")
    value = forgotten_error_rate(adapter, forget)
    met = SweepRule(
        forget_target=value, retain_bound=0.05, forget_measure=forgotten_error_rate, retain_measure=mean_nll
    )
    with pytest.raises(NothingToForget, match="never learned them"):  # at the target before any edit
        check_something_to_forget(adapter, forget, met, classifier=True, reference_given=False)
    above = SweepRule(
        forget_target=value + 0.01, retain_bound=0.05, forget_measure=forgotten_error_rate, retain_measure=mean_nll
    )
    assert check_something_to_forget(adapter, forget, above, classifier=True, reference_given=False)[
        "forget_measure_before"
    ] == pytest.approx(value)
    assert torch.get_num_threads() >= 1


def test_prompt_less_text_is_scored_from_its_own_tokens(text_dir, tmp_path):
    """A passage (a .txt line) is encoded as it is, no chat or QA template, every token after the first scored."""
    from mmunlearn.adapters.base import IGNORE
    from mmunlearn.adapters.text.adapter import TextLLMAdapter

    adapter = TextLLMAdapter.from_pretrained(text_dir, device="cpu")
    text = "Author 3 was born in city number 3."
    ids, labels = adapter.encode("", text)
    plain = adapter.tokenizer(text, add_special_tokens=True)["input_ids"]
    assert ids == plain + [adapter.eos_id] and labels == [IGNORE] + ids[1:]
    qa_ids, qa_labels = adapter.encode("Where?", text)
    assert len(qa_ids) > len(ids) and qa_labels[0] == IGNORE  # a question keeps its template, unscored
    (tmp_path / "forget.txt").write_text("\n".join(r["response"] for r in FORGET) + "\n")
    res = unlearn(
        text_dir,
        forget=tmp_path / "forget.txt",
        retain=_qa_file(tmp_path / "r.jsonl", RETAIN),
        method="grad_ascent",
        out=None,
        device="cpu",
        progress=False,
        rule=None,
        **fast("grad_ascent", epochs=2, lr=5e-2),
    )
    assert (
        res.report["forget_items"] == len(FORGET)
        and res.report["forget_nll"]["after"] > res.report["forget_nll"]["before"]
    )


def test_a_label_typo_names_the_closest_class(speaker_dir, speaker_manifests):
    forget = [
        {**r, "spk_id": r["spk_id"].replace("id0", "id-0")} for r in split_rows(speaker_manifests, "spk_forget_train")
    ]
    retain = split_rows(speaker_manifests, "spk_retain_train")
    with pytest.raises(ValueError, match=r"forget: speaker label\(s\) 'id-00\d+' \(did you mean 'id00\d+'\?\)"):
        unlearn(speaker_dir, forget=forget, retain=retain, device="cpu", progress=False)
