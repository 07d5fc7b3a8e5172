"""Tests of mmunlearn.data.user.sets: every accepted text and speech format gives the same rows, bad inputs their
errors, relative audio paths resolve from the manifest's folder, datasets' Audio and ClassLabel columns, overlap,
held-out split."""

import csv
import io
import json
import logging

import datasets
import numpy as np
import pytest
import soundfile as sf

from mmunlearn.data.manifest import ManifestError, write_manifest
from mmunlearn.data.user.sets import (
    DataFormatError,
    duplicate_count,
    overlap,
    read_speech_rows,
    read_text_rows,
    split_held_out,
)

QA = [("Who wrote The Silent Harbour?", "Mara Voss"), ("Where was Mara Voss born?", "In Tallinn, 1961.")]
ROWS = [{"question": q, "answer": a} for q, a in QA]
TEXTS = ["Mara Voss wrote The Silent Harbour.", "She was born in Tallinn\nin 1961."]
PLAIN = [{"question": "", "answer": t} for t in TEXTS]


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def _csv(path, header, rows, delimiter=","):
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, delimiter=delimiter)
        writer.writerows([header, *rows] if header else rows)
    return path


# ------------------------------------------------------------------------------------------ text
def _text_sources(tmp_path):
    as_dicts = [{"question": q, "answer": a, "author": "Mara Voss"} for q, a in QA]
    return {
        "json list": _write(tmp_path / "a.json", json.dumps(as_dicts)),
        "json data": _write(tmp_path / "b.json", json.dumps({"data": as_dicts, "version": 1})),
        "json rows": _write(tmp_path / "c.json", json.dumps({"rows": [{"prompt": q, "completion": a} for q, a in QA]})),
        "jsonl": _write(
            tmp_path / "d.jsonl", "\n".join(json.dumps({"Instruction": q, "Output": a}) for q, a in QA) + "\n\n"
        ),
        "csv": _csv(tmp_path / "e.csv", ["prompt", "response"], QA),
        "tsv": _csv(tmp_path / "f.tsv", ["input", "target"], QA, delimiter="\t"),
        "dicts": [{"question": q, "answer": a} for q, a in QA],
        "pairs": list(QA),
        "padded pairs": [(f"  {q} ", f"{a}\n") for q, a in QA],
        "dataset": datasets.Dataset.from_dict({"prompt": [q for q, _ in QA], "response": [a for _, a in QA]}),
    }


def test_every_text_format_gives_the_same_rows(tmp_path):
    for label, source in _text_sources(tmp_path).items():
        assert read_text_rows(source, "forget") == ROWS, label


def test_prompt_less_text_is_an_answer_to_an_empty_question(tmp_path):
    sources = {
        "paragraphs": _write(tmp_path / "p.txt", f"{TEXTS[0]}\n\n\n{TEXTS[1]}\n"),
        "strings": TEXTS,
        "text field": _write(tmp_path / "t.jsonl", "\n".join(json.dumps({"text": t}) for t in TEXTS)),
        "dataset": datasets.Dataset.from_dict({"text": TEXTS}),
    }
    for label, source in sources.items():
        assert read_text_rows(source, "forget") == PLAIN, label
    lines = _write(tmp_path / "l.txt", "first text\nsecond text\n")  # no blank line: one text per line
    assert read_text_rows(lines, "retain") == [
        {"question": "", "answer": "first text"},
        {"question": "", "answer": "second text"},
    ]


@pytest.mark.parametrize(
    "source, message",
    [
        (
            [{"question": "q", "prompt": "p", "answer": "a"}],
            r"forget\[0\]: ambiguous fields 'question', 'prompt'.*"
            r"fields found: question, prompt, answer",
        ),
        ([{"text": "t", "answer": "a"}], r"forget\[0\]: ambiguous fields 'text', 'answer'"),
        (
            [{"question": "q", "answer": "a"}, {"question": "q2", "reply": "a"}],
            r"forget\[1\]: no answer field \(fields found: question, reply\)",
        ),
        ([{"id": 3}], r"forget\[0\]: no question/answer or text field \(fields found: id\)"),
        ([("q", ["a"])], r"forget\[0\]: the answer is not text \(got list"),
        ([("q", "  ")], r"forget\[0\]: empty answer"),
        ([""], r"forget\[0\]: empty text"),
        ([3.5], r"forget\[0\]: expected an object with question/answer"),
        ([], r"forget: the forget set is empty"),
        (42, r"forget: expected a file path"),
    ],
)
def test_text_errors_name_the_row_and_the_problem(source, message):
    with pytest.raises(DataFormatError, match=message):
        read_text_rows(source, "forget")


def test_text_file_errors_name_the_file_and_line(tmp_path):
    cases = [
        (_write(tmp_path / "a.jsonl", '{"question": "q", "answer": "a"}\n{"question": \n'), r"a\.jsonl:2: not a JSON"),
        (
            _csv(tmp_path / "b.csv", ["question", "answer"], [("q", "a"), ("q2", "a2", "extra")]),
            r"b\.csv:3: 3 field\(s\), the header has 2",
        ),
        (
            _write(tmp_path / "c.json", json.dumps({"items": []})),
            r"c\.json: a JSON object needs its rows .*keys found: items",
        ),
        (
            _write(tmp_path / "d.json", json.dumps([{"question": "q", "answer": "a"}, {"q": 1}])),
            r"d\.json row 1: no question/answer or text field \(fields found: q\)",
        ),
        (_write(tmp_path / "e.txt", "\n \n"), r"e\.txt: the forget set is empty"),
        (_write(tmp_path / "f.parquet", ""), r"f\.parquet: unknown file type '\.parquet'"),
        (tmp_path / "missing.json", r"missing\.json: file not found"),
    ]
    (tmp_path / "g.csv").write_bytes(b"question,answer\n\xff\xfe,x\n")
    cases.append((tmp_path / "g.csv", r"g\.csv: not UTF-8"))
    for path, message in cases:
        with pytest.raises(DataFormatError, match=message):
            read_text_rows(path, "forget")
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["x"]})})
    with pytest.raises(DataFormatError, match=r"forget: a DatasetDict holds several splits \(train\); pass one"):
        read_text_rows(splits, "forget")


def test_duplicates_are_kept_and_counted(caplog):
    source = [*QA, (QA[0][0] + "  ", QA[0][1])]
    with caplog.at_level(logging.WARNING, logger="mmunlearn.data.user.sets"):
        rows = read_text_rows(source, "forget")
    assert len(rows) == 3 and duplicate_count(rows) == 1 and duplicate_count(rows, "answer") == 1
    assert "1 duplicate row(s) in the forget set" in caplog.text


def test_overlap_finds_the_rows_in_both_sets_after_whitespace_normalisation():
    forget = read_text_rows([*QA, ("Who is Mara?", "A novelist.")], "forget")
    retain = read_text_rows(
        [(" Who wrote  The Silent\nHarbour? ", "Mara Voss"), ("Where was Mara Voss born?", "Riga")], "retain"
    )
    assert overlap(forget, retain) == [ROWS[0]]
    assert overlap(forget, retain, key="question") == ROWS
    assert overlap(forget, retain, key=lambda r: r["answer"].lower()) == [ROWS[0]]
    assert overlap(forget, []) == []


# ------------------------------------------------------------------------------------------ speech
RATE = 16000


def _tone(freq, seconds=0.1):
    return (0.5 * np.sin(2 * np.pi * freq * np.arange(int(seconds * RATE)) / RATE)).astype(np.float32)


def _wav_bytes(freq):
    buf = io.BytesIO()
    sf.write(buf, _tone(freq), RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()


SPEAKERS = {"alice": (220, 330), "bob": (440, 550)}
CLIPS = [(f"clips/{spk}_{i}.wav", spk, freq) for spk, freqs in SPEAKERS.items() for i, freq in enumerate(freqs)]


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """A data folder with four clips, and a working directory elsewhere (relative paths must not resolve there)."""
    root = tmp_path / "data"
    (root / "clips").mkdir(parents=True)
    for rel, _, freq in CLIPS:
        sf.write(root / rel, _tone(freq), RATE, subtype="PCM_16")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return root


def _pairs(rows):
    return [(str(row["wav"]), row["spk_id"]) for row in rows]


def test_every_speech_file_format_gives_the_same_rows_from_the_manifests_folder(corpus):
    expected = [(str(corpus / rel), spk) for rel, spk, _ in CLIPS]
    manifest = write_manifest(
        corpus / "forget.csv",
        [
            {"ID": f"u{i}", "duration": 0.1, "wav": rel, "start": 0, "stop": 1600, "spk_id": spk}
            for i, (rel, spk, _) in enumerate(CLIPS)
        ],
    )
    relative = [(rel, spk) for rel, spk, _ in CLIPS]
    sources = {
        "speechbrain manifest": manifest,
        "path,label": _csv(corpus / "a.csv", ["path", "label"], relative),
        "headerless": _csv(corpus / "b.csv", None, relative),
        "Audio,Speaker tsv": _csv(
            corpus / "c.tsv", ["Audio", "Speaker", "gender"], [(*r, "f") for r in relative], delimiter="\t"
        ),
        "jsonl": _write(corpus / "d.jsonl", "\n".join(json.dumps({"file": p, "speaker_id": s}) for p, s in relative)),
        "json": _write(corpus / "e.json", json.dumps({"data": [{"wav": p, "spk_id": s} for p, s in relative]})),
        "absolute pairs": [(corpus / rel, spk) for rel, spk, _ in CLIPS],
        "absolute dicts": [{"audio": str(corpus / rel), "label": spk} for rel, spk, _ in CLIPS],
    }
    for label, source in sources.items():
        rows = read_speech_rows(source, "forget")
        assert _pairs(rows) == expected, label
        assert [set(row) >= {"ID", "wav", "spk_id"} for row in rows] == [True] * 4, label
    assert [r["ID"] for r in read_speech_rows(manifest, "forget")] == ["u0", "u1", "u2", "u3"]
    assert read_speech_rows(sources["Audio,Speaker tsv"], "forget")[0]["gender"] == "f"  # other columns pass through
    assert [r["ID"] for r in read_speech_rows(sources["jsonl"], "forget")] == [
        "forget0",
        "forget1",
        "forget2",
        "forget3",
    ]


def test_a_datasets_audio_column_is_written_as_wav_files_and_class_labels_become_names(corpus, tmp_path):
    names = ["bob", "alice"]  # ids 1 and 0 below are alice and bob
    ds = datasets.Dataset.from_dict(
        {
            "audio": [{"bytes": _wav_bytes(freq), "path": None} for _, _, freq in CLIPS],
            "speaker": [names.index(spk) for _, spk, _ in CLIPS],
            "id": ["a", "b", "c", "d"],
        }
    )
    ds = ds.cast_column("audio", datasets.Audio()).cast_column("speaker", datasets.ClassLabel(names=names))
    out = tmp_path / "audio"
    rows = read_speech_rows(ds, "forget", audio_dir=out)
    assert [(r["ID"], r["spk_id"]) for r in rows] == [("a", "alice"), ("b", "alice"), ("c", "bob"), ("d", "bob")]
    assert sorted(p.name for p in out.iterdir()) == [f"forget-00000{i}.wav" for i in range(4)]  # no temporary left
    for row, (rel, _, _) in zip(rows, CLIPS):
        written, rate = sf.read(row["wav"], dtype="int16")
        assert rate == RATE and sf.info(row["wav"]).subtype == "PCM_16"
        np.testing.assert_array_equal(written, sf.read(corpus / rel, dtype="int16")[0])
    by_path = datasets.Dataset.from_dict(
        {"voice": [str(corpus / rel) for rel, _, _ in CLIPS], "label": [spk for _, spk, _ in CLIPS]}
    ).cast_column("voice", datasets.Audio())
    assert _pairs(read_speech_rows(by_path, "retain")) == [(str(corpus / rel), spk) for rel, spk, _ in CLIPS]
    arrays = datasets.Dataset.from_dict(
        {"audio": [{"array": _tone(f), "sampling_rate": RATE} for _, _, f in CLIPS[:2]], "spk_id": ["alice", "alice"]}
    )  # decoded arrays in a plain column
    written = read_speech_rows(arrays, "retain", audio_dir=out)
    assert [np.abs(sf.read(r["wav"])[0] - _tone(f)).max() < 1e-4 for r, (_, _, f) in zip(written, CLIPS)] == [True] * 2
    with pytest.raises(DataFormatError, match=r"retain\[0\]: the audio is held in memory .* pass audio_dir="):
        read_speech_rows(arrays, "retain")


def test_speech_errors_name_the_file_row_and_problem(corpus):
    bad_wav = [("clips/alice_0.wav", "alice"), ("clips/nobody.wav", "bob")]
    with pytest.raises(
        ManifestError,
        match=r"(?s)b\.csv: 1 bad row\(s\) of 2.*row 1 \(ID 'forget1'\): 'wav' .*nobody\.wav"
        r"' does not exist",
    ):
        read_speech_rows(_csv(corpus / "b.csv", ["wav", "spk_id"], bad_wav), "forget")
    cases = [
        (
            _csv(corpus / "c.csv", ["wav", "path", "spk_id"], [("a.wav", "b.wav", "s")]),
            r"c\.csv:2: ambiguous audio fields 'wav', 'path' \(fields found: wav, path, spk_id\)",
        ),
        (
            _csv(corpus / "d.csv", ["wav", "who"], [("clips/alice_0.wav", "s")]),
            r"d\.csv:2: no speaker label field \(fields found: wav, who\); expected exactly one of spk_id\|speaker",
        ),
        (
            _write(corpus / "e.jsonl", json.dumps({"wav": "clips/alice_0.wav", "spk_id": 1.5})),
            r"e\.jsonl:1: the speaker label is not text or an integer \(got float",
        ),
        (_write(corpus / "f.txt", "clips/alice_0.wav\n"), r"f\.txt: unknown file type '\.txt'"),
        (_write(corpus / "g.json", "[]"), r"g\.json: the forget set is empty"),
        (
            _csv(
                corpus / "h.csv",
                ["ID", "wav", "spk_id"],
                [("x", "clips/alice_0.wav", "a"), ("x", "clips/bob_0.wav", "b")],
            ),
            r"h\.csv: rows 0 and 1 share the ID 'x'",
        ),
        ([("clips/alice_0.wav",)], r"forget\[0\]: expected a row with audio and label fields"),
        ([{"wav": 3, "spk_id": "a"}], r"forget\[0\]: the audio is not a path"),
        ([{"wav": {"sampling_rate": RATE}, "spk_id": "a"}], r"forget\[0\]: the audio holds none of 'array', 'bytes'"),
        ([{"wav": {"array": _tone(220), "sampling_rate": 0}, "spk_id": "a"}], r"no positive integer 'sampling_rate'"),
    ]
    for source, message in cases:
        with pytest.raises(DataFormatError, match=message):
            read_speech_rows(source, "forget", audio_dir=corpus / "out")
    with pytest.raises(DataFormatError, match=r"forget\[0\]: the audio bytes are not a format soundfile reads"):
        read_speech_rows([{"audio": {"bytes": b"not audio"}, "label": "a"}], "forget", audio_dir=corpus / "out")
    no_label = datasets.Dataset.from_dict({"audio": [str(corpus / CLIPS[0][0])]}).cast_column("audio", datasets.Audio())
    with pytest.raises(DataFormatError, match=r"forget \(dataset\): no speaker label field \(fields found: audio\)"):
        read_speech_rows(no_label, "forget")


def test_relative_pairs_resolve_from_the_working_directory_at_the_call(corpus, monkeypatch):
    monkeypatch.chdir(corpus)
    rows = read_speech_rows([(rel, spk) for rel, spk, _ in CLIPS], "forget")
    assert _pairs(rows) == [(str(corpus / rel), spk) for rel, spk, _ in CLIPS]


def test_overlap_of_speech_rows_by_audio_file(corpus):
    forget = read_speech_rows([(corpus / rel, spk) for rel, spk, _ in CLIPS[:2]], "forget")
    retain = read_speech_rows(
        _csv(corpus / "r.csv", ["path", "label"], [(rel, spk) for rel, spk, _ in CLIPS[1:]]), "retain"
    )
    assert overlap(forget, retain, key="wav") == [forget[1]]


# ------------------------------------------------------------------------------------------ held-out split
def test_split_held_out_is_deterministic_and_keeps_both_sides():
    rows = [{"question": f"q{i}", "answer": "a"} for i in range(10)]
    fit, held = split_held_out(rows, fraction=0.3, seed=1)
    assert (fit, held) == split_held_out(rows, fraction=0.3, seed=1) and len(held) == 3
    assert sorted(fit + held, key=rows.index) == rows and fit == [r for r in rows if r in fit]
    assert split_held_out(rows, fraction=0.3, seed=2) != (fit, held)
    assert [len(p) for p in split_held_out(rows[:2], fraction=0.01)] == [1, 1]
    assert [len(p) for p in split_held_out(rows[:2], fraction=0.99)] == [1, 1]
    assert split_held_out(rows[:1]) == (rows[:1], [])
    assert split_held_out(rows[:3], min_rows=4) == (rows[:3], [])
    twins = [rows[0], dict(rows[0]), rows[1], rows[2]]  # duplicates stay on one side
    for seed in range(5):
        fit, held = split_held_out(twins, fraction=0.4, seed=seed)
        assert not (rows[0] in fit and rows[0] in held)
    with pytest.raises(ValueError, match="fraction must be in"):
        split_held_out(rows, fraction=1.0)


def test_split_held_out_keeps_every_speaker_on_both_sides():
    rows = [{"ID": f"{s}{i}", "wav": f"/d/{s}{i}.wav", "spk_id": s} for s in "abc" for i in range(4)]
    rows.append({"ID": "d0", "wav": "/d/d0.wav", "spk_id": "d"})  # one row: fit side only
    for seed in range(5):
        fit, held = split_held_out(rows, fraction=0.25, seed=seed)
        assert {r["spk_id"] for r in held} == set("abc") and {r["spk_id"] for r in fit} == set("abcd")
        assert len(held) == 3
    segments = [{"ID": f"s{i}", "wav": f"/d/{i // 2}.wav", "start": i % 2, "stop": 9, "spk_id": "a"} for i in range(6)]
    fit, held = split_held_out(segments, fraction=0.3)
    assert not {r["wav"] for r in fit} & {r["wav"] for r in held}  # segments of one recording stay together
    lonely = [{"ID": s, "wav": f"/d/{s}.wav", "spk_id": s} for s in "xyz"]  # one row per speaker: split as a whole
    assert [len(p) for p in split_held_out(lonely, fraction=0.3)] == [2, 1]
