"""recipes.runner.Stages: the one progress line per finished stage of a comparison (tofu and ctofu compare)."""

import time

from recipes.runner import Stages


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
