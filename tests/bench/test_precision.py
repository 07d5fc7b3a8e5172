"""The precision benchmark: plain loop beside the project's, per stage and precision,
on a tiny model and real QA rows."""

import json
import statistics

import pytest
import torch
from typer.testing import CliRunner

from mmunlearn.bench import precision as pb
from mmunlearn.cli import app
from tests.tiny import tiny_causal_lm, tiny_tokenizer


@pytest.fixture(scope="module")
def measured():
    """One run on a tiny Llama; the model it trained and a copy of its starting weights."""
    torch.set_num_threads(1)
    model = tiny_causal_lm("llama", vocab=len(tiny_tokenizer()), hidden=32, layers=2)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    res = pb.run((model, tiny_tokenizer()), data="synthetic", batch=4, new_tokens=4, repeats=2)
    return res, model, start


def test_every_stage_and_precision_has_both_implementations(measured):
    res, _, _ = measured
    assert [(r.stage, r.precision) for r in res.rows] == [(s, p) for s in pb.STAGES for p in pb.PRECISIONS]
    for r in res.rows:
        assert len(r.plain_runs) == len(r.mmunlearn_runs) == 2 and min(r.plain_runs + r.mmunlearn_runs) > 0
        assert r.plain_seconds == statistics.median(r.plain_runs)
        assert r.mmunlearn_seconds == statistics.median(r.mmunlearn_runs)
        assert r.plain_tokens_per_s == pytest.approx(r.tokens / r.plain_seconds)
        assert r.mmunlearn_tokens_per_s == pytest.approx(r.tokens / r.mmunlearn_seconds)
        assert r.ratio == pytest.approx(r.mmunlearn_tokens_per_s / r.plain_tokens_per_s)
        assert r.goal_met == (r.ratio >= pb.GOAL_RATIO)
        ref = res.row(r.stage, "float32")
        assert r.mmunlearn_speedup == pytest.approx(r.mmunlearn_tokens_per_s / ref.mmunlearn_tokens_per_s)
        assert r.plain_speedup == pytest.approx(r.plain_tokens_per_s / ref.plain_tokens_per_s)
    # the batch: 4 QA rows, answer tokens a strict part of the real tokens, which train and score count
    assert res.batch == 4 and 0 < res.answer_tokens < res.batch_tokens
    assert res.row("train", "bf16").tokens == res.row("score", "float32").tokens == res.batch_tokens
    gen = res.row("generate", "float32")
    assert gen.tokens == 4 * gen.accuracy["decoding_steps"] and 1 <= gen.accuracy["decoding_steps"] <= 4
    goals = pb.goal_lines(res)
    assert len(goals) == 6 and all(("goal met" in g) != ("GOAL MISSED" in g) for g in goals)


def test_the_two_implementations_compute_the_same_thing(measured):
    res, _, _ = measured
    same = [c for c in res.checks if c.kind == "same"]
    assert len(same) == 6 and all(c.passed for c in same), same
    for p in pb.PRECISIONS:
        acc = res.row("train", p).accuracy
        assert acc["loss"] == pytest.approx(acc["plain_loss"], rel=1e-3)
        assert res.row("generate", p).accuracy["same_as_plain"] == 4


def test_bf16_scoring_is_reported_against_float32(measured):
    res, _, _ = measured
    acc = res.row("score", "bf16").accuracy
    assert 0 < acc["mean_abs_nll_diff_vs_float32"] <= acc["max_abs_nll_diff_vs_float32"]
    assert abs(acc["mean_nll_diff_vs_float32"]) <= acc["mean_abs_nll_diff_vs_float32"]
    assert res.row("score", "float32").accuracy["max_abs_nll_diff_vs_float32"] == 0.0
    bound = next(c for c in res.checks if c.name.startswith("score bf16: mean"))
    assert bound.passed == (acc["mean_abs_nll_diff_vs_float32"] <= pb.SCORE_NLL_BOUND)
    assert "vs float32 mean abs diff" in res.row("score", "bf16").agreement
    assert res.row("generate", "float32").accuracy["share_same_as_float32"] == 1.0


def test_training_is_not_undone_inside_the_timed_steps(measured):
    """The train stage trained the model it was given, continuing from step to step: no restore."""
    res, model, start = measured
    assert res.weights_changed is True
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, start[k])]
    assert len(changed) == len(start)  # every tensor moved (tied head counted with the embedding)
    # the starting losses were measured at the starting weights: recompute one
    from mmunlearn.adapters.text.adapter import TextLLMAdapter
    from mmunlearn.data.tofu import load_split

    fresh = tiny_causal_lm("llama", vocab=len(tiny_tokenizer()), hidden=32, layers=2)
    adapter = TextLLMAdapter(fresh, tiny_tokenizer())
    with torch.no_grad():
        loss = float(adapter.loss(adapter.collate(load_split("synthetic", "forget10")[:4])))
    assert res.row("train", "float32").accuracy["loss"] == pytest.approx(loss, rel=1e-5)


def test_no_weight_restore_in_the_timed_stage(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("load_state_dict called during the benchmark")

    monkeypatch.setattr(torch.nn.Module, "load_state_dict", refuse)
    model = tiny_causal_lm("llama", vocab=len(tiny_tokenizer()), hidden=16, layers=1)
    res = pb.run((model, tiny_tokenizer()), batch=2, repeats=1, stages=("train",), precisions=("float32",))
    assert [(r.stage, r.precision) for r in res.rows] == [("train", "float32")] and res.weights_changed


def test_bad_arguments_are_refused():
    model = (tiny_causal_lm("llama", vocab=len(tiny_tokenizer())), tiny_tokenizer())
    with pytest.raises(ValueError, match="stages"):
        pb.run(model, stages=("decode",))
    with pytest.raises(ValueError, match="float32 first"):
        pb.run(model, precisions=("bf16", "float32"))
    with pytest.raises(ValueError, match="repeats"):
        pb.interleaved({("plain", "float32"): lambda: None}, 0)


def test_cli_prints_both_implementations_and_writes_json(tmp_path):
    out, md = tmp_path / "p.json", tmp_path / "p.md"
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "precision",
            "--model",
            "micro",
            "--batch",
            "2",
            "--new-tokens",
            "3",
            "--repeats",
            "1",
            "--stage",
            "score",
            "--json",
            str(out),
            "--markdown",
            str(md),
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert [(r["stage"], r["precision"]) for r in data["rows"]] == [("score", "float32"), ("score", "bf16")]
    for r in data["rows"]:
        assert r["ratio"] == pytest.approx(r["mmunlearn_tokens_per_s"] / r["plain_tokens_per_s"])
        assert r["goal_met"] == (r["ratio"] >= 0.9)
    assert data["threads"] == 1 and data["model"] == "micro (random init)" and data["batch"] == 2
    machine = data["machine"]
    assert machine["cores"] >= 1 and machine["torch"] == torch.__version__
    assert {"avx512_bf16", "load_1min_before", "load_1min_after"} <= set(machine)
    assert "plain tok/s" in md.read_text() and "mmunlearn/plain" in md.read_text()
    assert ("goal met" in res.output) or ("GOAL MISSED" in res.output)
    bad = CliRunner().invoke(app, ["bench", "precision", "--model", "micro", "--stage", "decode"])
    assert bad.exit_code != 0
