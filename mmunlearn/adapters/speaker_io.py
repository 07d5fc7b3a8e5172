"""Speaker-classifier directories in SpeechBrain's pretrained ``EncoderClassifier`` layout: write, and read safely.

Layout (as speechbrain/spkrec-ecapa-voxceleb on the hub)::

    hyperparams.yaml       HyperPyYAML: compute_features, mean_var_norm, embedding_model, classifier, ...
    embedding_model.ckpt   torch.save(state_dict) of the ECAPA-TDNN
    classifier.ckpt        torch.save(state_dict) of the cosine Classifier
    label_encoder.ckpt     SpeechBrain CategoricalEncoder: 'speaker_id' => class index

Reading also accepts ``label_encoder.txt`` (the hub's name for it; preferred when both exist).
Other files (``mean_var_norm_emb.ckpt``, used by SpeechBrain only for normalised verification
embeddings) are ignored.

**Reading runs nothing the folder names.** HyperPyYAML, which SpeechBrain uses, imports and calls
whatever a ``!new:``/``!apply:``/``!name:`` tag names (``pwn: !apply:os.system [...]`` runs a shell
command), reads ``!include:`` files and even evaluates ``(...)`` tuples with PyYAML's unsafe loader.
So by default :func:`read_speaker_dir` never hands the file to HyperPyYAML: it parses it with
PyYAML's ``SafeLoader``, under which every tag becomes inert data (:class:`Tagged`); refuses the
file, before anything is constructed, if any tag anywhere in it is not ``!ref``/``!copy``/
``!tuple`` or a ``!new:``/``!name:`` of the allow-list (:data:`ALLOWED_NEW`, :data:`ALLOWED_NAME`);
resolves the ``!ref`` s itself; and builds the four modules from the resulting plain data through an
explicit table of imported classes (:class:`~mmunlearn.adapters.speaker_model.SpeakerSpec`).
Checking tags and then letting HyperPyYAML build the modules would not be enough: its tuple
resolver runs PyYAML's unsafe loader on plain strings, which no tag check sees. Checkpoints are read
with ``torch.load(weights_only=True)``, which refuses pickled code, and are checked against the
module shapes on PyTorch's ``meta`` device before any weight memory is allocated.

``trust_hparams=True`` loads ``hyperparams.yaml`` with HyperPyYAML as SpeechBrain does, i.e. **runs
the code the file names**: only for folders you trust. Either way :func:`write_speaker_dir` writes a
``hyperparams.yaml`` generated from the model's :class:`SpeakerSpec`, never a copy of the input.
"""

from __future__ import annotations

import ast
import operator
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from mmunlearn.adapters.speaker_model import (
    ACTIVATIONS,
    DEFAULT_MARGIN,
    DEFAULT_SCALE,
    LABEL_ENCODER,
    MODULE_CLASSES,
    PRETRAINER,
    ModuleSpec,
    NameRef,
    SpeakerNet,
    SpeakerSpec,
    build_modules,
    hparams_yaml,
)
from mmunlearn.checkpoint import atomic_dir
from mmunlearn.paths import check_tree

HPARAMS = "hyperparams.yaml"
EMBEDDING_CKPT = "embedding_model.ckpt"
CLASSIFIER_CKPT = "classifier.ckpt"
LABELS = ("label_encoder.txt", "label_encoder.ckpt")
#: The label file written (the name SpeechBrain's pretrainer fetches for the ``label_encoder`` loadable).
LABELS_WRITTEN = "label_encoder.ckpt"

_MODULE_TARGETS = tuple(t for ts in MODULE_CLASSES.values() for t in ts)
#: Classes a safe read accepts as ``!new:`` (anywhere in the file; only the four modules are built).
ALLOWED_NEW: frozenset[str] = frozenset(_MODULE_TARGETS + (PRETRAINER, LABEL_ENCODER))
#: Names a safe read accepts as ``!name:``.
ALLOWED_NAME: frozenset[str] = ALLOWED_NEW | frozenset(ACTIVATIONS)
_VALUE_TAGS = ("!ref", "!copy", "!tuple")
#: A real hyperparams.yaml is a few kB; bigger files, or ones expanding to more nodes, are refused.
MAX_HPARAMS_BYTES = 1 << 20
_MAX_NODES = 100_000
#: Parameters + buffers allowed in the feature modules (an 80-mel Fbank holds ~16k).
_MAX_FEATURE_NUMEL = 10_000_000
_TRUST_HINT = ("If you trust this folder, load it with trust_hparams=True (--trust-hparams), "
               "which runs the code hyperparams.yaml names.")


@dataclass
class SpeakerDir:
    """What a speaker-model directory holds once read."""

    net: SpeakerNet
    speakers: list[str]  # class index -> speaker ID
    spec: SpeakerSpec | None  # None only after a trusted read whose modules have no spec (see spec_error)
    margin: float
    scale: float
    sample_rate: int
    spec_error: str | None = None


# ---------------------------------------------------------------------------------------------- writing
def write_speaker_dir(path: str | os.PathLike, net: SpeakerNet, speakers: list[str], spec: SpeakerSpec,
                      overwrite: bool = False) -> Path:
    """Write the directory atomically: ``hyperparams.yaml`` generated from ``spec`` (which must describe
    ``net``), the two checkpoints (plain tensors) and ``label_encoder.ckpt``."""
    from speechbrain.dataio.encoder import CategoricalEncoder

    out = Path(path).resolve()
    if not isinstance(spec, SpeakerSpec):
        raise ValueError(f"a SpeakerSpec is needed to write {HPARAMS}, got {type(spec).__name__}")
    if len(speakers) != net.n_classes:
        raise ValueError(f"{len(speakers)} speaker IDs for a classifier of {net.n_classes} classes")
    states = {name: {k: v.detach().cpu() for k, v in getattr(net, name).state_dict().items()}
              for name in ("embedding_model", "classifier")}
    mismatch = _shape_mismatch(spec, states)
    if mismatch:
        raise ValueError(f"the model does not match its own spec, refusing to write {out}: "
                         f"{mismatch[0] or 'spec'}: {mismatch[1]}")
    text = hparams_yaml(spec)
    encoder = CategoricalEncoder()
    for spk in speakers:
        encoder.add_label(spk)
    with atomic_dir(out, overwrite=overwrite) as tmp:
        (tmp / HPARAMS).write_text(text, encoding="utf-8")
        torch.save(states["embedding_model"], tmp / EMBEDDING_CKPT)
        torch.save(states["classifier"], tmp / CLASSIFIER_CKPT)
        encoder.save(tmp / LABELS_WRITTEN)
    return out


# ---------------------------------------------------------------------------------------------- parsing
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
            raise yaml.constructor.ConstructorError(None, None, f"!tuple needs '(...)', got {value!r}",
                                                    node.start_mark)
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
            return tag[len(prefix):] not in allowed
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
        f"(!name: also {list(ACTIVATIONS)}). {_TRUST_HINT}")


_REF = re.compile(r"<([^<>]*)>")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


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
            raise ValueError(f"{self.file}: {where}: attribute references (<{key}>) call getattr and are not "
                             f"supported. {_TRUST_HINT}")
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
                    return NameRef(value.tag[len("!name:"):])
                except ValueError as exc:
                    raise ValueError(f"{resolver.file}: {at}: {exc}") from None
            raise ValueError(f"{resolver.file}: {at}: {value.tag} is not supported as an argument "
                             "(only plain values, !ref and !name: of an activation)")
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
    if not isinstance(node, Tagged) or not node.tag.startswith("!new:") or node.tag[len("!new:"):] not in allowed:
        got = node.tag if isinstance(node, Tagged) else type(node).__name__
        raise ValueError(f"{file}: {role} must be !new:{' or !new:'.join(allowed)}, got {got}")
    args, kwargs = _arguments(node, resolver, role)
    return ModuleSpec.bind(node.tag[len("!new:"):], args, kwargs, where=f"{file}: {role}")


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
    sample_rate = _scalar(tree, resolver, "sample_rate", 16000)
    if isinstance(sample_rate, float) and sample_rate.is_integer():
        sample_rate = int(sample_rate)
    try:
        return SpeakerSpec(**modules, sample_rate=sample_rate,
                           margin=float(_scalar(tree, resolver, "aam_margin", DEFAULT_MARGIN)),
                           scale=float(_scalar(tree, resolver, "aam_scale", DEFAULT_SCALE)))
    except ValueError as exc:
        raise ValueError(f"{file}: {exc}") from None


# ---------------------------------------------------------------------------------------------- reading
def _read_text(file: Path) -> str:
    with file.open("rb") as fh:
        data = fh.read(MAX_HPARAMS_BYTES + 1)  # bounded, whatever the file claims to be
    if len(data) > MAX_HPARAMS_BYTES:
        raise ValueError(f"{file}: a {HPARAMS} over {MAX_HPARAMS_BYTES} bytes is refused")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{file}: not UTF-8 text ({exc})") from None


def read_state(file: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's ``{name: tensor}`` via ``torch.load(weights_only=True)``; a pickle holding anything
    but tensors and plain containers (e.g. code) is refused with a ValueError naming the file."""
    if not file.is_file():
        raise FileNotFoundError(f"missing checkpoint {file}")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for code, RuntimeError/EOFError for corrupt files, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(f"{file}: not a weights-only PyTorch checkpoint, refused ({type(exc).__name__}: "
                         f"{first[:300]}); mmunlearn never unpickles objects from a model folder") from None
    if not isinstance(state, Mapping) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                 for k, v in state.items()):
        raise ValueError(f"{file}: expected a state dict (parameter name -> tensor), got {type(state).__name__}")
    return dict(state)


def _shape_mismatch(spec: SpeakerSpec,
                    states: Mapping[str, Mapping[str, torch.Tensor]]) -> tuple[str | None, str] | None:
    """``(module name or None, why)`` when ``states`` (embedding_model / classifier) do not fit the
    modules of ``spec``; None when they do.

    The modules are built on PyTorch's ``meta`` device: no memory is allocated for them, so a file
    asking for absurd sizes costs nothing before it is refused.
    """
    try:
        with torch.device("meta"):
            meta = build_modules(spec)
    except Exception as exc:  # a constructor rejecting its arguments: TypeError, ValueError, RuntimeError...
        return None, f"the modules cannot be built: {type(exc).__name__}: {exc}"
    for name in ("compute_features", "mean_var_norm"):
        module = getattr(meta, name)
        numel = sum(t.numel() for t in (*module.parameters(), *module.buffers()))
        if numel > _MAX_FEATURE_NUMEL:
            return None, f"{name} would hold {numel} values (more than {_MAX_FEATURE_NUMEL})"
    for name, state in states.items():
        want = {k: tuple(v.shape) for k, v in getattr(meta, name).state_dict().items()}
        have = {k: tuple(v.shape) for k, v in state.items()}
        if want != have:
            missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
            shapes = [f"{k}: {have[k]} vs {want[k]}" for k in sorted(set(want) & set(have)) if want[k] != have[k]]
            return name, (f"missing {missing[:3]}, unexpected {extra[:3]}, shape differences {shapes[:3]}"
                          f" ({len(missing)}/{len(extra)}/{len(shapes)} in all)")
    return None


def _read_labels(root: Path, n_classes: int) -> list[str]:
    from speechbrain.dataio.encoder import CategoricalEncoder

    found = [root / name for name in LABELS if (root / name).is_file()]
    if not found:
        raise FileNotFoundError(f"{root} has no {' or '.join(LABELS)} (the speaker ID <-> class index map)")
    try:
        lab2ind, _, _ = CategoricalEncoder._load_literal(found[0])  # ast.literal_eval: safe on any input
    except (ValueError, SyntaxError, RecursionError, MemoryError) as exc:
        raise ValueError(f"{found[0]} is not a SpeechBrain CategoricalEncoder file: {exc}") from exc
    by_index = {ind: str(lab) for lab, ind in lab2ind.items()}
    if sorted(by_index) != list(range(n_classes)):
        raise ValueError(f"{found[0]} maps {len(by_index)} labels to indices {sorted(by_index)[:5]}...; "
                         f"the classifier has {n_classes} classes (expected indices 0..{n_classes - 1})")
    return [by_index[i] for i in range(n_classes)]


def read_speaker_dir(path: str | os.PathLike, trust_hparams: bool = False) -> SpeakerDir:
    """Build the modules ``hyperparams.yaml`` describes and load their checkpoints (CPU, eval mode).

    By default nothing the file names is run: tags outside the allow-list are refused with a
    ValueError naming the file, key and tag, before anything is constructed (module notes).
    ``trust_hparams=True`` instantiates the file with HyperPyYAML instead, which **runs the code the
    file names**; the result's ``spec`` is then None when the modules are not ones
    :func:`spec_from_hparams` can describe (such a model cannot be saved).
    """
    root = Path(path).resolve()
    file = root / HPARAMS
    if not file.is_file():
        raise FileNotFoundError(f"{root} is not a SpeechBrain model directory (no {HPARAMS})")
    # No FIFO, device or broken link, and no link to an outside folder. Links to outside regular files are
    # followed deliberately: SpeechBrain's savedir is made of them, and a speaker folder is only read as data
    # (parsed YAML, weights-only checkpoints) and never copied into an output.
    check_tree(root, outside_files=True)
    if trust_hparams:
        return _read_trusted(root)
    text = _read_text(file)
    tree = parse_hparams(text, file)
    check_hparams_tags(tree, file)
    spec = spec_from_hparams(tree, file)
    states = {"embedding_model": read_state(root / EMBEDDING_CKPT), "classifier": read_state(root / CLASSIFIER_CKPT)}
    mismatch = _shape_mismatch(spec, states)
    if mismatch:
        name, why = mismatch
        what = root / f"{name}.ckpt" if name else root
        raise ValueError(f"{what} does not fit the modules {root / HPARAMS} describes: {why}")
    with torch.random.fork_rng(devices=[]):  # initial weights are overwritten; leave the caller's RNG alone
        net = build_modules(spec)
    net.embedding_model.load_state_dict(states["embedding_model"], strict=True)
    net.classifier.load_state_dict(states["classifier"], strict=True)
    speakers = _read_labels(root, net.n_classes)
    return SpeakerDir(net=net.eval(), speakers=speakers, spec=spec, margin=spec.margin, scale=spec.scale,
                      sample_rate=spec.sample_rate)


def _load_state(module: torch.nn.Module, file: Path) -> None:
    state = read_state(file)
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"{file} does not fit the module built from {HPARAMS}: {exc}") from exc


def _read_trusted(root: Path) -> SpeakerDir:
    """``trust_hparams=True``: HyperPyYAML instantiates the file (runs what it names), as SpeechBrain does."""
    from hyperpyyaml import load_hyperpyyaml

    file = root / HPARAMS
    text = file.read_text(encoding="utf-8")
    spec, spec_error = None, None
    try:
        spec = spec_from_hparams(parse_hparams(text, file), file)
    except ValueError as exc:
        spec_error = str(exc)
    try:
        hp = load_hyperpyyaml(text, overrides={"pretrained_path": str(root)}, overrides_must_match=False)
    except Exception as exc:  # HyperPyYAML raises yaml, import and constructor errors of many types
        raise ValueError(f"{file} could not be instantiated: {type(exc).__name__}: {exc}") from exc
    missing = [k for k in ("compute_features", "embedding_model", "classifier") if k not in hp]
    if missing:
        raise ValueError(f"{file} defines no {missing}")
    norm = hp.get("mean_var_norm")
    if getattr(norm, "norm_type", None) == "global":
        raise ValueError(f"{file}: mean_var_norm with norm_type 'global' keeps statistics this "
                         "loader does not read; only 'sentence' / 'batch' normalisation is supported")
    classifier = hp["classifier"]
    if not isinstance(getattr(classifier, "weight", None), torch.nn.Parameter) or classifier.weight.dim() != 2:
        raise ValueError(f"{file}: classifier has no 2-D 'weight' (expected ECAPA_TDNN.Classifier)")
    net = SpeakerNet(hp["compute_features"], norm, hp["embedding_model"], classifier)
    _load_state(net.embedding_model, root / EMBEDDING_CKPT)
    _load_state(net.classifier, root / CLASSIFIER_CKPT)
    speakers = _read_labels(root, net.n_classes)
    if spec is not None:
        states = {n: getattr(net, n).state_dict() for n in ("embedding_model", "classifier")}
        mismatch = _shape_mismatch(spec, states)
        if mismatch:
            spec, spec_error = None, f"the built modules differ from what {file} describes as data: {mismatch[1]}"
    return SpeakerDir(net=net.eval(), speakers=speakers, spec=spec, spec_error=spec_error,
                      margin=float(hp.get("aam_margin", DEFAULT_MARGIN)),
                      scale=float(hp.get("aam_scale", DEFAULT_SCALE)),
                      sample_rate=int(hp.get("sample_rate", 16000)))
