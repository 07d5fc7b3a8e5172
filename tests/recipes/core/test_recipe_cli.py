"""Benchmark commands' surface (no model work): a handful of options each, every other setting listed in --help and
taken as KEY=VALUE or as --key VALUE (the spelling of the old options), both building the same config."""

import dataclasses
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from mmunlearn.cli import app as root_app
from recipes.ctofu.config import CTofuConfig
from recipes.recipe_cli import OPTIONS, config_command, settings_from_args
from recipes.recipe_config import ConfigError, field_types
from recipes.tofu.config import COMPARE_EXCLUDES, RUN_EXCLUDES, TofuConfig
from recipes.voxceleb2.config import VoxCelebConfig

#: the benchmark commands: path under `mmunlearn`, options declared beyond OPTIONS, config, fields not taken
REPO = Path(__file__).resolve().parents[3]
BENCHMARKS = [
    (("tofu", "run"), (), TofuConfig, RUN_EXCLUDES),
    (("tofu", "compare"), (), TofuConfig, COMPARE_EXCLUDES),
    (("ctofu", "run"), ("langs",), CTofuConfig, RUN_EXCLUDES),
    (("ctofu", "compare"), ("langs",), CTofuConfig, COMPARE_EXCLUDES),
    (("voxceleb2", "speaker"), ("manifests", "model"), VoxCelebConfig, ()),
    (("voxceleb2", "sample"), ("manifests", "model"), VoxCelebConfig, ()),
]


def _command(path):
    cmd = typer.main.get_command(root_app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd


@pytest.mark.parametrize("path,extra,config,excluded", BENCHMARKS, ids=[" ".join(b[0]) for b in BENCHMARKS])
def test_a_benchmark_command_has_a_handful_of_options_and_lists_every_other_setting(path, extra, config, excluded):
    cmd = _command(path)
    options = [p.name for p in cmd.params if type(p).__name__.endswith("Option") and p.name != "help"]
    assert len(options) <= 10, options
    assert set(options) <= {"config", "method_option", *OPTIONS, *extra}, options
    res = CliRunner().invoke(root_app, [*path, "--help"], terminal_width=200)
    assert res.exit_code == 0, res.output
    help_text = " ".join(res.output.replace("│", " ").split())
    settings = [f.name for f in dataclasses.fields(config) if f.name not in (*options, *excluded, "method_options")]
    assert len(settings) > 10
    for key in settings:  # each with its default and its help text
        assert f"{key}=" in help_text, key
        text = " ".join(next(f for f in dataclasses.fields(config) if f.name == key).metadata["help"].split())
        assert text[:30] in help_text.replace("\\[", "["), (key, text)  # the field's own help (rich escapes '[')


def test_old_option_spellings_and_key_value_build_the_same_config(tmp_path):
    app, seen = typer.Typer(), []

    @config_command(app, CTofuConfig, name="go", exclude=COMPARE_EXCLUDES, options=("langs",))
    def go(cfg):
        seen.append(cfg)

    @app.command()
    def other() -> None:  # a second command keeps "go" a subcommand
        pass

    old = [
        "go",
        "--langs",
        "en,fr",
        "--facts",
        "3",
        "--audit",
        "--no-resume",
        "--retain-bound=0.25",
        "--forget-lang",
        "fr",
        "seed=4",
    ]
    new = [
        "go",
        "--langs",
        "en,fr",
        "facts=3",
        "audit=true",
        "resume=false",
        "retain_bound=0.25",
        "forget_lang=fr",
        "seed=4",
    ]
    for args in (old, new):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
    a, b = seen
    assert a == b
    assert (a.langs, a.facts, a.audit, a.resume, a.retain_bound, a.forget_lang, a.seed) == (
        "en,fr",
        3,
        True,
        False,
        0.25,
        "fr",
        4,
    )
    res = CliRunner().invoke(app, ["go", "--facts"])
    assert res.exit_code == 2 and "--facts needs a value" in res.output
    res = CliRunner().invoke(app, ["go", "--factz", "3"])
    assert res.exit_code == 2 and "no option or setting --factz" in " ".join(res.output.replace("│", " ").split())
    assert not seen[2:]


def test_settings_from_args_reads_switches_values_and_plain_assignments():
    types_ = field_types(CTofuConfig)
    settings = [f.name for f in dataclasses.fields(CTofuConfig) if f.name not in OPTIONS]
    assert settings_from_args(
        ["--sweep", "--no-audit", "--facts", "-1", "seed=2", "--base=base"], types_, settings
    ) == ["sweep=true", "audit=false", "facts=-1", "seed=2", "base=base"]
    with pytest.raises(ConfigError, match="no option or setting --out"):
        settings_from_args(["--out", "x"], types_, settings)  # an option is not a setting: typer parses options


def test_a_run_stopped_by_sigterm_marks_its_folder_so_the_next_run_may_resume_there(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from mmunlearn.files.layout import MARKER
    from recipes.recipe_cli import check_out

    script = tmp_path / "slow.py"
    script.write_text(
        "import time, typer\n"
        "from recipes.recipe_cli import config_command\n"
        "from recipes.tofu.config import COMPARE_EXCLUDES, TofuConfig\n"
        "app = typer.Typer()\n"
        "@config_command(app, TofuConfig, name='go', exclude=COMPARE_EXCLUDES)\n"
        "def go(cfg):\n"
        "    cfg.out.mkdir()\n"
        "    (cfg.out / 'partial.json').write_text('{}')\n"
        "    time.sleep(60)\n"
        "@app.command()\n"
        "def other():\n"
        "    pass\n"
        "app()\n"
    )
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, str(script), "go", "--out", str(out)], cwd=str(REPO))
    deadline = time.monotonic() + 60
    while not (out / "partial.json").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM  # still ended by the signal
    assert (out / MARKER).is_file()
    check_out(out)  # a later run may write there (it raised before the marker was written on SIGTERM)
