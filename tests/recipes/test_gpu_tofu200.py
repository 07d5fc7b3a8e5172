"""examples/gpu_tofu200.py, the prepared GPU run of full TOFU on SmolLM2, at micro scale on the CPU (built-in data)."""

import json

import pytest

from examples import gpu_tofu200 as g

DATA = "synthetic:n_authors=10"


def _run(tmp_path, **kw) -> g.GpuRun:
    settings = dict(data=DATA, out=tmp_path / "run", report=tmp_path / "report", preset="micro", device="cpu",
                    cache_dir=tmp_path / "cache", ft_max_steps=2, pretrain_max_steps=2, utility_items=3,
                    rule_retain_items=6, max_new_tokens=6, score_batch=8, gen_batch=8)
    return g.GpuRun(**{**settings, **kw})


@pytest.mark.slow
def test_the_run_writes_a_row_per_method_then_skips_what_the_budget_leaves_no_time_for(tmp_path):
    result = g.run_all(_run(tmp_path, methods=("t3", "grad_diff")))
    assert result["finished"] and not result["skipped"]
    assert [r["method"] for r in result["rows"]] == ["target model", "retain model", "t3", "grad_diff"]
    assert result["columns"] == g.RECORD_COLUMNS
    for row in result["rows"][2:]:
        assert row["forget_quality"] is not None and row["eval_seconds"] > 0 and "target_reached" in row
    stages = [s["stage"] for s in result["stages"]]
    assert stages[:2] == ["base model folder", "target and retain models"] and stages[-2:] == ["t3", "grad_diff"]
    assert json.loads((tmp_path / "report" / "result.json").read_text()) == result
    # the models are cached; a budget already spent skips every method and says why
    again = g.run_all(_run(tmp_path, methods=("t3", "npo"), budget=1e-3))
    assert [s["method"] for s in again["skipped"]] == ["t3", "npo"] and "budget" in again["skipped"][0]["why"]
    assert [r["method"] for r in again["rows"]] == ["target model", "retain model"]


def test_settings_are_checked_before_any_model_work(tmp_path):
    with pytest.raises(ValueError, match="methods"):
        _run(tmp_path, methods=("t3", "no-such-method"))
    with pytest.raises(ValueError, match="budget"):
        _run(tmp_path, budget=0)
    with pytest.raises(ValueError, match="gen_batch"):
        _run(tmp_path, gen_batch=0)
    with pytest.raises(ValueError, match="device"):
        _run(tmp_path, device="tpu")
    with pytest.raises(ValueError, match="max_new_tokens"):
        _run(tmp_path, max_new_tokens="lots")


def test_the_command_line_gives_the_same_settings(tmp_path):
    run = g.parse_args(["--data", DATA, "--out", str(tmp_path / "o"), "--report", str(tmp_path / "r"), "--device",
                        "cpu", "--methods", "t3, npo", "--max-new-tokens", "24", "--budget", "100"])
    assert run.methods == ("t3", "npo") and run.max_new_tokens == 24 and run.budget == 100.0
    assert run.preset == "smollm2-135m" and run.authors is None and run.gen_batch == 256 and run.ft_lr is None
    assert g.parse_args(["--data", DATA, "--out", "o", "--report", "r", "--ft-batch-size", "64", "--ft-lr", "6e-4",
                         "--device", "cpu"]).ft_batch_size == 64
