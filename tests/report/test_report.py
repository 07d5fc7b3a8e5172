"""mmunlearn report: records keep a run's rows with their provenance; docs tables are regenerated and checked."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mmunlearn import report
from mmunlearn.cli import app

RUN = {
    "context": {"preset": "micro"},
    "columns": [["method", "method"], ["forget quality", "forget_quality"], ["rule met", "target_reached"]],
    "rows": [
        {"method": "target model", "forget_quality": 1.2e-07, "target_reached": None},
        {"method": "t3", "forget_quality": 0.081, "target_reached": True},
    ],
}


def test_a_record_keeps_rows_columns_command_and_machine(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "compare.json").write_text(json.dumps(RUN))
    res = CliRunner().invoke(
        app,
        [
            "report",
            "record",
            str(tmp_path / "run"),
            "--name",
            "demo",
            "--command",
            "mmunlearn tofu compare --preset micro",
            "--out",
            str(tmp_path / "results"),
        ],
    )
    assert res.exit_code == 0, res.output
    rec = json.loads((tmp_path / "results" / "demo.json").read_text())
    assert rec["rows"] == RUN["rows"] and rec["command"] == "mmunlearn tofu compare --preset micro"
    assert rec["machine"]["cores"] >= 1 and rec["date"] and rec["context"] == {"preset": "micro"}
    assert report.render(rec).splitlines() == [
        "| method | forget quality | rule met |",
        "|---|---:|---:|",
        "| target model | 1.20e-07 | n/a |",
        "| t3 | 0.0810 | yes |",
    ]
    assert "config" not in rec
    res = CliRunner().invoke(
        app,
        [
            "report",
            "record",
            str(tmp_path / "run"),
            "--name",
            "demo2",
            "--command",
            "mmunlearn tofu compare --config tofu/micro",
            "--recipe-config",
            "tofu/micro",
            "--out",
            str(tmp_path / "results"),
        ],
    )
    assert (
        res.exit_code == 0 and json.loads((tmp_path / "results" / "demo2.json").read_text())["config"] == "tofu/micro"
    )


def test_pages_are_regenerated_and_a_stale_table_is_found(tmp_path):
    results, docs = tmp_path / "docs" / "results", tmp_path / "docs"
    rec = report.make_record(RUN, name="demo", command="c", commit="abc")
    report.write_record(rec, results)
    page = docs / "tofu.md"
    page.write_text("# TOFU\n\n<!-- results: demo -->\nold table\n<!-- /results -->\n\nProse stays.\n")
    assert report.stale_blocks([page], results) == [f"{page}: demo"]
    res = CliRunner().invoke(app, ["report", "check", "--docs", str(docs), "--results", str(results)])
    assert res.exit_code == 1 and "demo" in res.output
    assert report.update_pages([page], results) == [str(page)]
    text = page.read_text()
    assert report.render(rec) in text and "old table" not in text and text.endswith("Prose stays.\n")
    assert report.stale_blocks([page], results) == [] and report.update_pages([page], results) == []
    res = CliRunner().invoke(app, ["report", "check", "--docs", str(docs), "--results", str(results)])
    assert res.exit_code == 0, res.output


def test_columns_can_be_chosen_on_the_command_line(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps({"rows": [{"stage": "train", "ratio": 1.25, "runs": [1, 2]}]}))
    res = CliRunner().invoke(
        app,
        [
            "report",
            "record",
            str(tmp_path / "bench.json"),
            "--name",
            "b",
            "--command",
            "c",
            "--columns",
            "stage=stage,mmunlearn/plain=ratio",
            "--out",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    rec = json.loads((tmp_path / "b.json").read_text())
    assert report.render(rec).splitlines()[2] == "| train | 1.2500 |"
    res = CliRunner().invoke(
        app,
        [
            "report",
            "record",
            str(tmp_path / "bench.json"),
            "--name",
            "b",
            "--command",
            "c",
            "--columns",
            "nokey",
            "--out",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 2 and "header=key" in res.output


def test_bad_records_and_missing_ones_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="record name"):
        report.make_record(RUN, name="../x", command="c")
    with pytest.raises(ValueError, match="no 'rows'"):
        report.make_record({"rows": []}, name="x", command="c")
    with pytest.raises(ValueError, match="columns"):
        report.render({"columns": [["only one"]], "rows": [{}]})
    page = tmp_path / "p.md"
    page.write_text("<!-- results: nowhere -->\n<!-- /results -->\n")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        report.stale_blocks([page], tmp_path)
    with pytest.raises(FileNotFoundError, match="no compare.json"):
        report.load_source(tmp_path)


def test_a_record_names_no_absolute_path_of_the_machine_it_was_made_on(tmp_path, monkeypatch):
    home, work = tmp_path / "home" / "me", tmp_path / "work" / "repo"
    context = {
        "target": str(home / ".cache/mmunlearn/models/full-1"),
        "out": str(work / "runs" / "x"),
        "langs": ["en", str(work)],
        "other": str(tmp_path / "work" / "repo2" / "a"),
        "n": 3,
    }
    assert report.portable(context, cwd=work, home=home) == {
        "target": "~/.cache/mmunlearn/models/full-1",
        "out": "runs/x",
        "langs": ["en", "."],
        "other": str(tmp_path / "work" / "repo2" / "a"),
        "n": 3,
    }  # a sibling folder is not under the working one
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    rec = report.make_record(
        {"rows": [{"method": "a", "model": str(tmp_path / "m")}], "context": {"cache": str(home / "c")}},
        name="r",
        command="x",
    )
    assert rec["rows"][0]["model"] == "m" and rec["context"]["cache"] == "~/c"


def _absolute_paths(value, where: str = ""):
    """``where: value`` of every string in a JSON value that is an absolute path."""
    if isinstance(value, str):
        return [f"{where}: {value}"] if value.startswith(("/", "\\")) or value[1:3] == ":\\" else []
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _absolute_paths(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _absolute_paths(v, f"{where}[{i}]")]
    return []


def test_no_shipped_record_names_an_absolute_path():
    """Every record in docs/results is portable (a record's context is sometimes completed by hand after
    ``report record``, which makes paths portable): no string of one is an absolute path of a machine."""
    results = Path(__file__).resolve().parents[2] / "docs" / "results"
    found = [f"{p.name}{a}" for p in sorted(results.glob("*.json")) for a in _absolute_paths(json.loads(p.read_text()))]
    assert len(list(results.glob("*.json"))) > 10 and not found, found
    assert _absolute_paths({"a": ["x", {"b": "/root/c"}]}) == [".a[1].b: /root/c"]  # the walk finds one


def test_every_table_is_written_by_the_one_writer():
    """No module but mmunlearn/report/__init__.py writes a Markdown table's separator row: every table goes through
    report.table (one formatter, one escaping)."""
    root = Path(__file__).resolve().parents[2]
    files = [f for d in ("mmunlearn", "recipes", "data_prep") for f in (root / d).rglob("*.py")]
    assert len(files) > 100
    writers = sorted(str(f.relative_to(root)) for f in files if "|---" in f.read_text())
    assert writers == ["mmunlearn/report/__init__.py"]


@pytest.mark.parametrize(
    "items, cell",
    [
        ([f"text.layers.{i}" for i in range(20, 30)], "text.layers.20-29"),
        (
            ["audio.conv", "audio.layers.0", "audio.layers.1", "audio.proj", "text.layers.5"],
            "audio.conv, audio.layers.0-1, audio.proj, text.layers.5",
        ),
        (["blocks.1", "blocks.3", "blocks.4", "head.2", "head.3"], "blocks.1, blocks.3-4, head.2-3"),
        (["id00004", "id00005"], "id00004, id00005"),  # zero-padded numbers stay as written
        (["layers.2", "layers.1"], "layers.2, layers.1"),  # order kept: only ascending runs merge
    ],
)
def test_a_list_of_names_is_one_short_cell_with_numbered_runs_as_ranges(items, cell):
    assert report.fmt(items) == cell
    assert report.fmt([0.1, 0.25]) == "[0.1000, 0.2500]"  # a numeric pair is still an interval
