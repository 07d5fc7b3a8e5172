"""TOFU comparison tables: rows kept from an earlier comparison of the same context."""

import json

from recipes.tofu.report import earlier_rows, memorisation_line


def test_earlier_rows_ignore_the_last_calls_wall_time_but_not_the_context(tmp_path):
    rows = [{"method": "target model"}, {"method": "npo", "forget_quality": 0.5}, {"method": "t3"}]
    (tmp_path / "compare.json").write_text(
        json.dumps({"context": {"preset": "micro", "wall_seconds": 10.0}, "rows": rows})
    )
    assert earlier_rows(tmp_path, {"preset": "micro"}, exclude=["t3"]) == [rows[1]]
    assert earlier_rows(tmp_path, {"preset": "mini"}, exclude=["t3"]) == []


def test_the_memorisation_line_says_what_failed():
    ok = {
        "memorisation": {
            "memorised": True,
            "forget_prob": 0.98,
            "min_forget_prob": 0.8,
            "retain_prob": 0.05,
            "min_forget_rouge": 0.85,
            "forget_rouge": 1.0,
        },
        "wall_seconds": 600,
    }
    line = memorisation_line(ok)
    assert "memorised the forget answers: yes" in line and "10.0 min" in line and "retain model's 0.0500" in line
    bad = {
        "memorisation": {
            "memorised": False,
            "failed": ["forget ROUGE-L 0.5 (memorised: >= 0.85)"],
            "forget_prob": 0.9,
            "min_forget_prob": 0.8,
            "min_forget_rouge": 0.85,
            "forget_rouge": 0.5,
        }
    }
    assert "NO (forget ROUGE-L 0.5" in memorisation_line(bad)
    assert memorisation_line({}) == ""
