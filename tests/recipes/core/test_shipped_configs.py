"""Shipped recipe configs (recipes/configs/<benchmark>/<name>.yaml): every one validates into its command's config
with no unknown key, names its command and doc section, and is package data; ``--config NAME`` resolves like the
file (a file path wins); an unknown name is a one-line error listing the names; ``configs`` lists them; and
every one runs end to end through the CLI on the smallest preset with tiny overrides."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from mmunlearn.presets.cache import CACHE_ENV
from recipes.configs import ROOT, describe, resolve, shipped
from recipes.ctofu.cli import app as ctofu_app
from recipes.ctofu.config import CTofuConfig
from recipes.recipe_cli import config_command
from recipes.recipe_config import ConfigError, build_config, read_yaml
from recipes.requests.config import BUILT_IN, RequestsConfig
from recipes.tofu.cli import app as tofu_app
from recipes.tofu.config import COMPARE_EXCLUDES, RUN_EXCLUDES, TofuConfig
from recipes.voxceleb2.cli import app as voxceleb2_app
from recipes.voxceleb2.config import CLASSIFIER_ONLY, VoxCelebConfig
from tests.recipes.conftest import TOFU_DATA
from tests.speech_corpus import one_thread, speaker_manifests  # noqa: F401  (fixtures)

REPO = Path(__file__).resolve().parents[3]
COMPARE_DEFAULTS = {"out": Path("runs/x"), "preset": "mini", "sweep": True}
#: (benchmark, command) -> the command's config class, excluded fields, own defaults and --method-option kind
COMMANDS: dict[tuple[str, str], tuple[type, tuple[str, ...], dict[str, Any], str | None]] = {
    ("tofu", "run"): (TofuConfig, RUN_EXCLUDES, {}, "text"),
    ("tofu", "compare"): (TofuConfig, COMPARE_EXCLUDES, COMPARE_DEFAULTS, "text"),
    ("ctofu", "run"): (CTofuConfig, RUN_EXCLUDES, {}, "text"),
    ("ctofu", "compare"): (CTofuConfig, COMPARE_EXCLUDES, COMPARE_DEFAULTS, "text"),
    ("voxceleb2", "speaker"): (VoxCelebConfig, (), {}, None),
    ("voxceleb2", "sample"): (VoxCelebConfig, (), {}, None),
    ("requests", "requests"): (RequestsConfig, (), {}, None),
}
APPS = {"tofu": tofu_app, "ctofu": ctofu_app, "voxceleb2": voxceleb2_app}
#: a benchmark whose command is not ``mmunlearn <benchmark> <command>``: the command its configs' headers name
PATHS = {"requests": ("bench", "requests")}
SHIPPED = shipped()


def _command(name: str) -> tuple[str, str]:
    """(benchmark, command) of a shipped config: its folder, and the word after it in its first comment line (for a
    benchmark of :data:`PATHS`, the line starts with its command's path)."""
    benchmark = name.partition("/")[0]
    words = describe(SHIPPED[name]).replace(":", " ").split()
    if benchmark in PATHS:
        if tuple(words[:2]) != PATHS[benchmark]:
            pytest.fail(
                f"{name}: the first comment line must start with '{' '.join(PATHS[benchmark])}', got "
                f"{describe(SHIPPED[name])!r}"
            )
        return benchmark, PATHS[benchmark][1]
    if len(words) < 2 or words[0] != benchmark:
        pytest.fail(
            f"{name}: the first comment line must start with '{benchmark} <command>', got {describe(SHIPPED[name])!r}"
        )
    return benchmark, words[1]


def _build(benchmark: str, command: str, file: Path, overrides: tuple[str, ...] = ()) -> Any:
    cls, exclude, defaults, kind = COMMANDS[(benchmark, command)]
    keys = [f.name for f in dataclasses.fields(cls) if f.name not in exclude]
    return build_config(cls, allowed=keys, defaults=defaults, file=file, overrides=overrides, kind=kind)


def _invoke(app: typer.Typer, *args: Any):
    res = CliRunner().invoke(app, [str(a) for a in args])
    return res, " ".join(res.output.replace("│", " ").split())  # rich boxes and wrapping undone


def test_the_documented_presets_are_shipped():
    assert {
        "tofu/micro",
        "tofu/mini",
        "tofu/smollm2",
        "ctofu/mini",
        "voxceleb2/ecapa_fsdd",
        "voxceleb2/hf_audio_fsdd",
    } <= set(SHIPPED)
    assert all(path.is_file() and path.parent.parent == ROOT for path in SHIPPED.values())
    assert set(shipped("tofu")) == {n for n in SHIPPED if n.startswith("tofu/")}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_config_validates_into_its_commands_config(name):
    """Every key a field of the command's config (no unknown one), every value of its type and accepted by the
    config's checks; the header names the command it runs and an existing doc page it reproduces."""
    path = SHIPPED[name]
    benchmark, command = _command(name)
    assert (benchmark, command) in COMMANDS, f"{name}: unknown command {benchmark} {command}"
    data = read_yaml(path)
    cfg = _build(benchmark, command, path)
    cls = COMMANDS[(benchmark, command)][0]
    assert isinstance(cfg, cls) and data and set(data) <= {f.name for f in dataclasses.fields(cls)}
    header = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    docs = re.findall(r"docs/[\w-]+\.md", header)
    assert docs and all((REPO / d).is_file() for d in docs), f"{name}: the header names no existing docs/ page"
    assert not any(str(v).startswith("/") for v in data.values()), f"{name}: an absolute (machine's own) path"


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_config_is_package_data(name):
    tomllib = pytest.importorskip("tomllib")
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = setuptools["package-data"]["recipes.configs"]
    relative = SHIPPED[name].relative_to(ROOT).as_posix()
    assert any(fnmatch.fnmatch(relative, p) for p in patterns), f"{relative} is not in package-data {patterns}"
    assert any(fnmatch.fnmatch("recipes.configs", p) for p in setuptools["packages"]["find"]["include"])


def test_a_name_and_its_file_give_the_same_config(tmp_path, monkeypatch):
    """Through a command made like the recipes' (nothing run): the name, the bare name, name.yaml and the path."""
    monkeypatch.chdir(tmp_path)  # the config's relative out= is never written into the repository
    seen: list[TofuConfig] = []

    def compare(cfg: TofuConfig) -> None:
        seen.append(cfg)

    app = typer.Typer()
    config_command(
        app, TofuConfig, name="compare", exclude=COMPARE_EXCLUDES, defaults=COMPARE_DEFAULTS, benchmark="tofu"
    )(compare)
    app.command("other")(lambda: None)  # two commands: the app takes the command's name
    for spec in ("tofu/smollm2", "smollm2", "tofu/smollm2.yaml", SHIPPED["tofu/smollm2"]):
        res, _ = _invoke(app, "compare", "--config", spec, "authors=3")
        assert res.exit_code == 0, res.output
    assert len(seen) == 4 and all(cfg == seen[0] for cfg in seen)
    assert (seen[0].preset, seen[0].authors, seen[0].utility_items) == ("smollm2-135m", 3, 40)
    assert resolve("tofu/smollm2") == resolve("smollm2", "tofu") == SHIPPED["tofu/smollm2"]


def test_a_file_path_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tofu").mkdir()
    (tmp_path / "tofu" / "micro").write_text("preset: micro\nauthors: 7\n")
    assert resolve("tofu/micro", "tofu") == Path("tofu/micro")
    cfg = _build("tofu", "compare", resolve("tofu/micro", "tofu"))
    assert cfg.authors == 7 and cfg.methods == ("all",)  # the local file, not the shipped micro (t3, qr-erase)


def test_an_unknown_name_is_a_one_line_error_listing_the_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for spec, benchmark in (("tofu/nope", "tofu"), ("nope", "tofu"), ("ctofu/mini", "tofu"), ("x/y", None)):
        with pytest.raises(ConfigError) as err:
            resolve(spec, benchmark)
        message = str(err.value)
        assert err.value.key == "config" and "\n" not in message and repr(spec) in message
        assert all(n in message for n in shipped(benchmark)), message
    res, text = _invoke(tofu_app, "compare", "--config", "tofu/nope")
    assert res.exit_code == 2 and "'tofu/nope' is neither a file nor a shipped config" in text, res.output
    assert "tofu/micro, tofu/mini" in text and "--config" in text and not (tmp_path / "runs").exists()
    res, text = _invoke(tofu_app, "compare", "--config", "voxceleb2/ecapa_fsdd")
    assert res.exit_code == 2 and "a config of `mmunlearn voxceleb2`" in text, res.output


@pytest.mark.parametrize("benchmark", sorted(APPS))
def test_configs_lists_the_shipped_configs_with_their_first_comment(benchmark):
    res = CliRunner().invoke(APPS[benchmark], ["configs", "--paths"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    for name, path in shipped(benchmark).items():
        line = next(line for line in lines if line.startswith(name + " "))
        assert describe(path) in line and describe(path)
        assert str(path) in res.output
    res = CliRunner().invoke(APPS[benchmark], ["configs", "--help"])
    assert res.exit_code == 0 and "shipped" in res.output and "--paths" in res.output


def test_tofu_micro_runs_through_the_cli_with_tiny_overrides(tofu_micro, tmp_path, monkeypatch):
    """The shipped quick check, as a user runs it (``--config tofu/micro``), kept tiny by KEY=VALUE overrides: one
    method, no sweep, the forget metrics; the world is the session's micro models (their cache)."""
    monkeypatch.chdir(tmp_path)
    res, _ = _invoke(
        tofu_app,
        "compare",
        "--config",
        "tofu/micro",
        f"out={tmp_path / 'out'}",
        f"cache_dir={tofu_micro.cache_dir}",
        "device=cpu",
        "threads=1",
        "max_new_tokens=8",
        "metrics=forget",
        "methods=t3",
        "sweep=false",
    )
    assert res.exit_code == 0, res.output
    saved = json.loads((tmp_path / "out" / "compare.json").read_text())
    context = saved["context"]
    assert (context["preset"], context["data"], context["forget_split"]) == (
        "micro",
        "synthetic:n_authors=10",
        "forget10",
    )  # from the shipped file
    assert context["max_new_tokens"] == 8 and context["metrics"] == ["forget"]  # from the overrides
    assert [r["method"] for r in saved["rows"]] == ["target model", "retain model", "t3"]
    assert (tmp_path / "out" / "t3" / "TOFU_EVAL.json").is_file() and not (tmp_path / "runs").exists()


#: what makes each benchmark's run tiny; the rest of the config is its own
TINY = {
    "tofu": [
        "preset=micro",
        f"data={TOFU_DATA}",
        "authors=none",
        "forget_split=forget10",
        "max_new_tokens=24",
        "metrics=forget",
        "methods=grad_diff",
        "epochs=1",
        "sweep=false",
        "utility_items=none",
        "rule_retain_items=none",
        "audit_attacks=quantise",
    ],
    "ctofu": [
        "preset=micro",
        "data=synthetic",
        "authors=1",
        "facts=2",
        "langs=en,fr",
        "max_new_tokens=8",
        "methods=grad_diff",
        "epochs=1",
        "sweep=false",
    ],
    "voxceleb2": [
        "preset=tiny",
        "methods=grad_diff",
        "epochs=1",
        "sweep=false",
        "scope=all",
        "train_epochs=2",
        "audit_attacks=quantise",
    ],
    "requests": ["preset=tiny", "extract=gradient", "train_epochs=2", "gd_epochs=1", "batch=false", "threads=1"],
    "requests_tofu": [
        "preset=micro",
        f"data={TOFU_DATA}",
        "authors=none",
        "extract=gradient",
        "gd_epochs=1",
        "threads=1",
    ],
}
#: the table each command writes in its --out
TABLE = {
    ("tofu", "compare"): "compare.json",
    ("ctofu", "compare"): "compare.json",
    ("voxceleb2", "speaker"): "speaker.json",
    ("voxceleb2", "sample"): "sample.json",
    ("requests", "requests"): "requests.json",
}


#: the cTOFU run builds its own world's models (40 s here), tofu/smollm2_gpu200 its own fine-tuning's: kept for
#: `make test-all` (the SmolLM2 ones are rehearsed end to end in test_rehearsal.py)
SLOW_RUNS = {"ctofu/mini", "ctofu/smollm2", "ctofu/smollm2_gpu", "ctofu/smollm2_gpu_ja", "tofu/smollm2_gpu200"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_RUNS else n for n in sorted(SHIPPED)]
)
def test_every_shipped_config_runs_on_the_smallest_preset(name, request, tmp_path, monkeypatch):
    """Each config as a user runs it (``--config NAME``), its own settings kept, only size, data and work made tiny
    by KEY=VALUE overrides (TOFU on the session's micro world, speakers on the tiny espeak corpus), one method."""
    monkeypatch.chdir(tmp_path)  # a config's relative out/workdir land here, never in the repository
    benchmark, command = _command(name)
    if benchmark == "requests":  # no --out: its tables and work folder are settings; the tiny corpus or its own
        return _run_requests(name, request, tmp_path, monkeypatch)
    overrides = [*TINY[benchmark], f"out={tmp_path / 'out'}", "device=cpu", "threads=1"]
    if benchmark == "tofu":
        overrides.append(f"cache_dir={request.getfixturevalue('tofu_micro').cache_dir}")
    table = tmp_path / "out" / TABLE[(benchmark, command)]
    if benchmark == "voxceleb2":
        overrides += [f"manifests={request.getfixturevalue('speaker_manifests')}", f"workdir={tmp_path / 'work'}"]
        if read_yaml(SHIPPED[name]).get("model") == "speech-llm":  # its own size setting and table
            overrides = [o for o in overrides if o.split("=")[0] not in CLASSIFIER_ONLY]  # refused on a speech LLM
            overrides += [
                "llm=tiny",
                *(f"{key}=none" for key in ("reference", "retrained") if read_yaml(SHIPPED[name]).get(key)),
            ]  # the real model's folders
            table = tmp_path / "out" / command / "results.json"
    if benchmark == "ctofu" and read_yaml(SHIPPED[name]).get("forget_lang", "en") not in ("en", "fr"):
        overrides.append("forget_lang=fr")  # the synthetic world speaks en and fr only
    res = CliRunner().invoke(APPS[benchmark], [command, "--config", name, *overrides])
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    rows = json.loads(table.read_text())["rows"]
    assert "grad_diff" in {r["method"] for r in rows}
    assert not (tmp_path / "runs").exists()


def _run_requests(name: str, request, tmp_path: Path, monkeypatch) -> None:
    """``bench requests --config NAME`` on the tiny manifests (a built-in corpus's config with its sizes set back to
    the defaults, which a prepared corpus takes: the smallest built-in corpus takes minutes to synthesise), or a TOFU
    config on the session's micro world."""
    from mmunlearn.cli import app as root_app

    table = tmp_path / "out" / TABLE[("requests", "requests")]
    overrides = [f"json={table}", f"markdown={tmp_path / 'out' / 'requests.md'}", f"workdir={tmp_path / 'work'}"]
    if read_yaml(SHIPPED[name]).get("dataset") == "tofu":  # the session's micro models, in their own cache
        monkeypatch.setenv(CACHE_ENV, str(request.getfixturevalue("tofu_micro").cache_dir))
        overrides += TINY["requests_tofu"]
    else:
        overrides += [*TINY["requests"], f"manifests={request.getfixturevalue('speaker_manifests')}"]
        defaults = {f.name: f.default for f in dataclasses.fields(RequestsConfig)}
        overrides += [f"{key}={defaults[key]}" for key in BUILT_IN if key in read_yaml(SHIPPED[name])]
    res = CliRunner().invoke(root_app, ["bench", "requests", "--config", name, *overrides])
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    rows = json.loads(table.read_text())["rows"]
    assert {"grad_diff", "qr-erase"} <= {r["method"] for r in rows}
    assert not (tmp_path / "runs").exists()
