"""Every command of the ``mmunlearn`` CLI (the library's, the recipes' mounted by entry point, ``bench requests``)
has at most :data:`MAX_OPTIONS` options (issue 48: "each command <= 12 options, the rest in config files"); the
rest are settings, given as ``KEY=VALUE`` (or ``--key VALUE``, the old option spelling) or in a ``--config`` file
(:mod:`mmunlearn.config.command` for the library's commands, ``recipes/recipe_cli.py`` for the recipes')."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from mmunlearn.cli import app as root_app
from mmunlearn.config import opt
from mmunlearn.config.command import settings_command

MAX_OPTIONS = 12
#: parameters that are not counted: help, the config file (the settings' way in)
NOT_COUNTED = ("help", "config")


def commands(cmd, prefix: str = ""):
    """``(path, click command)`` for every leaf command under ``cmd``."""
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from commands(sub, f"{prefix} {name}".strip())
    else:
        yield prefix, cmd


def options(cmd) -> list[str]:
    """The options of a click command, by their first flag (arguments, --help and --config not counted)."""
    return [p.opts[0] for p in cmd.params if p.param_type_name == "option" and p.name not in NOT_COUNTED]


def test_every_command_has_at_most_twelve_options():
    counts = {path: options(cmd) for path, cmd in commands(typer.main.get_command(root_app))}
    assert len(counts) >= 30 and {"erase", "audit", "bench requests", "voxceleb2 train", "tofu finetune"} <= set(counts)
    over = {path: f"{len(found)}: {' '.join(found)}" for path, found in counts.items() if len(found) > MAX_OPTIONS}
    assert not over, f"commands over {MAX_OPTIONS} options (move the rarely used ones to its settings): {over}"


def test_the_count_sees_a_command_with_many_options():
    app = typer.Typer()

    @app.command()
    def wide(a: int = 0, b: int = 0, c: int = 0, config: str = "", d: bool = False) -> None:
        pass

    @app.command()
    def other() -> None:
        pass

    found = dict(commands(typer.main.get_command(app)))
    assert options(found["wide"]) == ["--a", "--b", "--c", "--d"]


@dataclasses.dataclass(frozen=True)
class _Knobs:
    """Knobs of the test command."""

    steps: int = opt(3, "Steps.")
    rate: float | None = opt(None, "Rate.")
    exact: bool = opt(False, "Exact.")
    names: tuple[str, ...] = opt(("a",), "Names.")

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be at least 1, got {self.steps}")


def _app(seen: list):
    app = typer.Typer()

    @settings_command(app, _Knobs, ("steps", "rate", "exact", "names"), name="go")
    def go(out: Path = typer.Option(..., help="Where."), settings: dict | None = None) -> None:
        seen.append((out, settings))

    @app.command()
    def other() -> None:
        pass

    return app


def test_settings_as_key_value_old_option_spelling_and_config_file_are_the_same(tmp_path):
    seen: list = []
    app = _app(seen)
    file = tmp_path / "knobs.yaml"
    file.write_text("steps: 5\nrate: 0.5\nexact: true\nnames: [x, y]\n")
    runs = (
        ["go", "--out", "o", "steps=5", "rate=0.5", "exact=true", "names=x,y"],
        ["go", "--out", "o", "--steps", "5", "--rate=0.5", "--exact", "--names", "x", "--names", "y"],
        ["go", "--out", "o", "--config", str(file)],
    )
    for args in runs:
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
    assert seen == [(Path("o"), {"steps": 5, "rate": 0.5, "exact": True, "names": ("x", "y")})] * 3
    seen.clear()
    res = CliRunner().invoke(app, ["go", "--out", "o", "--config", str(file), "steps=7", "--no-exact"])
    assert res.exit_code == 0, res.output
    assert seen == [(Path("o"), {"steps": 7, "rate": 0.5, "exact": False, "names": ("x", "y")})]  # args over file
    seen.clear()
    res = CliRunner().invoke(app, ["go", "--out", "o"])
    assert res.exit_code == 0 and seen == [(Path("o"), {})]  # none given: the command's own defaults apply


@pytest.mark.parametrize(
    "args, named",
    [
        (["steps=0"], "steps must be at least 1"),
        (["steps=many"], "steps: expected int"),
        (["speed=2"], "unknown setting 'speed'"),
        (["--speed", "2"], "no option or setting --speed"),
        (["--steps"], "--steps needs a value"),
    ],
)
def test_a_bad_setting_is_a_usage_error_naming_it_before_the_command_runs(args, named):
    seen: list = []
    res = CliRunner().invoke(_app(seen), ["go", "--out", "o", *args], terminal_width=200)
    assert res.exit_code == 2 and named in " ".join(res.output.replace("│", " ").split()), res.output
    assert seen == []


def test_the_settings_are_listed_under_help_with_their_defaults():
    res = CliRunner().invoke(_app([]), ["go", "--help"], terminal_width=200)
    assert res.exit_code == 0
    text = " ".join(res.output.replace("│", " ").split())
    for shown in (
        "steps=3 Steps.",
        "rate=none Rate.",
        "exact=false (switch: --exact) Exact.",
        "names=a Names.",
        "Knobs of the test command (KEY=VALUE)",
    ):
        assert shown in text, shown
