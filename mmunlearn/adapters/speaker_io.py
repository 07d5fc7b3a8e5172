"""Speaker-classifier directories in SpeechBrain's pretrained ``EncoderClassifier`` layout: write and read.

Layout (as speechbrain/spkrec-ecapa-voxceleb on the hub)::

    hyperparams.yaml       HyperPyYAML: compute_features, mean_var_norm, embedding_model, classifier, ...
    embedding_model.ckpt   torch.save(state_dict) of the ECAPA-TDNN
    classifier.ckpt        torch.save(state_dict) of the cosine Classifier
    label_encoder.txt      SpeechBrain CategoricalEncoder: 'speaker_id' => class index

Reading also accepts ``label_encoder.ckpt`` (the name SpeechBrain's ``from_hparams`` gives it in
its ``savedir``). ``hyperparams.yaml`` is instantiated with HyperPyYAML, i.e. it runs the
``!new:`` constructors it names, as SpeechBrain itself does: load only directories you trust.
Other files (``mean_var_norm_emb.ckpt``, used by SpeechBrain only for normalised verification
embeddings) are ignored.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from mmunlearn.adapters.speaker_model import DEFAULT_MARGIN, DEFAULT_SCALE, SpeakerNet
from mmunlearn.checkpoint import atomic_dir

HPARAMS = "hyperparams.yaml"
EMBEDDING_CKPT = "embedding_model.ckpt"
CLASSIFIER_CKPT = "classifier.ckpt"
LABELS = ("label_encoder.txt", "label_encoder.ckpt")
_PRETRAINED_LINE = re.compile(r"^pretrained_path:.*$", re.MULTILINE)


@dataclass
class SpeakerDir:
    """What a speaker-model directory holds once read."""

    net: SpeakerNet
    speakers: list[str]  # class index -> speaker ID
    hparams_text: str
    margin: float
    scale: float
    sample_rate: int


def write_speaker_dir(path: str | os.PathLike, net: SpeakerNet, speakers: list[str], hparams_text: str,
                      overwrite: bool = False) -> Path:
    """Write the directory atomically; a top-level ``pretrained_path:`` line is set to its absolute path."""
    from speechbrain.dataio.encoder import CategoricalEncoder

    out = Path(path).resolve()
    if len(speakers) != net.n_classes:
        raise ValueError(f"{len(speakers)} speaker IDs for a classifier of {net.n_classes} classes")
    text = _PRETRAINED_LINE.sub(lambda _: f"pretrained_path: {out}", hparams_text, count=1)
    encoder = CategoricalEncoder()
    for spk in speakers:
        encoder.add_label(spk)
    with atomic_dir(out, overwrite=overwrite) as tmp:
        (tmp / HPARAMS).write_text(text, encoding="utf-8")
        torch.save({k: v.detach().cpu() for k, v in net.embedding_model.state_dict().items()}, tmp / EMBEDDING_CKPT)
        torch.save({k: v.detach().cpu() for k, v in net.classifier.state_dict().items()}, tmp / CLASSIFIER_CKPT)
        encoder.save(tmp / LABELS[0])
    return out


def _read_labels(root: Path, n_classes: int) -> list[str]:
    from speechbrain.dataio.encoder import CategoricalEncoder

    found = [root / name for name in LABELS if (root / name).is_file()]
    if not found:
        raise FileNotFoundError(f"{root} has no {' or '.join(LABELS)} (the speaker ID <-> class index map)")
    try:
        lab2ind, _, _ = CategoricalEncoder._load_literal(found[0])
    except (ValueError, SyntaxError) as exc:
        raise ValueError(f"{found[0]} is not a SpeechBrain CategoricalEncoder file: {exc}") from exc
    by_index = {ind: str(lab) for lab, ind in lab2ind.items()}
    if sorted(by_index) != list(range(n_classes)):
        raise ValueError(f"{found[0]} maps {len(by_index)} labels to indices {sorted(by_index)[:5]}...; "
                         f"the classifier has {n_classes} classes (expected indices 0..{n_classes - 1})")
    return [by_index[i] for i in range(n_classes)]


def _load_state(module: torch.nn.Module, file: Path) -> None:
    if not file.is_file():
        raise FileNotFoundError(f"missing checkpoint {file}")
    state = torch.load(file, map_location="cpu", weights_only=True)
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"{file} does not fit the module built from {HPARAMS}: {exc}") from exc


def read_speaker_dir(path: str | os.PathLike) -> SpeakerDir:
    """Build the modules named in ``hyperparams.yaml`` and load their checkpoints (CPU, eval mode)."""
    from hyperpyyaml import load_hyperpyyaml

    root = Path(path).resolve()
    if not (root / HPARAMS).is_file():
        raise FileNotFoundError(f"{root} is not a SpeechBrain model directory (no {HPARAMS})")
    text = (root / HPARAMS).read_text(encoding="utf-8")
    try:
        hp = load_hyperpyyaml(text, overrides={"pretrained_path": str(root)}, overrides_must_match=False)
    except Exception as exc:  # HyperPyYAML raises yaml, import and constructor errors of many types
        raise ValueError(f"{root / HPARAMS} could not be instantiated: {type(exc).__name__}: {exc}") from exc
    missing = [k for k in ("compute_features", "embedding_model", "classifier") if k not in hp]
    if missing:
        raise ValueError(f"{root / HPARAMS} defines no {missing}")
    norm = hp.get("mean_var_norm")
    if getattr(norm, "norm_type", None) == "global":
        raise ValueError(f"{root / HPARAMS}: mean_var_norm with norm_type 'global' keeps statistics this "
                         "loader does not read; only 'sentence' / 'batch' normalisation is supported")
    classifier = hp["classifier"]
    if not isinstance(getattr(classifier, "weight", None), torch.nn.Parameter) or classifier.weight.dim() != 2:
        raise ValueError(f"{root / HPARAMS}: classifier has no 2-D 'weight' (expected ECAPA_TDNN.Classifier)")
    net = SpeakerNet(hp["compute_features"], norm, hp["embedding_model"], classifier)
    _load_state(net.embedding_model, root / EMBEDDING_CKPT)
    _load_state(net.classifier, root / CLASSIFIER_CKPT)
    speakers = _read_labels(root, net.n_classes)
    return SpeakerDir(net=net.eval(), speakers=speakers, hparams_text=text,
                      margin=float(hp.get("aam_margin", DEFAULT_MARGIN)),
                      scale=float(hp.get("aam_scale", DEFAULT_SCALE)),
                      sample_rate=int(hp.get("sample_rate", 16000)))
