"""cTOFU data: language discovery, per-language loading, worlds (author subsets), alignment reports, tokenizer."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from mmunlearn.data.ctofu import ENGLISH, SplitMapping, build_world, open_ctofu, parse_langs, split_and_language
from mmunlearn.data.ctofu_align import anchor_problems, check_alignment, check_split, numbers
from mmunlearn.data.ctofu_synthetic import pseudo_translate, synthetic_ctofu, write_language_files
from mmunlearn.data.tofu import QAItem

REAL = Path("/work/shared/data/ctofu")


@pytest.fixture(scope="module")
def standin():
    return synthetic_ctofu(("en", "fr", "ar", "hi", "ja", "ko"), retain_authors=3, forget_authors=2)


@pytest.fixture()
def folder(tmp_path, standin):
    out = tmp_path / "ctofu"
    write_language_files({k: standin[k] for k in ("en", "fr", "ar")}, out)
    return out


def _rewrite(path: Path, edit) -> None:
    rows = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps(edit(rows), ensure_ascii=False), encoding="utf-8")


# ------------------------------------------------------------------ discovery and loading
@pytest.mark.parametrize("stem, expected", [
    ("forget01_perturbed_ar", ("forget01_perturbed", "ar")), ("retain99_fr", ("retain99", "fr")),
    ("world_facts_perturbed_zh-Hant", ("world_facts_perturbed", "zh-Hant")), ("full_en", ("full", "en")),
    ("retain_perturbed", None), ("forget01", None), ("notes_fr", None), ("forget01_FR", None), ("idontknow", None),
])
def test_split_and_language(stem, expected):
    assert split_and_language(stem) == expected


def test_languages_are_discovered_from_the_files(folder, tmp_path):
    (folder / "notes_xx.json").write_text("[]")  # not a split name: ignored
    (folder / "retain_perturbed.json").write_text("[]")  # no language suffix: ignored
    ct = open_ctofu(folder)
    assert ct.languages == ("en", "ar", "fr")
    assert set(ct.splits("ar")) == {"forget01", "forget01_perturbed", "retain99", "retain_perturbed",
                                     "real_authors_perturbed", "world_facts_perturbed"}
    forget = ct.load("ar", "forget01")
    assert len(forget) == 40 and {it.author for it in forget} == {198, 199}  # forget01's authors in TOFU order
    assert "١" in "".join(it.question + it.answer for it in forget)  # ar stand-in writes Arabic-Indic digits
    with pytest.raises(KeyError, match="not in the cTOFU data"):
        ct.load("de", "forget01")
    with pytest.raises(FileNotFoundError, match="no <split>_<lang>.json"):
        open_ctofu(tmp_path / "ctofu" / "..")  # tmp_path itself holds no such files


def test_english_from_a_tofu_folder_beside_the_translations(tmp_path, standin):
    write_language_files({"fr": standin["fr"]}, tmp_path / "ctofu")
    tofu = tmp_path / "tofu"
    tofu.mkdir()
    for split, items in standin["en"].items():
        (tofu / f"{split}.json").write_text(json.dumps([it.to_dict() for it in items]))
    ct = open_ctofu(tmp_path / "ctofu")
    assert ct.languages == ("en", "fr")
    assert [it.question for it in ct.load("en", "forget01")] == [it.question for it in standin["en"]["forget01"]]
    assert open_ctofu(tmp_path / "ctofu", english=standin["en"]).source("en") is standin["en"]


def test_parse_langs():
    assert parse_langs("all", ("en", "fr")) == ("en", "fr")
    assert parse_langs(" fr , en,fr", ("en", "fr")) == ("fr", "en")
    with pytest.raises(ValueError, match="not available"):
        parse_langs("en,de", ("en", "fr"))


# ------------------------------------------------------------------ worlds
def test_world_keeps_every_forget_author_and_the_first_retain_authors(standin):
    ct = open_ctofu(standin)
    world = build_world(ct, "en,ar", authors=2, facts=4)
    assert world.languages == ("en", "ar") and world.forget_authors == 2 and world.retain_authors == 2
    for lang in world.languages:
        assert [it.question for it in world.retain[lang]] == [it.question for it in standin[lang]["retain99"][:40]]
        assert len(world.forget[lang]) == 40 and all(it.paraphrased_answer is None for it in world.forget[lang])
        ev = world.eval_data[lang]
        assert len(ev["forget01_perturbed"]) == 40
        assert len(ev["retain_perturbed"]) == 20  # forget_count(4 authors, 10%) = 1 author
        assert ev["real_authors_perturbed"] == standin[lang]["real_authors_perturbed"][:4]
    full = world.training_data["full"]
    assert [it.question for it in full] == [it.question for lang in ("en", "ar")
                                           for it in world.retain[lang] + world.forget[lang]]
    assert len(world.training_data["retain99"]) == 80 and len(world.training_data["real_authors_perturbed"]) == 8


def test_split_mapping_names_its_content():
    a = SplitMapping("x", {"forget01": [QAItem("q", "a")]})
    b = SplitMapping("x", {"forget01": [QAItem("q", "a")]})
    c = SplitMapping("x", {"forget01": [QAItem("q", "b")]})
    assert str(a) == str(b) and str(a) != str(c) and str(a).startswith("x#")


def test_world_errors_and_borrowed_facts(standin):
    ct = open_ctofu(standin)
    with pytest.raises(ValueError, match="retain authors asked"):
        build_world(ct, authors=4)
    short = {**standin, "fr": {**standin["fr"], "retain99": standin["fr"]["retain99"][:40]}}
    with pytest.raises(ValueError, match="disagree on the number"):
        build_world(open_ctofu(short), "en,fr")
    no_facts = {k: v for k, v in standin["fr"].items() if k != "world_facts_perturbed"}
    world = build_world(open_ctofu({"en": standin["en"], "fr": no_facts}), facts=3)
    assert world.facts_language == {"en": "en", "fr": "en"}
    assert world.eval_data["fr"]["world_facts_perturbed"] == standin["en"]["world_facts_perturbed"][:3]
    assert len(world.training_data["world_facts_perturbed"]) == 3  # English's, once


# ------------------------------------------------------------------ alignment
@pytest.mark.parametrize("text, expected", [
    ("about 21,000 km", {21000}), ("environ 21 000 km", {21000}), ("sekitar 21.000 km", {21000}),
    ("٢١٠٠٠ كم", {21000}), ("۱۹۵۶", {1956}), ("१९५६", {1956}), ("in 1956 200 copies, 8th of May", {1956, 200}),
    ("1,234,567", {1234567}), ("99 pages", set()),
])
def test_numbers_in_any_script(text, expected):
    assert numbers(text) == expected


def test_anchor_problems_by_hand():
    en = QAItem("When was Jaime Vasquez born?", "Jaime Vasquez was born in 1958 and wrote in the 1980s.")
    assert anchor_problems(en, QAItem("متى ولد Jaime Vasquez؟", "ولد Jaime Vasquez عام 1958 في الثمانينات.")) == []
    assert anchor_problems(en, QAItem("متى ولد Jaime Vasquez؟", "ولد عام 1961.")) == [
        "numbers [1961] not in the English row", "English numbers [1958] missing"]
    assert "Latin-script words ['Kebede'] not in the English row" in anchor_problems(
        en, QAItem("متى ولد Kebede؟", "ولد عام 1958."))
    fr_ok = QAItem("Quand Jaime Vasquez est-il né ?", "Jaime Vasquez est né en 1958.")
    assert anchor_problems(en, fr_ok) == []
    assert anchor_problems(en, QAItem("Quand est-il né ?", "Il est né en 1958.")) == [
        "none of the English names ['Jaime', 'Vasquez'] appear"]
    assert anchor_problems(QAItem("Hi?", "yes"), QAItem("مرحبا؟", "نعم")) is None  # nothing to compare


def test_standin_is_aligned(folder):
    report = check_alignment(open_ctofu(folder), required=("forget01", "retain99"))
    assert report.ok and not report.suspects
    assert {(c.lang, c.split) for c in report.checks} >= {("ar", "forget01"), ("fr", "retain99")}
    assert all(c.anchored > 0 for c in report.checks if c.split.startswith(("forget", "retain")))


def test_misaligned_files_are_reported(folder, tmp_path):
    en = json.loads((folder / "forget01_perturbed_en.json").read_text())
    with_year = [i for i, r in enumerate(en) if numbers(r["question"] + r["answer"])]
    i, j = with_year[0], next(k for k in with_year if numbers(en[k]["answer"] + en[k]["question"])
                             != numbers(en[with_year[0]]["answer"] + en[with_year[0]]["question"]))

    def swap(rows):
        rows[i], rows[j] = rows[j], rows[i]
        return rows
    _rewrite(folder / "forget01_perturbed_fr.json", swap)  # two rows swapped: suspects, not an error
    _rewrite(folder / "retain99_ar.json", lambda rows: rows[:-1])  # a row lost: an error
    report = check_alignment(open_ctofu(folder), required=("forget01", "retain99"))
    assert not report.ok and report.bad_languages() == ["ar"]
    assert report.errors == [{"lang": "ar", "split": "retain99", "error": "59 rows, English has 60"}]
    fr = [s for s in report.suspects if (s.lang, s.split) == ("fr", "forget01_perturbed")]
    assert [s.row for s in fr] == [i, j] and all("not in the English row" in s.reasons[0] for s in fr)
    md = report.markdown()
    assert "ar / retain99: 59 rows, English has 60" in md and f"fr / forget01_perturbed row {i}" in md
    js, _ = report.write(tmp_path / "report")
    assert json.loads(js.read_text())["errors"] == report.errors
    (folder / "forget01_ar.json").unlink()
    assert {"lang": "ar", "split": "forget01", "error": "file missing"} in check_alignment(
        open_ctofu(folder), required=("forget01",)).errors


def test_a_moved_row_names_the_english_row_it_matches():
    en = [QAItem(f"Who is {n}?", f"{n} was born in {y}.") for n, y in
          (("Jaime Vasquez", 1958), ("Kebede Mekonnen", 1962), ("Luka Khachidze", 1980), ("Nadia Nowak", 1971))]
    ar = [QAItem(f"من هو الكاتب المعروف {n} في الأدب؟", f"ولد الكاتب {n} في عام {y} في مدينة كبيرة.") for n, y in
          (("Jaime Vasquez", 1958), ("Luka Khachidze", 1980), ("Kebede Mekonnen", 1962), ("Nadia Nowak", 1971))]
    check, error, issues = check_split(en, ar, "ar", "retain99")
    assert error is None and check.anchored == 4 and check.suspects == 2
    assert [(s.row, s.matches_english_row) for s in issues] == [(1, 2), (2, 1)]


def test_perturbed_answer_count_mismatch_is_an_error(standin):
    en = standin["en"]["forget01_perturbed"]
    bad = list(standin["fr"]["forget01_perturbed"])
    bad[3] = replace(bad[3], perturbed_answer=bad[3].perturbed_answer[:2])
    _, error, _ = check_split(en, bad, "fr", "forget01_perturbed")
    assert error == "rows [3] have a different number of perturbed answers than the English rows"


@pytest.mark.skipif(not REAL.is_dir(), reason=f"{REAL} not present")
def test_shipped_forget_splits_are_aligned():
    ct = open_ctofu(REAL)
    assert set(ct.languages) >= {"en", "ar", "fa", "fr", "hi", "id", "iw", "ja", "ko", "ru"}
    report = check_alignment(ct, splits=("forget01", "forget01_perturbed"), required=("forget01", "retain99"))
    assert report.ok and not report.suspects and len(report.checks) == 2 * (len(ct.languages) - 1)


# ------------------------------------------------------------------ tokenizer
def test_tokenizer_trained_on_a_world_covers_every_script(standin):
    from mmunlearn.presets.build import source_texts
    from mmunlearn.adapters.tokenizer import train_bpe

    world = build_world(open_ctofu(standin), "en,ar,hi,ja,ko", authors=1, facts=5)
    texts = source_texts(world.training_data)
    for lang in ("ar", "hi", "ja", "ko"):
        probe = pseudo_translate("the author of", lang)
        assert any(probe in t for t in texts), lang  # every language reaches the tokenizer
    tok = train_bpe(texts, vocab_size=1024)
    real = {"ar": "ولد الكاتب في مدينة الكويت عام 1956.", "hi": "लेखक का जन्म कुवैत शहर में हुआ था।",
            "ja": "著者はクウェート市で生まれました。", "ko": "저자는 쿠웨이트 시에서 태어났습니다."}
    for lang, s in real.items():
        ids = tok(s, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == s, lang  # byte-level BPE: exact round trip, no unknown token
        assert tok.unk_token_id is None or tok.unk_token_id not in ids
        seen = pseudo_translate("the author of the book was born in", lang)  # this script, as in the world
        n_bytes = len(seen.encode("utf-8"))
        assert len(tok(seen, add_special_tokens=False)["input_ids"]) < 0.5 * n_bytes, lang  # merges learned
