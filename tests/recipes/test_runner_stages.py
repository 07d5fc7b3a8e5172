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
    comparison = Comparison(["a", "b"], rows=rows.__getitem__, write=lambda got: written.append(list(got)),
                            audit=lambda name: {"method": name}, write_audit=lambda got: audited.append(list(got)))
    got, audits = run_comparison(comparison, Stages(2, time.perf_counter(), say=lines.append))
    assert got == rows["a"] + rows["b"] and audits == [{"method": "a"}, {"method": "b"}]
    assert written == [rows["a"], rows["a"] + rows["b"]]  # after every method, all rows so far
    assert audited == [[{"method": "a"}], [{"method": "a"}, {"method": "b"}]]
    assert lines[0] == "running a (1/2) ..." and lines[1].startswith("[stage 1/2] a: ")
    assert lines[2] == "auditing a ..." and lines[4].startswith("[stage 2/2] b: reused")
    got, audits = run_comparison(Comparison(["b"], rows=rows.__getitem__, write=written.append),
                                 Stages(1, time.perf_counter(), say=lines.append))
    assert audits == [] and got == rows["b"]
