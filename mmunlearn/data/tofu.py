"""TOFU splits as typed records, from a local folder of JSON files, the HF hub or the built-in generator.

``source`` is one of:

- a folder of ``<split>.json`` files (each a JSON list of objects; ``<split>.jsonl`` also works)
  laid out like ``locuslab/TOFU``;
- ``"synthetic"`` or ``"synthetic:n_authors=40,seed=0,concentration=0.5,forget_pcts=1/5/10"``:
  :func:`mmunlearn.data.synthetic.synthetic_splits` (no files needed), or any mapping split -> records;
- a hub id such as ``"locuslab/TOFU"``: ``datasets.load_dataset(id, split, split="train")`` (network).

Author layout, checked on the real files (tests/data/test_tofu.py): ``full`` is 200 authors x 20 QA
in author order; ``forgetPP`` is the last PP% of the authors (``forget10 == full[-400:]``),
``retainRR`` the first ones (``retain90 == full[:3600]``); ``forgetPP_perturbed`` has forgetPP's rows
in the same order; ``retain_perturbed == full[:400]``: the first 20 authors (as many as forget10,
retain in every split); ``holdoutPP`` holds as many other authors as forgetPP (20 QA each; holdout01
and holdout05 are prefixes of holdout10). ``QAItem.author`` numbers authors in ``full`` order
(0..T-1) and holdout authors after them (T, T+1, ...).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from mmunlearn.data.qa import QA_PER_AUTHOR, TOFU_SPLITS, QAItem, TOFUFormatError, forget_count
from mmunlearn.data.synthetic import splits_from_spec

__all__ = [
    "QA_PER_AUTHOR",
    "TOFU_SPLITS",
    "QAItem",
    "SplitInfo",
    "TOFUFormatError",
    "author_subset",
    "forget_count",
    "list_splits",
    "load_split",
    "parse_rows",
    "split_info",
]

QA_FIELDS = ("question", "answer")
PERTURBED_FIELDS = ("question", "answer", "paraphrased_answer", "perturbed_answer", "paraphrased_question")
MC_FIELDS = ("question", "answer", "perturbed_answer")
OPTION_FIELDS = ("question", "option1", "option2", "option3", "option4", "answer")

_SPLIT_RE = re.compile(r"(forget|retain|holdout)(\d\d)(_perturbed)?")
_SAFE_NAME = re.compile(r"[A-Za-z0-9][\w.-]*")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_NOT_SPLITS = {"idontknow"}  # TOFU's refusal strings (IdkDPO), not a QA split


class SplitInfo(NamedTuple):
    """What a split name means: family (full, retain, forget, holdout, retain_perturbed, real_authors,
    world_facts or custom), forget share in percent for forget/retain/holdout, and the fields it needs."""

    name: str
    family: str
    forget_pct: int | None
    fields: tuple[str, ...]


def split_info(split: str) -> SplitInfo:
    """Parse a split name; unknown but file-safe names are ``custom`` splits needing question/answer."""
    if not isinstance(split, str) or not _SAFE_NAME.fullmatch(split):
        raise ValueError(f"bad split name {split!r}: use letters, digits, '_', '-', '.' (e.g. 'forget10')")
    m = _SPLIT_RE.fullmatch(split)
    if m:
        family, pct, perturbed = m.group(1), int(m.group(2)), bool(m.group(3))
        if not 0 < pct < 100:
            raise ValueError(f"split {split!r}: the percentage must be between 01 and 99")
        if perturbed and family != "forget":
            raise ValueError(f"split {split!r}: only forgetPP has a _perturbed variant (else 'retain_perturbed')")
        share = 100 - pct if family == "retain" else pct
        return SplitInfo(split, family, share, PERTURBED_FIELDS if perturbed else QA_FIELDS)
    if split == "full":
        return SplitInfo(split, "full", None, QA_FIELDS)
    if split == "retain_perturbed":
        return SplitInfo(split, "retain_perturbed", None, PERTURBED_FIELDS)
    for family in ("real_authors", "world_facts"):
        if split == family:
            return SplitInfo(split, family, None, OPTION_FIELDS)
        if split == family + "_perturbed":
            return SplitInfo(split, family, None, MC_FIELDS)
    return SplitInfo(split, "custom", None, QA_FIELDS)


def _text(row: Mapping, key: str, where: str) -> str:
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        raise TOFUFormatError(f"{where}: field {key!r} must be a non-empty string, got {value!r:.80}")
    return value


def _row_to_item(row: object, info: SplitInfo, where: str) -> QAItem:
    need = ", ".join(info.fields)
    if not isinstance(row, Mapping):
        raise TOFUFormatError(f"{where}: expected an object with fields {need}, got {type(row).__name__}")
    missing = [f for f in info.fields if f not in row]
    if missing:
        raise TOFUFormatError(f"{where}: missing field(s) {', '.join(missing)}; split {info.name!r} needs {need}")
    perturbed: tuple[str, ...] = ()
    if info.fields == OPTION_FIELDS:
        options = [_text(row, f"option{k}", where) for k in range(1, 5)]
        answer = _text(row, "answer", where)
        if answer not in options:
            raise TOFUFormatError(f"{where}: 'answer' {answer!r} is none of option1..option4")
        perturbed = tuple(o for o in options if o != answer)
    elif "perturbed_answer" in row:
        raw = row["perturbed_answer"]
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, (list, tuple)) or not raw:
            raise TOFUFormatError(f"{where}: 'perturbed_answer' must be a non-empty list of strings")
        if not all(isinstance(p, str) and p.strip() for p in raw):
            raise TOFUFormatError(f"{where}: 'perturbed_answer' must hold non-empty strings, got {raw!r:.80}")
        perturbed = tuple(raw)
    optional = {
        k: _text(row, k, where)
        for k in ("paraphrased_answer", "paraphrased_question")
        if k in info.fields or row.get(k) is not None
    }
    return QAItem(_text(row, "question", where), _text(row, "answer", where), perturbed_answer=perturbed, **optional)


def _author_ids(n_rows: int, info: SplitInfo) -> list[int] | None:
    """Author index per row from the split's position in `full` (see the module docstring)."""
    if n_rows % QA_PER_AUTHOR or info.family in ("real_authors", "world_facts", "custom"):
        return None
    n = n_rows // QA_PER_AUTHOR
    offset = 0
    if info.family in ("forget", "holdout"):
        if (n * 100) % info.forget_pct:
            return None
        total = n * 100 // info.forget_pct  # authors in `full`, e.g. 20 forget10 authors -> 200
        offset = total - n if info.family == "forget" else total
    return [offset + i // QA_PER_AUTHOR for i in range(n_rows)]


def parse_rows(rows: object, split: str, where: str) -> list[QAItem]:
    """Validate a list of TOFU records for ``split`` and turn them into :class:`QAItem`s.

    ``where`` names the file (or table) in error messages.
    """
    info = split_info(split)
    need = ", ".join(info.fields)
    if not isinstance(rows, list):
        raise TOFUFormatError(
            f"{where}: expected a JSON list of objects with fields {need}, got a {type(rows).__name__}"
        )
    if not rows:
        raise TOFUFormatError(f"{where}: empty list; split {split!r} needs records with fields {need}")
    items = [_row_to_item(row, info, f"{where} row {i}") for i, row in enumerate(rows)]
    ids = _author_ids(len(items), info)
    return items if ids is None else [replace(it, author=a) for it, a in zip(items, ids)]


def _read_rows(path: Path, info: SplitInfo) -> object:
    need = ", ".join(info.fields)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TOFUFormatError(f"{path}: cannot read ({e}); expected a JSON list with fields {need}") from e
    try:
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TOFUFormatError(
            f"{path}: not valid JSON ({e.msg}, line {e.lineno}); expected a JSON list of objects with fields {need}"
        ) from e


def _load_folder(folder: Path, split: str) -> list[QAItem]:
    info = split_info(split)
    for suffix in (".json", ".jsonl"):
        path = folder / f"{split}{suffix}"
        if path.is_file():
            return parse_rows(_read_rows(path, info), split, str(path))
    raise FileNotFoundError(
        f"{folder / (split + '.json')} not found: split {split!r} needs a JSON list of "
        f"objects with fields {', '.join(info.fields)}; splits in {folder}: "
        f"{', '.join(list_splits(folder)) or 'none'}"
    )


def _load_hub(name: str, split: str) -> list[QAItem]:
    try:
        import datasets

        table = datasets.load_dataset(name, split, split="train")
    except Exception as e:  # any failure (offline, unknown config, auth) gets the same advice
        raise RuntimeError(
            f"could not load split {split!r} of {name!r} from the Hugging Face hub "
            f"({type(e).__name__}: {e}). No network? Put the dataset's JSON files in a folder and pass "
            f"that folder (no local folder {name!r} exists), or use source='synthetic'."
        ) from e
    return parse_rows([dict(row) for row in table], split, f"hub:{name}[{split}]")


def _from_mapping(splits: Mapping[str, Sequence[QAItem]], split: str) -> list[QAItem]:
    if split not in splits:
        raise KeyError(f"split {split!r} not in the given splits: {', '.join(splits)}")
    items = list(splits[split])
    bad = next((type(x).__name__ for x in items if not isinstance(x, QAItem)), None)
    if bad is not None:
        raise TypeError(f"split {split!r}: expected QAItem records, found a {bad}")
    return items


def _resolve(source: object) -> tuple[str, object]:
    """(kind, handle): kind is mapping, synthetic, folder or hub."""
    if isinstance(source, Mapping):
        return "mapping", source
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            f"TOFU source must be a folder, 'synthetic[:k=v,...]', a hub id or a mapping, got {type(source).__name__}"
        )
    text = os.fspath(source)
    if isinstance(source, str) and (text == "synthetic" or text.startswith("synthetic:")):
        return "synthetic", text
    path = Path(text).expanduser()
    if path.is_dir():
        return "folder", path
    if path.exists():
        raise NotADirectoryError(f"{path} is a file: pass the folder holding the TOFU split files")
    if isinstance(source, str) and _HUB_ID.fullmatch(text):
        return "hub", text
    raise FileNotFoundError(f"TOFU source {text!r}: no such folder (and not a hub id 'owner/name' nor 'synthetic')")


def _mapping_for(kind: str, handle: object) -> Mapping[str, Sequence[QAItem]]:
    if kind == "synthetic":
        return splits_from_spec(str(handle))
    return handle  # type: ignore[return-value]


def list_splits(source: str | os.PathLike | Mapping[str, Sequence[QAItem]]) -> list[str]:
    """Split names available in ``source``: standard TOFU names first, then others alphabetically.

    For a hub id this is the standard list (checking the hub would need the network).
    """
    kind, handle = _resolve(source)
    if kind == "hub":
        return list(TOFU_SPLITS)
    if kind == "folder":
        names = {
            p.stem
            for p in Path(handle).iterdir()  # type: ignore[arg-type]
            if p.suffix in (".json", ".jsonl") and p.is_file() and _SAFE_NAME.fullmatch(p.stem)
        }
        names -= _NOT_SPLITS
    else:
        names = set(_mapping_for(kind, handle))
    order = {name: i for i, name in enumerate(TOFU_SPLITS)}
    return sorted(names, key=lambda n: (order.get(n, len(order)), n))


def load_split(
    source: str | os.PathLike | Mapping[str, Sequence[QAItem]],
    split: str,
    *,
    authors: int | None = None,
    forget_pct: float | None = None,
) -> list[QAItem]:
    """Records of one split; with ``authors``, only that many authors' worth (see :func:`author_subset`).

    >>> len(load_split("synthetic:n_authors=20", "forget10_perturbed"))  # 2 forget authors x 20 QA
    40
    """
    kind, handle = _resolve(source)
    if kind == "folder":
        items = _load_folder(handle, split)  # type: ignore[arg-type]
    elif kind == "hub":
        items = _load_hub(str(handle), split)
    else:
        split_info(split)  # same name validation as the file sources
        items = _from_mapping(_mapping_for(kind, handle), split)
    return items if authors is None else author_subset(items, split, authors, forget_pct=forget_pct)


def author_subset(
    items: Sequence[QAItem],
    split: str,
    n_authors: int,
    *,
    forget_pct: float | None = None,
    qa_per_author: int = QA_PER_AUTHOR,
) -> list[QAItem]:
    """Shrink a split to a world of ``n_authors`` authors (``--authors N``), keeping author blocks.

    With F = :func:`forget_count` (N, PP) forget authors and R = N - F retain authors, where PP is the
    split's forget share (forgetPP, holdoutPP: PP; retainRR: 100 - RR; ``full``: ``forget_pct``):

    - ``retainRR``: the first R authors (those the full retain set starts with);
    - ``forgetPP``, ``forgetPP_perturbed``: the last F authors (the ones nearest the end of ``full``,
      so at N = 200 the real split comes back unchanged and smaller forget sets nest in larger ones);
    - ``full``: the first R then the last F authors, i.e. retain + forget of the reduced world;
    - ``holdoutPP``: the first F holdout authors (as many as forgetPP, as in the real data);
    - ``retain_perturbed``: the first forget_count(N, 10) authors (as many as forget10, as in the
      real data, and retain authors for every forget share);
    - ``real_authors*``, ``world_facts*``: unchanged (general knowledge, not author data).

    E.g. forget10 with N = 40 keeps 4 forget authors (80 rows) and retain90 36 authors (720 rows).
    """
    info = split_info(split)
    if info.family in ("real_authors", "world_facts"):
        return list(items)
    if info.family == "custom":
        raise ValueError(f"split {split!r}: author subsets are defined for TOFU split names only")
    pct = info.forget_pct if info.forget_pct is not None else forget_pct
    if info.family == "retain_perturbed":
        pct = 10
    if pct is None:
        raise ValueError(
            f"split {split!r}: pass forget_pct to say how many of the {n_authors} authors are forget authors"
        )
    n_forget = forget_count(n_authors, pct)
    n_retain = n_authors - n_forget
    blocks = _author_blocks(items, split, qa_per_author)
    take = {
        "retain": (n_retain, 0),
        "forget": (0, n_forget),
        "full": (n_retain, n_forget),
        "holdout": (n_forget, 0),
        "retain_perturbed": (n_forget, 0),
    }[info.family]
    if sum(take) > len(blocks):
        raise ValueError(
            f"split {split!r} has {len(blocks)} authors; {n_authors} authors at {pct}% forget need {sum(take)} of them"
        )
    head, tail = take
    kept = blocks[:head] + (blocks[len(blocks) - tail :] if tail else [])
    return [item for block in kept for item in block]


def _author_blocks(items: Sequence[QAItem], split: str, size: int) -> list[list[QAItem]]:
    """Consecutive blocks of ``size`` rows, one author each (checked when authors are known)."""
    if len(items) % size:
        raise ValueError(f"split {split!r}: {len(items)} rows are not whole author blocks of {size}")
    blocks = [list(items[i : i + size]) for i in range(0, len(items), size)]
    seen: set[int] = set()
    for k, block in enumerate(blocks):
        ids = {it.author for it in block}
        author = next(iter(ids))
        if len(ids) != 1 or author in seen:
            raise ValueError(
                f"split {split!r}: rows {k * size}..{k * size + size - 1} are not one author's "
                f"block (authors {sorted(map(str, ids))})"
            )
        if author is not None:
            seen.add(author)
    return blocks
