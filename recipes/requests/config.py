"""The settings of ``mmunlearn bench requests`` as one config dataclass, :class:`RequestsConfig`: the dataset (a speaker
classifier on a built-in or prepared corpus, or a text LLM on a TOFU world), the requests, the two methods' budgets,
the rule and the outputs. The command takes one whole (:mod:`recipes.recipe_cli`: options, ``--config FILE.yaml`` or a
shipped ``requests/<name>``, ``key=value``); a setting the chosen dataset has no use for is refused when set, with why,
and every check raises a :class:`~recipes.recipe_config.ConfigError` naming the setting, before any work.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from mmunlearn.adapters.speaker.batches import SCOPES
from mmunlearn.config import opt
from mmunlearn.taskvec.extract import KINDS
from recipes.recipe_config import ConfigError

DATASETS = ("speaker", "tofu")
#: the settings of one dataset, refused on the other when set (with why)
SPEAKER_ONLY = {
    "speakers": "the built-in speaker corpus",
    "utterances": "the built-in speaker corpus",
    "videos": "the built-in speaker corpus",
    "requests": "the speaker requests (TOFU: one per forget author)",
    "train_epochs": "the speaker classifier's training",
    "gd_lr": "GradDiff on the speaker classifier",
    "manifests": "a prepared speaker corpus",
    "scope": "QR-Erase's scope on the speaker classifier",
    "batch": "the speaker requests' union edit",
}
TOFU_ONLY = {
    "data": "the TOFU world",
    "forget_split": "the TOFU world",
    "authors": "the TOFU world",
    "base": "the TOFU task vectors' model",
}
BASES = ("target", "base")
#: the built-in corpus's settings, which a prepared corpus (``manifests``) replaces
BUILT_IN = ("speakers", "utterances", "videos", "requests")
PRESETS = {"speaker": ("tiny", "small"), "tofu": ("micro", "mini", "smollm2-135m")}


@dataclass(frozen=True)
class RequestsConfig:
    """Settings of ``bench requests``: deletion requests one after another, QR-Erase with the retain state cached
    against GradDiff reaching the same forget criterion."""

    dataset: str = opt(
        "speaker",
        "speaker (classifier on the built-in espeak corpus, or a prepared one: manifests) "
        "or tofu (text LLM, one request per forget author).",
    )
    workdir: Path = opt(
        Path("runs/bench_requests"),
        "Folder for the corpus, the trained models and the retain state (reused when present).",
    )
    preset: str | None = opt(
        None,
        "Model preset: speaker tiny (default) or small; tofu micro (default), mini or smollm2-135m (real).",
    )
    data: str = opt("synthetic", "tofu: a TOFU folder or synthetic[:...] (models built by the preset builder, cached).")
    forget_split: str = opt("forget10", "tofu: forget split (forget01, forget05, forget10).")
    authors: int | None = opt(20, "tofu: world of N authors (none: all of them).")
    speakers: int = opt(10, "speaker: speakers of the built-in espeak corpus (at least 3).")
    utterances: int = opt(20, "speaker: utterances per speaker and video of the built-in corpus (at least 2).")
    videos: int = opt(
        2, "speaker: videos (sessions) per speaker of the built-in corpus (at least 2); one is held out for testing."
    )
    requests: int = opt(
        3, "speaker: deletion requests on the built-in corpus, one forget speaker each, applied in order."
    )
    manifests: Path | None = opt(
        None,
        "speaker: a prepared corpus (voxceleb2 prepare / prepare-corpus output, e.g. "
        "FSDD with forget_speakers=3) instead of the built-in one; one request per "
        "forget speaker.",
    )
    train_epochs: int | None = opt(None, "speaker: epochs of the classifier's training (default: the preset's).")
    scope: str = opt(
        "all",
        "speaker: weights QR-Erase edits: all, embedding, or head (class weights only, retain rank "
        "0; scoring reuses the embeddings). GradDiff always trains every weight.",
    )
    extract: tuple[str, ...] | None = opt(
        None,
        "QR-Erase forget extraction kinds to measure, comma-separated "
        "(default: speaker gradient,finetune; tofu gradient,lora,finetune).",
    )
    base: str = opt(
        "target",
        "tofu: the model QR-Erase takes its task vectors (and the retain state) from: target (the model itself, "
        "what a user without its pretrained model has) or base (the preset's pretrained model, as tofu compare's "
        "base=base).",
    )
    retain_bound: float | None = opt(
        None, "The rule's bound on the retain NLL's rise in nats (default: speaker 0.05, tofu 0.1, as their recipes)."
    )
    gd_epochs: int | None = opt(
        None,
        "GradDiff's epoch budget; it stops as soon as it meets the forget criterion "
        "(default: speaker 20, tofu its preset's).",
    )
    gd_lr: float | None = opt(None, "speaker: GradDiff's learning rate (default: its preset's).")
    score_retain: int = opt(
        32, "Retain items the rule scores (spread over the retain set; 0: all of them), for both methods."
    )
    batch: bool = opt(
        True, "speaker: also edit once with the union of the requests and compare it with the requests one by one."
    )
    json: Path | None = opt(None, "Also write every request's row and the summary to this JSON file.")
    markdown: Path | None = opt(None, "Also write the summary as Markdown to this file.")
    strict: bool = opt(False, "Exit with status 1 if QR-Erase is not 10x faster per request or misses the rule.")
    threads: int | None = opt(None, "torch CPU threads (default: torch's choice).")
    progress: bool = opt(True, "Progress bars of training, task-vector extraction and sweeps.")

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ConfigError(f"dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}", "dataset")
        for key, low in (
            ("speakers", 3),
            ("utterances", 2),
            ("videos", 2),
            ("requests", 1),
            ("train_epochs", 1),
            ("gd_epochs", 1),
            ("score_retain", 0),
            ("authors", 2),
            ("threads", 1),
        ):
            value = getattr(self, key)
            if value is not None and value < low:
                raise ConfigError(f"{key} must be at least {low}, got {value}", key)
        if self.retain_bound is not None and not self.retain_bound >= 0:
            raise ConfigError(f"retain_bound must be >= 0, got {self.retain_bound}", "retain_bound")
        if self.preset is not None and self.preset not in PRESETS[self.dataset]:
            raise ConfigError(
                f"preset {self.preset!r} is not a {self.dataset} preset: choose {' or '.join(PRESETS[self.dataset])}",
                "preset",
            )
        if self.extract is not None and (not self.extract or any(k not in KINDS for k in self.extract)):
            raise ConfigError(f"extract: choose from {', '.join(KINDS)}, got {','.join(self.extract)!r}", "extract")
        if self.base not in BASES:
            raise ConfigError(f"base must be one of {', '.join(BASES)}, got {self.base!r}", "base")
        if self.scope not in SCOPES:
            raise ConfigError(f"scope must be one of {', '.join(SCOPES)}, got {self.scope!r}", "scope")
        unused = TOFU_ONLY if self.dataset == "speaker" else SPEAKER_ONLY
        for key, what in unused.items():
            _unused(self, key, f"it sets {what}; dataset is {self.dataset}")
        if self.manifests is not None:
            for key in BUILT_IN:
                _unused(
                    self,
                    key,
                    "it sizes the built-in corpus; manifests gives a prepared one, one request per forget speaker",
                )

    def resolved_preset(self) -> str:
        """``preset``, or the dataset's smallest."""
        return self.preset or PRESETS[self.dataset][0]

    def resolved_retain_bound(self) -> float:
        """``retain_bound``, or the dataset's recipe's."""
        return self.retain_bound if self.retain_bound is not None else 0.1 if self.dataset == "tofu" else 0.05

    def extracts(self) -> list[str]:
        """The extraction kinds measured: ``extract``, or the dataset's."""
        if self.extract is not None:
            return list(self.extract)
        return ["gradient", "lora", "finetune"] if self.dataset == "tofu" else ["gradient", "finetune"]


def _unused(cfg: RequestsConfig, key: str, why: str) -> None:
    """Refuse ``key`` set to other than its default: the run would not use it (``why``)."""
    default = next(f.default for f in fields(cfg) if f.name == key)
    if getattr(cfg, key) != default:
        raise ConfigError(f"{key} does not apply here ({why}); leave it unset", key)
