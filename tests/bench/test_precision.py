"""The precision benchmark: every stage and precision on a micro model, with accuracy against float32."""

import json

from typer.testing import CliRunner

from mmunlearn.bench import precision as pb
from mmunlearn.cli import app


def test_every_stage_and_precision_is_measured_against_float32():
    res = pb.run("micro", batch=2, seq=16, new_tokens=4, repeats=1)
    got = {(r.stage, r.precision) for r in res.rows}
    assert got == {("train", "float32"), ("train", "bf16-autocast"), ("score", "float32"), ("score", "bf16-autocast"),
                   ("score", "bf16-weights"), ("generate", "float32"), ("generate", "bf16-autocast"),
                   ("generate", "bf16-weights"), ("generate-no-cache", "float32")}
    for r in res.rows:
        assert r.tokens_per_s > 0 and r.seconds > 0
        if (r.stage, r.precision) in {("train", "float32"), ("score", "float32"), ("generate", "float32")}:
            assert r.speedup == 1.0
    score32 = next(r for r in res.rows if r.stage == "score" and r.precision == "float32")
    assert "diff 0.0e+00" in score32.agreement  # float32 against itself
    nocache = next(r for r in res.rows if r.stage == "generate-no-cache")
    assert nocache.agreement.startswith("100.0 %")  # the KV cache changes nothing in greedy decoding
    assert set(pb.recommend(res)) == {"train", "score", "generate"}


def test_cli_writes_json(tmp_path):
    out = tmp_path / "p.json"
    res = CliRunner().invoke(app, ["bench", "precision", "--model", "micro", "--batch", "2", "--seq", "16",
                                   "--new-tokens", "3", "--repeats", "1", "--stage", "score", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert {r["stage"] for r in data["rows"]} == {"score"} and data["recommended"]["score"] in pb.PRECISIONS
    bad = CliRunner().invoke(app, ["bench", "precision", "--model", "micro", "--stage", "decode"])
    assert bad.exit_code != 0
