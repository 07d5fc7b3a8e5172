"""``tofu compare --jobs``: method stages in separate ``tofu run`` processes that the comparison then reuses."""

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from recipes.recipe_config import build_config
from recipes.tofu import pipeline as tofu_pipeline
from recipes.tofu.cli import app
from recipes.tofu.config import RUN_EXCLUDES, TofuConfig
from recipes.tofu.parallel import run_settings

DATA = "synthetic:n_authors=10"


def test_a_jobs_settings_are_the_comparisons_with_one_method(tmp_path):
    cfg = TofuConfig(
        out=tmp_path / "cmp",
        methods=("npo", "rmu"),
        preset="micro",
        data=DATA,
        sweep=True,
        lr=2e-3,
        max_new_tokens="auto",
        utility_items=5,
        cache_dir=tmp_path / "cache",
        threads=1,
        jobs=2,
        method_options={"rmu": {"steering": 7.0}},
        audit=True,
    )
    settings = run_settings(cfg, "rmu")
    path = tmp_path / "rmu.yaml"
    path.write_text(yaml.safe_dump(settings))
    allowed = [f.name for f in dataclasses.fields(TofuConfig) if f.name not in RUN_EXCLUDES]
    back = build_config(TofuConfig, allowed=allowed, file=path)
    # every setting `run` takes arrives as the comparison had it; the method and its folder are the job's own
    for name in allowed:
        expected = {"method": "rmu", "out": tmp_path / "cmp" / "rmu", "resume": True}.get(name, getattr(cfg, name))
        assert getattr(back, name) == expected, name


@pytest.mark.slow
def test_compare_with_two_jobs_reuses_the_stages_its_processes_finished(tmp_path_factory, tmp_path):
    cache = tmp_path_factory.mktemp("cache")
    tofu_pipeline.prepare(
        TofuConfig(preset="micro", data=DATA, cache_dir=cache, device="cpu", max_new_tokens=24)
    )  # models built once
    res = CliRunner().invoke(
        app,
        [
            "compare",
            "--preset",
            "micro",
            "--data",
            DATA,
            "--out",
            str(tmp_path),
            "--cache-dir",
            str(cache),
            "--max-new-tokens",
            "24",
            "--device",
            "cpu",
            "--methods",
            "t3,grad_ascent",
            "--jobs",
            "2",
            "--threads",
            "1",
        ],
    )
    assert res.exit_code == 0, res.output
    for method in ("t3", "grad_ascent"):
        assert f"[jobs] {method}: finished" in res.output, res.output
        assert f"{method}: reused (finished earlier in " in res.output  # the job's key is the comparison's
        assert (tmp_path / "jobs" / f"{method}.log").is_file()
        assert json.loads((tmp_path / method / "run.json").read_text())["method"] == method
    rows = {r["method"]: r for r in json.loads((tmp_path / "compare.json").read_text())["rows"]}
    assert rows["t3"]["forget_quality"] is not None and rows["grad_ascent"]["forget_quality"] is not None
    again = CliRunner().invoke(
        app,
        [
            "compare",
            "--preset",
            "micro",
            "--data",
            DATA,
            "--out",
            str(tmp_path),
            "--cache-dir",
            str(cache),
            "--max-new-tokens",
            "24",
            "--device",
            "cpu",
            "--methods",
            "t3,grad_ascent",
            "--jobs",
            "2",
            "--threads",
            "1",
        ],
    )
    assert again.exit_code == 0 and "[jobs]" not in again.output  # nothing left to run: no process started


def test_jobs_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="jobs"):
        TofuConfig(out=Path(tmp_path), jobs=0)
