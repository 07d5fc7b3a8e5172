"""examples/tofu_goals.py on a hand-made compare folder: the wall-time goal given, whether the target's forget
quality separates the table, QR-Erase's and T3's forget quality, utility ratio and ROUGE-L gap to the retain model."""

import json

from examples import tofu_goals as g


def _row(method, fq, mu, rouge):
    return {"method": method, "forget_quality": fq, "model_utility": mu, "forget_Q_A_ROUGE": rouge}


def _folder(tmp_path, target_fq=0.005, qr_rouge=0.40, t3_mu=0.17):
    rows = [
        _row("target model", target_fq, 0.20, 0.99),
        _row("retain model", 1.0, 0.30, 0.34),
        _row("qr-erase", 0.5, 0.26, qr_rouge),
        _row("t3", 0.9, t3_mu, 0.20),
    ]
    (tmp_path / "compare.json").write_text(json.dumps({"context": {"wall_seconds": 120 * 60}, "rows": rows}))
    return tmp_path


def _met(rows):
    return {r["goal"]: r["met"] for r in rows}


def test_every_goal_is_judged_from_the_rows(tmp_path):
    met = _met(g.goals(_folder(tmp_path), wall_goal_min=150))
    assert met["whole compare wall time"] is True  # 120 <= 150
    assert met["target model: forget quality (the table separates)"] is True  # 0.005 <= 0.01
    assert met["qr-erase: forget quality"] is True and met["qr-erase: model utility / target's"] is True
    assert met["qr-erase: forget ROUGE-L - the retain model's"] is True  # 0.40 - 0.34 = 0.06
    assert met["t3: model utility / target's"] is False  # 0.17 / 0.20 = 0.85 < 0.9
    assert met["t3: forget ROUGE-L - the retain model's"] is False  # 0.20 - 0.34 = -0.14: further than 0.1


def test_a_missed_goal_says_so(tmp_path):
    met = _met(g.goals(_folder(tmp_path, target_fq=0.08, qr_rouge=0.50), wall_goal_min=90))
    assert met["whole compare wall time"] is False  # 120 > 90
    assert met["target model: forget quality (the table separates)"] is False
    assert met["qr-erase: forget ROUGE-L - the retain model's"] is False  # 0.16 from the retain model's
