"""examples/ctofu_goals.py on a hand-made compare.json: the forget criterion chosen by the target's forget quality,
methods meeting it with utility kept per language, transfer by script, QR-Erase against SVD-UNLEARN."""

import json

import pytest

from examples import ctofu_goals as g

LANGS = ("en", "fr", "ja")


def _row(method, lang, fq, rouge, mu, rel_drop=None, seconds=None):
    return {
        "method": method,
        "lang": lang,
        "forget_quality": fq,
        "forget_Q_A_ROUGE": rouge,
        "model_utility": mu,
        "forget_Q_A_Prob": 0.5,
        "rouge_drop": 0.9 - rouge,
        "rouge_rel_drop": rel_drop,
        "total_seconds": seconds,
    }


def _compare(target_fq=0.001):
    rows = [_row("target model", lang, target_fq, 0.9, 0.5) for lang in LANGS]
    rows += [_row("retain model", lang, 1.0, 0.3, 0.5) for lang in LANGS]
    drops = {"en": 0.8, "fr": 0.4, "ja": 0.1}
    rows += [
        _row("qr-erase", lang, 0.2 if lang == "en" else 0.01, 0.2 if lang == "en" else 0.6, 0.48, drops[lang], 10.0)
        for lang in LANGS
    ]
    rows += [
        _row(
            "svd-unlearn",
            lang,
            0.2 if lang == "en" else 0.01,
            0.25 if lang == "en" else 0.6,
            0.40 if lang == "ja" else 0.47,
            drops[lang],
            40.0,
        )
        for lang in LANGS
    ]
    return {"context": {"forget_langs": ["en"]}, "rows": rows}


def test_fq_criterion_when_it_separates_target_and_retain():
    rows = {r["lang"]: r for r in g.criterion_rows(_compare())}
    assert rows["en"]["criterion"] == "FQ >= 0.05" and rows["ja"]["script"] == "Japanese"
    assert rows["en"]["forget_met"] == "qr-erase, svd-unlearn" and rows["fr"]["forget_met"] == "none"
    assert rows["en"]["both"] == "qr-erase, svd-unlearn"  # 0.47 >= 0.9 * 0.5
    assert rows["ja"]["mu_kept"] == "qr-erase"  # svd-unlearn's 0.40 < 0.45


def test_rouge_criterion_when_the_target_is_not_separated():
    comp = _compare(target_fq=0.2)
    assert not g.fq_separates(comp)
    rows = {r["lang"]: r for r in g.criterion_rows(comp)}
    assert rows["en"]["criterion"] == "forget ROUGE-L <= retain model's"
    assert rows["en"]["forget_met"] == "qr-erase, svd-unlearn"  # 0.2, 0.25 <= 0.3
    assert rows["fr"]["forget_met"] == "none"  # 0.6 > 0.3
    with pytest.raises(ValueError, match="criterion"):
        g.criterion_rows(comp, "mia")


def test_transfer_by_script_and_qr_against_svd(tmp_path):
    scripts = {r["method"]: r for r in g.script_rows(_compare())}
    qr = scripts["qr-erase"]
    assert qr["transfer_latin"] == pytest.approx(0.5) and qr["transfer_non_latin"] == pytest.approx(0.125)
    assert (qr["latin"], qr["non_latin"]) == ("fr", "ja")
    rows = {r["metric"]: r for r in g.qr_vs_svd_rows(_compare())}
    assert rows["forget ROUGE-L drop (en)"]["gap"] == pytest.approx(0.05 / 0.65)
    assert rows["forget ROUGE-L drop (en)"]["within"] is False and rows["forget quality (fr)"]["within"] is True
    assert rows["extraction + sweep + edit, s (QR / SVD)"]["gap"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="no rows"):
        g.qr_vs_svd_rows({"rows": []})


def test_tables_render_as_records(tmp_path, monkeypatch):
    from mmunlearn import report

    path = tmp_path / "compare.json"
    path.write_text(json.dumps(_compare()))
    monkeypatch.setattr("sys.argv", ["ctofu_goals.py", str(path), str(tmp_path / "goals")])
    g.main()
    for name in ("criterion", "scripts", "qr_vs_svd"):
        rec = report.make_record(report.load_source(tmp_path / "goals" / f"{name}.json"), name=name, command="x")
        assert report.render(rec).count("\n") >= 3


def test_a_target_without_utility_in_a_language_leaves_its_ratio_unknown():
    comp = _compare()
    for r in comp["rows"]:
        if r["method"] == "target model" and r["lang"] == "fr":
            r["model_utility"] = 0.0  # every real-authors / world-facts answer wrong in French
    rows = {r["lang"]: r for r in g.criterion_rows(comp)}
    assert rows["fr"]["mu_kept"] == rows["fr"]["both"] == "n/a (target MU 0)"
    assert rows["en"]["both"] == "qr-erase, svd-unlearn"  # the other languages as before
