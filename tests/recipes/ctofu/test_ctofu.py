"""cTOFU recipe end to end on the micro preset, three stand-in languages (en, fr, ar) read from files:
every method through the harness, the CLI (finetune, compare) on two methods, misaligned data, trained
vs scored text."""

import json
import math
import shutil

import pytest
import torch
from typer.testing import CliRunner

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.data.ctofu.synthetic import synthetic_ctofu, write_language_files
from mmunlearn.data.ctofu.worlds import build_world, open_ctofu
from mmunlearn.methods import UnlearnRequest, get, mean_nll, names, run_unlearning
from recipes.ctofu import pipeline as ctofu_pipeline
from recipes.ctofu.cli import _world, app

WORLD = dict(authors=2, facts=5)
OPTS = ["--authors", "2", "--facts", "5", "--preset", "micro", "--device", "cpu", "--threads", "1"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("ctofu")
    write_language_files(synthetic_ctofu(("en", "fr", "ar"), retain_authors=2, forget_authors=1), out)
    return out


@pytest.fixture(scope="module")
def ctx(folder, tmp_path_factory):
    world = build_world(open_ctofu(folder), **WORLD)
    return ctofu_pipeline.prepare(
        "micro", world, ("en",), ("en", "ar"), ("en",), 0, tmp_path_factory.mktemp("cache"), "cpu", max_new_tokens=8
    )


def test_target_knows_the_forget_authors_in_every_language(ctx):
    target = {r["lang"]: r for r in ctx.reference_rows("target")}
    retain = {r["lang"]: r for r in ctx.reference_rows("retain")}
    for lang in ("en", "ar"):
        assert retain[lang]["forget_quality"] == 1.0 and target[lang]["forget_quality"] < 0.05
        assert target[lang]["forget_Q_A_Prob"] > 1.5 * retain[lang]["forget_Q_A_Prob"]
        assert target[lang]["rouge_drop"] == 0.0


@pytest.mark.slow
def test_every_method_raises_the_forget_nll_of_the_forget_language(ctx):
    world = ctx.world
    probes = {lang: world.items("forget", (lang,)) for lang in world.languages}
    fresh = TextLLMAdapter.from_pretrained(ctx.built.target, device="cpu")
    before = {lang: mean_nll(fresh, items) for lang, items in probes.items()}
    for method in names("text"):
        target = TextLLMAdapter.from_pretrained(ctx.built.target, device="cpu")
        res = run_unlearning(
            UnlearnRequest(method, "text", size="micro", progress=False), target, ctx.forget, ctx.retain
        )
        after = {lang: mean_nll(res.adapter, items) for lang, items in probes.items()}
        assert after["en"] > before["en"], (method, before, after)  # micro defaults, no sweep: some rise
        assert all(math.isfinite(v) for v in after.values())  # also in the languages it was not given
        assert (res.report["changed_fraction"] == 0.0) == (not get(method).edits_weights), method  # t3, t3-port


def test_compare_cli_on_two_methods(ctx, folder, tmp_path):
    res = CliRunner().invoke(
        app,
        [
            "compare",
            "--data",
            str(folder),
            *OPTS,
            "--methods",
            "grad_ascent,t3",
            "--forget-lang",
            "en",
            "--eval-langs",
            "en,ar",
            "--no-sweep",
            "--max-new-tokens",
            "8",
            "--cache-dir",
            str(ctx.cache_dir),
            "--out",
            str(tmp_path),
            "--method-option",
            "t3.head_epochs=7",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "[stage 1/3] target and retain models" in res.output  # one progress line per stage
    assert "[stage 2/3] grad_ascent:" in res.output and "[stage 3/3] t3:" in res.output
    report = json.loads((tmp_path / "compare.json").read_text())
    for method in ("grad_ascent", "t3"):  # the runner's layout, as tofu's: rows, cost, the method's config
        run = json.loads((tmp_path / method / "run.json").read_text())
        assert run["method"] == method and [r["lang"] for r in run["rows"]] == ["en", "ar"]
        assert all(r["unlearn_seconds"] == run["cost"]["unlearn_seconds"] for r in run["rows"])
        assert {"key", "config", "rule", "info", "context"} <= set(run)
    t3_config = json.loads((tmp_path / "t3" / "run.json").read_text())["config"]
    assert t3_config["head_epochs"] == 7  # a method's own setting through --method-option
    rows = report["rows"]
    assert [(r["method"], r["lang"]) for r in rows] == [
        (m, lang) for m in ("target model", "retain model", "grad_ascent", "t3") for lang in ("en", "ar")
    ]
    target = {r["lang"]: r for r in rows if r["method"] == "target model"}
    for r in rows[4:]:
        logs = json.loads((tmp_path / r["method"] / r["lang"] / "TOFU_EVAL.json").read_text())
        rouge = logs["forget_Q_A_ROUGE"]["agg_value"]
        assert r["forget_Q_A_ROUGE"] == pytest.approx(rouge)
        assert r["rouge_drop"] == pytest.approx(target[r["lang"]]["forget_Q_A_ROUGE"] - rouge)
        assert r["forget_quality"] == pytest.approx(logs["forget_quality"]["agg_value"])
    ga = {r["lang"]: r for r in rows if r["method"] == "grad_ascent"}
    summary = {s["method"]: s for s in report["transfer"]}
    assert summary["grad_ascent"]["rouge_drop_forget_lang"] == pytest.approx(ga["en"]["rouge_rel_drop"])
    if ga["en"]["rouge_rel_drop"] > 0:
        assert summary["grad_ascent"]["rouge_transfer"] == pytest.approx(
            ga["ar"]["rouge_rel_drop"] / ga["en"]["rouge_rel_drop"]
        )
    md = (tmp_path / "compare.md").read_text()
    assert "| method | en | ar |" in md and "| t3 |" in md
    assert (tmp_path / "fq_heatmap.png").stat().st_size > 0 and (tmp_path / "rouge_drop.png").stat().st_size > 0
    assert (tmp_path / "t3" / "model" / "tilt").is_dir() and (tmp_path / "grad_ascent" / "model").is_dir()
    from mmunlearn.api.restore import restore_folder
    from mmunlearn.files.checkpoint import load_checkpoint

    original = load_checkpoint(ctx.built.target).tensors
    for method in ("grad_ascent", "t3"):  # cTOFU outputs restore to the target bit for bit
        back = load_checkpoint(restore_folder(tmp_path / method / "model", tmp_path / "r" / method)).tensors
        assert all(torch.equal(back[k], original[k]) for k in original), method


def test_finetune_cli_reuses_the_built_models(ctx, folder, tmp_path):
    res = CliRunner().invoke(
        app, ["finetune", "--data", str(folder), *OPTS, "--cache-dir", str(ctx.cache_dir), "--out", str(tmp_path)]
    )
    assert res.exit_code == 0, res.output
    models = json.loads((tmp_path / "models.json").read_text())
    assert models["target"] == str(ctx.built.target) and models["retain"] == str(ctx.built.retain)
    assert models["logs"]["target"]["cached"] and models["world"]["languages"] == ["en", "ar", "fr"]
    assert "| fr | retain99 | 40 |" in (tmp_path / "alignment.md").read_text()


def test_misaligned_language_stops_the_run_or_is_left_out(folder, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    rows = json.loads((broken / "retain99_fr.json").read_text())
    (broken / "retain99_fr.json").write_text(json.dumps(rows[:-1], ensure_ascii=False))
    res = CliRunner().invoke(app, ["finetune", "--data", str(broken), *OPTS, "--out", str(tmp_path / "out")])
    assert res.exit_code != 0 and "not row-aligned" in res.output
    assert json.loads((tmp_path / "out" / "alignment.json").read_text())["errors"] == [
        {"lang": "fr", "split": "retain99", "error": "39 rows, English has 40"}
    ]
    world = _world(str(broken), None, "all", 2, 5, True, tmp_path / "out2")
    assert world.languages == ("en", "ar")


def _plain_output(output: str) -> str:
    return " ".join(output.replace("│", " ").split())  # rich wraps the error panel


def test_text_mismatch_stops_the_run_or_is_recorded(tmp_path):
    data = tmp_path / "retranslated"  # forget01_perturbed translated apart from forget01, as the shipped files
    write_language_files(
        synthetic_ctofu(("en", "fr", "ar"), retain_authors=2, forget_authors=1, retranslated=("forget01_perturbed",)),
        data,
    )
    res = CliRunner().invoke(
        app, ["finetune", "--data", str(data), *OPTS, "--train-text", "files", "--out", str(tmp_path / "stop")]
    )
    assert res.exit_code != 0  # stops before any model is built
    text = _plain_output(res.output)
    assert "other question/answer text than the metrics score" in text and "--allow-text-mismatch" in text
    assert not (tmp_path / "stop" / "models.json").exists()
    report = json.loads((tmp_path / "stop" / "alignment.json").read_text())
    shared = {(t["lang"], t["split"]): (t["shared"], t["scored"]) for t in report["texts"]}
    assert shared == {
        ("en", "forget01"): (20, 20),
        ("en", "retain99"): (20, 20),
        ("ar", "forget01"): (0, 20),
        ("ar", "retain99"): (20, 20),
        ("fr", "forget01"): (0, 20),
        ("fr", "retain99"): (20, 20),
    }
    assert report["text_mismatches"] == 2 and not report["text_mismatch_allowed"]
    assert "the run stops" in (tmp_path / "stop" / "alignment.md").read_text()

    world = _world(str(data), None, "all", 2, 5, False, tmp_path / "allowed", "files", True)
    assert world.train_text == "files"
    md = (tmp_path / "allowed" / "alignment.md").read_text()
    assert "| fr | forget01 | forget01_perturbed | 20 | 0 | 0 |" in md and "(allowed for this run" in md
    assert json.loads((tmp_path / "allowed" / "alignment.json").read_text())["text_mismatch_allowed"]

    world = _world(str(data), None, "all", 2, 5, False, tmp_path / "default")  # trained on the scored text
    md = (tmp_path / "default" / "alignment.md").read_text()
    assert "| fr | forget01 | forget01_perturbed | 20 | 20 | 0 |" in md and "differs" not in md
    for lang in world.languages:
        assert [(it.question, it.answer) for it in world.items("forget", (lang,))] == [
            (it.question, it.answer) for it in world.eval_data[lang]["forget01_perturbed"]
        ]
    res = CliRunner().invoke(
        app, ["finetune", "--data", str(data), *OPTS, "--train-text", "perturbed", "--out", str(tmp_path / "bad")]
    )
    assert res.exit_code != 0 and "choose from scored, files" in _plain_output(res.output)


def test_rows_and_transfer_summary_by_hand():
    target = {"forget_Q_A_ROUGE": 0.8, "forget_Q_A_Prob": 0.5}
    row = ctofu_pipeline.make_row("m", "en", {"forget_Q_A_ROUGE": 0.2, "forget_Q_A_Prob": 0.1}, target)
    assert row["rouge_drop"] == pytest.approx(0.6) and row["rouge_rel_drop"] == pytest.approx(0.75)
    assert row["prob_drop"] == pytest.approx(0.4) and row["prob_rel_drop"] == pytest.approx(0.8)

    def r(method, lang, rel):
        return {
            "method": method,
            "lang": lang,
            "rouge_rel_drop": rel,
            "prob_rel_drop": rel / 2,
            "forget_quality": 0.1,
            "model_utility": 0.5,
        }

    rows = [
        r("target model", "en", 0.0),
        r("a", "en", 0.8),
        r("a", "fr", 0.4),
        r("a", "ar", 0.2),
        r("b", "en", 0.6),
        r("b", "fr", 0.6),
        r("b", "ar", 0.3),
        r("c", "en", 0.05),
        r("c", "fr", 0.0),
    ]
    summary = {s["method"]: s for s in ctofu_pipeline.transfer_summary(rows, ("en",))}
    assert set(summary) == {"a", "b", "c"}
    assert summary["a"]["rouge_transfer"] == pytest.approx(0.3 / 0.8) and summary["a"]["verdict"] == "partial"
    assert summary["a"]["prob_transfer"] == pytest.approx(0.15 / 0.4)
    assert summary["b"]["rouge_transfer"] == pytest.approx(0.75) and summary["b"]["verdict"] == "transfers"
    assert summary["c"]["verdict"] == "no forgetting"
    assert ctofu_pipeline.transfer_summary(rows, ("de",))[0]["verdict"] == "n/a"  # forget language not evaluated


@pytest.mark.slow
@pytest.mark.slow
def test_compare_with_two_jobs_reuses_the_stages_of_its_ctofu_run_processes(ctx, folder, tmp_path):
    """``jobs=2``: each method's stage is made by a ``ctofu run`` process in ``OUT/<method>/`` (its tables in
    ``summary.md``), with the comparison's own stage key, so the comparison reuses both and starts nothing again."""
    args = ["compare", "--data", str(folder), *OPTS, "--methods", "grad_ascent,t3", "--forget-lang", "en"]
    args += ["--eval-langs", "en,ar", "--no-sweep", "--max-new-tokens", "8", "--cache-dir", str(ctx.cache_dir)]
    args += ["--out", str(tmp_path), "jobs=2", "resume=true"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    for method in ("grad_ascent", "t3"):
        assert f"[jobs] {method}: finished" in res.output, res.output
        assert f"{method}: reused (finished earlier in " in res.output  # the job's key is the comparison's
        run = json.loads((tmp_path / method / "run.json").read_text())
        assert run["method"] == method and [r["lang"] for r in run["rows"]] == ["en", "ar"]
        summary = json.loads((tmp_path / method / "summary.json").read_text())  # `ctofu run`'s own tables
        assert {r["method"] for r in summary["rows"]} == {"target model", method, "retain model"}
    rows = json.loads((tmp_path / "compare.json").read_text())["rows"]
    assert {(r["method"], r["lang"]) for r in rows} >= {(m, x) for m in ("grad_ascent", "t3") for x in ("en", "ar")}
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "[jobs]" not in again.output  # nothing left to run: no process started


def test_compare_with_audit_reports_every_language(ctx, folder, tmp_path):
    res = CliRunner().invoke(
        app,
        [
            "compare",
            "--data",
            str(folder),
            *OPTS,
            "--methods",
            "grad_ascent",
            "--forget-lang",
            "en",
            "--eval-langs",
            "en,ar",
            "--no-sweep",
            "--max-new-tokens",
            "8",
            "--cache-dir",
            str(ctx.cache_dir),
            "--out",
            str(tmp_path),
            "--audit",
            "--audit-attacks",
            "paraphrase,quantise",
            "--audit-relearn-steps",
            "2",
        ],
    )
    assert res.exit_code == 0, res.output
    saved = json.loads((tmp_path / "AUDIT.json").read_text())
    result = saved["results"][0]
    assert result["method"] == "grad_ascent" and "language_ar" in result["attacks"]
    assert "language_en" not in result["attacks"]  # the forget language is the plain measure
    ar = result["attacks"]["language_ar"]
    assert set(ar) >= {"target", "retain", "unlearned", "kept"}
    assert ar["target"]["forget_prob"] > ar["retain"]["forget_prob"]  # the target knows them in Arabic too
    assert "probe" not in result["attacks"]  # no holdout split in the translations
    assert "kept: ar" in (tmp_path / "AUDIT.md").read_text()


def test_qr_erase_is_set_beside_svd_unlearn_per_language():
    from recipes.ctofu.report import markdown, qr_vs_svd

    def row(method, lang, mu, drop, ratio, seconds):
        return {
            "method": method,
            "lang": lang,
            "forget_quality": 0.5,
            "model_utility": mu,
            "rouge_drop": drop,
            "prob_ratio": ratio,
            "total_seconds": seconds,
        }

    rows = [
        row("qr-erase", "en", 0.50, 0.40, 0.10, 30.0),
        row("svd-unlearn", "en", 0.52, 0.40, 0.10, 120.0),
        row("qr-erase", "fr", 0.50, 0.20, 0.30, 30.0),
        row("svd-unlearn", "fr", 0.50, 0.25, 0.30, 100.0),
        row("t3", "en", 0.4, 0.1, 0.5, 5.0),
    ]
    en, fr = qr_vs_svd(rows)
    assert en["lang"] == "en" and en["max_rel_diff"] == pytest.approx(0.02 / 0.52) and en["time_ratio"] == 0.25
    assert fr["max_rel_diff"] == pytest.approx(0.2) and fr["time_ratio"] == pytest.approx(0.3)
    assert qr_vs_svd([r for r in rows if r["method"] != "svd-unlearn"]) == []  # one of the two missing: no pair
    assert "QR-Erase beside SVD-UNLEARN" in markdown(rows, [], ("en",))
    assert "QR-Erase beside SVD-UNLEARN" not in markdown(rows[:1], [], ("en",))


def test_parallel_reference_evaluations_are_the_ones_a_single_process_makes(folder, tmp_path):
    """With parallel builds the languages' reference evaluations are split between two processes: each language's
    logs are written once, under the keys a single-process run looks up (a second, sequential prepare recomputes
    nothing), and a language the spawned process evaluated scores as this process scores it."""
    world = build_world(open_ctofu(folder), **WORLD)
    langs, cache = ("en", "fr", "ar"), tmp_path / "cache"
    here, there = ctofu_pipeline._split_languages(world, langs)
    assert sorted(here + there) == sorted(langs) and here and there
    args = ("micro", world, ("en",), langs, ("en",), 0, cache, "cpu")
    par = ctofu_pipeline.prepare(*args, max_new_tokens=8, build_options={"parallel": True})
    logs = [p for t in par.by_lang.values() for p in (t.retain_logs, t.target_logs)]
    assert len(set(logs)) == 6 and all(p.is_file() for p in logs)
    written = {p: p.stat().st_mtime_ns for p in logs}
    seq = ctofu_pipeline.prepare(*args, max_new_tokens=8, build_options={"parallel": False})
    assert {p: p.stat().st_mtime_ns for p in logs} == written  # found, not recomputed
    assert [t.target_logs for t in seq.by_lang.values()] == [t.target_logs for t in par.by_lang.values()]
    child = par.by_lang[there[0]].target_logs
    before = ctofu_pipeline._summary(child)
    shutil.rmtree(child.parent)  # evaluate the spawned process's language again, here
    again = ctofu_pipeline.prepare(*args, max_new_tokens=8, build_options={"parallel": False})
    after = ctofu_pipeline._summary(again.by_lang[there[0]].target_logs)
    assert before.keys() == after.keys() and all(math.isclose(before[k], after[k], abs_tol=1e-6) for k in before)
