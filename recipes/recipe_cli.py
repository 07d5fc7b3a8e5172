"""Typer commands made from a recipe's config dataclass: a handful of ``--options`` (:data:`OPTIONS`: where the
output goes, which methods, which model and data, which device), ``--config FILE.yaml`` (or a shipped config's name,
:mod:`recipes.configs`), ``--method-option METHOD.SETTING=VALUE``, and every other field as a setting given
``key=value`` (or ``--key VALUE``, as the options were once spelled), listed with its help under the command's
``--help`` by the part of the config that declares it. The command body receives the whole config
(:func:`recipes.recipe_config.build_config`). :func:`configs_command` adds a benchmark's ``configs`` listing.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

# option_flag and settings_from_args are also imported from here by the recipes and tests
from mmunlearn.config.settings import is_flag, option_flag, settings_from_args, settings_help  # noqa: F401
from mmunlearn.errors import UnsafePathError
from mmunlearn.files.atomic import terminate_raises, write_json_atomic
from mmunlearn.files.layout import MARKER
from recipes.configs import ROOT as CONFIGS_ROOT
from recipes.configs import describe, resolve, shipped
from recipes.recipe_config import METHOD_OPTIONS, ConfigError, build_config, field_types

_SCALARS = (str, int, float, bool, Path)
#: Parameters every config command has besides the config's fields.
EXTRA = ("ctx", "config", "method_option", "overrides")
#: The config fields a benchmark command declares as options (those its config has); the rest are settings.
OPTIONS = ("out", "method", "methods", "preset", "data", "device")


@dataclasses.dataclass(frozen=True)
class ConfigCommand:
    """A command made by :func:`config_command`: its config class, the fields it takes (``keys``), the kind whose
    methods ``--method-option`` may set and the body it runs (what ``tests/recipes/core/test_settings_reach.py`` walks:
    every setting a command takes reaches its run or is refused)."""

    cls: type
    name: str
    keys: tuple[str, ...]
    kind: str | None
    body: Callable[[Any], None]


#: Every command :func:`config_command` made, in the order the recipe modules were imported.
CONFIG_COMMANDS: list[ConfigCommand] = []


def _cli_type(tp: Any) -> Any:
    """The type Typer parses a field's option as: the field's own for a scalar (optional or not), else text
    (converted by the config loader)."""
    if tp in _SCALARS:
        return tp
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(args) == 1 and args[0] in _SCALARS and type(None) in typing.get_args(tp):
        return args[0] | None
    return str | None


def _cli_default(value: Any, cli_type: Any) -> Any:
    if cli_type == (str | None) and isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    if cli_type == (str | None) and value is not None and not isinstance(value, str):
        return str(value)
    return value


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
    if (
        out.is_dir()
        and not (out / MARKER).is_file()
        and any(out.iterdir())
        and not any((out / name).is_file() for name in RECIPE_FILES)
    ):
        raise UnsafePathError(
            f"--out {out} is a folder mmunlearn did not write (no {MARKER}, and not empty): "
            "the run would overwrite its files; give a new or empty folder"
        )


def mark_out(out: str | Path | None) -> None:
    """Mark a recipe's ``--out`` folder, once it exists, as written by mmunlearn (so a later run may write there)."""
    if out is not None and Path(out).is_dir() and not Path(out).is_symlink() and not (Path(out) / MARKER).exists():
        write_json_atomic(Path(out) / MARKER, {"tool": "mmunlearn", "what": "recipe output"})


def config_command(
    app: typer.Typer,
    cls: type,
    *,
    name: str,
    exclude: Collection[str] = (),
    defaults: Mapping[str, Any] | None = None,
    kind: str | None = "text",
    benchmark: str | None = None,
    options: Collection[str] = (),
    listed: bool = True,
) -> Callable:
    """A decorator: ``body(cfg)`` becomes the command ``name`` of ``app`` taking the fields of ``cls`` but
    ``exclude``: those in :data:`OPTIONS` or ``options`` (a benchmark's own) as ``--options``, the others as
    settings (``key=value`` or ``--key VALUE``; ``method_options`` by ``--method-option``), with ``defaults`` over
    the fields' defaults; ``kind``: the kind whose methods ``--method-option`` may set (None: any); ``benchmark``:
    whose shipped configs ``--config NAME`` names (``listed``: by ``mmunlearn <benchmark> configs``); a config error is
    a usage error naming the option or setting. The command function carries what Typer is told about it
    (``typer_kwargs``), so that another app mounts it the same (:func:`mmunlearn.config.command.mount`)."""
    types_ = field_types(cls)
    keys = [k for k in types_ if k not in exclude]
    shown = [k for k in keys if k != METHOD_OPTIONS]
    _check_fields(cls, shown, options, types_)
    declared = [k for k in shown if k in OPTIONS or k in options]
    settings = [k for k in shown if k not in declared]
    base = {
        f.name: f.default if f.default is not dataclasses.MISSING else None
        for f in dataclasses.fields(cls)
        if f.name in shown and f.default_factory is dataclasses.MISSING
    }
    base.update({k: v for k, v in (defaults or {}).items() if k in shown})
    helps = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}

    def decorate(body: Callable[[Any], None]) -> Callable:
        params = _parameters(benchmark, METHOD_OPTIONS in keys, bool(settings), listed)
        params += [_option(key, types_[key], base.get(key), helps.get(key, "")) for key in declared]

        @functools.wraps(body)
        def command(ctx: typer.Context, overrides=None, *, config=None, method_option=None, **options: Any) -> None:
            # typer may bring its own copy of click: the source is told by its name
            given = {
                k: v
                for k, v in options.items()
                if getattr(ctx.get_parameter_source(k), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")
            }
            command_defaults = {k: v for k, v in base.items() if k not in given}
            try:
                file = resolve(config, benchmark) if config is not None else None
                assignments = settings_from_args(overrides or (), types_, settings)
                cfg = build_config(
                    cls,
                    allowed=keys,
                    defaults=command_defaults,
                    file=file,
                    given=given,
                    overrides=assignments,
                    method_settings=method_option or (),
                    kind=kind,
                )
            except ConfigError as e:
                hint = (
                    option_flag(e.key)
                    if e.key in declared
                    else f"{e.key} ({option_flag(e.key)})"
                    if e.key in settings
                    else {METHOD_OPTIONS: "--method-option", "config": "--config"}.get(e.key or "")
                )
                raise typer.BadParameter(str(e), param_hint=hint) from None
            out = getattr(cfg, "out", None)
            check_out(out)
            with terminate_raises():  # a run stopped by SIGTERM marks its folder too: the next run resumes there
                try:
                    body(cfg)
                finally:
                    mark_out(out)

        CONFIG_COMMANDS.append(ConfigCommand(cls, name, tuple(keys), kind, body))
        del command.__wrapped__  # Typer reads the signature below, not the body's
        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        # unknown --key tokens reach `overrides`, where settings_from_args reads them as settings
        command.typer_kwargs = dict(
            epilog=settings_help(cls, settings, base, types_) or None,
            context_settings={"ignore_unknown_options": True} if settings else None,
        )
        return app.command(name, **command.typer_kwargs)(command)

    return decorate


def _check_fields(cls: type, shown: Collection[str], options: Collection[str], types_: Mapping[str, Any]) -> None:
    """A config class whose fields clash with a command's own parameters, or options naming no field: a TypeError."""
    clash = [k for k in shown if k in EXTRA]
    if clash:
        raise TypeError(f"{cls.__name__}: fields {clash} clash with the command's own parameters")
    unknown = [k for k in options if k not in types_]
    if unknown:
        raise TypeError(f"{cls.__name__}: options {unknown} are not fields of the config")


def _parameters(
    benchmark: str | None, method_options: bool, settings: bool, listed: bool = True
) -> list[inspect.Parameter]:
    """The parameters every config command has before its declared options: the settings argument, --config and
    (when the config has method settings) --method-option."""
    what = (
        "Settings as KEY=VALUE (or --key VALUE), over --config and the options; the settings are listed below"
        if settings
        else "Settings as KEY=VALUE, over --config and the options"
    )
    params = [
        inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
        inspect.Parameter(
            "overrides",
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=None,
            annotation=Annotated[
                list[str] | None,
                typer.Argument(
                    help=what
                    + ("; method_options.METHOD.SETTING=VALUE for a method's own settings." if method_options else "."),
                    show_default=False,
                ),
            ],
        ),
        inspect.Parameter(
            "config",
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[Path | None, typer.Option(help=_config_help(benchmark, listed))],
        ),
    ]
    if method_options:
        params.append(
            inspect.Parameter(
                "method_option",
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[
                    list[str] | None,
                    typer.Option(
                        help="A setting of one method's config, METHOD.SETTING=VALUE (e.g. "
                        "rmu.steering=8; `mmunlearn methods` lists them); repeatable.",
                        show_default=False,
                    ),
                ],
            )
        )
    return params


def _option(key: str, tp: Any, default: Any, help: str) -> inspect.Parameter:
    """The ``--option`` of a declared config field (``--flag/--no-flag`` for a switch)."""
    cli_type = _cli_type(tp)
    flag = option_flag(key)
    flags = f"{flag}/--no-{flag[2:]}" if cli_type is bool else flag
    return inspect.Parameter(
        key,
        inspect.Parameter.KEYWORD_ONLY,
        default=_cli_default(default, cli_type),
        annotation=Annotated[cli_type, typer.Option(flags, help=help)],
    )


def _config_help(benchmark: str | None, listed: bool = True) -> str:
    names = list(shipped(benchmark)) if benchmark is not None else []
    says = (
        f"`mmunlearn {benchmark} configs` says what each runs"
        if listed
        else f"the first comment line of recipes/configs/{benchmark}/NAME.yaml says what it runs"
    )
    shipped_names = f" ({', '.join(names)}; {says})" if names else ""
    return (
        "YAML file of settings, or the name of a shipped config" + shipped_names + " (keys: the options' names "
        "with '_'; read with yaml.safe_load; a file path wins over a name); options and KEY=VALUE arguments "
        "override it."
    )


def configs_command(app: typer.Typer, benchmark: str) -> None:
    """Add ``configs`` to ``app``: it lists ``benchmark``'s shipped configs with their first comment lines."""

    def configs(
        paths: Annotated[
            bool, typer.Option("--paths/--no-paths", help="Also print each config's file (copy one to edit it).")
        ] = False,
    ) -> None:
        found = shipped(benchmark)
        width = max((len(n) for n in found), default=0)
        for config_name, path in found.items():
            typer.echo(f"{config_name:<{width}}  {describe(path)}" + (f"\n{'':<{width}}  {path}" if paths else ""))
        if not found:
            typer.echo(f"no shipped {benchmark} configs (in {CONFIGS_ROOT / benchmark})")

    configs.__doc__ = (
        f"List the configs shipped for {benchmark} (recipes/configs/{benchmark}/*.yaml) with what each "
        f"runs; run one with `--config NAME` and override it with options or KEY=VALUE arguments."
    )
    app.command("configs")(configs)


def help_of(cls: type, key: str) -> str:
    """The help text of field ``key`` of the config dataclass ``cls`` (for commands that take single options)."""
    return next(f.metadata.get("help", "") for f in dataclasses.fields(cls) if f.name == key)


def require(cfg: Any, *keys: str) -> None:
    """A usage error for a setting a command needs that neither an option, the file nor an override gave."""
    for key in keys:
        if getattr(cfg, key) is None:
            raise typer.BadParameter(
                f"missing: give {option_flag(key)} (or '{key}:' in the --config file, or {key}=VALUE)",
                param_hint=option_flag(key),
            )
