"""hyperparams.yaml of a speaker folder written from its :class:`~mmunlearn.adapters.speaker.model.SpeakerSpec`.

The file is generated from the spec alone (every value written as plain data), never copied from an input, in the
layout of SpeechBrain's pretrained ``EncoderClassifier`` models: the four modules, then every other module the
input's file named (:class:`~mmunlearn.adapters.speaker.model.ExtraModule`, e.g. spkrec's ``mean_var_norm_emb``) in
``modules`` and, when it has a checkpoint, in the pretrainer's ``loadables``, so SpeechBrain loads it from
``<name>.ckpt`` beside the file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from mmunlearn.adapters.speaker.model import LABEL_ENCODER, PRETRAINER, ModuleSpec, NameRef, SpeakerConfig, SpeakerSpec


def _yaml_value(value: Any) -> str:
    """``value`` (plain data, see :func:`_check_value`) as a YAML flow scalar/collection that PyYAML's
    SafeLoader and ruamel (HyperPyYAML) read back as the same value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot write non-finite number {value!r}")
        text = repr(value)
        if "e" in text and "." not in text.split("e")[0]:  # YAML 1.1 floats need a dot: 1e-05 -> 1.0e-05
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent if exponent[0] in '+-' else '+' + exponent}"
        return text
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid double-quoted YAML scalar
    if isinstance(value, NameRef):
        return f"!name:{value.target}"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{json.dumps(k)}: {_yaml_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"cannot write {type(value).__name__} to hyperparams.yaml")


def _module_yaml(key: str, module: ModuleSpec) -> str:
    lines = [f"{key}: !new:{module.target}"]
    lines += [f"    {name}: {_yaml_value(value)}" for name, value in module.kwargs.items()]
    return "\n".join(lines)


def hparams_yaml(spec: SpeakerSpec | SpeakerConfig) -> str:
    """hyperparams.yaml in the layout of SpeechBrain's pretrained ``EncoderClassifier`` models.

    Generated from ``spec`` alone (every value written as plain data), so it never carries anything
    an input file said beyond the module arguments. The pretrainer names no ``paths``: SpeechBrain's
    ``EncoderClassifier.from_hparams(source=dir, savedir=...)`` then fetches ``<name>.ckpt`` from
    ``dir``, wherever the directory has been moved. ``aam_margin``/``aam_scale`` record the training loss.
    """
    if isinstance(spec, SpeakerConfig):
        spec = spec.spec()
    modules = [
        ("compute_features", spec.compute_features),
        ("mean_var_norm", spec.mean_var_norm),
        ("embedding_model", spec.embedding_model),
        ("classifier", spec.classifier),
    ]
    modules = [(k, m) for k, m in modules if m is not None] + [(e.name, e.module) for e in spec.extras]
    blocks = "\n\n".join(_module_yaml(k, m) for k, m in modules)
    refs = "\n".join(f"    {k}: !ref <{k}>" for k, _ in modules)
    loaded = ["embedding_model", "classifier", *(e.name for e in spec.extras if e.loadable)]
    loadables = "\n".join(f"        {k}: !ref <{k}>" for k in (*loaded, "label_encoder"))
    return f"""# Speaker classifier written by mmunlearn: SpeechBrain ECAPA-TDNN + cosine Classifier.
# Loads with mmunlearn's SpeakerAdapter.load(dir), or with SpeechBrain:
#   EncoderClassifier.from_hparams(source=dir, savedir=...)
sample_rate: {spec.sample_rate}
aam_margin: {_yaml_value(float(spec.margin))}
aam_scale: {_yaml_value(float(spec.scale))}

{blocks}

modules:
{refs}

label_encoder: !new:{LABEL_ENCODER}

pretrainer: !new:{PRETRAINER}
    loadables:
{loadables}
"""


__all__ = ["hparams_yaml"]
