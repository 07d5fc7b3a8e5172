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


def _runs(folder, qr_seconds, qr_forget, gd_forgets, gd_seconds=200.0, target=2.5):
    """QR-Erase's run (its cost and the forget NLL it reached) and GradDiff's early-stopped trajectory."""
    rule = {"forget_target": target}
    (folder / "qr-erase" / "model").mkdir(parents=True)
    (folder / "qr-erase" / "run.json").write_text(
        json.dumps({"row": {"total_seconds": qr_seconds}, "rule": {**rule, "forget": qr_forget}})
    )
    (folder / "qr-erase" / "model" / "unlearn_report.json").write_text(json.dumps({"forget_nll": {"after": qr_forget}}))
    sweep = [{"step": i + 1, "forget_nll": f} for i, f in enumerate(gd_forgets)]
    (folder / "grad_diff").mkdir()
    (folder / "grad_diff" / "run.json").write_text(
        json.dumps(
            {"row": {"unlearn_seconds": gd_seconds}, "rule": rule, "info": {"steps": len(sweep), "sweep": sweep}}
        )
    )


def test_qr_erases_cost_against_grad_diffs_time_to_the_same_nll_and_to_the_rules_target(tmp_path):
    folder = _folder(tmp_path)
    # GradDiff stops at step 4 of 4 (200 s), once past the target 2.5; QR-Erase overshot to 3.0 in 60 s
    _runs(folder, qr_seconds=60.0, qr_forget=3.0, gd_forgets=[0.5, 1.5, 2.2, 2.8])
    found = {r["goal"].split(" / ")[1].split(" (")[0]: r for r in g.goals(folder) if " / grad_diff" in r["goal"]}
    same, to_target = (
        found["grad_diff's time to the same forget NLL"],
        found["grad_diff's time to the rule's forget target"],
    )
    assert same["met"] is None and "never reached" in same["measured"]  # GradDiff never got to 3.0
    assert to_target["measured"] == "60 s / 200 s = 0.30" and to_target["met"] is True  # 0.30 <= 1/3


def test_a_qr_erase_short_of_the_target_gets_no_cost_ratio(tmp_path):
    folder = _folder(tmp_path)
    _runs(folder, qr_seconds=60.0, qr_forget=2.0, gd_forgets=[0.5, 1.5, 2.2, 2.8])
    row = next(r for r in g.goals(folder) if "rule's forget target" in r["goal"])
    assert row["met"] is None and row["measured"] == "60 s / 200 s"  # no ratio: QR-Erase did not reach the target
