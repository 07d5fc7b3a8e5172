"""Checks of a preparation: option ranges, shortfalls against what was asked, speaker names that look like folders."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from data_prep.voxceleb2_inputs import Source
from mmunlearn.data.manifest import Utterance

#: Longest segment or shortest-file bound an option may ask for (seconds): an hour
MAX_OPTION_SECONDS = 3600.0


def check_options(
    forget_fraction: float, test_video_fraction: float, max_utterances: int, segment_seconds: float, min_duration: float
) -> None:
    """ValueError for split or filter options out of range (before anything is read)."""
    if segment_seconds < 0 or min_duration < 0 or max_utterances < 0:
        raise ValueError("segment_seconds, min_duration and max_utterances must be >= 0")
    for name, value in (("--segment-seconds", segment_seconds), ("--min-duration", min_duration)):
        if not value <= MAX_OPTION_SECONDS:  # inf, 1e308 and NaN included
            raise ValueError(f"{name} must be a number of seconds up to {MAX_OPTION_SECONDS:g}, got {value!r}")
    if not 0.0 <= forget_fraction <= 0.5 or not 0.0 < test_video_fraction < 1.0:
        raise ValueError(
            f"forget_fraction must be in [0, 0.5] and test_video_fraction in (0, 1), got "
            f"{forget_fraction} and {test_video_fraction}"
        )


#: Folder names that name a category of recordings rather than a person (checked case-insensitively).
CATEGORY_NAME = re.compile(
    r"(?i)^(fe)?male|(^|[_-])(audio|audios|wavs?|clips?|recordings?|speech|data|train|test|dev|"
    r"eval|valid|samples?|files?|speakers?|voices?|men|women|adults?|children|kids)([_-]|$)"
)
#: Fewer speakers than this draw a warning: a speaker benchmark with so few classes is rarely what was meant.
FEW_SPEAKERS = 5


def speaker_warnings(speakers: Sequence[str]) -> list[str]:
    """Warnings about the speakers a pattern found: too few of them, or names that look like category folders
    (``female_audio``, ``male``, ``train``) rather than people -- usually a pattern one folder level off."""
    out = []
    if len(speakers) < FEW_SPEAKERS:
        out.append(
            f"only {len(speakers)} speaker(s) found ({', '.join(list(speakers)[:10])}); check that the "
            "pattern's (?P<spk>...) group matches a per-speaker folder or file-name part"
        )
    looks = [s for s in speakers if CATEGORY_NAME.search(s)]
    if looks:
        out.append(
            f"speaker name(s) {looks[:10]} look like category folders, not people; the speaker is probably "
            "one level deeper (e.g. --pattern '[^/]+/(?P<spk>[^/]+)/(?P<utt>[^/]+)\\.wav')"
        )
    return out


class ShortfallError(ValueError):
    """``prepare`` cannot give the speakers or utterances asked for (``--allow-fewer`` writes what there is)."""


#: Splits that may be empty without a shortfall when the options ask for no such utterances.
_SAMPLE_SPLITS = ("sample_forget", "sample_holdout")


def _per_speaker(
    splits: dict[str, list[Utterance]], todo: list[Source], too_short: list[dict], failed: list[dict]
) -> dict[str, dict[str, int]]:
    """Per speaker: files selected, left out (too short / unreadable) and utterances in each split."""
    by_path = {s.path: s.spk_id for s in todo}
    table: dict[str, dict[str, int]] = {}
    for src in todo:
        row = table.setdefault(src.spk_id, {"files": 0, "too_short": 0, "failed": 0})
        row["files"] += 1
    for what, items in (("too_short", too_short), ("failed", failed)):
        for item in items:
            table[by_path[item["path"]]][what] += 1
    for name in (
        "spk_forget_train",
        "spk_forget_test",
        "spk_retain_train",
        "spk_retain_test",
        "sample_forget",
        "sample_holdout",
    ):
        for u in splits[name]:
            table[u.spk_id][name] = table[u.spk_id].get(name, 0) + 1
    return dict(sorted(table.items()))


def _split_shortfalls(
    splits: dict[str, list[Utterance]], per_speaker: dict[str, dict[str, int]], options: dict[str, Any]
) -> list[str]:
    """What the options asked for and the kept utterances do not give."""
    found = []
    cap = options["max_utterances"]
    if cap:
        short = {s: c["files"] - c["too_short"] - c["failed"] for s, c in per_speaker.items()}
        short = {s: n for s, n in short.items() if n < cap}
        if short:
            found.append(
                f"{len(short)} speaker(s) have fewer than --max-utterances {cap} usable files: "
                + ", ".join(f"{s} {n}" for s, n in list(short.items())[:10])
            )
    for name, items in splits.items():
        if items or (name in _SAMPLE_SPLITS and options["forget_fraction"] == 0):
            continue
        found.append(f"split {name} is empty")
    no_test = [
        s
        for s, c in per_speaker.items()
        if c["files"] > c["too_short"] + c["failed"] and not c.get("spk_forget_test") and not c.get("spk_retain_test")
    ]
    if no_test:
        found.append(f"{len(no_test)} speaker(s) have a single video, so no held-out test utterances: {no_test[:10]}")
    return found
