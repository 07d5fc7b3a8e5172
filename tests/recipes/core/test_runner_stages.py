"""recipes.runner: Stages, the one progress line per finished stage of a comparison, and run_comparison, the one
comparison loop (tofu, ctofu and voxceleb2 compare)."""

import time

from recipes.runner import Comparison, Stages, run_comparison


def test_one_line_per_stage_with_an_estimate_from_method_stages_only():
    lines: list[str] = []
    stages = Stages(4, time.perf_counter(), say=lines.append)
    stages.done("target and retain models, their evaluations", 600.0, setup=True)
    stages.done("qr-erase", 60.0)
    stages.done("t3", 0.0, reused=True)
    stages.done("npo", 120.0)
    assert len(lines) == 4
    assert lines[0].startswith("[stage 1/4] target and retain models, their evaluations: 600 s; elapsed ")
    assert "min left" not in lines[0]  # the models' build is no guide to a method's time
    assert lines[1].startswith("[stage 2/4] qr-erase: 60 s;") and lines[1].endswith("about 2 min left")
    assert lines[2].startswith("[stage 3/4] t3: reused (finished earlier);") and lines[2].endswith("about 1 min left")
    assert "min left" not in lines[3]


def test_the_comparison_writes_the_tables_after_each_method_and_audits_each_when_asked():
    lines, written, audited = [], [], []
    rows = {"a": [{"method": "a", "lang": "en"}, {"method": "a", "lang": "fr"}], "b": [{"method": "b", "reused": True}]}
    stages = Stages(2, time.perf_counter(), say=lines.append)
    logged = []  # the stages the timing holds when each write happens: the last write's holds both
    comparison = Comparison(
        ["a", "b"],
        rows=rows.__getitem__,
        write=lambda got: (written.append(list(got)), logged.append([s["stage"] for s in stages.timing()["stages"]])),
        audit=lambda name: {"method": name},
        write_audit=lambda got: audited.append(list(got)),
    )
    got, audits = run_comparison(comparison, stages)
    assert logged == [["a"], ["a", "b"]]
    assert got == rows["a"] + rows["b"] and audits == [{"method": "a"}, {"method": "b"}]
    assert written == [rows["a"], rows["a"] + rows["b"]]  # after every method, all rows so far
    assert audited == [[{"method": "a"}], [{"method": "a"}, {"method": "b"}]]
    assert lines[0] == "running a (1/2) ..." and lines[1].startswith("[stage 1/2] a: ")
    assert lines[2] == "auditing a ..." and lines[4].startswith("[stage 2/2] b: reused")
    got, audits = run_comparison(
        Comparison(["b"], rows=rows.__getitem__, write=written.append), Stages(1, time.perf_counter(), say=lines.append)
    )
    assert audits == [] and got == rows["b"]


class _Setup:
    """What run_method reads of a setup before it would run anything: its description and whether a folder holds a
    finished evaluation."""

    preset = "micro"

    def describe(self) -> dict:
        return {"preset": "micro"}

    def evaluated(self, folder) -> bool:
        return True


def test_a_reused_stage_brings_the_time_it_took_when_it_ran_into_the_record(tmp_path):
    import json

    from recipes.runner import RUN_JSON, run_method, stage_key
    from recipes.tofu.report import time_line

    setup, folder = _Setup(), tmp_path / "npo"
    (folder / "model").mkdir(parents=True)
    key = stage_key("npo", setup, {}, None, "target")
    (folder / RUN_JSON).write_text(json.dumps({"key": key, "rows": [{"method": "npo"}], "stage_seconds": 125.0}))
    rows = run_method("npo", setup, folder, options={}, overrides={}, rule=None, base="target", device="cpu")
    assert rows == [{"method": "npo", "reused": True, "stage_seconds": 125.0}]
    lines: list[str] = []
    stages = Stages(2, time.perf_counter(), say=lines.append)
    stages.done("target and retain models, their evaluations", 3.0, setup=True)
    run_comparison(Comparison(["npo"], rows=lambda name: rows, write=lambda got: None), stages)
    assert lines[-1].startswith("[stage 2/2] npo: reused (finished earlier in 125 s);")
    timing = stages.timing()
    assert timing["stages"][1] == {"stage": "npo", "seconds": 125.0, "reused": True} and timing["wall_seconds"] >= 0
    line = time_line({"wall_seconds": 60.0, "timing": timing})
    assert "1 of 2 stages reused from earlier calls; they took 2.1 min when they ran" in line
    assert (
        time_line({"wall_seconds": 60.0, "timing": {"stages": [{"stage": "a", "seconds": 5, "reused": False}]}})
        == "\nWhole command: 1.0 min wall."
    )


def test_the_stage_key_follows_the_methods_resolved_config(monkeypatch):
    """A stage finished before a method's default changed is not reused: the key holds the config as it resolves now
    (the preset's defaults and the overrides), so it changes with a default as it does with an override."""
    from mmunlearn.methods import get
    from recipes.runner import stage_key

    setup = _Setup()
    key = stage_key("npo", setup, {}, None, "target")
    assert key == stage_key("npo", setup, {}, None, "target")  # stable
    assert key != stage_key("npo", setup, {}, None, "target", overrides={"lr": 1e-3})
    assert key != stage_key("npo", setup, {}, None, "target", size="mini")  # another preset row, other defaults
    monkeypatch.setitem(get("npo").defaults, "beta", 0.123)  # a default changed after the stage ran
    assert stage_key("npo", setup, {}, None, "target") != key


def test_the_timing_names_the_training_seconds_each_built_model_records(tmp_path):
    import json
    from types import SimpleNamespace

    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "train_log.json").write_text(json.dumps({"seconds": 1814.2}))
    (tmp_path / "retain").mkdir()  # no log: not named
    built = SimpleNamespace(base=None, target=tmp_path / "target", retain=tmp_path / "retain")
    assert Stages(1, time.perf_counter()).timing(built)["model_builds"] == {"target": 1814.2}


def test_no_method_starts_after_the_budget_and_the_skipped_ones_are_listed():
    lines, written, ran = [], [], []

    def rows(name):
        ran.append(name)
        time.sleep(0.05)
        return [{"method": name}]

    stages = Stages(4, time.perf_counter(), say=lines.append)
    got, _ = run_comparison(
        Comparison(
            ["a", "b", "c"],
            rows=rows,
            write=lambda done: written.append((list(done), [s["stage"] for s in stages.timing()["skipped"]])),
        ),
        stages,
        budget=0.08,
    )
    # a runs (0.05 s); b would start at 0.05 s with 0.05 s (the longest stage so far) to go, past 0.08 s: skipped, c too
    assert ran == ["a"] and got == [{"method": "a"}]
    timing = stages.timing()
    assert [s["stage"] for s in timing["skipped"]] == ["b", "c"] and "budget" in timing["skipped"][0]["why"]
    assert [s["stage"] for s in timing["stages"]] == ["a"]
    assert written[-1] == ([{"method": "a"}], ["b", "c"])  # the tables list the skipped stages as they are skipped
    assert any(line.startswith("[stage 2/4] b: skipped: budget") for line in lines)
    # without a budget every method runs
    ran.clear()
    run_comparison(
        Comparison(["a", "b"], rows=rows, write=lambda done: None), Stages(2, time.perf_counter(), say=lines.append)
    )
    assert ran == ["a", "b"]


def test_keep_going_lists_a_failed_method_and_runs_the_next_one():
    import pytest

    def rows(name):
        if name == "bad":
            raise RuntimeError("out of memory")
        return [{"method": name}]

    lines: list[str] = []
    stages = Stages(3, time.perf_counter(), say=lines.append)
    got, _ = run_comparison(Comparison(["bad", "good"], rows=rows, write=lambda done: None), stages, keep_going=True)
    assert got == [{"method": "good"}]
    (failed,) = stages.timing()["skipped"]
    assert failed["stage"] == "bad" and failed["why"] == "RuntimeError: out of memory" and failed["seconds"] >= 0
    assert any("Traceback" in line for line in lines) and any("bad: FAILED after" in line for line in lines)
    with pytest.raises(RuntimeError, match="out of memory"):  # by default the error stops the comparison
        run_comparison(
            Comparison(["bad", "good"], rows=rows, write=lambda done: None),
            Stages(2, time.perf_counter(), say=lines.append),
        )
