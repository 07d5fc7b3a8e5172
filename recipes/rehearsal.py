"""``tofu compare --rehearse`` / ``ctofu compare --rehearse``: a config run on the CPU at the smallest size through
the same code, so that what would make the full run fail (a missing package, data folder or model file, a setting a
method refuses, an error in any stage) shows in minutes on any machine before a GPU is spent on it.

The rehearsal keeps the config's data folder, methods, languages, sweep, batches, budget, parallel builds and
``keep_going``, and changes only the size: the ``micro`` preset, a few pretraining and fine-tuning steps, few
authors and evaluation items, the CPU, its output in ``<out>_rehearsal``. The full run's model is checked without
being trained (:func:`preflight`: its file and the packages that read it). Also here: :func:`host_precision`, what a
record says of the host's bf16 and the precisions a run used.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmunlearn.adapters.base import resolve_device
from mmunlearn.presets.gguf import smollm2_gguf
from mmunlearn.presets.models import PRESETS, REAL_MODELS
from mmunlearn.train.config import cpu_has_native_bf16

if TYPE_CHECKING:
    from recipes.ctofu.pipeline import CrossLingualSetup
    from recipes.tofu.pipeline import TofuSetup

#: What a rehearsal sets, per benchmark (every other setting is the config's own).
SMALLEST: dict[str, dict[str, Any]] = {
    "tofu": {
        "authors": 10,
        "utility_items": 3,
        "rule_retain_items": 6,
        "target": None,
        "retain_model": None,
        "precision": None,
    },
    "ctofu": {"authors": 1, "facts": 2},
}
COMMON = {
    "preset": "micro",
    "device": "cpu",
    "threads": 1,
    "ft_max_steps": 2,
    "pretrain_max_steps": 2,
    "max_new_tokens": 8,
    "rehearse": False,
}
#: the packages a real checkpoint's conversion reads it with
PACKAGES = {"smollm2-135m": ("gguf", "transformers", "safetensors")}
#: the packages every run imports only when it gets there (ROUGE-L after the models' training: a GPU run once stopped
#: there on a missing rouge_score), checked before any work
LATE_IMPORTS = ("rouge_score", "nltk", "scipy", "matplotlib", "accelerate")


def preflight(preset: str) -> dict[str, Any]:
    """Check, without training or converting anything, that the full run's ``preset`` can be had here and that the
    packages it imports late are installed (:data:`LATE_IMPORTS`; a real checkpoint: its file and the packages that
    read it, :data:`PACKAGES`; a model folder: its ``config.json``); what was found. A ``FileNotFoundError`` /
    ``ModuleNotFoundError`` with one line saying what is missing."""
    missing = [name for name in (*LATE_IMPORTS, *PACKAGES.get(preset, ())) if importlib.util.find_spec(name) is None]
    if missing:
        raise ModuleNotFoundError(
            f"package(s) {', '.join(missing)} not installed in this environment: the run (preset {preset}) imports them"
        )
    if preset in PRESETS:
        return {"preset": preset, "built": True}
    if preset in REAL_MODELS:
        return {"preset": preset, "file": str(smollm2_gguf()), "packages": list(PACKAGES.get(preset, ()))}
    folder = Path(preset).expanduser()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"preset {preset}: no such preset, and no model folder with a config.json there")
    return {"preset": preset, "folder": str(folder)}


def rehearsal_of(cfg: Any, bench: str, say: Callable[[str], Any] = print) -> Any:
    """After :func:`preflight` of the run's preset (every ``compare``: a missing package stops it before any model
    work), ``cfg`` itself, or with ``cfg.rehearse`` its rehearsal (module docstring)."""
    found = preflight(cfg.preset)
    if not getattr(cfg, "rehearse", False):
        return cfg
    fields = {f.name for f in dataclasses.fields(cfg)}
    changes = {k: v for k, v in {**COMMON, **SMALLEST[bench]}.items() if k in fields}
    if cfg.authors is not None:
        changes["authors"] = min(cfg.authors, changes["authors"])
    out = Path(cfg.out)
    changes["out"] = out.parent / f"{out.name}_rehearsal"
    say(
        f"rehearsal: the full run's model is there ({found}); running this config on {changes['preset']} on the CPU "
        f"into {changes['out']}"
    )
    return dataclasses.replace(cfg, **changes)


def host_precision(device: str, setup: TofuSetup | CrossLingualSetup) -> dict[str, Any]:
    """What a record says of the host and the precisions a run used: whether the CPU computes bf16 natively
    (AVX512_BF16 or AMX; without it float32 is the fast path on a CPU), the device, the scoring precision and each
    built model's fine-tuning precision (its train_log.json)."""
    dev = resolve_device(device).type
    logs = setup.built.logs or {}
    training = {
        role: (log.get("config") or {}).get("mixed_precision")
        for role, log in logs.items()
        if role in ("target", "retain") and isinstance(log, dict) and log.get("config")
    }
    return {
        "cpu_native_bf16": cpu_has_native_bf16(),
        "device": dev,
        "scoring_precision": setup.precision,
        "training_precision": training,
        "note": "float32 is the fast path on a CPU without native bf16",
    }


__all__ = ["preflight", "rehearsal_of", "host_precision"]
