"""cTOFU data: language discovery, per-language loading, worlds (author subsets), trained = scored text,
alignment reports, tokenizer."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from mmunlearn.data.ctofu.align import AlignmentReport, anchor_problems, check_alignment, check_split, numbers
from mmunlearn.data.ctofu.synthetic import (
    pseudo_translate,
    synthetic_ctofu,
    synthetic_ctofu_from_spec,
    write_language_files,
)
from mmunlearn.data.ctofu.worlds import (
    SplitMapping,
    build_world,
    open_ctofu,
    parse_langs,
    same_text,
    split_and_language,
)
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
@pytest.mark.parametrize(
    "stem, expected",
    [
        ("forget01_perturbed_ar", ("forget01_perturbed", "ar")),
        ("retain99_fr", ("retain99", "fr")),
        ("world_facts_perturbed_zh-Hant", ("world_facts_perturbed", "zh-Hant")),
        ("full_en", ("full", "en")),
        ("retain_perturbed", None),
        ("forget01", None),
        ("notes_fr", None),
        ("forget01_FR", None),
        ("idontknow", None),
    ],
)
def test_split_and_language(stem, expected):
    assert split_and_language(stem) == expected


def test_languages_are_discovered_from_the_files(folder, tmp_path):
    (folder / "notes_xx.json").write_text("[]")  # not a split name: ignored
    (folder / "retain_perturbed.json").write_text("[]")  # no language suffix: ignored
    ct = open_ctofu(folder)
    assert ct.languages == ("en", "ar", "fr")
    assert set(ct.splits("ar")) == {
        "forget01",
        "forget01_perturbed",
        "retain99",
        "retain_perturbed",
        "real_authors_perturbed",
        "world_facts_perturbed",
    }
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
    assert [it.question for it in full] == [
        it.question for lang in ("en", "ar") for it in world.retain[lang] + world.forget[lang]
    ]
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
    short = {
        **standin,
        "fr": {
            **standin["fr"],
            "retain99": standin["fr"]["retain99"][:40],
            "retain_perturbed": standin["fr"]["retain_perturbed"][:20],
        },
    }
    with pytest.raises(ValueError, match="disagree on the number"):
        build_world(open_ctofu(short), "en,fr")
    longer = {**standin, "fr": {**standin["fr"], "retain99": standin["fr"]["retain99"][:40]}}
    with pytest.raises(ValueError, match="retain_perturbed has 60 rows, more than retain99's 40"):
        build_world(open_ctofu(longer), "en,fr")  # its rows cannot all be retain99 rows
    no_facts = {k: v for k, v in standin["fr"].items() if k != "world_facts_perturbed"}
    world = build_world(open_ctofu({"en": standin["en"], "fr": no_facts}), facts=3)
    assert world.facts_language == {"en": "en", "fr": "en"}
    assert world.eval_data["fr"]["world_facts_perturbed"] == standin["en"]["world_facts_perturbed"][:3]
    assert len(world.training_data["world_facts_perturbed"]) == 3  # English's, once


# ------------------------------------------------------------------ trained text = scored text
RETRANSLATED = ("forget01_perturbed", "retain_perturbed")


def _qa(items) -> list[tuple[str, str]]:
    return [(it.question, it.answer) for it in items]


@pytest.fixture(scope="module")
def retranslated_folder(tmp_path_factory):
    """Files whose scored splits are a second translation, as the shipped ones are: every non-English
    question and answer of forget01_perturbed / retain_perturbed differs from forget01 / retain99."""
    out = tmp_path_factory.mktemp("retranslated")
    write_language_files(
        synthetic_ctofu(("en", "fr", "ar", "ja"), retain_authors=3, forget_authors=2, retranslated=RETRANSLATED), out
    )
    return out


def test_retranslated_standin_differs_from_the_training_files_and_stays_aligned(retranslated_folder):
    ct = open_ctofu(retranslated_folder)
    for lang in ("fr", "ar", "ja"):
        for train, scored in (("forget01", "forget01_perturbed"), ("retain99", "retain_perturbed")):
            pairs = list(zip(ct.load(lang, train), ct.load(lang, scored)))
            assert all(a.question != b.question and a.answer != b.answer for a, b in pairs), (lang, train)
            assert all(a.author == b.author for a, b in pairs)  # same rows, other wording
    en = ct.load("en", "forget01")
    assert _qa(en) == _qa(ct.load("en", "forget01_perturbed"))  # English: one wording, as in TOFU
    report = check_alignment(ct, required=("forget01", "retain99"))
    assert report.ok and not report.suspects  # names and numbers kept: still row-aligned with English
    assert pseudo_translate("Where was Amara born?", "fr", 1) == "En quel lieu fut Amara née ?"
    spec = synthetic_ctofu_from_spec(
        "synthetic:retain_authors=1,forget_authors=1,langs=en/ko,retranslated=forget01_perturbed"
    )
    assert all(not same_text(a, b) for a, b in zip(spec["ko"]["forget01"], spec["ko"]["forget01_perturbed"]))
    assert _qa(spec["ko"]["retain99"][:20]) == _qa(spec["ko"]["retain_perturbed"])
    with pytest.raises(ValueError, match="retranslated splits"):
        synthetic_ctofu(("en",), retranslated=("forget05",))


def test_every_forget_row_is_trained_on_the_text_it_is_scored_with(retranslated_folder):
    world = build_world(open_ctofu(retranslated_folder), authors=2)
    assert world.train_text == "scored"
    training = world.training_data
    n = 40  # forget rows per language (2 forget authors)
    for k, lang in enumerate(world.languages):
        scored = world.eval_data[lang]["forget01_perturbed"]
        assert len(scored) == n
        assert _qa(world.items("forget", (lang,))) == _qa(scored), lang
        assert _qa(training["forget01"][k * n : (k + 1) * n]) == _qa(scored), lang  # what unlearning reads
        full = {(it.question, it.answer) for it in training["full"]}
        assert set(_qa(scored)) <= full, lang  # what the target model is trained on
        assert [it.author for it in world.forget[lang]] == [it.author for it in scored]


def test_scored_retain_rows_are_trained_on_the_scored_text(retranslated_folder):
    ct = open_ctofu(retranslated_folder)
    world = build_world(ct, authors=2)
    for lang in world.languages:
        scored = world.eval_data[lang]["retain_perturbed"]
        retain = world.retain[lang]
        assert len(scored) == 20 and len(retain) == 40
        assert _qa(retain[:20]) == _qa(scored), lang
        # retain99's rows beyond the ones this world scores still come from retain_perturbed where it has them
        # (the file holds 3 authors), so a row's text does not depend on the world's size
        assert _qa(retain[20:]) == _qa(ct.load(lang, "retain_perturbed")[20:40]), lang
    big = build_world(ct, "fr")  # all 3 retain authors: 60 retain rows, all of them in retain_perturbed
    assert _qa(big.retain["fr"]) == _qa(ct.load("fr", "retain_perturbed"))
    assert _qa(big.retain["fr"][:40]) == _qa(world.retain["fr"])


def test_text_agreement_counts_shared_rows_per_language_and_split(retranslated_folder):
    ct = open_ctofu(retranslated_folder)
    files = {(t.lang, t.split): t for t in build_world(ct, authors=2, train_text="files").text_agreement()}
    scored = {(t.lang, t.split): t for t in build_world(ct, authors=2).text_agreement()}
    assert (
        set(files) == set(scored) == {(lang, s) for lang in ("en", "ar", "fr", "ja") for s in ("forget01", "retain99")}
    )
    for (lang, split), t in files.items():
        rows = 40 if split == "forget01" else 20
        assert t.scored == rows and scored[lang, split].scored == rows
        expected = rows if lang == "en" else 0
        assert t.shared == t.in_files == scored[lang, split].in_files == expected, (lang, split)
        assert t.ok == (lang == "en") and t.differing_rows == (() if lang == "en" else tuple(range(10)))
        assert scored[lang, split].shared == rows and scored[lang, split].ok and not scored[lang, split].differing_rows
    with pytest.raises(ValueError, match="train_text must be one of"):
        build_world(ct, train_text="perturbed")


def test_alignment_report_shows_trained_vs_scored_text(retranslated_folder, tmp_path):
    ct = open_ctofu(retranslated_folder)
    report = check_alignment(ct, "fr", ("forget01", "forget01_perturbed"))
    assert report.add_text_agreement(build_world(ct, "en,fr", authors=2)) == []
    md = report.markdown()
    assert "| fr | forget01 | forget01_perturbed | 40 | 40 | 0 |" in md and "differs" not in md
    bad = report.add_text_agreement(build_world(ct, "en,fr", authors=2, train_text="files"), allowed=True)
    assert [(t.lang, t.split, t.shared, t.scored) for t in bad] == [
        ("fr", "forget01", 0, 40),
        ("fr", "retain99", 0, 20),
    ]
    md = report.markdown()
    assert (
        "| fr | forget01 | forget01_perturbed | 40 | 0 | 0 |" in md
        and "| en | retain99 | retain_perturbed | 20 | 20 | 20 |" in md
    )
    assert "**Trained text differs from scored text** (allowed for this run" in md
    assert "- fr / forget01: 0 of 40 rows shared" in md
    js, _ = report.write(tmp_path)
    data = json.loads(js.read_text())
    assert data["train_text"] == "files" and data["text_mismatches"] == 2 and data["text_mismatch_allowed"]
    assert {(t["lang"], t["split"]): t["shared"] for t in data["texts"]}[("fr", "forget01")] == 0
    assert "the run stops" in AlignmentReport(texts=bad, train_text="files").markdown()


@pytest.mark.skipif(not REAL.is_dir(), reason=f"{REAL} not present")
def test_shipped_fr_ja_train_the_forget_text_they_are_scored_with():
    ct = open_ctofu(REAL)
    world = build_world(ct, "fr,ja")
    for lang in ("fr", "ja"):
        shipped = ct.load(lang, "forget01")
        scored = world.eval_data[lang]["forget01_perturbed"]
        assert len(scored) == len(shipped) == 40
        assert sum(map(same_text, shipped, scored)) == 0, lang  # the two files were translated apart
        assert _qa(world.items("forget", (lang,))) == _qa(scored), lang
        retain_scored = world.eval_data[lang]["retain_perturbed"]
        assert len(retain_scored) == 400 and _qa(world.retain[lang][:400]) == _qa(retain_scored), lang
        assert _qa(world.retain[lang][400:]) == _qa(ct.load(lang, "retain99")[400:]), lang
    agreement = {(t.lang, t.split): (t.shared, t.scored, t.in_files) for t in world.text_agreement()}
    assert agreement == {
        ("fr", "forget01"): (40, 40, 0),
        ("fr", "retain99"): (400, 400, 400),
        ("ja", "forget01"): (40, 40, 0),
        ("ja", "retain99"): (400, 400, 400),
    }


# ------------------------------------------------------------------ alignment
@pytest.mark.parametrize(
    "text, expected",
    [
        ("about 21,000 km", {21000}),
        ("environ 21 000 km", {21000}),
        ("sekitar 21.000 km", {21000}),
        ("٢١٠٠٠ كم", {21000}),
        ("۱۹۵۶", {1956}),
        ("१९५६", {1956}),
        ("in 1956 200 copies, 8th of May", {1956, 200}),
        ("1,234,567", {1234567}),
        ("99 pages", set()),
    ],
)
def test_numbers_in_any_script(text, expected):
    assert numbers(text) == expected


def test_anchor_problems_by_hand():
    en = QAItem("When was Jaime Vasquez born?", "Jaime Vasquez was born in 1958 and wrote in the 1980s.")
    assert anchor_problems(en, QAItem("متى ولد Jaime Vasquez؟", "ولد Jaime Vasquez عام 1958 في الثمانينات.")) == []
    assert anchor_problems(en, QAItem("متى ولد Jaime Vasquez؟", "ولد عام 1961.")) == [
        "numbers [1961] not in the English row",
        "English numbers [1958] missing",
    ]
    assert "Latin-script words ['Kebede'] not in the English row" in anchor_problems(
        en, QAItem("متى ولد Kebede؟", "ولد عام 1958.")
    )
    fr_ok = QAItem("Quand Jaime Vasquez est-il né ?", "Jaime Vasquez est né en 1958.")
    assert anchor_problems(en, fr_ok) == []
    assert anchor_problems(en, QAItem("Quand est-il né ?", "Il est né en 1958.")) == [
        "none of the English names ['Jaime', 'Vasquez'] appear"
    ]
    assert anchor_problems(QAItem("Hi?", "yes"), QAItem("مرحبا؟", "نعم")) is None  # nothing to compare


def test_standin_is_aligned(folder):
    report = check_alignment(open_ctofu(folder), required=("forget01", "retain99"))
    assert report.ok and not report.suspects
    assert {(c.lang, c.split) for c in report.checks} >= {("ar", "forget01"), ("fr", "retain99")}
    assert all(c.anchored > 0 for c in report.checks if c.split.startswith(("forget", "retain")))


def test_misaligned_files_are_reported(folder, tmp_path):
    en = json.loads((folder / "forget01_perturbed_en.json").read_text())
    with_year = [i for i, r in enumerate(en) if numbers(r["question"] + r["answer"])]
    i, j = (
        with_year[0],
        next(
            k
            for k in with_year
            if numbers(en[k]["answer"] + en[k]["question"])
            != numbers(en[with_year[0]]["answer"] + en[with_year[0]]["question"])
        ),
    )

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
        open_ctofu(folder), required=("forget01",)
    ).errors


def test_a_moved_row_names_the_english_row_it_matches():
    en = [
        QAItem(f"Who is {n}?", f"{n} was born in {y}.")
        for n, y in (
            ("Jaime Vasquez", 1958),
            ("Kebede Mekonnen", 1962),
            ("Luka Khachidze", 1980),
            ("Nadia Nowak", 1971),
        )
    ]
    ar = [
        QAItem(f"من هو الكاتب المعروف {n} في الأدب؟", f"ولد الكاتب {n} في عام {y} في مدينة كبيرة.")
        for n, y in (
            ("Jaime Vasquez", 1958),
            ("Luka Khachidze", 1980),
            ("Kebede Mekonnen", 1962),
            ("Nadia Nowak", 1971),
        )
    ]
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
    from mmunlearn.adapters.text.tokenizer import train_bpe
    from mmunlearn.presets.items import source_texts

    world = build_world(open_ctofu(standin), "en,ar,hi,ja,ko", authors=1, facts=5)
    texts = source_texts(world.training_data)
    for lang in ("ar", "hi", "ja", "ko"):
        probe = pseudo_translate("the author of", lang)
        assert any(probe in t for t in texts), lang  # every language reaches the tokenizer
    tok = train_bpe(texts, vocab_size=1024)
    real = {
        "ar": "ولد الكاتب في مدينة الكويت عام 1956.",
        "hi": "लेखक का जन्म कुवैत शहर में हुआ था।",
        "ja": "著者はクウェート市で生まれました。",
        "ko": "저자는 쿠웨이트 시에서 태어났습니다.",
    }
    for lang, s in real.items():
        ids = tok(s, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == s, lang  # byte-level BPE: exact round trip, no unknown token
        assert tok.unk_token_id is None or tok.unk_token_id not in ids
        seen = pseudo_translate("the author of the book was born in", lang)  # this script, as in the world
        n_bytes = len(seen.encode("utf-8"))
        assert len(tok(seen, add_special_tokens=False)["input_ids"]) < 0.5 * n_bytes, lang  # merges learned
