"""``compare --rehearse``: the shipped SmolLM2 configs (the GPU ones and the CPU ones) run end to end on the CPU
through the same command, code and data layout at the micro preset's size (recipes/rehearsal.py); what the full run
needs that the rehearsal cannot train with (the real checkpoint's file and packages) is checked without training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mmunlearn.data.ctofu.synthetic import synthetic_ctofu, write_language_files
from mmunlearn.data.synthetic import synthetic_splits
from recipes import rehearsal
from recipes.ctofu.cli import app as ctofu_app
from recipes.tofu.cli import app as tofu_app

APPS = {"tofu": tofu_app, "ctofu": ctofu_app}
#: the configs a rehearsal test runs, with the languages of the cTOFU ones
CONFIGS = {
    "tofu/smollm2_gpu200": None,
    "tofu/smollm2_20": None,
    "ctofu/smollm2_gpu": ("en", "fr", "ru", "ar", "ja"),
    "ctofu/smollm2_gpu_ja": ("en", "fr", "ru", "ar", "ja"),
    "ctofu/smollm2": ("en", "fr", "ru"),
}
#: rehearsed in the quick suite (about 30 and 55 s here); the others (1-2 min: parallel builds and jobs spawn
#: processes, or a second world) in `make test-all`, and each runs in test_shipped_configs on tiny overrides
FAST = ("tofu/smollm2_gpu200", "ctofu/smollm2_gpu")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """A TOFU folder (10 synthetic authors as JSON files) and a cTOFU folder (<split>_<lang>.json, five languages):
    the layouts of the real data the configs name."""
    root = tmp_path_factory.mktemp("data")
    tofu = root / "tofu"
    tofu.mkdir()
    for split, items in synthetic_splits(10).items():
        (tofu / f"{split}.json").write_text(json.dumps([it.to_dict() for it in items]))
    ctofu = root / "ctofu"
    write_language_files(synthetic_ctofu(("en", "fr", "ru", "ar", "ja"), retain_authors=2, forget_authors=1), ctofu)
    return {"tofu": tofu, "ctofu": ctofu}


def _rehearse(name: str, data: dict[str, Path], tmp_path: Path, *extra: str):
    bench = name.partition("/")[0]
    args = [
        "compare",
        "--config",
        name,
        "--rehearse",
        f"data={data[bench]}",
        f"out={tmp_path / 'run'}",
        f"cache_dir={tmp_path / 'cache'}",
        *extra,
    ]
    return CliRunner().invoke(APPS[bench], args)


def _check_record(name: str, tmp_path: Path, methods: list[str]) -> dict:
    out = tmp_path / "run_rehearsal"
    assert not (tmp_path / "run").exists()  # the full run's folder is left alone
    saved = json.loads((out / "compare.json").read_text())
    context = saved["context"]
    assert context["preset"] == "micro"
    host = context["host"]
    assert isinstance(host["cpu_native_bf16"], bool) and host["device"] == "cpu"
    assert host["scoring_precision"] == "no" and set(host["training_precision"].values()) == {"no"}  # micro: float32
    timing = context["timing"]
    assert [s["stage"] for s in timing["stages"] if not s.get("setup")] == methods
    assert all(s["seconds"] > 0 for s in timing["stages"]) and timing["skipped"] == []
    langs = CONFIGS[name]
    rows = saved["rows"]
    if langs is None:
        assert sorted(r["method"] for r in rows if not r["method"].endswith(" model")) == sorted(methods)
        assert all(r.get("forget_quality") is not None for r in rows)
    else:
        assert {(r["method"], r["lang"]) for r in rows} == {
            (m, lang) for m in ["target model", "retain model", *methods] for lang in langs
        }
        for r in rows:
            assert r["prob_ratio"] is not None and r["prob_ratio"] >= 0
            if r["method"] == "target model":
                assert r["prob_ratio"] == pytest.approx(1.0)
        assert (out / "prob_ratio.png").stat().st_size > 0 and "after / before" in (out / "compare.md").read_text()
        by_lang = context["memorisation_by_lang"]  # the target's memorisation per language, reported either way
        assert set(by_lang) == set(langs)
        for lang, check in by_lang.items():
            target = next(r for r in rows if r["method"] == "target model" and r["lang"] == lang)
            assert check["forget_prob"] == pytest.approx(target["forget_Q_A_Prob"])
            assert check["memorised"] is (not check["failed"])
    for method in methods:
        assert (out / method / "run.json").is_file()  # every stage's JSON, written as it finished
    return saved


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in sorted(CONFIGS)])
def test_each_config_rehearses_end_to_end_on_the_cpu(name, data, tmp_path, monkeypatch):
    """Two methods (one edit, one fine-tuning baseline) with every other setting the config's own but the wall-clock
    budget (a GPU run's cap: on a loaded 2-core CPU the ctofu rehearsal's first method ran past its 3 minutes and the
    second was skipped); the rehearsal of every method is the slow test below."""
    monkeypatch.chdir(tmp_path)
    res = _rehearse(name, data, tmp_path, "methods=t3,grad_diff", "budget_minutes=none")
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    assert "rehearsal: the full run's model is there" in res.output
    _check_record(name, tmp_path, ["t3", "grad_diff"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tofu/smollm2_gpu200", "ctofu/smollm2_gpu"])
def test_the_gpu_configs_rehearse_every_method(name, data, tmp_path, monkeypatch):
    from mmunlearn.methods import names

    monkeypatch.chdir(tmp_path)
    res = _rehearse(name, data, tmp_path, "budget_minutes=none")
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    _check_record(name, tmp_path, names("text"))


def test_a_rehearsal_fails_where_the_full_run_would(data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = _rehearse("tofu/smollm2_gpu200", {"tofu": tmp_path / "no-such-folder"}, tmp_path)
    assert res.exit_code != 0 and not (tmp_path / "run_rehearsal" / "compare.json").exists()
    assert rehearsal.preflight("smollm2-135m")["file"].endswith(".gguf")
    with pytest.raises(FileNotFoundError, match="no model folder"):
        rehearsal.preflight(str(tmp_path / "not-a-model"))
    monkeypatch.setitem(rehearsal.PACKAGES, "smollm2-135m", ("transformers", "no_such_package_for_the_test"))
    res = _rehearse("tofu/smollm2_gpu200", data, tmp_path)
    assert res.exit_code != 0 and "no_such_package_for_the_test" in str(res.exception)
    # every compare checks the packages it imports late before any model work (not only a rehearsal)
    monkeypatch.setattr(rehearsal, "LATE_IMPORTS", ("no_such_late_import",))
    res = CliRunner().invoke(
        tofu_app, ["compare", "--config", "tofu/micro", f"out={tmp_path / 'micro'}", f"cache_dir={tmp_path / 'cache'}"]
    )
    assert res.exit_code != 0 and "no_such_late_import" in str(res.exception)
    assert not (tmp_path / "cache").exists()
