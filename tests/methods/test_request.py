"""The one settings object of an unlearning request (mmunlearn/methods/request.py): frozen, checked when made (a
clear ValueError naming the setting), its deletion-request settings refused by the harness, and ``mmunlearn.unlearn``
with its defaults writing the report it wrote when the settings travelled as keyword chains."""

import dataclasses
import json
from pathlib import Path

import pytest

import mmunlearn
from mmunlearn.methods import SweepRule, UnlearnRequest, get, run_unlearning
from mmunlearn.methods.request import REQUEST_ONLY
from mmunlearn.requests import run_request
from mmunlearn.taskvec.extract import ExtractConfig
from tests.api.test_unlearn_text_rule import FORGET, RETAIN, _memorise, _write
from tests.tiny import fast


def test_a_request_is_frozen_and_keeps_its_own_copies():
    overrides, meta = {"rank": 4}, {"source": "here"}
    request = UnlearnRequest(
        "qr-erase", "text", size="micro", overrides=overrides, meta=meta, out="out", inputs=["model"]
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.method = "npo"
    overrides["rank"], meta["source"] = 8, "elsewhere"  # the caller's dicts change later: the request does not
    assert request.overrides == {"rank": 4} and request.meta == {"source": "here"}
    assert request.out == Path("out") and request.inputs == ("model",)
    changed = dataclasses.replace(request, out="other")  # a changed request is a new one, checked again
    assert changed.out == Path("other") and request.out == Path("out")
    with pytest.raises(TypeError):
        UnlearnRequest("qr-erase", "text", "micro")  # only the method and the kind by position


def test_every_field_says_what_it_is_for():
    fields = dataclasses.fields(UnlearnRequest)
    assert {"method", "kind", "config", "size", "overrides", "rule", "out", "progress", *REQUEST_ONLY} <= {
        f.name for f in fields
    }
    assert [f.name for f in fields if len(f.metadata.get("help", "")) < 10] == []


@pytest.mark.parametrize(
    "settings, needle",
    [
        ({"method": "not-a-method"}, "unknown method 'not-a-method'"),
        ({"kind": "not-a-kind"}, "unknown model kind"),
        ({"method": "t3", "kind": "speaker"}, "t3 does not apply to a speaker model"),
        ({"overrides": {"no_such_setting": 1}}, "has no setting 'no_such_setting'"),
        ({"size": "enormous"}, "unknown text preset size 'enormous'"),
        ({"overrides": [("rank", 4)]}, "overrides must map setting names"),
        ({"config": object(), "overrides": {"rank": 4}}, "config is the method's whole config"),
        ({"config": object(), "size": "micro"}, "config is the method's whole config"),
        ({"rule": 0.5}, "rule must be a SweepRule or None, got float"),
        ({"progress": "yes"}, "progress must be True or False"),
        ({"batch": 1}, "batch must be True or False"),
        ({"use_retain_state": "no"}, "use_retain_state must be True, False or None"),
        ({"out": 3}, "out must be a path or None, got int"),
        ({"inputs": "model_dir"}, "inputs must be a list of paths"),
        ({"meta": ["x"]}, "meta must be a mapping"),
        ({"retain_extract": {"kind": "gradient"}}, "retain_extract must be an ExtractConfig"),
        ({"undo_dir": "undo"}, "undo_dir applies to a request with an output folder"),
        ({"compare_batch": True}, "compare_batch compares a batch"),
        ({"retain_state": "state", "use_retain_state": False}, "use_retain_state=False with a retain state folder"),
        ({"refresh_retain": True}, "refresh_retain recomputes a retain state"),
    ],
)
def test_a_bad_or_contradictory_setting_is_a_value_error_naming_it(settings, needle):
    given = {"method": "qr-erase", "kind": "text", **settings}
    with pytest.raises(ValueError) as err:
        UnlearnRequest(given.pop("method"), given.pop("kind"), **given)
    assert needle in str(err.value)


def test_the_settings_that_do_belong_together_are_taken():
    cfg = get("qr-erase").config_for("text", "micro")
    request = UnlearnRequest(
        "qr-erase",
        "text",
        config=cfg,
        rule=SweepRule(forget_target=3.0, retain_bound=0.1),
        out="o",
        undo_dir="u",
        retain_state="s",
        refresh_retain=True,
        batch=True,
        compare_batch=True,
        retain_extract=ExtractConfig(),
    )
    assert request.wants_state and request.request_settings() == [
        "retain_state",
        "refresh_retain",
        "retain_extract",
        "batch",
        "compare_batch",
    ]
    assert UnlearnRequest("qr-erase", "text", use_retain_state=True).wants_state  # in memory, no folder
    assert not UnlearnRequest("qr-erase", "text").wants_state


def test_the_harness_part_drops_the_deletion_request_settings():
    request = UnlearnRequest(
        "qr-erase",
        "text",
        size="micro",
        overrides={"rank": 2},
        retain_state="s",
        batch=True,
        compare_batch=True,
        reuse_edit_size=False,
        out="o",
        meta={"a": 1},
    )
    cfg = get("qr-erase").config_for("text", "micro", rank=2)
    run = request.for_harness(cfg, meta={"b": 2})
    assert run.request_settings() == [] and run.config is cfg and run.size is None and run.overrides == {}
    assert (run.method, run.kind, run.out, run.meta) == ("qr-erase", "text", Path("o"), {"b": 2})


def test_the_harness_refuses_what_only_a_deletion_request_honours():
    with pytest.raises(ValueError, match="retain_state, batch apply to a deletion request"):
        run_unlearning(UnlearnRequest("qr-erase", "text", retain_state="s", batch=True), None, [1], [2])
    with pytest.raises(ValueError, match="takes an UnlearnRequest first, got str"):
        run_unlearning("qr-erase", None, [1], [2])  # the keyword-chain call of before is refused by name
    with pytest.raises(ValueError, match="a retain state applies to the methods that work from task vectors"):
        run_request(UnlearnRequest("grad_ascent", "text", use_retain_state=True), None, [1], [2])


#: What ``mmunlearn.unlearn`` reported with its defaults on a text LLM before the settings became one object
#: (recorded from the keyword-chain code, commit 99eeec6): the report's fields and those of its sections.
TEXT_REPORT = {
    "changed_fraction": None,
    "config": None,
    "erase_report": None,
    "extract_seconds": None,
    "forget_items": None,
    "forget_level": None,
    "forget_nll": ["after", "before"],
    "held_retain_items": None,
    "info": None,
    "knowledge_check": ["chance", "checked", "forget_measure_before", "forget_target"],
    "large_update_tensors": None,
    "max_relative_update": None,
    "method": None,
    "method_chosen_by": None,
    "model_dir": None,
    "model_kind": None,
    "out": None,
    "prompt_format": ["chosen_by", "forget_nll", "format"],
    "reference": None,
    "requests": None,
    "retain_items": None,
    "retain_nll": ["after", "before"],
    "rule": [
        "base_forget",
        "base_retain",
        "forget",
        "forget_measure",
        "forget_target",
        "judged",
        "retain",
        "retain_bound",
        "retain_measure",
    ],
    "rule_target": None,
    "scope": None,
    "target_reached": None,
    "undo": ["folder", "id"],
    "undo_patch": None,
    "unlearn_seconds": None,
    "verdict": None,
    "where": None,
}


def test_unlearn_with_its_defaults_reports_the_fields_it_did(tmp_path):
    model, tok = _memorise(FORGET + RETAIN)
    model.save_pretrained(tmp_path / "llm")
    tok.save_pretrained(tmp_path / "llm")
    res = mmunlearn.unlearn(
        tmp_path / "llm",
        forget=_write(tmp_path / "f.jsonl", FORGET),
        retain=_write(tmp_path / "r.jsonl", RETAIN),
        out=tmp_path / "out",
        device="cpu",
        progress=False,
        **fast("qr-erase-rows"),
    )
    shape = {
        k: (sorted(v) if isinstance(v, dict) and k not in ("config", "info") else None) for k, v in res.report.items()
    }
    assert shape == TEXT_REPORT
    assert list(res.report)[0] == "verdict" and res.report["method"] == "qr-erase-rows"
    written = json.loads((tmp_path / "out" / "unlearn_report.json").read_text())
    assert (
        written["method_chosen_by"]
        == res.report["method_chosen_by"]
        == ("the default for the model kind (api.DEFAULT_METHOD)")
    )
    assert written["config"]["rank"] == fast("qr-erase-rows")["rank"]  # the overrides reached the method
    assert written["requests"][0]["method"] == "qr-erase-rows" and res.report["rule"]["judged"]["rows"] == 4
