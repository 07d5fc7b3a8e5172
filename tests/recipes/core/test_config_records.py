"""A record names the shipped config that reproduces it (its ``config`` field, ``report record --recipe-config``), and
that config gives the same settings as the command the record ran: the record's command (the ``mmunlearn
<benchmark> <command> ...`` in its ``command`` field) and ``--config NAME`` are parsed by the real command into
configs that are equal field by field, bar the differences a config declares in its header (listed here with the
reason). So a record's figures reproduce from ``--config NAME``; a config whose header names a record is named back
by it."""

import dataclasses
import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mmunlearn.cli import app as root_app
from recipes import recipe_cli
from recipes.configs import describe, shipped
from recipes.ctofu.cli import app as ctofu_app
from recipes.tofu.cli import app as tofu_app
from recipes.voxceleb2.cli import app as voxceleb2_app

REPO = Path(__file__).resolve().parents[3]
#: the app each benchmark's commands are called on (``bench``: the root app, ``bench requests`` joining it through
#: its entry point)
APPS = {"tofu": tofu_app, "ctofu": ctofu_app, "voxceleb2": voxceleb2_app}
#: config -> the settings it deliberately sets otherwise than its record's command, and why (said in its header)
DIFFERS = {"voxceleb2/hf_audio_fsdd": {"scope"}}  # the record ran when scope all was the kind's only scope
REAL_BUILD = recipe_cli.build_config
#: a benchmark command in a record's command field: it ends at ";", a parenthesis or ", " (prose follows)
COMMAND = re.compile(r"mmunlearn (tofu|ctofu|voxceleb2|bench) ([a-z][a-z-]*)((?:[^;(),]|,(?!\s))*)")


def _record_of(path: Path) -> str | None:
    """The record a config's header says it reproduces (``the table NAME``) or makes (``the record NAME``)."""
    header = " ".join(line.lstrip("# ") for line in path.read_text().splitlines() if line.startswith("#"))
    found = re.search(r"the (?:table|record) ([A-Za-z0-9_]+)", header)
    return found.group(1) if found else None


RECORDS = {p.stem: json.loads(p.read_text()) for p in sorted((REPO / "docs" / "results").glob("*.json"))}
#: (config, record) for every record that names its config
PAIRS = [(rec["config"], name) for name, rec in RECORDS.items() if rec.get("config")]


class _Captured(Exception):
    pass


def _config(monkeypatch, benchmark: str, args: list[str]):
    """The config the real command builds from ``args`` (nothing run: the build is caught)."""
    seen = []

    def capture(*a, **k):
        seen.append(REAL_BUILD(*a, **k))
        raise _Captured

    monkeypatch.setattr(recipe_cli, "build_config", capture)
    res = CliRunner().invoke(*((APPS[benchmark], args) if benchmark in APPS else (root_app, [benchmark, *args])))
    assert seen and isinstance(res.exception, _Captured), f"{args}: {res.output}"
    return seen[0]


def test_a_config_naming_a_record_is_named_back_by_it():
    named = {name: record for name, path in shipped().items() if (record := _record_of(path)) in RECORDS}
    assert {
        "tofu/smollm2",
        "voxceleb2/ecapa_fsdd",
        "voxceleb2/ecapa_fsdd_sample",
        "voxceleb2/hf_audio_fsdd",
        "tofu/micro",
        "tofu/mini",
    } <= set(named)
    assert all(RECORDS[record].get("config") == name for name, record in named.items())
    assert all(config in shipped() for config, _ in PAIRS)


@pytest.mark.parametrize("name, record", PAIRS)
def test_a_config_reproduces_the_command_of_its_record(monkeypatch, name, record):
    benchmark, command = describe(shipped()[name]).replace(":", " ").split()[:2]
    recorded = RECORDS[record]["command"]
    runs = [m for m in COMMAND.finditer(recorded) if (m.group(1), m.group(2)) == (benchmark, command)]
    assert runs, f"{record}'s command runs no `mmunlearn {benchmark} {command}`: {recorded[:200]}"
    args = [command, *shlex.split(runs[0].group(3))]
    from_record = _config(monkeypatch, benchmark, args)
    from_config = _config(monkeypatch, benchmark, [command, "--config", name])
    skip = DIFFERS.get(name, set())
    a, b = dataclasses.asdict(from_record), dataclasses.asdict(from_config)
    assert {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}
    assert all(a[k] != b[k] for k in skip)  # a declared difference is one
