"""The precision benchmark's roofline, model FLOPs and ablation (each speed-up alone), on a tiny model."""

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

from mmunlearn.bench import precision as pb
from mmunlearn.bench.precision_roofline import forward_flops, matmul_roofline
from mmunlearn.cli import app
from tests.tiny import tiny_causal_lm, tiny_tokenizer


def test_model_flops_of_the_linear_layers_and_head_match_torchs_count():
    model = tiny_causal_lm("llama", vocab=512, hidden=32, layers=2)
    n = 11
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=torch.randint(3, 500, (1, n)))
    counts = counter.get_flop_counts()["Global"]
    matmuls = sum(v for k, v in counts.items() if "mm" in str(k) and "bmm" not in str(k))
    no_attention = forward_flops(model.config, [n], n) - forward_flops(model.config, [0], 0)
    attention = 4.0 * 2 * 32 * n * (n + 1) / 2  # layers x heads*head_dim x keys (causal)
    assert matmuls == pytest.approx(no_attention - attention)


def test_the_roofline_measures_both_precisions_in_this_thread():
    f32 = matmul_roofline("float32", repeats=1)
    bf16 = matmul_roofline("bf16", repeats=1)
    assert f32.n == 2048 and f32.flops_per_s == pytest.approx(2 * 2048**3 / f32.seconds)
    assert 256 <= bf16.n <= 2048 and bf16.flops_per_s > 0 and bf16.cpu_flops_per_s > 0


def test_the_ablation_times_each_speed_up_alone_and_keeps_the_numbers():
    torch.set_num_threads(1)
    model = tiny_causal_lm("llama", vocab=len(tiny_tokenizer()), hidden=32, layers=2)
    res = pb.run(
        (model, tiny_tokenizer()),
        data="synthetic",
        batch=6,
        repeats=1,
        stages=("train", "score"),
        precisions=("float32",),
        ablation=True,
    )
    names = {(v.stage, v.name) for v in res.variants}
    assert names == {("train", n) for n in pb.ABLATION} | {("train", "mmunlearn")} | {
        ("score", n) for n in pb.ABLATION if n != "+fused AdamW"
    } | {("score", "mmunlearn")}
    same = [c for c in res.checks if c.kind == "same"]
    assert len(same) == 4 and all(c.passed for c in same), same
    assert [m["precision"] for m in res.roofline] == ["float32", "float32"]  # before and after the stages
    for r in res.rows:
        assert r.flops > 0 and 0 < r.mmunlearn_roofline_share and len(r.mmunlearn_cpu_runs) == 1
        assert 0 < r.mmunlearn_cpu_roofline_share and 0 < r.plain_cpu_roofline_share
    before = next(v for v in res.variants if v.stage == "score" and v.name == "before").to_dict()
    assert before["speedup_vs_before"] == 1.0
    assert "implementation" in pb.markdown(res) and "padding excluded" in pb.markdown(res)


def test_cli_takes_one_precision_and_writes_the_ablation(tmp_path):
    out = tmp_path / "p.json"
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "precision",
            "--model",
            "micro",
            "--batch",
            "3",
            "--repeats",
            "1",
            "--stage",
            "score",
            "--precision",
            "float32",
            "--ablation",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert [r["precision"] for r in data["rows"]] == ["float32"]
    assert {v["name"] for v in data["variants"]} == {"before", "+packing", "+prefix", "mmunlearn"}
    assert "roofline" in res.output
    bad = CliRunner().invoke(app, ["bench", "precision", "--model", "micro", "--precision", "fp8"])
    assert bad.exit_code != 0
