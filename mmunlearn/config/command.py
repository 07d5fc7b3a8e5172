"""Library commands with settings beside their options: a command's rarely used knobs are fields of a dataclass,
given as ``KEY=VALUE`` arguments (or ``--key VALUE``, as the options were once spelled) or in a YAML file named by
``--config``, and listed with their help and default under the command's ``--help`` (:func:`settings_command`).
So every command keeps a handful of options (``tests/test_cli_options.py``); the recipes' config commands
(``recipes/recipe_cli.py``) read their settings the same way (:mod:`mmunlearn.config.settings`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import typing
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from mmunlearn.config.settings import (
    ConfigError,
    field_types,
    given_settings,
    option_flag,
    settings_from_args,
    settings_help,
)

#: The parameters :func:`settings_command` adds to a command (its function must not use these names).
ADDED = ("overrides", "config")


def check_settings(cls: type, given: Mapping[str, Any]) -> None:
    """Build ``cls`` from the ``given`` settings (its other fields at their defaults), so that its checks refuse a
    bad value before any work: a :class:`ConfigError` naming the setting (a ValueError's: the given setting its
    message names as a word)."""
    try:
        cls(**given)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        named = [k for k in given if re.search(rf"\b{re.escape(k)}\b", str(e))]
        raise ConfigError(str(e), max(named, key=len) if named else None) from None


def settings_command(
    app: typer.Typer,
    cls: type,
    keys: Collection[str],
    *,
    name: str | None = None,
    param: str = "settings",
    shown: Mapping[str, Any] | None = None,
) -> Callable:
    """A decorator: the function becomes the command ``name`` of ``app`` with its own options plus the settings
    ``keys`` (fields of the dataclass ``cls``): ``KEY=VALUE`` arguments or ``--key VALUE``, over ``--config
    FILE.yaml``. The function receives, as its parameter ``param``, the settings given (typed by their fields and
    checked by building ``cls`` from them; one not given is absent, so the function's own default applies). ``shown``:
    defaults to show in ``--help`` instead of the fields' (e.g. when they depend on the model)."""
    types_ = field_types(cls)
    keys = tuple(keys)
    unknown = [k for k in keys if k not in types_]
    if unknown:
        raise TypeError(f"{cls.__name__}: settings {unknown} are not fields of the dataclass")
    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        for f in dataclasses.fields(cls)
        if f.name in keys
    }
    defaults.update(shown or {})

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(fn, include_extras=True)  # the options' Annotated[...], not their text
        own = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(fn).parameters.values()
            if p.name != param
        ]
        clash = [p.name for p in own if p.name in ADDED]
        if clash:
            raise TypeError(f"{fn.__name__}: parameters {clash} clash with the settings' own")

        @functools.wraps(fn)
        def command(*args: Any, overrides: list[str] | None = None, config: Path | None = None, **options: Any) -> Any:
            try:
                given = given_settings(
                    cls, keys, file=config, overrides=settings_from_args(overrides or (), types_, keys)
                )
                check_settings(cls, given)
            except ConfigError as e:
                hint = (
                    f"{e.key} ({option_flag(e.key)})"
                    if e.key in keys
                    else "--config"
                    if e.key is None and config is not None and "config file" in str(e)
                    else None
                )
                raise typer.BadParameter(str(e), param_hint=hint) from None
            return fn(*args, **options, **{param: given})

        params = [*own, *_added()]
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        command.typer_kwargs = dict(  # type: ignore[attr-defined]
            epilog=settings_help(cls, keys, defaults, types_) or None, context_settings={"ignore_unknown_options": True}
        )  # --key VALUE reaches `overrides`
        app.command(name, **command.typer_kwargs)(command)  # type: ignore[attr-defined]
        return command

    return decorate


def _added() -> list[inspect.Parameter]:
    return [
        inspect.Parameter(
            "overrides",
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[
                list[str] | None,
                typer.Argument(
                    help="Settings as KEY=VALUE (or --key VALUE), over --config; listed below.",
                    show_default=False,
                    metavar="KEY=VALUE",
                ),
            ],
        ),
        inspect.Parameter(
            "config",
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[
                Path | None,
                typer.Option(
                    help="YAML file of settings (the keys listed below; read with a safe loader); "
                    "KEY=VALUE arguments override it."
                ),
            ],
        ),
    ]


def mount(app: typer.Typer, name: str, command: Callable[..., Any]) -> None:
    """Add a command function to another app under ``name``, with what :func:`settings_command` (or a recipe's
    config command) told Typer about it (its settings listing; ``--key VALUE`` reaching the settings)."""
    app.command(name, **getattr(command, "typer_kwargs", {}))(command)
