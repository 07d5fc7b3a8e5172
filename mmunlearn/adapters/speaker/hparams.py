"""Safe reading of a speaker folder's ``hyperparams.yaml``: parsed with tags kept inert, refused unless every tag is on
the allow-list, ``!ref`` resolved here, and the modules described as plain data (:class:`SpeakerSpec`).

**Reading runs nothing the folder names.** HyperPyYAML, which SpeechBrain uses, imports and calls
whatever a ``!new:``/``!apply:``/``!name:`` tag names (``pwn: !apply:os.system [...]`` runs a shell
command), reads ``!include:`` files and even evaluates ``(...)`` tuples with PyYAML's unsafe loader.
So by default :func:`~mmunlearn.adapters.speaker.io.read_speaker_dir` never hands the file to HyperPyYAML:
it parses it with PyYAML's ``SafeLoader``, under which every tag becomes inert data (:class:`Tagged`); refuses the
file, before anything is constructed, if any tag anywhere in it is not ``!ref``/``!copy``/
``!tuple`` or a ``!new:``/``!name:`` of the allow-list (:data:`ALLOWED_NEW`, :data:`ALLOWED_NAME`);
resolves the ``!ref`` s itself; and builds the four modules from the resulting plain data through an
explicit table of imported classes (:class:`~mmunlearn.adapters.speaker.model.SpeakerSpec`).
Checking tags and then letting HyperPyYAML build the modules would not be enough: its tuple
resolver runs PyYAML's unsafe loader on plain strings, which no tag check sees.
"""

from __future__ import annotations

import ast
import operator
import os
import re
from collections.abc import Mapping
from typing import Any

import yaml

from mmunlearn.adapters.speaker.model import (
    ACTIVATIONS,
    DEFAULT_MARGIN,
    DEFAULT_SCALE,
    LABEL_ENCODER,
    MODULE_CLASSES,
    PRETRAINER,
    ExtraModule,
    ModuleSpec,
    NameRef,
    SpeakerSpec,
)

#: The hyperparameter file of a speaker folder.
HPARAMS = "hyperparams.yaml"
_MODULE_TARGETS = tuple(t for ts in MODULE_CLASSES.values() for t in ts)
#: Classes a safe read accepts as ``!new:`` (anywhere in the file; only the four modules are built).
ALLOWED_NEW: frozenset[str] = frozenset(_MODULE_TARGETS + (PRETRAINER, LABEL_ENCODER))
#: Names a safe read accepts as ``!name:``.
ALLOWED_NAME: frozenset[str] = ALLOWED_NEW | frozenset(ACTIVATIONS)
_VALUE_TAGS = ("!ref", "!copy", "!tuple")
#: A parsed file expanding to more nodes than this is refused (aliases can multiply a small file).
_MAX_NODES = 100_000
_TRUST_HINT = (
    "If you trust this folder, load it with trust_hparams=True (--trust-hparams), "
    "which runs the code hyperparams.yaml names."
)


class Tagged:
    """A YAML value with a tag (``!new:...``, ``!ref``, ``!!python/...``), kept as inert data: nothing is
    imported or called while parsing."""

    __slots__ = ("tag", "value", "line")

    def __init__(self, tag: str, value: Any, line: int):
        self.tag, self.value, self.line = tag, value, line

    def __repr__(self) -> str:
        return f"Tagged({self.tag!r}, {self.value!r})"


class _HparamsLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, plus: every tag it has no constructor for becomes a :class:`Tagged`."""


def _construct_tagged(loader: yaml.SafeLoader, tag: str, node: yaml.Node) -> Tagged:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if tag == "!tuple":  # HyperPyYAML's "(a, b)"; its own loader is unsafe here, ours is not
        if not isinstance(value, str) or not (value.startswith("(") and value.endswith(")")):
            raise yaml.constructor.ConstructorError(None, None, f"!tuple needs '(...)', got {value!r}", node.start_mark)
        value = yaml.safe_load("[" + value[1:-1] + "]")
    return Tagged(tag, value, node.start_mark.line + 1)


_HparamsLoader.add_multi_constructor("", _construct_tagged)  # the catch-all: any unknown tag, incl. !!python/
_HparamsLoader.add_implicit_resolver("!tuple", re.compile(r"^\(.*\)$"), ["("])


def parse_hparams(text: str, file: str | os.PathLike = HPARAMS) -> dict[str, Any]:
    """``hyperparams.yaml`` text as a dict whose tagged values are :class:`Tagged` (nothing executed)."""
    try:
        tree = yaml.load(text, Loader=_HparamsLoader)  # noqa: S506  (SafeLoader subclass, see above)
    except yaml.YAMLError as exc:
        raise ValueError(f"{file}: not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise ValueError(f"{file}: nested too deeply") from None
    if not isinstance(tree, dict):
        raise ValueError(f"{file}: expected a mapping of keys at the top, got {type(tree).__name__}")
    return tree


def _walk_tags(tree: Any, file: str | os.PathLike) -> list[tuple[str, int, str]]:
    """Every tag in ``tree`` as (key path, line, tag); ValueError past :data:`_MAX_NODES` nodes
    (counted as a tree, so YAML aliases cannot blow up the later steps)."""
    found, count = [], 0
    stack: list[tuple[str, Any]] = [("", tree)]
    while stack:
        path, node = stack.pop()
        count += 1
        if count > _MAX_NODES:
            raise ValueError(f"{file}: more than {_MAX_NODES} values (after expanding aliases); refused")
        if isinstance(node, Tagged):
            found.append((path or "(top)", node.line, node.tag))
            stack.append((path, node.value))
        elif isinstance(node, dict):
            for k, v in node.items():
                sub = str(k) if not path else f"{path}[{k}]"
                stack.append((f"{sub} (key)", k))
                stack.append((sub, v))
        elif isinstance(node, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(node))
    return sorted(found, key=lambda f: f[1])


def _refused(tag: str) -> bool:
    if tag in _VALUE_TAGS:
        return False
    for prefix, allowed in (("!new:", ALLOWED_NEW), ("!name:", ALLOWED_NAME)):
        if tag.startswith(prefix):
            return tag[len(prefix) :] not in allowed
    return True


def check_hparams_tags(tree: Mapping[str, Any], file: str | os.PathLike = HPARAMS) -> None:
    """ValueError naming the file, the keys and the tags if any tag of ``tree`` is outside the allow-list."""
    bad = [(key, line, tag) for key, line, tag in _walk_tags(tree, file) if _refused(tag)]
    if not bad:
        return
    listed = "; ".join(f"key {key!r} (line {line}) uses {tag}" for key, line, tag in bad[:5])
    more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
    raise ValueError(
        f"{file}: refused, nothing in it was run or built: {listed}{more}. A speaker-classifier "
        f"{HPARAMS} may only use !ref, !copy, !tuple and !new:/!name: of {sorted(ALLOWED_NEW)} "
        f"(!name: also {list(ACTIVATIONS)}). {_TRUST_HINT}"
    )


_REF = re.compile(r"<([^<>]*)>")
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


class _NotArithmetic(Exception):
    pass


def _arithmetic(text: str) -> Any:
    """HyperPyYAML's reference arithmetic (``<a> * 2``) on numbers only; anything else stays a string."""
    if len(text) > 200:  # references are short; long strings are paths or text, never sums
        return text
    try:
        body = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return text

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            value = ev(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise _NotArithmetic

    try:
        return ev(body)
    except (_NotArithmetic, ArithmeticError, RecursionError):
        return text


class _Resolver:
    """Resolves ``!ref``/``!copy``/``!tuple`` of a parsed tree to plain values; other tags stay :class:`Tagged`."""

    def __init__(self, tree: Mapping[str, Any], file: str | os.PathLike):
        self.tree, self.file = tree, file
        self.steps = 0  # values produced: references can multiply like YAML aliases, so they are counted

    def value(self, node: Any, where: str, seen: tuple[str, ...] = ()) -> Any:
        self.steps += 1
        if self.steps > _MAX_NODES:
            raise ValueError(f"{self.file}: more than {_MAX_NODES} values after resolving references; refused")
        if isinstance(node, Tagged):
            if node.tag in ("!ref", "!copy"):
                return self._ref(node.value, where, seen)
            if node.tag == "!tuple":
                return [self.value(v, where, seen) for v in node.value]
            return node
        if isinstance(node, dict):
            return {k: self.value(v, f"{where}[{k}]", seen) for k, v in node.items()}
        if isinstance(node, list):
            return [self.value(v, f"{where}[{i}]", seen) for i, v in enumerate(node)]
        return node

    def _ref(self, text: Any, where: str, seen: tuple[str, ...]) -> Any:
        if not isinstance(text, str):
            raise ValueError(f"{self.file}: {where}: !ref needs a '<key>' string, got {text!r}")
        whole = _REF.fullmatch(text.strip())
        if whole:
            return self._deref(whole.group(1), where, seen)

        def substitute(match: re.Match) -> str:
            value = self._deref(match.group(1), where, seen)
            if isinstance(value, (Tagged, dict, list)):
                raise ValueError(f"{self.file}: {where}: <{match.group(1)}> is not a scalar to put in a string")
            return str(value)

        return _arithmetic(_REF.sub(substitute, text))

    def _deref(self, key: str, where: str, seen: tuple[str, ...]) -> Any:
        if key in seen:
            raise ValueError(f"{self.file}: {where}: circular reference {' -> '.join((*seen, key))}")
        if "." in key:
            raise ValueError(
                f"{self.file}: {where}: attribute references (<{key}>) call getattr and are not "
                f"supported. {_TRUST_HINT}"
            )
        node: Any = self.tree
        for part in key.split("["):
            part = part.strip().rstrip("]").strip()
            if isinstance(node, Tagged) and isinstance(node.value, (dict, list)):
                node = node.value  # <module[argument]>: an argument of a !new: object, as HyperPyYAML allows
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise ValueError(f"{self.file}: {where}: reference <{key}> names no value")
        return self.value(node, key, (*seen, key))


def _arguments(node: Tagged, resolver: _Resolver, where: str) -> tuple[list, dict]:
    """A ``!new:`` node's positional and keyword arguments, resolved, with ``!name:`` as :class:`NameRef`."""
    raw = resolver.value(node.value, where)

    def plain(value: Any, at: str) -> Any:
        if isinstance(value, Tagged):
            if value.tag.startswith("!name:"):
                try:
                    return NameRef(value.tag[len("!name:") :])
                except ValueError as exc:
                    raise ValueError(f"{resolver.file}: {at}: {exc}") from None
            raise ValueError(
                f"{resolver.file}: {at}: {value.tag} is not supported as an argument "
                "(only plain values, !ref and !name: of an activation)"
            )
        if isinstance(value, dict):
            return {k: plain(v, f"{at}[{k}]") for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v, f"{at}[{i}]") for i, v in enumerate(value)]
        return value

    if isinstance(raw, dict):
        return [], {k: plain(v, f"{where}[{k}]") for k, v in raw.items()}
    if isinstance(raw, list):
        return [plain(v, f"{where}[{i}]") for i, v in enumerate(raw)], {}
    if raw in (None, ""):
        return [], {}
    return [plain(raw, where)], {}


def _module(tree: Mapping[str, Any], resolver: _Resolver, role: str) -> ModuleSpec | None:
    file = resolver.file
    if role not in tree:
        return None
    node = resolver.value(tree[role], role)
    allowed = MODULE_CLASSES[role]
    if not isinstance(node, Tagged) or not node.tag.startswith("!new:") or node.tag[len("!new:") :] not in allowed:
        got = node.tag if isinstance(node, Tagged) else type(node).__name__
        raise ValueError(f"{file}: {role} must be !new:{' or !new:'.join(allowed)}, got {got}")
    args, kwargs = _arguments(node, resolver, role)
    return ModuleSpec.bind(node.tag[len("!new:") :], args, kwargs, where=f"{file}: {role}")


def _keys(node: Any) -> list[str]:
    """The keys of a mapping node (a ``!new:`` node's arguments when tagged); none for anything else."""
    node = node.value if isinstance(node, Tagged) else node
    return [str(k) for k in node] if isinstance(node, dict) else []


def _extras(tree: Mapping[str, Any], resolver: _Resolver) -> tuple[ExtraModule, ...]:
    """Every module the file names besides the four and the label encoder -- in ``modules`` or in the pretrainer's
    ``loadables`` -- as data (:class:`ExtraModule`; its checkpoint is read with the folder). Each must be defined at
    the top level under that name, as a ``!new:`` of the allow-list."""
    pretrainer = tree.get("pretrainer")
    loadables = (
        _keys(pretrainer.value.get("loadables"))
        if isinstance(pretrainer, Tagged) and isinstance(pretrainer.value, dict)
        else []
    )
    names = [
        k
        for k in dict.fromkeys([*_keys(tree.get("modules")), *loadables])
        if k not in MODULE_CLASSES and k != "label_encoder"
    ]
    extras = []
    for name in names:
        node = resolver.value(tree[name], name) if name in tree else None
        if not isinstance(node, Tagged) or not node.tag.startswith("!new:"):
            raise ValueError(
                f"{resolver.file}: module {name!r} (named in modules or the pretrainer's loadables) "
                "must be defined at the top level under that name as a !new: of the allow-list"
            )
        args, kwargs = _arguments(node, resolver, name)
        module = ModuleSpec.bind(node.tag[len("!new:") :], args, kwargs, where=f"{resolver.file}: {name}")
        extras.append(ExtraModule(name, module, loadable=name in loadables))
    return tuple(extras)


def _scalar(tree: Mapping[str, Any], resolver: _Resolver, key: str, default: Any) -> Any:
    value = resolver.value(tree[key], key) if key in tree else default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{resolver.file}: {key} must be a number, got {value!r}")
    return value


def spec_from_hparams(tree: Mapping[str, Any], file: str | os.PathLike = HPARAMS) -> SpeakerSpec:
    """The :class:`SpeakerSpec` a parsed ``hyperparams.yaml`` describes (its four modules and the
    ``sample_rate``/``aam_margin``/``aam_scale`` scalars); ValueError naming the file otherwise."""
    try:
        return _spec_from_hparams(tree, file)
    except RecursionError:
        raise ValueError(f"{file}: nested too deeply") from None


def _spec_from_hparams(tree: Mapping[str, Any], file: str | os.PathLike) -> SpeakerSpec:
    resolver = _Resolver(tree, file)
    missing = [k for k in ("compute_features", "embedding_model", "classifier") if k not in tree]
    if missing:
        raise ValueError(f"{file} defines no {missing}")
    modules = {role: _module(tree, resolver, role) for role in MODULE_CLASSES}
    extras = _extras(tree, resolver)
    sample_rate = _scalar(tree, resolver, "sample_rate", 16000)
    if isinstance(sample_rate, float) and sample_rate.is_integer():
        sample_rate = int(sample_rate)
    try:
        return SpeakerSpec(
            **modules,
            sample_rate=sample_rate,
            margin=float(_scalar(tree, resolver, "aam_margin", DEFAULT_MARGIN)),
            scale=float(_scalar(tree, resolver, "aam_scale", DEFAULT_SCALE)),
            extras=extras,
        )
    except ValueError as exc:
        raise ValueError(f"{file}: {exc}") from None
