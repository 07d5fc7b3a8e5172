"""Deletion requests on a tiny speaker classifier: a retain state reused by fingerprint, requests that chain,
undo patches that walk back bit for bit, and a batch edited once with the union of its forget sets."""

import hashlib
import json

import pytest
import torch

from mmunlearn.api.restore import restore_folder
from mmunlearn.api.unlearn import prepare_retain, unlearn
from mmunlearn.data.utterances import split_rows
from mmunlearn.requests import HISTORY_DIR, load_retain_state, model_fingerprint, read_history
from mmunlearn.requests.state import META_NAME
from tests.speech_corpus import llm_dir, one_thread, speaker_manifests  # noqa: F401  (fixtures)
from tests.tiny import fast

OPTS = dict(device="cpu", progress=False, rule=None, **fast("qr-erase"))  # the presets: these tests check plumbing


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _weights(folder):
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter

    return SpeakerAdapter.load(folder, device="cpu").model.state_dict()


def _same(a, b):
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


@pytest.fixture(scope="module")
def parts(speaker_manifests):
    """Three speakers' training rows: two deletion requests and the retain set (the third and fourth)."""
    rows = split_rows(speaker_manifests, "train")
    speakers = sorted({r["spk_id"] for r in rows})
    by = {s: [r for r in rows if r["spk_id"] == s] for s in speakers}
    return by[speakers[0]], by[speakers[1]], by[speakers[2]] + by[speakers[3]]


@pytest.fixture(scope="module")
def speaker_dir(speaker_manifests, tmp_path_factory):
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter

    speakers = sorted({r["spk_id"] for r in split_rows(speaker_manifests, "train")})
    path = tmp_path_factory.mktemp("requests") / "speaker"
    SpeakerAdapter.build(speakers, preset="tiny", device="cpu", seed=0).save(path)
    return path


def test_retain_state_is_reused_when_it_matches_and_recomputed_when_not(speaker_dir, parts, tmp_path):
    first, second, retain = parts
    before = _digest(speaker_dir)
    state = prepare_retain(
        speaker_dir, retain, tmp_path / "state", device="cpu", progress=False, kind="gradient", lr=1.0
    )
    assert state.status == "computed" and (tmp_path / "state" / META_NAME).is_file()
    stored = load_retain_state(tmp_path / "state")
    assert stored.meta["model_fingerprint"] == model_fingerprint(_model(speaker_dir))
    assert set(stored.task) == set(state.task) and all(torch.equal(stored.task[k], state.task[k]) for k in state.task)
    again = prepare_retain(
        speaker_dir, retain, tmp_path / "state", device="cpu", progress=False, kind="gradient", lr=1.0
    )
    assert again.status == "loaded"

    res = unlearn(
        speaker_dir, forget=first, retain=retain, out=tmp_path / "r1", retain_state=tmp_path / "state", **OPTS
    )
    assert res.report["retain_state"]["status"] == "loaded" and res.report["extract_seconds"] >= 0
    assert _digest(speaker_dir) == before  # the input is never modified
    # a cached retain side gives the same edit as extracting it in the request, bit for bit
    plain = unlearn(
        speaker_dir,
        forget=first,
        retain=retain,
        out=tmp_path / "plain",
        extract_kind="gradient",
        **{k: v for k, v in OPTS.items() if k != "extract_kind"},
    )
    assert "retain_state" not in plain.report  # this one extracted its retain side itself
    assert _same(_weights(tmp_path / "r1"), _weights(tmp_path / "plain"))

    other = retain[: len(retain) - 2]  # other retain data: another fingerprint
    res = unlearn(
        speaker_dir, forget=first, retain=other, out=tmp_path / "r1b", retain_state=tmp_path / "state", **OPTS
    )
    assert res.report["retain_state"]["status"] == "recomputed"
    assert "retain data" in res.report["retain_state"]["reason"]
    assert load_retain_state(tmp_path / "state").meta["retain_items"] == len(other)

    # weights that differ (another seed) with no recorded lineage: recomputed, and it says why
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter

    speakers = SpeakerAdapter.load(speaker_dir, device="cpu").speakers
    SpeakerAdapter.build(speakers, preset="tiny", device="cpu", seed=1).save(tmp_path / "other_model")
    res = unlearn(
        tmp_path / "other_model",
        forget=first,
        retain=other,
        out=tmp_path / "r1c",
        retain_state=tmp_path / "state",
        **OPTS,
    )
    assert res.report["retain_state"]["status"] == "recomputed"
    assert res.report["retain_state"]["reason"] == "the model weights changed"
    with pytest.raises(ValueError, match="methods that work from task vectors"):
        unlearn(
            speaker_dir,
            forget=first,
            retain=retain,
            method="grad_ascent",
            retain_state=tmp_path / "state",
            device="cpu",
            progress=False,
            rule=None,
        )


def _model(folder):
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter

    return SpeakerAdapter.load(folder, device="cpu").model


def test_requests_compose_and_undo_patches_chain_bit_for_bit(speaker_dir, parts, tmp_path):
    first, second, retain = parts
    state = tmp_path / "state"
    prepare_retain(speaker_dir, retain, state, device="cpu", progress=False, kind="gradient", lr=1.0)
    r1 = unlearn(speaker_dir, forget=first, retain=retain, out=tmp_path / "r1", retain_state=state, **OPTS)
    r2 = unlearn(tmp_path / "r1", forget=second, retain=retain, out=tmp_path / "r2", retain_state=state, **OPTS)
    # the state was computed on the original model; request 2 edits the model request 1 wrote (recorded lineage)
    assert r2.report["retain_state"]["status"] == "loaded" and "1 request(s) ago" in r2.report["retain_state"]["reason"]
    history = r2.report["requests"]
    assert [h["index"] for h in history] == [1, 2] and [h["forget_items"] for h in history] == [len(first), len(second)]
    assert history[0]["model_after"] == history[1]["model_before"] == r1.report["requests"][0]["model_after"]
    assert json.loads((tmp_path / "r2" / "unlearn_report.json").read_text())["requests"] == history
    assert (
        read_history(tmp_path / "r2").depth == 2
        and (tmp_path / "r2.undo" / HISTORY_DIR / "request-0001.json").is_file()
    )
    assert not (tmp_path / "r2" / HISTORY_DIR).exists() and not (tmp_path / "r2" / "undo_patch.safetensors").exists()
    original, after1, after2 = _weights(speaker_dir), _weights(tmp_path / "r1"), _weights(tmp_path / "r2")
    assert not _same(after1, after2) and not _same(original, after1)

    restore_folder(tmp_path / "r2", tmp_path / "back1", progress=False)  # undo request 2 only
    assert _same(_weights(tmp_path / "back1"), after1)
    # request 1's undo record as request 1 wrote it, kept apart again (back1.undo); its report names that folder
    assert (
        _digest(tmp_path / "back1.undo")["undo_patch.safetensors"]
        == _digest(tmp_path / "r1.undo")["undo_patch.safetensors"]
    )
    reports = [json.loads((tmp_path / f / "unlearn_report.json").read_text()) for f in ("back1", "r1")]
    assert reports[0]["undo"]["folder"] == "back1.undo" and {**reports[0], "undo": None} == {**reports[1], "undo": None}
    assert (
        not (tmp_path / "back1" / HISTORY_DIR).exists() and not (tmp_path / "back1" / "undo_patch.safetensors").exists()
    )
    restore_folder(tmp_path / "back1", tmp_path / "back0", progress=False)  # then request 1
    assert _same(_weights(tmp_path / "back0"), original)
    restore_folder(tmp_path / "r2", tmp_path / "all", steps=0, progress=False)  # both at once
    assert _same(_weights(tmp_path / "all"), original)
    assert not {"undo_patch.safetensors", "unlearn_report.json", HISTORY_DIR} & {
        p.name for p in (tmp_path / "all").iterdir()
    }
    with pytest.raises(ValueError, match="records 2 request"):
        restore_folder(tmp_path / "r2", tmp_path / "x", steps=3)
    from typer.testing import CliRunner

    from mmunlearn.cli import app

    done = CliRunner().invoke(
        app, ["restore", "--model", str(tmp_path / "r2"), "--out", str(tmp_path / "cli"), "--steps", "0"]
    )
    assert done.exit_code == 0, done.output
    assert _same(_weights(tmp_path / "cli"), original)


def test_a_batch_is_edited_once_with_the_union(speaker_dir, parts, speaker_manifests, tmp_path):
    first, second, retain = parts
    res = unlearn(
        speaker_dir, forget=[first, second], batch=True, retain=retain, out=tmp_path / "b", compare_batch=True, **OPTS
    )
    batch = res.report["batch"]
    assert res.report["forget_items"] == len(first) + len(second) == batch["union_items"]
    assert [s["items"] for s in batch["sets"]] == [len(first), len(second)]
    one = batch["one_by_one"]
    assert len(one["forget_nll_union"]) == 2 and one["identical"] == (one["max_relative_weight_difference"] == 0.0)
    assert res.report["requests"][0]["batch_sets"] == 2
    # manifest paths are a batch without saying so; a set repeated in a batch counts once in the union
    path = speaker_manifests / "spk_forget_train.csv"
    res = unlearn(speaker_dir, forget=[path, path], retain=retain, out=None, **OPTS)
    assert res.report["forget_items"] == len(split_rows(speaker_manifests, "spk_forget_train"))


def test_prepare_retain_command(speaker_dir, speaker_manifests, tmp_path):
    from typer.testing import CliRunner

    from mmunlearn.cli import app

    args = [
        "prepare-retain",
        "--model",
        str(speaker_dir),
        "--retain",
        str(speaker_manifests / "spk_retain_train.csv"),
        "--out",
        str(tmp_path / "state"),
        "--extract-kind",
        "gradient",
        "--device",
        "cpu",
    ]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "retain state computed" in first.output
    assert load_retain_state(tmp_path / "state").meta["extract"]["kind"] == "gradient"
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "retain state loaded (fingerprints match)" in again.output
    inside = CliRunner().invoke(app, args[:5] + ["--out", str(speaker_dir / "state")] + args[7:])
    assert inside.exit_code != 0 and not (speaker_dir / "state").exists()  # never inside the model's folder


def test_a_later_request_tries_the_edit_size_the_previous_one_chose_first(speaker_dir, parts, tmp_path):
    from mmunlearn.erase.search import MAX_HALVINGS
    from mmunlearn.methods import SweepRule

    first, second, retain = parts
    rule = SweepRule(forget_target=-1.0, retain_bound=1e9)  # every edit meets it: the first point tried is chosen
    r1 = unlearn(speaker_dir, forget=first, retain=retain, out=tmp_path / "r1", **{**OPTS, "rule": rule})
    size = r1.report["requests"][0]["relative_edit"]
    assert size == r1.report["info"]["sweep"][0]["relative"] and r1.report["config"]["sweep_first"] is None
    r2 = unlearn(tmp_path / "r1", forget=second, retain=retain, out=tmp_path / "r2", **{**OPTS, "rule": rule})
    assert r2.report["config"]["sweep_first"] == size
    sweep = r2.report["info"]["sweep"]
    assert abs(sweep[0]["relative"] - size) <= 1e-9 * size  # the previous request's size, tried first
    # it met the rule: halved down towards the smallest size that still does (every size does here: all halvings),
    # the sweep rule choosing among them; the next request starts from that choice
    sizes = [p["relative"] for p in sweep]
    assert sizes == pytest.approx([size / 2**i for i in range(MAX_HALVINGS + 1)])
    assert r2.report["requests"][1]["relative_edit"] == r2.report["info"]["relative"] in sizes


def test_a_request_with_a_retain_state_and_a_rule_defaults_to_the_cheap_forget_extraction(speaker_dir, parts, tmp_path):
    from mmunlearn.kinds import get_kind
    from mmunlearn.methods import SweepRule

    first, _, retain = parts
    rule = SweepRule(forget_target=-1.0, retain_bound=1e9)
    prepare_retain(speaker_dir, retain, tmp_path / "state", device="cpu", progress=False, kind="gradient", lr=1.0)
    res = unlearn(
        speaker_dir,
        forget=first,
        retain=retain,
        rule=rule,
        retain_state=tmp_path / "state",
        rank=2,
        retain_rank=4,
        device="cpu",
        progress=False,
    )
    cfg = res.report["config"]
    assert cfg["extract"]["kind"] == get_kind("speaker").request_extract == "gradient" and cfg["sweep_scales"] == "auto"
    kept = unlearn(
        speaker_dir,
        forget=first,
        retain=retain,
        rule=rule,
        retain_state=tmp_path / "state",
        rank=2,
        retain_rank=4,
        extract_kind="finetune",
        extract_steps=1,
        device="cpu",
        progress=False,
    )
    assert kept.report["config"]["extract"]["kind"] == "finetune"  # the caller's choice wins
    plain = unlearn(
        speaker_dir,
        forget=first,
        retain=retain,
        rank=2,
        retain_rank=4,
        extract_steps=1,
        device="cpu",
        progress=False,
        rule=None,
    )
    assert plain.report["config"]["extract"]["kind"] == "finetune"  # no retain state: the preset's extraction


def test_a_speech_llm_request_chain_restores_through_safetensors(llm_dir, parts, tmp_path):
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter

    first, second, retain = parts
    opts = dict(device="cpu", progress=False, **fast("qr-erase"))  # a speech LLM: "auto" is no rule
    state = tmp_path / "state"
    unlearn(llm_dir, forget=first, retain=retain, out=tmp_path / "r1", retain_state=state, **opts)
    r2 = unlearn(tmp_path / "r1", forget=second, retain=retain, out=tmp_path / "r2", retain_state=state, **opts)
    assert r2.report["retain_state"]["status"] == "loaded" and len(r2.report["requests"]) == 2
    weights = {p: SpeechLLMAdapter.load(p, device="cpu").model.state_dict() for p in (llm_dir, tmp_path / "r1")}
    restore_folder(tmp_path / "r2", tmp_path / "back1", progress=False)
    assert _same(SpeechLLMAdapter.load(tmp_path / "back1", device="cpu").model.state_dict(), weights[tmp_path / "r1"])
    restore_folder(tmp_path / "back1", tmp_path / "back0", progress=False)
    assert _same(SpeechLLMAdapter.load(tmp_path / "back0", device="cpu").model.state_dict(), weights[llm_dir])
    assert not (tmp_path / "back0" / HISTORY_DIR).exists() and not (tmp_path / "back1" / HISTORY_DIR).exists()


def test_a_history_record_linking_out_of_the_folder_is_refused(speaker_dir, parts, tmp_path):
    import os
    import shutil

    first, second, retain = parts
    unlearn(speaker_dir, forget=first, retain=retain, out=tmp_path / "r1", **OPTS)
    unlearn(tmp_path / "r1", forget=second, retain=retain, out=tmp_path / "r2", **OPTS)
    evil = tmp_path / "evil"
    shutil.copytree(tmp_path / "r2", evil)
    shutil.copytree(tmp_path / "r2.undo", tmp_path / "evil.undo")  # its undo folder, named by its report
    report = json.loads((evil / "unlearn_report.json").read_text())
    report["undo"]["folder"] = "evil.undo"
    (evil / "unlearn_report.json").write_text(json.dumps(report))
    (tmp_path / "secret").write_text("not yours")
    record = tmp_path / "evil.undo" / HISTORY_DIR / "request-0001.json"
    record.unlink()
    os.symlink(tmp_path / "secret", record)
    with pytest.raises(ValueError, match="link"):
        unlearn(evil, forget=first, retain=retain, out=tmp_path / "r3", **OPTS)
    with pytest.raises(ValueError, match="link"):
        restore_folder(evil, tmp_path / "back", progress=False)
    assert not (tmp_path / "r3").exists() and not (tmp_path / "back").exists()


@pytest.mark.parametrize("method", ["grad_diff", "npo"])
def test_a_retain_state_is_refused_for_a_method_without_task_vectors(method, speaker_dir, speaker_manifests, tmp_path):
    from mmunlearn.api.unlearn import prepare_retain
    from mmunlearn.methods import needing

    assert method not in needing("task_vectors") and "qr-erase" in needing("task_vectors")
    with pytest.raises(ValueError, match="task vectors"):
        prepare_retain(
            speaker_dir, speaker_manifests / "spk_retain_train.csv", tmp_path / "state", method=method, device="cpu"
        )
    assert not (tmp_path / "state").exists()
