"""TOFU retain logs without the MIA (or truth-ratio) entry: the metric that needs it is None with a warning
naming the file, the other is still computed; the retain log is never modified."""

import json
import logging

import pytest

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.eval import evaluate_tofu
from tests.reliability.untrusted import digest_tree
from tests.tiny import tiny_causal_lm, tiny_tokenizer

SOURCE = "synthetic:n_authors=10"
KW = dict(metrics=["forget", "mia"], max_new_tokens=2, batch_size=8)


@pytest.fixture(scope="module")
def adapter():
    return TextLLMAdapter(tiny_causal_lm(seed=0), tiny_tokenizer())


@pytest.fixture(scope="module")
def retain_logs(adapter, tmp_path_factory):
    """The model's own TOFU_EVAL.json: against it forget quality is 1 and privleak 0."""
    out = tmp_path_factory.mktemp("retain")
    evaluate_tofu(adapter, SOURCE, out_dir=out, **KW)
    return json.loads((out / "TOFU_EVAL.json").read_text())


def _write(tmp_path, logs, drop):
    folder = tmp_path / "retain"
    folder.mkdir()
    (folder / "TOFU_EVAL.json").write_text(json.dumps({k: v for k, v in logs.items() if k not in drop}))
    return folder / "TOFU_EVAL.json"


@pytest.mark.parametrize(
    "drop, quality, leak",
    [
        (("mia_min_k",), 1.0, None),
        (("forget_truth_ratio",), None, 0.0),
        (("mia_min_k", "forget_truth_ratio"), None, None),
    ],
)
def test_a_missing_entry_leaves_its_metric_none_with_a_warning(
    adapter, retain_logs, tmp_path, caplog, drop, quality, leak
):
    file = _write(tmp_path, retain_logs, drop)
    before = digest_tree(tmp_path)
    with caplog.at_level(logging.WARNING, logger="mmunlearn.eval.tofu"):
        logs = evaluate_tofu(adapter, SOURCE, retain_logs=file, out_dir=tmp_path / "out", **KW)
    got = (logs["forget_quality"]["agg_value"], logs["privleak"]["agg_value"])
    assert got[0] == (None if quality is None else pytest.approx(quality))
    assert got[1] == (None if leak is None else pytest.approx(leak, abs=1e-6))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for key, metric in (("mia_min_k", "privleak"), ("forget_truth_ratio", "forget_quality")):
        hits = [w for w in warned if str(file) in w and repr(key) in w and f"{metric} is left None" in w]
        assert len(hits) == (key in drop), (key, warned)
    after = digest_tree(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("out/")} == before  # only out/ was written
    assert json.loads((tmp_path / "out" / "TOFU_SUMMARY.json").read_text()).get("privleak") == got[1]


def test_an_mia_entry_without_a_value_counts_as_missing_but_a_malformed_one_is_an_error(
    adapter, retain_logs, tmp_path, caplog
):
    logs = dict(retain_logs, mia_min_k={"agg_value": None})
    file = _write(tmp_path, logs, ())
    with caplog.at_level(logging.WARNING, logger="mmunlearn.eval.tofu"):
        out = evaluate_tofu(adapter, SOURCE, retain_logs=file, **KW)
    assert out["privleak"]["agg_value"] is None and out["forget_quality"]["agg_value"] == pytest.approx(1.0)
    assert any("privleak is left None" in r.getMessage() for r in caplog.records)
    file.write_text(json.dumps(dict(retain_logs, mia_min_k=[0.5])))
    with pytest.raises(ValueError, match=rf"{file}: 'mia_min_k' is not an entry"):
        evaluate_tofu(adapter, SOURCE, retain_logs=file, **KW)
    file.write_text("{not json")
    with pytest.raises(ValueError, match=rf"{file}: not valid JSON"):
        evaluate_tofu(adapter, SOURCE, retain_logs=file, **KW)
