"""Recipe configs (no model work): YAML + key=value layers, typing, refused keys / types / YAML tags, and every
registered method's every setting reaching that method's config through the recipe path."""

import dataclasses
import typing

import pytest
from typer.testing import CliRunner

from mmunlearn.methods import get, names
from recipes.ctofu.cli import app as ctofu_app
from recipes.ctofu.config import CTofuConfig
from recipes.recipe_config import ConfigError, _method_fields, build_config
from recipes.tofu.cli import app as tofu_app
from recipes.tofu.config import COMPARE_EXCLUDES, RUN_EXCLUDES, TofuConfig

RUN_KEYS = [f.name for f in dataclasses.fields(TofuConfig) if f.name not in RUN_EXCLUDES]
#: valid text values for the methods' text settings, two each (a test picks one that differs from the default)
TEXT_VALUES = {
    "subspace": ("svd", "cpqr"),
    "layer_rule": ("top", "all"),
    "extract_kind": ("lora", "gradient"),
    "pooling": ("last", "cummean"),
    "task_matrix": ("update", "extract"),
    "subtract": ("own", "swept"),
    "retain_model": ("models/retain", "models/other"),
    "sweep_pick": ("utility", "first"),
    "sweep_retain": ("needed", "every"),
}
#: valid numbers for the methods' bounded number settings (the doubling below would leave their range)
NUMBER_VALUES = {"round_share": (0.5, 0.75)}


def _yaml(tmp_path, text, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_yaml_then_options_then_overrides_each_typed(tmp_path):
    path = _yaml(
        tmp_path,
        "method: rmu\nout: runs/x\nauthors: 4\nretain_bound: 1\nsweep: true\n"
        "max_new_tokens: 32\nmethod_options:\n  rmu: {steering: 8, layer: 1}\n",
    )
    cfg = build_config(
        TofuConfig,
        allowed=RUN_KEYS,
        defaults={"preset": "micro"},
        file=path,
        given={"authors": 6},
        overrides=["max_new_tokens=auto", "rule_retain_items=5", "sweep=no", "method.rmu.alpha=3"],
        method_settings=["rmu.steering=9.5"],
    )
    assert (cfg.method, cfg.authors, cfg.max_new_tokens, cfg.sweep) == ("rmu", 6, "auto", False)
    assert cfg.retain_bound == 1.0 and isinstance(cfg.retain_bound, float) and cfg.rule_retain_items == 5
    assert str(cfg.out) == "runs/x" and cfg.preset == "micro"
    assert cfg.method_options == {"rmu": {"steering": 9.5, "layer": 1, "alpha": 3.0}}
    # the shared knobs reach every method with that setting, a method's own settings only that method
    cfg = dataclasses.replace(cfg, lr=0.25)
    assert cfg.method_overrides("rmu") == {"lr": 0.25, "steering": 9.5, "layer": 1, "alpha": 3.0}
    assert cfg.method_overrides("grad_diff") == {"lr": 0.25}
    compare = build_config(
        TofuConfig,
        allowed=[k for k in RUN_KEYS + ["methods"] if k not in COMPARE_EXCLUDES],
        overrides=["methods=rmu,t3"],
    )
    assert compare.chosen() == ["rmu", "t3"] and build_config(TofuConfig).chosen() == names("text")


@pytest.mark.parametrize(
    "overrides, key, message",
    [
        (["nope=1"], "nope", "valid settings: authors, base,"),
        (["audit=true"], "audit", "unknown setting 'audit'"),  # a compare setting, not run's
        (["authors=many"], "authors", "expected int or none"),
        (["sweep=maybe"], "sweep", "expected bool"),
        (["retain_bound=[1, 2]"], "retain_bound", "expected float"),
        (["authors=0"], "authors", "positive integer"),
        (["max_new_tokens=long"], "max_new_tokens", "positive integer or 'auto'"),
        (["precision=fp8"], "precision", "choose from no, bf16"),
        (["ft_lr=0"], "ft_lr", "lr must be positive"),
        (["methods=qr-erase"], "methods", "unknown setting"),
        (["method.rmu.nope=1"], "method_options", "settings of rmu: alpha, batch_size, epochs, layer"),
        (["method.nothing.lr=1"], "method_options", "unknown method 'nothing'"),
        (["method.rmu.steering=strong"], "method_options.rmu.steering", "expected float"),
        (["authors"], None, "write KEY=VALUE"),
    ],
)
def test_bad_settings_are_errors_naming_the_setting(overrides, key, message):
    with pytest.raises(ConfigError, match=None) as err:
        build_config(TofuConfig, allowed=RUN_KEYS, overrides=overrides)
    assert message in str(err.value) and (key is None or err.value.key == key or key in str(err.value))


def test_only_plain_yaml_is_read(tmp_path):
    marker = tmp_path / "ran"
    unsafe = _yaml(tmp_path, f"method: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError, match="not plain YAML"):
        build_config(TofuConfig, file=unsafe)
    assert not marker.exists()
    for text, message in (
        ("- a\n- b\n", "must hold a mapping"),
        ("method: [unclosed\n", "not plain YAML"),
        ("method_options: {rmu: 3}\n", "expected a mapping of settings"),
    ):
        with pytest.raises(ConfigError, match=message):
            build_config(TofuConfig, file=_yaml(tmp_path, text, "other.yaml"))
    with pytest.raises(ConfigError, match="cannot read"):
        build_config(TofuConfig, file=tmp_path / "missing.yaml")


def _changed(name: str, tp, default) -> tuple[str, object]:
    """A text for the setting ``name`` of type ``tp`` that differs from ``default``, and the value it means."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    base = args[0] if typing.get_origin(tp) in (typing.Union, __import__("types").UnionType) else tp
    if name in TEXT_VALUES:
        value = next(v for v in TEXT_VALUES[name] if v != default)
        return value, value
    if name in NUMBER_VALUES:
        value = next(v for v in NUMBER_VALUES[name] if v != default)
        return repr(value), value
    if base is bool:
        return str(not default).lower(), not default
    if base is int:
        value = (default or 1) + 2
        return str(value), value
    if base is float or base is typing.Any and not isinstance(default, tuple):
        value = float(default) * 2 + 0.5 if isinstance(default, (int, float)) else 0.75
        return repr(value), value
    if typing.get_origin(base) is tuple:
        item = typing.get_args(base)[0]
        value = (item(2), item(3))
        return f"{value[0]},{value[1]}", value
    if typing.get_origin(base) is dict:
        return "{strength: 2}", {"strength": 2}
    raise AssertionError(f"no test value for the setting {name} ({tp}); add one to this test")


def _setting(cfg, name: str):
    if name.startswith("extract_") and hasattr(cfg, "extract"):
        return getattr(cfg.extract, name[len("extract_") :])
    return getattr(cfg, name)


@pytest.mark.parametrize("method", names())
def test_every_setting_of_every_method_reaches_its_config(method, tmp_path):
    """Through ``--method-option`` and through the YAML file, tofu's and ctofu's configs alike."""
    assert method in names("text"), "every registered method should be reachable from the text recipes"
    default = get(method).config_for("text", "micro")
    for name, tp in _method_fields(method, "text").items():
        text, value = _changed(name, tp, _setting(default, name))
        by_option = build_config(TofuConfig, method_settings=[f"{method}.{name}={text}"])
        by_file = build_config(CTofuConfig, file=_yaml(tmp_path, f"method_options:\n  {method}:\n    {name}: {text}\n"))
        for cfg in (by_option, by_file):
            run = get(method).config_for("text", "micro", **cfg.method_overrides(method))
            assert _setting(run, name) == value, (name, text)
            other = next(m for m in names("text") if get(m).config is not get(method).config)
            assert cfg.method_overrides(other) == {}  # reaches no other method


def test_cli_config_errors_are_usage_errors_before_any_work(tmp_path):
    bad = _yaml(tmp_path, "method: rmu\nout: " + str(tmp_path / "o") + "\nsteering: 8\n")
    cases = [
        (tofu_app, ["run", "--config", bad], "unknown setting 'steering'"),
        (tofu_app, ["run", "--out", tmp_path / "o"], "missing: give --method"),
        (
            tofu_app,
            ["run", "--method", "rmu", "--out", tmp_path / "o", "--method-option", "rmu.depth=2"],
            "no setting 'depth'",
        ),
        (tofu_app, ["compare", "--out", tmp_path / "o", "methods=qr-erase,nothing"], "unknown methods ['nothing']"),
        (ctofu_app, ["run", "--config", bad, "--cache-dir", tmp_path / "c"], "unknown setting 'steering'"),
        (ctofu_app, ["compare", "--out", tmp_path / "o", "train_text=raw"], "choose from"),
    ]
    for app, args, message in cases:
        res = CliRunner().invoke(app, [str(a) for a in args])
        text = " ".join(res.output.replace("│", " ").split())
        assert res.exit_code == 2 and message in text, (args, res.output)
    assert not (tmp_path / "o").exists() and not (tmp_path / "c").exists()


def test_a_command_layers_the_file_over_its_defaults_and_its_options_over_the_file(tmp_path):
    import typer

    from recipes.recipe_cli import config_command

    app, seen = typer.Typer(), []

    @config_command(app, TofuConfig, name="go", exclude=COMPARE_EXCLUDES, defaults={"preset": "mini", "sweep": True})
    def go(cfg):
        seen.append(cfg)

    @app.command()
    def other() -> None:  # a second command keeps "go" a subcommand
        pass

    path = _yaml(tmp_path, "preset: micro\nauthors: 4\nsweep: false\nmethods: [rmu]\n")
    res = CliRunner().invoke(
        app, ["go", "--config", str(path), "--authors", "6", "retain_bound=0.5", "--method-option", "rmu.layer=2"]
    )
    assert res.exit_code == 0, res.output
    cfg = seen.pop()
    assert (cfg.preset, cfg.sweep, cfg.authors, cfg.retain_bound, cfg.methods) == ("micro", False, 6, 0.5, ("rmu",))
    assert cfg.method_options == {"rmu": {"layer": 2}}
    assert CliRunner().invoke(app, ["go", "--no-sweep"]).exit_code == 0
    cfg = seen.pop()
    assert (cfg.preset, cfg.sweep, cfg.authors) == ("mini", False, None)  # the command's default, an option
