"""TOFU_EVAL.json / TOFU_SUMMARY.json: key names, round trip, atomic writes, retain-log reading."""

import json
import math

import numpy as np
import pytest

from mmunlearn.metrics import (
    ALL_KEYS,
    EVAL_FILENAME,
    MODEL_UTILITY_KEYS,
    REFERENCE_KEYS,
    SUMMARY_FILENAME,
    agg_entry,
    forget_quality,
    mia_entry,
    prob_entry,
    read_tofu_logs,
    retain_agg_value,
    retain_forget_truth_ratios,
    score_entry,
    truth_ratio_entry,
    write_tofu_logs,
)

BRIEF_KEYS = (
    "forget_Q_A_Prob forget_Q_A_ROUGE forget_truth_ratio forget_quality model_utility retain_Q_A_Prob "
    "retain_Q_A_ROUGE retain_Truth_Ratio ra_Q_A_Prob_normalised ra_Q_A_ROUGE ra_Truth_Ratio "
    "wf_Q_A_Prob_normalised wf_Q_A_ROUGE wf_Truth_Ratio mia_loss mia_zlib mia_min_k "
    "mia_min_k_plus_plus privleak extraction_strength exact_memorization"
).split()


def test_key_names():
    assert set(BRIEF_KEYS) <= set(REFERENCE_KEYS)
    assert len(set(ALL_KEYS)) == len(ALL_KEYS)
    assert set(MODEL_UTILITY_KEYS) <= set(REFERENCE_KEYS) and len(MODEL_UTILITY_KEYS) == 9
    assert "forget_Truth_Ratio" not in ALL_KEYS  # the reference spells the forget one lower-case


def _logs():
    return {
        "forget_truth_ratio": truth_ratio_entry(
            [0.5, 1.0, 2.0], [[1.0], [1.0], [1.0]], "closer_to_1_better", indices=[4, 10, 2]
        ),
        "forget_Q_A_PERT_Prob": prob_entry([[0.1, 0.2], [0.3, math.inf]]),
        "mia_min_k": mia_entry([0.1, 0.2], [0.3, 0.1]),
        "extraction_strength": score_entry([0.5, 1.0]),
        "forget_quality": agg_entry(None),
        "model_utility": agg_entry(0.42),
    }


def test_write_round_trips_with_exact_layout(tmp_path):
    logs = _logs()
    eval_path, summary_path = write_tofu_logs(tmp_path / "run", logs)
    assert eval_path.name == EVAL_FILENAME and summary_path.name == SUMMARY_FILENAME
    back = read_tofu_logs(eval_path)
    assert back == json.loads(json.dumps(logs))  # identical after JSON's str keys / lists
    assert list(back) == sorted(logs)  # sorted top-level keys, as the reference writes
    assert back["forget_Q_A_PERT_Prob"]["value_by_index"]["1"]["prob"] == [pytest.approx(math.exp(-0.3)), 0.0]
    summary = json.loads(summary_path.read_text())
    # aggregates only; None (forget_quality without retain logs) left out
    assert summary == {k: pytest.approx(v["agg_value"]) for k, v in logs.items() if v["agg_value"] is not None}
    assert "forget_quality" not in summary
    assert [p.name for p in sorted((tmp_path / "run").iterdir())] == [EVAL_FILENAME, SUMMARY_FILENAME]


def test_unknown_key_is_refused_unless_not_strict(tmp_path):
    with pytest.raises(ValueError, match="forget_Truth_Ratio"):
        write_tofu_logs(tmp_path, {"forget_Truth_Ratio": agg_entry(0.1)})
    assert not list(tmp_path.iterdir())
    write_tofu_logs(tmp_path, {"my_metric": agg_entry(0.1)}, strict_keys=False)
    assert json.loads((tmp_path / SUMMARY_FILENAME).read_text()) == {"my_metric": 0.1}


def test_malformed_entries_are_refused(tmp_path):
    with pytest.raises(ValueError, match="agg_value"):
        write_tofu_logs(tmp_path, {"model_utility": {"value": 1.0}})
    with pytest.raises(ValueError, match="number"):
        write_tofu_logs(tmp_path, {"model_utility": {"agg_value": "high"}})
    with pytest.raises(ValueError, match="non-empty"):
        write_tofu_logs(tmp_path, {})


def test_failed_write_keeps_previous_file_and_leaves_no_temp(tmp_path):
    write_tofu_logs(tmp_path, {"model_utility": agg_entry(0.5)})
    before = (tmp_path / EVAL_FILENAME).read_text()
    bad = {"model_utility": {"agg_value": 0.6, "value_by_index": {"0": {"x": object()}}}}
    with pytest.raises(TypeError):
        write_tofu_logs(tmp_path, bad)
    assert (tmp_path / EVAL_FILENAME).read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [EVAL_FILENAME, SUMMARY_FILENAME]


def test_retain_truth_ratios_and_forget_quality(tmp_path):
    write_tofu_logs(tmp_path / "retain", _logs())
    r = retain_forget_truth_ratios(tmp_path / "retain")  # a directory or the file itself
    # R = exp(-1) / exp(-nll_correct) for indices 4, 10, 2 -> numeric index order 2, 4, 10
    np.testing.assert_allclose(r, [math.e, math.exp(-0.5), 1.0], rtol=1e-8)
    np.testing.assert_array_equal(retain_forget_truth_ratios(tmp_path / "retain" / EVAL_FILENAME), r)
    assert forget_quality(r, r) == pytest.approx(1.0)
    # mia_min_k AUC of members [0.1, 0.2] vs non-members [0.3, 0.1]: (1 + 1 + 0.5 + 0) / 4
    assert retain_agg_value(tmp_path / "retain") == pytest.approx(0.625)


def test_reads_a_reference_shaped_file(tmp_path):
    ref = {
        "forget_truth_ratio": {"agg_value": 0.5, "value_by_index": {"0": {"score": 0.5}, "1": {"score": 2.0}}},
        "mia_min_k": {"forget": {}, "holdout": {}, "auc": 0.6, "agg_value": 0.6},
    }
    (tmp_path / EVAL_FILENAME).write_text(json.dumps(ref, indent=4))
    np.testing.assert_array_equal(retain_forget_truth_ratios(tmp_path), [0.5, 2.0])
    assert retain_agg_value(tmp_path, "mia_min_k") == 0.6


def test_retain_log_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="TOFU_EVAL.json"):
        retain_forget_truth_ratios(tmp_path / "nowhere")
    write_tofu_logs(tmp_path, {"model_utility": agg_entry(0.5)})
    with pytest.raises(ValueError, match="no 'forget_truth_ratio' entry"):
        retain_forget_truth_ratios(tmp_path)
    with pytest.raises(ValueError, match="no 'mia_min_k' entry"):
        retain_agg_value(tmp_path)
    (tmp_path / EVAL_FILENAME).write_text(json.dumps({"forget_truth_ratio": {"agg_value": 1.0}}))
    with pytest.raises(ValueError, match="forget_truth_ratio.*value_by_index"):
        retain_forget_truth_ratios(tmp_path)
    (tmp_path / EVAL_FILENAME).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_tofu_logs(tmp_path)
