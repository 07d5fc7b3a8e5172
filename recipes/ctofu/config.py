"""The cTOFU recipes' settings: :class:`CTofuConfig`, the settings every TOFU recipe shares
(:class:`recipes.tofu.config.RecipeConfig`) plus the multilingual world's (files, languages, alignment, which
languages are forgotten, evaluated and retained). ``ctofu run|compare`` take one whole, like ``tofu``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mmunlearn.config import opt
from mmunlearn.data.ctofu.worlds import TRAIN_TEXTS
from recipes.recipe_config import BenchmarkSettings, ConfigError, with_default
from recipes.tofu.config import RecipeConfig


@dataclass(frozen=True)
class CTofuConfig(RecipeConfig):
    """Settings of ``ctofu run`` and ``ctofu compare``."""

    data: str = opt(
        "synthetic",
        "Folder of <split>_<lang>.json files (e.g. shared/data/ctofu), or "
        "'synthetic[:retain_authors=8,langs=en/fr/ar]' (built-in stand-in).",
    )
    authors: int | None = opt(None, "Keep the first N retain authors of every language (all forget authors are kept).")
    resume: bool = with_default(BenchmarkSettings, "resume", False)
    english: Path | None = opt(
        None, "TOFU folder for English (default: <split>_en.json files, or a 'tofu' folder beside --data)."
    )
    langs: str = opt("all", "Languages the models are trained on: 'all' (discovered from the files) or e.g. en,fr,ar.")
    facts: int | None = opt(
        None,
        "Keep the first K real-authors and K world-facts rows per language (scored for model utility; replayed in "
        "fine-tuning only by the built presets that replay facts, not by a real checkpoint's).",
    )
    forget_lang: str = opt("en", "Language(s) whose forget rows are unlearned, e.g. en or en,fr.")
    eval_langs: str = opt("all", "Languages to evaluate in: 'all' (the trained ones) or e.g. en,fr,ar.")
    retain_langs: str = opt(
        "forget", "Retain rows the methods may use: 'forget' (same languages as the forget rows), 'all', or a list."
    )
    skip_misaligned: bool = opt(
        False, "Drop languages whose files are not row-aligned with English (default: stop with the report)."
    )
    train_text: str = opt(
        "scored",
        "Question/answer text the models are trained on: 'scored' (each scored row's "
        "text from the file the metrics score, forget01_perturbed / retain_perturbed; "
        "default) or 'files' (forget01 / retain99 as shipped, as before issue 16; on the "
        "shipped translations that differs from the scored text and needs "
        "--allow-text-mismatch).",
    )
    allow_text_mismatch: bool = opt(
        False,
        "Go on when the trained question/answer text differs from the scored one "
        "(recorded in alignment.md; the forget metrics then partly measure "
        "paraphrase robustness). Default: stop with the counts.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.train_text not in TRAIN_TEXTS:
            raise ConfigError(f"{self.train_text!r}; choose from {', '.join(TRAIN_TEXTS)}", "train_text")
        if self.facts is not None and self.facts < 0:
            raise ConfigError(f"facts must be >= 0, got {self.facts}", "facts")
