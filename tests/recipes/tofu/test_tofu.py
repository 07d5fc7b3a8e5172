"""TOFU recipe end to end on the micro preset: harness ordering, every method, QR-Erase properties."""

import json

import pytest
import torch
from typer.testing import CliRunner

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.erase import column_basis, restore
from mmunlearn.methods import UnlearnRequest, get, names, run_unlearning
from recipes.tofu.cli import app

METHODS = names("text")

DATA = "synthetic:n_authors=10"


@pytest.fixture
def ctx(tofu_micro):
    return tofu_micro  # built once per session (tests/recipes/conftest.py)


def test_target_forget_quality_far_below_the_retain_models(ctx):
    target, retain = ctx.reference_row("target"), ctx.reference_row("retain")
    assert retain["forget_quality"] == pytest.approx(1.0)
    assert target["forget_quality"] < 0.05
    assert target["forget_Q_A_Prob"] > 2 * retain["forget_Q_A_Prob"]  # it saw the forget authors


@pytest.mark.slow
def test_compare_runs_every_method_end_to_end(ctx, tmp_path):
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
            str(ctx.cache_dir),
            "--max-new-tokens",
            "24",
            "--device",
            "cpu",
            "--no-sweep",
        ],
    )
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "compare.json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["target model", "retain model", *METHODS]
    for r in rows[2:]:
        assert r["forget_quality"] is not None and r["unlearn_seconds"] > 0
        assert (tmp_path / r["method"] / "TOFU_EVAL.json").is_file()
    assert (tmp_path / "compare.md").is_file() and (tmp_path / "compare.csv").is_file()
    assert (tmp_path / "fq_vs_mu.png").stat().st_size > 0
    t3 = next(r for r in rows if r["method"] == "t3")
    assert t3["changed_fraction"] == 0.0  # the base stays frozen
    # every method's output is in the harness's layout and restores to the target bit for bit
    from mmunlearn.api.restore import restore_folder
    from mmunlearn.files.checkpoint import load_checkpoint

    original = load_checkpoint(ctx.built.target).tensors
    for r in rows[2:]:
        restored = restore_folder(tmp_path / r["method"] / "model", tmp_path / "restored" / r["method"])
        back = load_checkpoint(restored).tensors
        assert back.keys() == original.keys() and all(torch.equal(back[k], original[k]) for k in back), r["method"]
        assert not (restored / "undo_patch.safetensors").exists() and not (restored / "tilt").exists()


def test_qr_erase_properties_on_micro(ctx):
    target = TextLLMAdapter.from_pretrained(ctx.built.target, device="cpu")
    before = {k: v.clone() for k, v in target.model.state_dict().items()}
    cfg = get("qr-erase").config_for("text", "micro")
    p_f, p_r = target.answer_nll(ctx.forget).neg().exp().mean(), target.answer_nll(ctx.retain).neg().exp().mean()
    request = UnlearnRequest("qr-erase", "text", config=cfg, progress=False)
    res = run_unlearning(request, target, ctx.forget, ctx.retain).result
    report = res.erase_report
    after = target.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(any(k.startswith(layer + ".") for layer in report.selected) for k in changed)
    # no component of the edit in the retain subspace (task vectors re-extracted: deterministic)
    from mmunlearn.taskvec.extract import extract_task_matrices

    fresh = TextLLMAdapter.from_pretrained(ctx.built.target, device="cpu")
    tr = extract_task_matrices(fresh, ctx.retain, cfg.extract, progress=False)
    for name in changed:
        delta = (before[name] - after[name]).double()
        k_r = min(cfg.retain_rank, *delta.shape)
        Q_r = column_basis(tr[name], rank=k_r).Q.double()
        assert float((Q_r.T @ delta).norm()) < 1e-4 * float(delta.norm())
    # forget probability falls far more than retain probability
    q_f, q_r = target.answer_nll(ctx.forget).neg().exp().mean(), target.answer_nll(ctx.retain).neg().exp().mean()
    assert (p_f - q_f) > 2 * (p_r - q_r) and q_f < p_f
    # the undo patch gives the target back bit for bit
    restore(target.model, report)
    assert all(torch.equal(before[k], target.model.state_dict()[k]) for k in before)


@pytest.mark.slow
def test_compare_with_audit_writes_the_audit_table(ctx, tmp_path):
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
            str(ctx.cache_dir),
            "--max-new-tokens",
            "8",
            "--device",
            "cpu",
            "--no-sweep",
            "--methods",
            "grad_diff,t3",
            "--audit",
            "--audit-relearn-steps",
            "3",
            "--audit-attacks",
            "quantise,relearn,paraphrase",
        ],
    )
    assert res.exit_code == 0, res.output
    saved = json.loads((tmp_path / "AUDIT.json").read_text())
    assert [r["method"] for r in saved["rows"]] == ["target model", "retain model", "grad_diff", "t3"]
    by_method = {r["method"]: r for r in saved["results"]}
    assert by_method["t3"]["white_box"]["weights_equal_target"] is True
    assert by_method["grad_diff"]["white_box"]["weights_equal_target"] is False
    assert (
        by_method["grad_diff"]["options"]["relearn_steps"] == 3
        and by_method["grad_diff"]["options"]["max_new_tokens"] == 8
    )
    for r in saved["rows"][2:]:
        assert {"kept_quantise_4bit", "kept_relearn", "kept_paraphrase"} <= set(r)
        assert (tmp_path / r["method"] / "AUDIT.json").is_file()
    table = (tmp_path / "AUDIT.md").read_text()
    assert "| grad_diff |" in table and "kept: 4-bit" in table and "T3 leaves the weights untouched" in table
    bad = CliRunner().invoke(
        app,
        [
            "compare",
            "--preset",
            "micro",
            "--data",
            DATA,
            "--out",
            str(tmp_path / "bad"),
            "--audit",
            "--audit-relearn-on",
            "both",
        ],
    )
    assert bad.exit_code != 0 and "relearn_on" in bad.output
