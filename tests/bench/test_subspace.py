"""The subspace benchmark runs end to end on small sizes and reports every method."""

import json

from typer.testing import CliRunner

from mmunlearn.bench import subspace as sb
from mmunlearn.cli import app


def test_benchmark_cli_writes_rows_and_checks(tmp_path):
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(
        app,
        ["bench", "subspace", "--sizes", "128", "--sizes", "192", "--rank", "8", "--repeats", "1", "--json", str(out)],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    methods = {r["method"] for r in data["rows"]}
    assert {"svd", "geqp3-full", "cpqr-torch", "cpqr-sketch", "svd-lowrank"} <= methods
    assert {r["size"] for r in data["rows"]} == {128, 192}
    for r in data["rows"]:
        if r["spectrum"] == "lowrank":
            assert r["min_cosine"] >= 0.999  # exact recovery by every method
        else:
            assert r["residual_ratio"] >= 1.0 - 1e-6  # nothing beats the SVD optimum
    assert any("exact recovery" in c["check"] and c["passed"] for c in data["checks"])


def test_task_matrix_spectra():
    T = sb.task_matrix(100, 5, "lowrank")
    assert int(torch_rank(T)) == 5


def torch_rank(T):
    import torch

    return torch.linalg.matrix_rank(T.double(), rtol=1e-6)
