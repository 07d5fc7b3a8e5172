"""Speaker-classifier directories in SpeechBrain's pretrained ``EncoderClassifier`` layout: write, and read safely.

Layout (as speechbrain/spkrec-ecapa-voxceleb on the hub)::

    hyperparams.yaml       HyperPyYAML: compute_features, mean_var_norm, embedding_model, classifier, ...
    embedding_model.ckpt   torch.save(state_dict) of the ECAPA-TDNN
    classifier.ckpt        torch.save(state_dict) of the cosine Classifier
    label_encoder.ckpt     SpeechBrain CategoricalEncoder: 'speaker_id' => class index

Reading also accepts ``label_encoder.txt`` (the hub's name for it; preferred when both exist).
Every other module the file names (in ``modules`` or the pretrainer's ``loadables``; e.g. spkrec's
``mean_var_norm_emb``, which SpeechBrain's ``encode_batch(normalize=True)`` uses) is kept as data with the bytes of
its ``<name>.ckpt`` (checked to be a weights-only checkpoint) and written back unchanged, so a folder written here
loads with ``EncoderClassifier.from_hparams`` with all the modules its input had.

**Reading runs nothing the folder names**: ``hyperparams.yaml`` is parsed and checked by
:mod:`mmunlearn.adapters.speaker.hparams` (tags inert, an allow-list, ``!ref`` resolved there) and the modules
are built from the resulting plain data. Checkpoints are read with ``torch.load(weights_only=True)``, which
refuses pickled code, and are checked against the module shapes on PyTorch's ``meta`` device before any weight
memory is allocated.

``trust_hparams=True`` loads ``hyperparams.yaml`` with HyperPyYAML as SpeechBrain does, i.e. **runs
the code the file names**: only for folders you trust. Either way :func:`write_speaker_dir` writes a
``hyperparams.yaml`` generated from the model's :class:`SpeakerSpec` (:mod:`mmunlearn.adapters.speaker.write_hparams`),
never a copy of the input.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from mmunlearn.adapters.speaker.hparams import HPARAMS, check_hparams_tags, parse_hparams, spec_from_hparams
from mmunlearn.adapters.speaker.model import (
    DEFAULT_MARGIN,
    DEFAULT_SCALE,
    ExtraModule,
    SpeakerNet,
    SpeakerSpec,
    build_modules,
)
from mmunlearn.adapters.speaker.write_hparams import hparams_yaml
from mmunlearn.files.checkpoint import atomic_dir
from mmunlearn.files.paths import check_tree

log = logging.getLogger(__name__)
EMBEDDING_CKPT = "embedding_model.ckpt"
CLASSIFIER_CKPT = "classifier.ckpt"
LABELS = ("label_encoder.txt", "label_encoder.ckpt")
#: The label file written (the name SpeechBrain's pretrainer fetches for the ``label_encoder`` loadable).
LABELS_WRITTEN = "label_encoder.ckpt"

#: A real hyperparams.yaml is a few kB; bigger files, or ones expanding to more nodes, are refused.
MAX_HPARAMS_BYTES = 1 << 20
#: The checkpoint of a carried module (spkrec's mean_var_norm_emb.ckpt: ~2 kB) is held in memory up to this size.
MAX_EXTRA_CKPT_BYTES = 64 << 20
#: Parameters + buffers allowed in the feature modules (an 80-mel Fbank holds ~16k).
_MAX_FEATURE_NUMEL = 10_000_000


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
def write_speaker_dir(
    path: str | os.PathLike, net: SpeakerNet, speakers: list[str], spec: SpeakerSpec, overwrite: bool = False
) -> Path:
    """Write the directory atomically: ``hyperparams.yaml`` generated from ``spec`` (which must describe
    ``net``), the two checkpoints (plain tensors) and ``label_encoder.ckpt``."""
    from speechbrain.dataio.encoder import CategoricalEncoder

    out = Path(path).resolve()
    if not isinstance(spec, SpeakerSpec):
        raise ValueError(f"a SpeakerSpec is needed to write {HPARAMS}, got {type(spec).__name__}")
    if len(speakers) != net.n_classes:
        raise ValueError(f"{len(speakers)} speaker IDs for a classifier of {net.n_classes} classes")
    states = {
        name: {k: v.detach().cpu() for k, v in getattr(net, name).state_dict().items()}
        for name in ("embedding_model", "classifier")
    }
    mismatch = _shape_mismatch(spec, states)
    if mismatch:
        raise ValueError(
            f"the model does not match its own spec, refusing to write {out}: {mismatch[0] or 'spec'}: {mismatch[1]}"
        )
    text = hparams_yaml(spec)
    encoder = CategoricalEncoder()
    for spk in speakers:
        encoder.add_label(spk)
    missing = [e.name for e in spec.extras if e.loadable and e.checkpoint is None]
    if missing:
        raise ValueError(
            f"the pretrainer loads {missing}, but their checkpoints were not read; refusing to write {out}"
        )
    with atomic_dir(out, overwrite=overwrite) as tmp:
        (tmp / HPARAMS).write_text(text, encoding="utf-8")
        write_state(states["embedding_model"], tmp / EMBEDDING_CKPT)
        write_state(states["classifier"], tmp / CLASSIFIER_CKPT)
        encoder.save(tmp / LABELS_WRITTEN)
        for extra in spec.extras:
            if extra.checkpoint is not None:  # the input's bytes, unchanged
                (tmp / f"{extra.name}.ckpt").write_bytes(extra.checkpoint)
    return out


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


def write_state(state: Mapping[str, torch.Tensor], file: Path) -> None:
    """Write a ``{name: tensor}`` state dict as SpeechBrain reads it (``torch.save``; :func:`read_state` reads it
    back with ``weights_only``)."""
    torch.save(dict(state), file)


def read_state(file: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's ``{name: tensor}`` via ``torch.load(weights_only=True)``; a pickle holding anything
    but tensors and plain containers (e.g. code) is refused with a ValueError naming the file."""
    if not file.is_file():
        raise FileNotFoundError(f"missing checkpoint {file}")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for code, RuntimeError/EOFError for corrupt files, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(
            f"{file}: not a weights-only PyTorch checkpoint, refused ({type(exc).__name__}: "
            f"{first[:300]}); mmunlearn never unpickles objects from a model folder"
        ) from None
    if not isinstance(state, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ValueError(f"{file}: expected a state dict (parameter name -> tensor), got {type(state).__name__}")
    return dict(state)


def _extra_checkpoint(root: Path, extra: ExtraModule) -> ExtraModule:
    """``extra`` with the bytes of ``<name>.ckpt`` when the pretrainer loads it (bounded, and refused unless
    ``torch.load(weights_only=True)`` reads it: no pickled code is carried into an output); without that file
    (its pretrainer ``paths`` name another place) the module is carried without a checkpoint, with a warning."""
    if not extra.loadable:
        return extra
    file = root / f"{extra.name}.ckpt"
    if not file.is_file():
        log.warning(
            "%s's pretrainer loads %r, but %s is missing: an output keeps the module without its checkpoint",
            root / HPARAMS,
            extra.name,
            file,
        )
        return dataclasses.replace(extra, loadable=False)
    with file.open("rb") as fh:
        data = fh.read(MAX_EXTRA_CKPT_BYTES + 1)
    if len(data) > MAX_EXTRA_CKPT_BYTES:
        raise ValueError(f"{file}: over {MAX_EXTRA_CKPT_BYTES} bytes, refused as the checkpoint of a carried module")
    try:
        torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for code, RuntimeError/EOFError for corrupt files, ...
        raise ValueError(
            f"{file}: not a weights-only PyTorch checkpoint, refused ({type(exc).__name__}); mmunlearn "
            "never unpickles objects from a model folder"
        ) from None
    return dataclasses.replace(extra, checkpoint=data)


def _with_checkpoints(root: Path, spec: SpeakerSpec | None) -> SpeakerSpec | None:
    if spec is None or not spec.extras:
        return spec
    return dataclasses.replace(spec, extras=tuple(_extra_checkpoint(root, e) for e in spec.extras))


def _shape_mismatch(
    spec: SpeakerSpec, states: Mapping[str, Mapping[str, torch.Tensor]]
) -> tuple[str | None, str] | None:
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
            return name, (
                f"missing {missing[:3]}, unexpected {extra[:3]}, shape differences {shapes[:3]}"
                f" ({len(missing)}/{len(extra)}/{len(shapes)} in all)"
            )
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
        raise ValueError(
            f"{found[0]} maps {len(by_index)} labels to indices {sorted(by_index)[:5]}...; "
            f"the classifier has {n_classes} classes (expected indices 0..{n_classes - 1})"
        )
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
    # (parsed YAML, weights-only checkpoints); what reaches an output is what was read: tensors, and the checked bytes
    # of a carried module's checkpoint.
    check_tree(root, outside_files=True)
    if trust_hparams:
        return _read_trusted(root)
    text = _read_text(file)
    tree = parse_hparams(text, file)
    check_hparams_tags(tree, file)
    spec = _with_checkpoints(root, spec_from_hparams(tree, file))
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
    return SpeakerDir(
        net=net.eval(), speakers=speakers, spec=spec, margin=spec.margin, scale=spec.scale, sample_rate=spec.sample_rate
    )


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
        spec = _with_checkpoints(root, spec_from_hparams(parse_hparams(text, file), file))
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
        raise ValueError(
            f"{file}: mean_var_norm with norm_type 'global' keeps statistics this "
            "loader does not read; only 'sentence' / 'batch' normalisation is supported"
        )
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
    return SpeakerDir(
        net=net.eval(),
        speakers=speakers,
        spec=spec,
        spec_error=spec_error,
        margin=float(hp.get("aam_margin", DEFAULT_MARGIN)),
        scale=float(hp.get("aam_scale", DEFAULT_SCALE)),
        sample_rate=int(hp.get("sample_rate", 16000)),
    )
