"""Markdown tables: one model's headline metrics and several models side by side."""

import json

import pytest

from mmunlearn.eval import compare_table, summary_table

TARGET = {
    "forget_quality": {"agg_value": 1.2e-5},
    "model_utility": {"agg_value": 0.61234},
    "forget_Q_A_ROUGE": {"agg_value": 0.95, "value_by_index": {"0": {"rougeL_recall": 0.95}}},
    "privleak": {"agg_value": None},
}
RETAIN = {"forget_quality": 1.0, "model_utility": 0.6, "forget_Q_A_ROUGE": 0.4, "retain_Q_A_Prob": 0.9}


def test_summary_table_rows_values_and_none():
    md = summary_table(TARGET)
    lines = md.strip().splitlines()
    assert lines[0] == "| Metric | Key | Value |" and len(lines) == 2 + 4
    assert "| `forget_quality` | 1.20e-05 |" in md and "| `model_utility` | 0.6123 |" in md
    assert "| `privleak` | n/a |" in md and "retain_Q_A_Prob" not in md
    with pytest.raises(ValueError, match="none of the headline"):
        summary_table({"mia_gradnorm": {"agg_value": 0.5}})


def test_compare_table_reads_mappings_and_paths(tmp_path):
    (tmp_path / "retain").mkdir()
    (tmp_path / "retain" / "TOFU_SUMMARY.json").write_text(json.dumps(RETAIN))
    md = compare_table({"target": TARGET, "retain": tmp_path / "retain"})
    lines = md.strip().splitlines()
    assert lines[0] == "| Metric | target | retain |" and lines[1] == "|---|---:|---:|"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    assert rows["Forget quality (KS p-value) ↑"].endswith("| 1.20e-05 | 1.0000 |")
    assert rows["Retain prob ↑"].endswith("| — | 0.9000 |")  # target lacks the key
    assert rows["PrivLeak (→ 0)"].endswith("| n/a | — |")
    assert len(lines) == 2 + 5
    with pytest.raises(FileNotFoundError, match="TOFU logs not found"):
        compare_table({"x": tmp_path / "missing"})
    with pytest.raises(ValueError, match="no models"):
        compare_table({})
