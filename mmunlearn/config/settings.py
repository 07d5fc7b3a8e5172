"""Settings read from text: a YAML file and ``KEY=VALUE`` arguments, each value typed by its dataclass field.

The library's commands that take settings beside their options (:mod:`mmunlearn.config.command`) and the recipes'
config commands (``recipes/recipe_config.py``, ``recipes/recipe_cli.py``) share what is here: :func:`read_yaml` (a
safe loader: tags never build objects, aliases are refused, at most :data:`MAX_CONFIG_BYTES`), :func:`coerce` (text
to a field's type), :func:`settings_from_args` (``key=value``, or ``--key VALUE`` as an option was once spelled) and
:func:`settings_help` (the settings listed in a command's ``--help``). A :class:`ConfigError` names the setting.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import stat
import types
import typing
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A setting that cannot be used; ``key`` names it (None: the file or the config as a whole)."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


#: the largest config file read (settings are a few kilobytes)
MAX_CONFIG_BYTES = 1 << 20


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases (``*name``: a few hundred bytes of nested aliases expand to
    billions of values) and reads numbers as people write them (``1e-3`` is a float, as in YAML 1.2)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.get_event()
            raise yaml.composer.ComposerError(
                None,
                None,
                f"alias *{event.anchor} refused (anchors and aliases are "
                "not read in config files: write the values out)",
                event.start_mark,
            )
        return super().compose_node(parent, index)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def _load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader: tags never build objects


def _read_config_text(path: Path) -> str:
    """The text of a regular file of at most :data:`MAX_CONFIG_BYTES` (a FIFO or device refused before reading)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"the config file {path} is not a regular file (a FIFO, device or folder)")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"the config file {path} is {st.st_size} bytes, more than a config may have ({MAX_CONFIG_BYTES})"
            )
        data = os.read(fd, MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"the config file {path} grew past {MAX_CONFIG_BYTES} bytes while it was read")
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"the config file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML file, read with a safe loader (a tag such as ``!!python/object`` is refused, and so
    are aliases); the file must be a regular file of at most :data:`MAX_CONFIG_BYTES`."""
    path = Path(path)
    try:
        data = _load(_read_config_text(path))
    except OSError as e:
        raise ConfigError(f"cannot read the config file {path}: {e.strerror or e}") from None
    except RecursionError:
        raise ConfigError(f"the config file {path} is nested too deeply") from None
    except yaml.YAMLError as e:
        raise ConfigError(
            f"the config file {path} is not plain YAML (only plain values are read; tags that "
            f"build objects and aliases are refused): {' '.join(str(e).split())}"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"the config file {path} must hold a mapping of settings, not a {type(data).__name__}")
    return data


def _text(value: str) -> Any:
    """A value typed on the command line, read as one plain YAML scalar, list or mapping."""
    try:
        return _load(value)
    except (yaml.YAMLError, RecursionError):
        return value


def _float(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def _describe(tp: Any) -> str:
    if tp is type(None):
        return "none"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` as type ``tp`` (a field's resolved type); text is parsed (``"3"`` -> 3, ``"none"`` -> None for an
    optional field, ``"a,b"`` -> a tuple); a :class:`ConfigError` naming ``key`` when it cannot be."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return _text(value) if isinstance(value, str) else value
    if origin in (typing.Union, types.UnionType):
        if (value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null"))) and type(
            None
        ) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {' or '.join(_describe(a) for a in args)}, got {value!r}", key)
    if origin in (tuple, list):
        if isinstance(value, str):
            value = (
                _text(value) if value.strip().startswith("[") else [v.strip() for v in value.split(",") if v.strip()]
            )
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}", key)
        item = args[0] if args else Any
        items = [coerce(v, item, key) for v in value]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        value = _text(value) if isinstance(value, str) else value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}", key)
        return dict(value)
    if tp is bool:
        if isinstance(value, str):
            value = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}.get(
                value.strip().lower(), value
            )
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, str):
            value = _text(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, str):  # "inf" and "nan" too, as a float option read them: the checks refuse them
            value = _float(value) if isinstance(_float(value), float) else _text(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
    elif dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
    elif isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"{key}: expected {_describe(tp)}, got {value!r}", key)


def field_types(cls: type) -> dict[str, Any]:
    """The resolved type of every init field of the dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def parse_assignments(items: Iterable[str], what: str = "override") -> dict[str, str]:
    """``["a=1", "b.c=x"]`` as ``{"a": "1", "b.c": "x"}`` (the value stays text; a ConfigError otherwise)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{what} {item!r}: write KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def option_flag(key: str) -> str:
    """The command-line option of a config field (``ft_epochs`` -> ``--ft-epochs``)."""
    return "--" + key.replace("_", "-")


def is_flag(tp: Any) -> bool:
    """Whether a field is a switch (``--audit`` / ``--no-audit`` take no value)."""
    return tp is bool or set(typing.get_args(tp)) == {bool, type(None)}


def _is_list(tp: Any) -> bool:
    """Whether a field holds a list or tuple (optional or not)."""
    return any(typing.get_origin(t) in (tuple, list) for t in (tp, *typing.get_args(tp)))


def settings_from_args(args: Sequence[str], types_: Mapping[str, Any], settings: Collection[str]) -> list[str]:
    """The ``key=value`` texts of a command's settings arguments: ``key=value`` as given, ``--key VALUE`` /
    ``--key=VALUE`` for a setting (``--flag`` / ``--no-flag`` for a switch), in their order; a list setting given as
    ``--key A --key B`` (a repeated option) is ``key=A,B``. A ConfigError for a ``--name`` that is no setting, or one
    missing its value."""
    out: list[str] = []
    repeated: dict[str, int] = {}  # a list setting given as --key: where its key=value is in out
    i = 0
    while i < len(args):
        arg = str(args[i])
        i += 1
        if not arg.startswith("--") or len(arg) == 2:
            out.append(arg)
            continue
        flag, eq, value = arg[2:].partition("=")
        key = flag.replace("-", "_")
        if key.startswith("no_") and key[3:] in settings and is_flag(types_[key[3:]]) and not eq:
            out.append(f"{key[3:]}=false")
        elif key in settings and is_flag(types_[key]) and not eq:
            out.append(f"{key}=true")
        elif key in settings:
            if not eq:
                if i >= len(args):
                    raise ConfigError(f"{arg} needs a value ({key}=VALUE)", key)
                value, i = str(args[i]), i + 1
            if key in repeated:
                out[repeated[key]] += f",{value}"
                continue
            if _is_list(types_[key]):
                repeated[key] = len(out)
            out.append(f"{key}={value}")
        else:
            raise ConfigError(
                f"no option or setting {arg.split('=')[0]}; settings: {', '.join(sorted(settings))} (see --help)", None
            )
    return out


def settings_help(cls: type, settings: Collection[str], defaults: Mapping[str, Any], types_: Mapping[str, Any]) -> str:
    """The settings of a command for its ``--help``: one paragraph per part of the config (the class in ``cls``'s
    bases that last declares them: shared settings first, then the benchmark's own), each ``key=DEFAULT  help``."""
    owner: dict[str, type] = {}
    for klass in cls.__mro__:  # most derived first: a field a benchmark re-declares is its own
        for key in vars(klass).get("__annotations__", {}):
            owner.setdefault(key, klass)
    helps = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}
    parts: list[str] = []
    for klass in reversed(cls.__mro__):
        keys = [k for k in settings if owner.get(k) is klass]
        if not keys:
            continue
        first = (inspect.getdoc(klass) or klass.__name__).split("\n\n")[0]  # the docstring's first paragraph
        title = " ".join(first.split()).rstrip(".").replace("``", "")
        lines = [
            f"{k}={shown_default(defaults.get(k))}"
            + (f"  (switch: --{k.replace('_', '-')})" if is_flag(types_[k]) else "")
            + "  "
            + helps[k].replace("[", "\\[")
            for k in keys
        ]
        parts.append(f"[bold]{title}[/bold] (KEY=VALUE)\n\n" + "\n\n".join(lines))
    return "\n\n".join(parts)


def shown_default(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value)) or "none"
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def given_settings(
    cls: type, keys: Collection[str], *, file: str | Path | None = None, overrides: Iterable[str] = ()
) -> dict[str, Any]:
    """The settings among ``keys`` (fields of the dataclass ``cls``) that a YAML ``file`` and then ``key=value``
    ``overrides`` give, later over earlier, each typed by its field (:func:`coerce`); only those given. A
    :class:`ConfigError` naming the key for one that is not among ``keys`` or cannot be read as its type."""
    types_ = field_types(cls)
    values: dict[str, Any] = {}

    def put(key: str, value: Any, source: str) -> None:
        if key not in keys or key not in types_:
            raise ConfigError(f"unknown setting {key!r} ({source}); valid settings: {', '.join(sorted(keys))}", key)
        values[key] = coerce(value, types_[key], key)

    if file is not None:
        for key, value in read_yaml(file).items():
            put(str(key), value, f"in {file}")
    for key, value in parse_assignments(overrides).items():
        put(key, value, "override")
    return values
