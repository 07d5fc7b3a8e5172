"""Recipe configs from a YAML file and ``key=value`` overrides, typed by the config dataclass's fields.

A recipe's settings are one dataclass (fields declared with :func:`mmunlearn.config.opt`, checked in its
``__post_init__``). :func:`build_config` layers, later over earlier: the dataclass defaults, a command's own
defaults, a YAML file (read with ``yaml.safe_load`` only: a file's tags never construct Python objects), the
options given on the command line, then ``key=value`` overrides. Every value is converted to its field's type
(:func:`coerce`); an unknown key is an error that lists the valid ones.

Method knobs: ``method_options`` maps a registered method's name to fields of its config dataclass
(``method_options: {rmu: {steering: 8, layer: 2}}`` in YAML, ``method_options.rmu.steering=8`` or
``method.rmu.steering=8`` as an override, ``--method-option rmu.steering=8`` on the command line); each value
is converted to that field's type and reaches only that method (:func:`parse_method_options`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import os
import re
import stat

import yaml

from mmunlearn.methods import get, names

#: The config field holding per-method settings, and the override prefixes that address it.
METHOD_OPTIONS = "method_options"
_PREFIXES = ("method_options.", "method.")


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
            raise yaml.composer.ComposerError(None, None, f"alias *{event.anchor} refused (anchors and aliases are "
                                              "not read in config files: write the values out)", event.start_mark)
        return super().compose_node(parent, index)


_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


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
            raise ConfigError(f"the config file {path} is {st.st_size} bytes, more than a config may have "
                              f"({MAX_CONFIG_BYTES})")
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
        raise ConfigError(f"the config file {path} is not plain YAML (only plain values are read; tags that "
                          f"build objects and aliases are refused): {' '.join(str(e).split())}") from None
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
        if (value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null"))) \
                and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {' or '.join(_describe(a) for a in args)}, got {value!r}", key)
    if origin in (tuple, list):
        if isinstance(value, str):
            value = _text(value) if value.strip().startswith("[") else [v.strip() for v in value.split(",")
                                                                            if v.strip()]
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
                value.strip().lower(), value)
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, str):
            value = _text(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, str):
            value = _text(value)
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


def _method_fields(name: str, kind: str | None) -> dict[str, Any]:
    """The settings of method ``name`` a recipe may set: its config's fields, and ``extract_<f>`` for the fields of
    a nested ``extract`` config (as :func:`mmunlearn.config.with_overrides` takes them). ``kind`` None: any
    registered method (a recipe whose model kind is a setting checks it applies)."""
    try:
        spec = get(name, kind)
    except ValueError:
        models = f" for {kind} models" if kind is not None else ""
        raise ConfigError(f"{METHOD_OPTIONS}: unknown method {name!r}{models}; choose from "
                          f"{', '.join(names(kind))}", METHOD_OPTIONS) from None
    found = {}
    for key, tp in field_types(spec.config).items():
        if key == "extract" and dataclasses.is_dataclass(tp):
            found.update({f"extract_{k}": t for k, t in field_types(tp).items()})
        else:
            found[key] = tp
    return found


def parse_method_options(raw: Mapping[str, Any], kind: str | None = "text") -> dict[str, dict[str, Any]]:
    """``{method: {field: value}}`` checked against each registered method's config and typed by its fields (a
    nested ``extract`` mapping becomes ``extract_<field>``)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{METHOD_OPTIONS}: expected a mapping of method names to settings, got {raw!r}",
                          METHOD_OPTIONS)
    out: dict[str, dict[str, Any]] = {}
    for name, settings in raw.items():
        known = _method_fields(str(name), kind)
        if not isinstance(settings, Mapping):
            raise ConfigError(f"{METHOD_OPTIONS}.{name}: expected a mapping of settings, got {settings!r}",
                              METHOD_OPTIONS)
        flat: dict[str, Any] = {}
        for key, value in settings.items():
            if key == "extract" and isinstance(value, Mapping):
                flat.update({f"extract_{k}": v for k, v in value.items()})
            else:
                flat[str(key)] = value
        typed = {}
        for key, value in flat.items():
            if key not in known:
                raise ConfigError(f"{METHOD_OPTIONS}.{name}: no setting {key!r}; settings of {name}: "
                                  f"{', '.join(sorted(known))}", METHOD_OPTIONS)
            typed[key] = coerce(value, known[key], f"{METHOD_OPTIONS}.{name}.{key}")
        out[str(name)] = {**out.get(str(name), {}), **typed}
    return out


def _nest(dotted: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"rmu.steering": v}`` as ``{"rmu": {"steering": v}}``."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in dotted.items():
        name, sep, setting = key.rpartition(".")
        if not sep or not name or not setting:
            raise ConfigError(f"method option {key!r}: write METHOD.SETTING=VALUE (e.g. rmu.steering=8)",
                              METHOD_OPTIONS)
        out.setdefault(name, {})[setting] = value
    return out


def build_config(cls: type, *, allowed: Collection[str] | None = None, defaults: Mapping[str, Any] | None = None,
                 file: str | Path | None = None, given: Mapping[str, Any] | None = None,
                 overrides: Iterable[str] = (), method_settings: Iterable[str] = (), kind: str | None = "text") -> Any:
    """An instance of the config dataclass ``cls`` from its layers (module docstring), each value typed by its field.

    ``allowed``: the keys this command takes (default: every field); ``given``: options given on the command
    line (typed already, or text); ``overrides``: ``key=value`` texts; ``method_settings``: ``method.setting=value``
    texts (``--method-option``). A :class:`ConfigError` for an unknown key, a wrong type or a value the config's
    checks refuse.
    """
    types_ = field_types(cls)
    allowed = set(types_ if allowed is None else allowed)
    values: dict[str, Any] = dict(defaults or {})
    extra: dict[str, dict[str, Any]] = {}

    def put(key: str, value: Any, source: str) -> None:
        if key not in allowed or key not in types_:
            raise ConfigError(f"unknown setting {key!r} ({source}); valid settings: {', '.join(sorted(allowed))}",
                              key)
        if key == METHOD_OPTIONS:
            for name, settings in parse_method_options(value, kind).items():
                extra[name] = {**extra.get(name, {}), **settings}
        else:
            values[key] = coerce(value, types_[key], key)

    if file is not None:
        for key, value in read_yaml(file).items():
            put(str(key), value, f"in {file}")
    for key, value in (given or {}).items():
        put(key, value, "option")
    dotted = {}
    for key, value in parse_assignments(overrides).items():
        prefix = next((p for p in _PREFIXES if key.startswith(p)), None)
        if prefix is not None and METHOD_OPTIONS in allowed:
            dotted[key[len(prefix):]] = value
        else:
            put(key, value, "override")
    dotted.update(parse_assignments(method_settings, "--method-option"))
    if dotted:
        put(METHOD_OPTIONS, _nest(dotted), "override")
    if extra:
        values[METHOD_OPTIONS] = extra
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from None
