"""Typer commands made from a recipe's config dataclass: one ``--option`` per field, declared once (the field's
help text and default), plus ``--config FILE.yaml`` (or a shipped config's name, :mod:`recipes.configs`),
``--method-option METHOD.SETTING=VALUE`` and ``key=value`` arguments; the command body receives the whole config
(:func:`recipes.recipe_config.build_config`). :func:`configs_command` adds a benchmark's ``configs`` listing.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from mmunlearn.atomic import write_json_atomic
from mmunlearn.errors import UnsafePathError
from mmunlearn.layout import MARKER
from recipes.configs import ROOT as CONFIGS_ROOT
from recipes.configs import describe, resolve, shipped
from recipes.recipe_config import METHOD_OPTIONS, ConfigError, build_config, field_types

_SCALARS = (str, int, float, bool, Path)
#: Parameters every config command has besides the config's fields.
EXTRA = ("ctx", "config", "method_option", "overrides")


def _cli_type(tp: Any) -> Any:
    """The type Typer parses a field's option as: the field's own for a scalar (optional or not), else text
    (converted by the config loader)."""
    if tp in _SCALARS:
        return tp
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(args) == 1 and args[0] in _SCALARS and type(None) in typing.get_args(tp):
        return Optional[args[0]]
    return Optional[str]


def _cli_default(value: Any, cli_type: Any) -> Any:
    if cli_type is Optional[str] and isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    if cli_type is Optional[str] and value is not None and not isinstance(value, str):
        return str(value)
    return value


def option_flag(key: str) -> str:
    """The command-line option of a config field (``ft_epochs`` -> ``--ft-epochs``)."""
    return "--" + key.replace("_", "-")


#: what a recipe folder written before recipes marked their --out holds (any one of them: the folder is ours)
RECIPE_FILES = ("compare.json", "run.json", "speaker.json", "sample.json", "models.json", "TOFU_EVAL.json")


def check_out(out: str | Path | None) -> None:
    """Refuse a recipe ``--out`` that is a link, a file, or a folder holding anything but what mmunlearn wrote (its
    :data:`MARKER`, or a recipe's results from before the marker): the run would overwrite its files (e.g. a
    ``speaker.md`` of yours). A new or empty folder is fine."""
    if out is None:
        return
    out = Path(out)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UnsafePathError(f"--out {out} is a link or not a folder: give a new folder")
    if out.is_dir() and not (out / MARKER).is_file() and any(out.iterdir()) and not any(
            (out / name).is_file() for name in RECIPE_FILES):
        raise UnsafePathError(f"--out {out} is a folder mmunlearn did not write (no {MARKER}, and not empty): "
                              "the run would overwrite its files; give a new or empty folder")


def mark_out(out: str | Path | None) -> None:
    """Mark a recipe's ``--out`` folder, once it exists, as written by mmunlearn (so a later run may write there)."""
    if out is not None and Path(out).is_dir() and not Path(out).is_symlink() and not (Path(out) / MARKER).exists():
        write_json_atomic(Path(out) / MARKER, {"tool": "mmunlearn", "what": "recipe output"})


def config_command(app: typer.Typer, cls: type, *, name: str, exclude: Collection[str] = (),
                   defaults: Mapping[str, Any] | None = None, kind: str | None = "text",
                   benchmark: str | None = None) -> Callable:
    """A decorator: ``body(cfg)`` becomes the command ``name`` of ``app`` whose options are the fields of ``cls``
    but ``exclude`` (and ``method_options``, set by ``--method-option``), with ``defaults`` over the fields'
    defaults; ``kind``: the model kind whose methods ``--method-option`` may set (None: any registered method);
    ``benchmark``: the recipe whose shipped configs ``--config NAME`` names (:func:`recipes.configs.resolve`); a
    config error is a usage error naming the option."""
    types_ = field_types(cls)
    keys = [k for k in types_ if k not in exclude]
    shown = [k for k in keys if k != METHOD_OPTIONS]
    clash = [k for k in shown if k in EXTRA]
    if clash:
        raise TypeError(f"{cls.__name__}: fields {clash} clash with the command's own parameters")
    base = {f.name: f.default if f.default is not dataclasses.MISSING else None
            for f in dataclasses.fields(cls) if f.name in shown and f.default_factory is dataclasses.MISSING}
    base.update({k: v for k, v in (defaults or {}).items() if k in shown})
    helps = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}

    def decorate(body: Callable[[Any], None]) -> Callable:
        params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
                  inspect.Parameter("overrides", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                    annotation=Annotated[Optional[list[str]], typer.Argument(
                                        help="Settings as KEY=VALUE (over --config and the options); "
                                             "method_options.METHOD.SETTING=VALUE for a method's own settings.",
                                        show_default=False)]),
                  inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None,
                                    annotation=Annotated[Optional[Path], typer.Option(
                                        help=_config_help(benchmark))])]
        if METHOD_OPTIONS in keys:
            params.append(inspect.Parameter("method_option", inspect.Parameter.KEYWORD_ONLY, default=None,
                                            annotation=Annotated[Optional[list[str]], typer.Option(
                                                help="A setting of one method's config, METHOD.SETTING=VALUE (e.g. "
                                                     "rmu.steering=8; `mmunlearn methods` lists them); repeatable.",
                                                show_default=False)]))
        for key in shown:
            cli_type = _cli_type(types_[key])
            flag = option_flag(key)
            flags = f"{flag}/--no-{flag[2:]}" if cli_type is bool else flag
            params.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY,
                                            default=_cli_default(base.get(key), cli_type),
                                            annotation=Annotated[cli_type, typer.Option(flags,
                                                                                        help=helps.get(key, ""))]))

        @functools.wraps(body)
        def command(ctx: typer.Context, overrides=None, *, config=None, method_option=None, **options: Any) -> None:
            # typer may bring its own copy of click: the source is told by its name
            given = {k: v for k, v in options.items()
                     if getattr(ctx.get_parameter_source(k), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")}
            command_defaults = {k: v for k, v in base.items() if k not in given}
            try:
                file = resolve(config, benchmark) if config is not None else None
                cfg = build_config(cls, allowed=keys, defaults=command_defaults, file=file, given=given,
                                   overrides=overrides or (), method_settings=method_option or (), kind=kind)
            except ConfigError as e:
                hint = option_flag(e.key) if e.key in shown else {METHOD_OPTIONS: "--method-option",
                                                                  "config": "--config"}.get(e.key or "")
                raise typer.BadParameter(str(e), param_hint=hint) from None
            out = getattr(cfg, "out", None)
            check_out(out)
            try:
                body(cfg)
            finally:
                mark_out(out)

        del command.__wrapped__  # Typer reads the signature below, not the body's
        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        return app.command(name)(command)

    return decorate


def _config_help(benchmark: str | None) -> str:
    names = list(shipped(benchmark)) if benchmark is not None else []
    shipped_names = f" ({', '.join(names)}; `mmunlearn {benchmark} configs` says what each runs)" if names else ""
    return ("YAML file of settings, or the name of a shipped config" + shipped_names + " (keys: the options' names "
            "with '_'; read with yaml.safe_load; a file path wins over a name); options and KEY=VALUE arguments "
            "override it.")


def configs_command(app: typer.Typer, benchmark: str) -> None:
    """Add ``configs`` to ``app``: it lists ``benchmark``'s shipped configs with their first comment lines."""

    def configs(
        paths: Annotated[bool, typer.Option("--paths/--no-paths", help="Also print each config's file (copy one to "
                                                                       "edit it).")] = False,
    ) -> None:
        found = shipped(benchmark)
        width = max((len(n) for n in found), default=0)
        for config_name, path in found.items():
            typer.echo(f"{config_name:<{width}}  {describe(path)}" + (f"\n{'':<{width}}  {path}" if paths else ""))
        if not found:
            typer.echo(f"no shipped {benchmark} configs (in {CONFIGS_ROOT / benchmark})")

    configs.__doc__ = (f"List the configs shipped for {benchmark} (recipes/configs/{benchmark}/*.yaml) with what each "
                       f"runs; run one with `--config NAME` and override it with options or KEY=VALUE arguments.")
    app.command("configs")(configs)


def help_of(cls: type, key: str) -> str:
    """The help text of field ``key`` of the config dataclass ``cls`` (for commands that take single options)."""
    return next(f.metadata.get("help", "") for f in dataclasses.fields(cls) if f.name == key)


def require(cfg: Any, *keys: str) -> None:
    """A usage error for a setting a command needs that neither an option, the file nor an override gave."""
    for key in keys:
        if getattr(cfg, key) is None:
            raise typer.BadParameter(f"missing: give {option_flag(key)} (or '{key}:' in the --config file, or "
                                     f"{key}=VALUE)", param_hint=option_flag(key))
