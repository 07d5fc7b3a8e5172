"""TOFU loader: every real split's fields and counts, the author layout, errors, and author subsets."""

import json
import sys
import types
from pathlib import Path

import pytest

from mmunlearn.data.tofu import (
    PERTURBED_FIELDS,
    TOFU_SPLITS,
    QAItem,
    TOFUFormatError,
    author_subset,
    forget_count,
    list_splits,
    load_split,
    split_info,
)

REAL = Path("/work/shared/data/tofu")
COUNTS = {
    "full": 4000,
    "retain90": 3600,
    "retain95": 3800,
    "retain99": 3960,
    "forget01": 40,
    "forget05": 200,
    "forget10": 400,
    "forget01_perturbed": 40,
    "forget05_perturbed": 200,
    "forget10_perturbed": 400,
    "retain_perturbed": 400,
    "real_authors": 100,
    "real_authors_perturbed": 100,
    "world_facts": 117,
    "world_facts_perturbed": 117,
    "holdout01": 40,
    "holdout05": 200,
    "holdout10": 400,
}


@pytest.fixture(scope="module")
def real() -> dict[str, list[QAItem]]:
    if not REAL.is_dir():
        pytest.skip(f"{REAL} not present")
    return {name: load_split(REAL, name) for name in list_splits(REAL)}


def qa(items):
    return [(it.question, it.answer) for it in items]


def test_every_real_split_has_its_fields_and_count(real):
    assert list(real) == list(TOFU_SPLITS)  # idontknow.jsonl is not listed as a split
    assert {k: len(v) for k, v in real.items()} == COUNTS
    for name, items in real.items():
        info = split_info(name)
        for it in items:
            assert it.question.strip() and it.answer.strip()
            if info.fields == PERTURBED_FIELDS:
                assert it.paraphrased_answer and it.paraphrased_question
                assert len(it.perturbed_answer) == 5
            elif name.startswith(("real_authors", "world_facts")):
                assert len(it.perturbed_answer) == 3 and it.answer not in it.perturbed_answer
                assert it.paraphrased_answer is None and it.author is None
            else:
                assert it.perturbed_answer == () and it.paraphrased_answer is None
    # the option-style files hold the same questions, right answers and wrong options
    assert real["real_authors"] == real["real_authors_perturbed"]
    assert real["world_facts"] == real["world_facts_perturbed"]


def test_real_author_layout(real):
    full = qa(real["full"])
    for pct, rows in (("01", 40), ("05", 200), ("10", 400)):
        assert qa(real[f"forget{pct}"]) == full[-rows:]
        assert qa(real[f"forget{pct}_perturbed"]) == full[-rows:]
        assert qa(real[f"retain{100 - int(pct)}"]) == full[:-rows]
        assert qa(real[f"holdout{pct}"]) == qa(real["holdout10"])[:rows]
    assert qa(real["retain_perturbed"]) == full[:400]  # the first 20 authors
    assert not {q for q, _ in qa(real["holdout10"])} & {q for q, _ in full}
    assert [it.author for it in real["full"]] == [i // 20 for i in range(4000)]
    assert [it.author for it in real["forget10"]] == [180 + i // 20 for i in range(400)]
    assert [it.author for it in real["forget01_perturbed"]] == [198] * 20 + [199] * 20
    assert [it.author for it in real["holdout05"]] == [200 + i // 20 for i in range(200)]
    assert real["retain_perturbed"][-1].author == 19


def test_real_author_subset_keeps_blocks_and_proportions(real):
    full = real["full"]
    assert author_subset(real["forget10"], "forget10", 40) == full[-80:]  # 4 forget authors
    assert author_subset(real["forget10_perturbed"], "forget10_perturbed", 40) == real["forget10_perturbed"][-80:]
    assert author_subset(real["retain90"], "retain90", 40) == full[:720]  # 36 retain authors
    assert author_subset(full, "full", 40, forget_pct=10) == full[:720] + full[-80:]
    assert author_subset(real["holdout10"], "holdout10", 40) == real["holdout10"][:80]
    assert author_subset(real["retain_perturbed"], "retain_perturbed", 40) == real["retain_perturbed"][:80]
    assert author_subset(real["forget05"], "forget05", 40) == full[-40:]  # 2 of 40
    assert author_subset(real["forget01"], "forget01", 40) == full[-20:]  # at least one author
    assert load_split(REAL, "retain99", authors=40) == full[:780]
    assert author_subset(real["world_facts"], "world_facts", 40) == real["world_facts"]
    for name in ("full", "retain90", "forget10", "forget10_perturbed", "holdout10", "retain_perturbed"):
        assert author_subset(real[name], name, 200, forget_pct=10) == real[name]  # N = 200: unchanged
    with pytest.raises(ValueError, match="forget_pct"):
        author_subset(full, "full", 40)
    with pytest.raises(ValueError, match="has 20 authors"):
        author_subset(real["holdout10"], "holdout10", 400)


@pytest.mark.parametrize(
    ("n", "pct", "expected"), [(40, 10, 4), (40, 5, 2), (40, 1, 1), (50, 5, 3), (200, 10, 20), (200, 1, 2), (2, 10, 1)]
)
def test_forget_count(n, pct, expected):
    assert forget_count(n, pct) == expected


def test_forget_count_rejects_degenerate_worlds():
    for n, pct in ((1, 10), (10, 0), (10, 100), (2, 90)):
        with pytest.raises(ValueError):
            forget_count(n, pct)


def block_items(authors):
    return [QAItem(f"q{a}-{i}", f"a{a}-{i}", author=a) for a in authors for i in range(20)]


def test_author_subset_rejects_broken_blocks():
    with pytest.raises(ValueError, match="whole author blocks"):
        author_subset(block_items([0, 1])[:30], "retain90", 2)
    mixed = block_items([0, 1, 2])
    mixed[5] = QAItem("x", "y", author=2)
    with pytest.raises(ValueError, match="not one author's block"):
        author_subset(mixed, "retain90", 2)
    with pytest.raises(ValueError, match="TOFU split names"):
        author_subset(block_items([0]), "mysplit", 2)


def write(folder: Path, name: str, content) -> Path:
    path = folder / name
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


def test_missing_file_names_file_and_fields(tmp_path):
    write(tmp_path, "forget10.json", [{"question": "q", "answer": "a"}])
    with pytest.raises(FileNotFoundError) as err:
        load_split(tmp_path, "forget10_perturbed")
    msg = str(err.value)
    assert "forget10_perturbed.json" in msg and "paraphrased_answer" in msg and "forget10" in msg


ROW = {
    "question": "q",
    "answer": "a",
    "paraphrased_answer": "p",
    "perturbed_answer": ["w"] * 5,
    "paraphrased_question": "pq",
}


@pytest.mark.parametrize(
    ("content", "match", "lists_fields"),
    [
        ("{not json", "not valid JSON", True),
        ({"question": "q", "answer": "a"}, "got a dict", True),
        ([], "empty list", True),
        (["just a string"], "row 0: expected an object", True),
        (
            [ROW, {k: v for k, v in ROW.items() if k != "paraphrased_answer"}],
            r"row 1: missing field\(s\) paraphrased_answer",
            True,
        ),
        ([{**ROW, "perturbed_answer": 3}], "'perturbed_answer' must be a non-empty list", False),
        ([{**ROW, "answer": ""}], "'answer' must be a non-empty string", False),
    ],
)
def test_malformed_file_names_file_and_fields(tmp_path, content, match, lists_fields):
    path = write(tmp_path, "forget10_perturbed.json", content)
    with pytest.raises(TOFUFormatError, match=match) as err:
        load_split(tmp_path, "forget10_perturbed")
    assert str(path) in str(err.value)
    assert (", ".join(PERTURBED_FIELDS) in str(err.value)) == lists_fields


def test_option_files_need_the_answer_among_options(tmp_path):
    row = {"question": "q", "option1": "a", "option2": "b", "option3": "c", "option4": "d", "answer": "e"}
    write(tmp_path, "world_facts.json", [row])
    with pytest.raises(TOFUFormatError, match="none of option1..option4"):
        load_split(tmp_path, "world_facts")
    write(tmp_path, "world_facts.json", [{**row, "answer": "c"}])
    assert load_split(tmp_path, "world_facts") == [QAItem("q", "c", perturbed_answer=("a", "b", "d"))]


def test_jsonl_and_custom_splits(tmp_path):
    write(tmp_path, "mine.jsonl", '{"question": "q1", "answer": "a1"}\n\n{"question": "q2", "answer": "a2"}\n')
    assert load_split(tmp_path, "mine") == [QAItem("q1", "a1"), QAItem("q2", "a2")]
    assert list_splits(tmp_path) == ["mine"]


def test_bad_sources_and_names(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        load_split(tmp_path / "absent" / "deeper", "full")
    with pytest.raises(NotADirectoryError):
        load_split(write(tmp_path, "full.json", []), "full")
    with pytest.raises(ValueError, match="bad split name"):
        load_split(tmp_path, "../full")
    with pytest.raises(ValueError, match="_perturbed variant"):
        split_info("holdout10_perturbed")
    with pytest.raises(TypeError):
        load_split(3, "full")
    with pytest.raises(KeyError, match="not in the given splits"):
        load_split({"full": []}, "forget10")


def test_hub_path_wraps_failures_and_parses_rows(monkeypatch):
    calls = []

    def offline(name, config, split):
        calls.append((name, config, split))
        raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(RuntimeError, match="locuslab/TOFU") as err:
        load_split("locuslab/TOFU", "forget10")
    assert "ConnectionError" in str(err.value) and "folder" in str(err.value)
    assert calls == [("locuslab/TOFU", "forget10", "train")]
    assert list_splits("locuslab/TOFU") == list(TOFU_SPLITS)

    rows = [dict(ROW, question=f"q{i}") for i in range(40)]
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda *a, **k: rows))
    items = load_split("locuslab/TOFU", "forget01_perturbed")
    assert [it.author for it in items] == [198] * 20 + [199] * 20 and items[0].perturbed_answer == ("w",) * 5


def test_to_dict_round_trips_through_the_parser(tmp_path):
    item = QAItem("q", "a", "p", ("w1", "w2"), "pq")
    assert item.to_dict() == {
        "question": "q",
        "answer": "a",
        "paraphrased_answer": "p",
        "perturbed_answer": ["w1", "w2"],
        "paraphrased_question": "pq",
    }
    write(tmp_path, "retain_perturbed.json", [item.to_dict()])
    assert load_split(tmp_path, "retain_perturbed") == [item]
