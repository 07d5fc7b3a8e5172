"""TOFU recipe options on the micro preset: fine-tuning options, given target/retain folders, the
memorisation check, metric groups and extraction options reach what they should."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from mmunlearn.eval.tofu import METRIC_GROUPS
from recipes.tofu import pipeline as tofu_pipeline
from recipes.tofu.cli import app

DATA = "synthetic:n_authors=10"
COMMON = ["--preset", "micro", "--data", DATA, "--device", "cpu", "--threads", "1"]
FORGET_KEYS = set(METRIC_GROUPS["forget"])
UNDERTRAINED = "the target did not memorise the forget answers"


@pytest.fixture
def ctx(tofu_micro):
    return tofu_micro  # built once per session (tests/recipes/conftest.py)


def _invoke(*args):
    res = CliRunner().invoke(app, [str(a) for a in args])
    return res, " ".join(res.output.replace("│", " ").split())  # rich boxes and wrapping undone


def _copy_model(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("evals"))
    return dst


@pytest.mark.slow
def test_finetune_options_reach_the_model_and_the_forget_nll_is_checked(ctx, tmp_path):
    cache = ["--cache-dir", ctx.cache_dir]
    res, text = _invoke(
        "finetune",
        "--out",
        tmp_path / "weak",
        *COMMON,
        *cache,
        "--epochs",
        "1",
        "--lr",
        "1e-5",
        "--batch-size",
        "8",
        "--grad-accum",
        "2",
        "--precision",
        "bf16",
    )
    assert res.exit_code == 0, res.output
    log = json.loads((tmp_path / "weak" / "train_log.json").read_text())
    cfg = log["config"]
    assert (cfg["epochs"], cfg["lr"], cfg["batch_size"], cfg["grad_accum"], cfg["mixed_precision"]) == (
        1,
        1e-5,
        8,
        2,
        "bf16",
    )
    assert log["steps"] == 17 and log["key"] != ctx.built.logs["target"]["key"]  # ceil(ceil(272 / 8) / 2)
    assert log["forget_examples"] == 20 and log["forget_answer_nll"] > 2.5
    assert "the model did not memorise the forget answers" in text and "probability" in text
    assert log["forget_prob"] < log["pretrained_forget_prob"] + 0.05 and "forget_rouge" in log

    res, text = _invoke("finetune", "--out", tmp_path / "capped", *COMMON, *cache, "--max-steps", "3")
    assert res.exit_code == 0, res.output
    log = json.loads((tmp_path / "capped" / "train_log.json").read_text())
    assert log["steps"] == 3 and log["config"]["steps"] == 3 and log["config"]["epochs"] is None

    res, text = _invoke("finetune", "--out", tmp_path / "default", *COMMON, *cache)
    assert res.exit_code == 0, res.output
    log = json.loads((tmp_path / "default" / "train_log.json").read_text())
    assert log["key"] == ctx.built.logs["target"]["key"]  # the preset's settings: the same model as the target
    assert log["forget_answer_nll"] < 2.5 and "did not memorise" not in text
    res, text = _invoke("finetune", "--out", tmp_path / "bad", *COMMON, *cache, "--precision", "fp8")
    assert res.exit_code == 2 and "--precision" in text and "bf16" in text


def test_run_builds_with_the_ft_options_warns_and_records_an_undertrained_target(ctx, tmp_path):
    res, text = _invoke(
        "run",
        "--method",
        "qr-erase",
        "--out",
        tmp_path / "run",
        *COMMON,
        "--cache-dir",
        ctx.cache_dir,
        "--max-new-tokens",
        "8",
        "--metrics",
        "forget",
        "--ft-epochs",
        "1",
        "--ft-lr",
        "1e-5",
        "--extract",
        "lora",
        "--extract-steps",
        "3",
    )
    assert res.exit_code == 0, res.output
    assert UNDERTRAINED in text and "--ft-epochs" in text
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    context = run["context"]
    assert context["memorised"] is False and context["memorisation"]["forget_quality"] > 0.05
    assert context["metrics"] == ["forget"]
    assert context["target"] != str(ctx.built.target) and context["retain"] != str(ctx.built.retain)
    for role in ("target", "retain"):
        cfg = json.loads((tofu_pipeline.Path(context[role]) / "train_log.json").read_text())["config"]
        assert cfg["epochs"] == 1 and cfg["lr"] == 1e-5
    logs = json.loads((tmp_path / "run" / "TOFU_EVAL.json").read_text())
    assert set(logs) == FORGET_KEYS and logs["forget_quality"]["agg_value"] is not None
    report = json.loads((tmp_path / "run" / "model" / "unlearn_report.json").read_text())
    assert report["config"]["extract"]["kind"] == "lora" and report["config"]["extract"]["steps"] == 3


def test_compare_on_the_default_target_has_no_warning_and_only_the_chosen_metrics(ctx, tmp_path):
    res, text = _invoke(
        "compare",
        "--methods",
        "qr-erase",
        "--out",
        tmp_path,
        *COMMON,
        "--cache-dir",
        ctx.cache_dir,
        "--max-new-tokens",
        "24",
        "--no-sweep",
        "--metrics",
        "forget",
        "--extract",
        "gradient",
    )
    assert res.exit_code == 0, res.output
    assert "did not memorise" not in text
    comp = json.loads((tmp_path / "compare.json").read_text())
    assert comp["context"]["memorised"] is True and comp["context"]["target"] == str(ctx.built.target)
    assert comp["context"]["memorisation"]["forget_quality"] < 0.05 and comp["context"]["extract_kind"] == "gradient"
    row = next(r for r in comp["rows"] if r["method"] == "qr-erase")
    assert row["forget_quality"] is not None and "model_utility" not in row
    assert set(json.loads((tmp_path / "qr-erase" / "TOFU_EVAL.json").read_text())) == FORGET_KEYS
    report = json.loads((tmp_path / "qr-erase" / "model" / "unlearn_report.json").read_text())
    assert report["config"]["extract"]["kind"] == "gradient"


def test_given_target_and_retain_folders_are_used_and_nothing_is_built(ctx, tmp_path):
    target = _copy_model(ctx.built.target, tmp_path / "my_target")
    retain = _copy_model(ctx.built.retain, tmp_path / "my_retain")
    empty = tmp_path / "empty_cache"
    res, text = _invoke(
        "run",
        "--method",
        "qr-erase",
        "--out",
        tmp_path / "run",
        *COMMON,
        "--cache-dir",
        empty,
        "--max-new-tokens",
        "24",
        "--metrics",
        "forget",
        "--target",
        target,
        "--retain-model",
        retain,
        "--base",
        "base",
    )
    assert res.exit_code == 0, res.output
    assert not empty.exists() or not [p for p in empty.iterdir() if not p.name.startswith(".")]  # no model built
    context = json.loads((tmp_path / "run" / "run.json").read_text())["context"]
    assert context["target"] == str(target) and context["retain"] == str(retain)
    assert context["base"] == str(ctx.built.base) and context["memorised"] is True  # the base its log names
    assert (target / "evals").is_dir() and (retain / "evals").is_dir()

    res, text = _invoke(
        "eval",
        "--target",
        target,
        "--retain-model",
        retain,
        "--out",
        tmp_path / "ev",
        "--data",
        DATA,
        "--device",
        "cpu",
        "--max-new-tokens",
        "8",
        "--metrics",
        "forget",
    )
    assert res.exit_code == 0, res.output
    logs = json.loads((tmp_path / "ev" / "TOFU_EVAL.json").read_text())
    assert set(logs) == FORGET_KEYS and logs["forget_quality"]["agg_value"] < 0.05


def test_bad_folders_metrics_and_a_missing_base_are_clear_errors(ctx, tmp_path):
    target = _copy_model(ctx.built.target, tmp_path / "t")
    (target / "train_log.json").unlink()  # a target that names no base
    (tmp_path / "empty").mkdir()
    run = ["run", "--method", "qr-erase", "--out", tmp_path / "o", *COMMON, "--cache-dir", tmp_path / "c"]
    cases = [
        (run + ["--target", tmp_path / "nowhere"], "no such folder"),
        (run + ["--retain-model", tmp_path / "empty"], "no config.json"),
        (run + ["--target", target, "--base", "base"], "names no base model"),
        (["compare", "--methods", "qr-erase", "--out", tmp_path / "o", *COMMON, "--target", target], "--no-sweep"),
        (run + ["--metrics", "forget,speed"], "unknown metric group"),
        (run + ["--extract", "svd"], "lora"),
        (run + ["--ft-lr", "0"], "lr must be positive"),
        (
            ["eval", "--target", target, "--retain-model", target, "--retain-logs", target, "--out", tmp_path / "o"],
            "not both",
        ),
    ]
    for args, message in cases:
        res, text = _invoke(*args)
        assert res.exit_code == 2 and message in text, (args, res.output)
    assert not (tmp_path / "c").exists() and not (tmp_path / "o").exists()  # refused before any model work


def test_the_memorisation_rule_per_preset_size():
    from recipes.tofu.settings import memorisation, memorisation_warning

    assert memorisation("mini", 0.95, 0.95, retain_prob=0.1)["memorised"] is True
    close = memorisation("mini", 0.95, 0.95, retain_prob=0.8)  # indistinguishable from the retain model
    assert close["memorised"] is False and "retain model" in memorisation_warning(close)
    low_rouge = memorisation("/models/smollm2", 0.9, 0.5, pretrained_prob=0.08)
    assert low_rouge["memorised"] is False and low_rouge["min_forget_rouge"] == 0.85
    assert "forget ROUGE-L 0.5000 (memorised: >= 0.85)" in memorisation_warning(low_rouge)
    assert memorisation("smollm2-135m", 0.98, 0.97, pretrained_prob=0.08, retain_prob=0.1)["memorised"] is True
    assert memorisation("micro", 0.25, 0.024, pretrained_prob=0.004)["memorised"] is True  # ROUGE-L not checked
    weak = memorisation("micro", 0.05, 0.025, forget_quality=0.001)  # a good forget quality is not memorisation
    assert weak["memorised"] is False and "probability 0.05" in memorisation_warning(weak, what="the model")
    assert (
        memorisation("micro", None, None)["memorised"] is None
        and memorisation_warning(memorisation("micro", None, None)) is None
    )


def test_a_yaml_config_runs_like_the_same_options_and_sets_rmus_own_settings(ctx, tmp_path):
    common = ["--cache-dir", ctx.cache_dir, "--max-new-tokens", "8", "--metrics", "forget", "--epochs", "2"]
    res, _ = _invoke(
        "run",
        "--method",
        "rmu",
        "--out",
        tmp_path / "by_options",
        *COMMON,
        *common,
        "--method-option",
        "rmu.steering=7",
        "--method-option",
        "rmu.layer=1",
    )
    assert res.exit_code == 0, res.output
    config = tmp_path / "run.yaml"
    config.write_text(
        f"method: rmu\npreset: micro\ndata: '{DATA}'\ndevice: cpu\nthreads: 1\n"
        f"cache_dir: {ctx.cache_dir}\nmax_new_tokens: 8\nmetrics: forget\nepochs: 3\n"
        "method_options:\n  rmu: {steering: 7}\n"
    )
    res, _ = _invoke(
        "run", "--config", config, "--method-option", "rmu.layer=1", f"out={tmp_path / 'by_file'}", "epochs=2"
    )  # the arguments override the file
    assert res.exit_code == 0, res.output
    by_options, by_file = (json.loads((tmp_path / d / "run.json").read_text()) for d in ("by_options", "by_file"))
    assert by_options["config"]["steering"] == 7 and by_options["config"]["layer"] == 1
    assert by_options["config"]["epochs"] == 2  # the shared --epochs knob reaches RMU
    for key in ("key", "method", "config", "context", "rule"):
        assert by_file[key] == by_options[key], key
    timeless = [{k: v for k, v in r.items() if not k.endswith("_seconds")} for r in (by_file["row"], by_options["row"])]
    assert timeless[0] == pytest.approx(timeless[1]) and by_file["rows"] == [by_file["row"]]
    report = json.loads((tmp_path / "by_file" / "model" / "unlearn_report.json").read_text())
    assert report["config"]["steering"] == 7 and report["config"]["layer"] == 1


def test_a_target_of_another_make_needs_its_own_retain_model(ctx, tmp_path):
    """No reference of another architecture is built silently for a user's target."""
    target = _copy_model(ctx.built.target, tmp_path / "users_model")
    (target / "train_log.json").unlink()  # not made by mmunlearn: nothing says which preset it came from
    res, text = _invoke(
        "run",
        "--method",
        "grad_diff",
        "--out",
        tmp_path / "o",
        *COMMON,
        "--cache-dir",
        tmp_path / "c",
        "--target",
        target,
        "--no-sweep",
        "--base",
        "target",
    )
    assert res.exit_code == 2 and "without --retain-model" in text and "another architecture" in text, res.output
    assert not (tmp_path / "c").exists() and not (tmp_path / "o").exists()  # refused before any model work


def test_tilt_reads_the_files_it_is_given(ctx, tmp_path):
    """--forget forget.txt is that file, not a forget.json beside it; a row in both sets is refused."""
    retain = [{"question": f"Who wrote book {i}?", "answer": f"Writer {i} did."} for i in range(4)]
    (tmp_path / "forget.json").write_text(json.dumps(retain[:1]))  # a decoy: read, it would be refused as overlap
    (tmp_path / "forget.txt").write_text("Author one wrote the first book.\nAuthor two wrote the second book.\n")
    (tmp_path / "retain.jsonl").write_text("\n".join(json.dumps(r) for r in retain))
    common = [
        "tilt",
        "--model",
        ctx.built.target,
        "--retain",
        tmp_path / "retain.jsonl",
        "--device",
        "cpu",
        "--epochs",
        "2",
        "--rank",
        "2",
        "--cache-dir",
        tmp_path / "cache",
    ]
    res, text = _invoke(*common, "--forget", tmp_path / "forget.txt", "--out", tmp_path / "head")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "head" / "tilt_config.json").is_file() and (
        tmp_path / "head" / "tilt_head.safetensors"
    ).is_file()
    assert "still hold the forget set" in text.replace("\n", " ")
    # T3's default for a model folder: the saved head spares the tokens already in the text; --no-spare-seen does not
    assert json.loads((tmp_path / "head" / "tilt_config.json").read_text()).get("spare_seen") is True
    res, text = _invoke(*common, "--forget", tmp_path / "forget.txt", "--out", tmp_path / "plain", "--no-spare-seen")
    assert res.exit_code == 0 and "spare_seen" not in json.loads((tmp_path / "plain" / "tilt_config.json").read_text())
    heads = [load_file(tmp_path / d / "tilt_head.safetensors") for d in ("head", "plain")]
    assert any(not torch.equal(heads[0][k], heads[1][k]) for k in heads[0])  # trained on other tokens ("0" is seen)
    (tmp_path / "both.jsonl").write_text(json.dumps(retain[1]))
    res, text = _invoke(*common, "--forget", tmp_path / "both.jsonl", "--out", tmp_path / "head2")
    assert res.exit_code == 2 and "also retain rows" in text and not (tmp_path / "head2").exists(), res.output
