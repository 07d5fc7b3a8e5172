"""Issue 32's questions answered from a finished `ctofu compare` folder's compare.json: per language, which methods
meet the forget criterion with model utility >= 0.9x the target's; how far forgetting in the forget language
reaches the other languages, Latin against non-Latin scripts; QR-Erase against SVD-UNLEARN on every metric and
on time (the seeds' claim: within 5 % on every metric at a fraction of the time).

The forget criterion is TOFU's (forget quality >= 0.05) when the forget quality separates the target from the
retain model (the target's own forget quality below 0.05) in every evaluated language; otherwise it is the forget
ROUGE-L against the retain model's (at most the retain model's, in that language), and every row says which::

    python examples/ctofu_goals.py runs/ctofu_mini/compare.json runs/ctofu_mini/goals

writes ``criterion.json``, ``scripts.json`` and ``qr_vs_svd.json`` (``{'columns', 'rows'}`` each) for
``mmunlearn report record``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from mmunlearn.files.atomic import write_text_atomic

MIN_FORGET_QUALITY = 0.05
MIN_UTILITY_RATIO = 0.9
MAX_RELATIVE_GAP = 0.05
#: the script each cTOFU language is written in
SCRIPTS = {
    "en": "Latin",
    "fr": "Latin",
    "id": "Latin",
    "ru": "Cyrillic",
    "ar": "Arabic",
    "fa": "Arabic",
    "iw": "Hebrew",
    "hi": "Devanagari",
    "ja": "Japanese",
    "ko": "Hangul",
}
REFERENCES = ("target model", "retain model")


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _cells(comp: dict) -> tuple[list[str], list[str], dict[tuple[str, str], dict]]:
    rows = comp.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ValueError("compare.json holds no rows")
    cell = {(r["method"], r["lang"]): r for r in rows}
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m not in REFERENCES]
    langs = list(dict.fromkeys(r["lang"] for r in rows))
    missing = [(ref, lang) for ref in REFERENCES for lang in langs if (ref, lang) not in cell]
    if missing:
        raise ValueError(f"compare.json lacks the reference rows {missing}")
    return methods, langs, cell


def fq_separates(comp: dict) -> bool:
    """Whether the target's forget quality is below the criterion in every language (else FQ cannot tell the
    target from the retain model with this many forget rows)."""
    _, langs, cell = _cells(comp)
    values = [_num(cell[("target model", lang)].get("forget_quality")) for lang in langs]
    return all(v is not None and v < MIN_FORGET_QUALITY for v in values)


def forgets(row: dict, retain: dict, criterion: str) -> bool | None:
    """The forget criterion on one (method, language) row: ``fq`` (forget quality >= 0.05) or ``rouge`` (forget
    ROUGE-L at most the retain model's in that language); None when a value is missing."""
    if criterion == "fq":
        fq = _num(row.get("forget_quality"))
        return None if fq is None else fq >= MIN_FORGET_QUALITY
    mine, ref = _num(row.get("forget_Q_A_ROUGE")), _num(retain.get("forget_Q_A_ROUGE"))
    return None if mine is None or ref is None else mine <= ref


def criterion_rows(comp: dict, criterion: str = "auto") -> list[dict]:
    """Per language: the criterion used, the references' values, and the methods meeting the forget criterion,
    the utility bound (>= 0.9x the target's in that language), and both."""
    if criterion not in ("auto", "fq", "rouge"):
        raise ValueError(f"criterion {criterion!r}: choose auto, fq or rouge")
    methods, langs, cell = _cells(comp)
    chosen = ("fq" if fq_separates(comp) else "rouge") if criterion == "auto" else criterion
    out = []
    for lang in langs:
        target, retain = cell[("target model", lang)], cell[("retain model", lang)]
        target_mu = _num(target.get("model_utility"))
        forget_ok, mu_ok = [], []
        for m in methods:
            row = cell.get((m, lang))
            if row is None:
                continue
            if forgets(row, retain, chosen):
                forget_ok.append(m)
            mu = _num(row.get("model_utility"))
            if mu is not None and target_mu and mu >= MIN_UTILITY_RATIO * target_mu:
                mu_ok.append(m)
        both = [m for m in forget_ok if m in mu_ok]
        # a target whose utility is 0 (every real-authors or world-facts answer wrong in that language) leaves no
        # ratio to keep: said, not counted as "none kept"
        unknown = "n/a (target MU 0)" if target_mu == 0 else None
        out.append(
            {
                "lang": lang,
                "script": SCRIPTS.get(lang, "?"),
                "criterion": "FQ >= 0.05" if chosen == "fq" else "forget ROUGE-L <= retain model's",
                "target_fq": target.get("forget_quality"),
                "target_rouge": target.get("forget_Q_A_ROUGE"),
                "retain_rouge": retain.get("forget_Q_A_ROUGE"),
                "target_prob": target.get("forget_Q_A_Prob"),
                "retain_prob": retain.get("forget_Q_A_Prob"),
                "target_mu": target.get("model_utility"),
                "forget_met": ", ".join(forget_ok) or "none",
                "mu_kept": unknown or ", ".join(mu_ok) or "none",
                "both": unknown or ", ".join(both) or "none",
            }
        )
    return out


def script_rows(comp: dict) -> list[dict]:
    """Per method: the relative forget ROUGE-L drop in the forget language(s), in the other Latin-script languages
    and in the non-Latin ones, and each side's share of the forget language's drop (its transfer ratio)."""
    methods, langs, cell = _cells(comp)
    forget_langs = tuple((comp.get("context") or {}).get("forget_langs") or ("en",))
    others = [lang for lang in langs if lang not in forget_langs]
    latin = [lang for lang in others if SCRIPTS.get(lang) == "Latin"]
    non_latin = [lang for lang in others if SCRIPTS.get(lang) != "Latin"]

    def drop(m: str, group: list[str]) -> float | None:
        return _mean([_num((cell.get((m, lang)) or {}).get("rouge_rel_drop")) for lang in group])

    def share(d: float | None, own: float | None) -> float | None:
        return d / own if d is not None and own is not None and own > 0 else None

    out = []
    for m in methods:
        own, lat, non = drop(m, list(forget_langs)), drop(m, latin), drop(m, non_latin)
        out.append(
            {
                "method": m,
                "drop_forget": own,
                "drop_latin": lat,
                "drop_non_latin": non,
                "transfer_latin": share(lat, own),
                "transfer_non_latin": share(non, own),
                "latin": ",".join(latin) or "none",
                "non_latin": ",".join(non_latin) or "none",
            }
        )
    return out


def _gap(a: float | None, b: float | None) -> float | None:
    """|a - b| relative to |b| (0 when both are 0, None when one is missing or b alone is 0)."""
    if a is None or b is None:
        return None
    if b == 0:
        return 0.0 if a == 0 else None
    return abs(a - b) / abs(b)


def qr_vs_svd_rows(comp: dict, qr: str = "qr-erase", svd: str = "svd-unlearn") -> list[dict]:
    """Per language and metric (forget quality, forget ROUGE-L drop, model utility), then unlearning time:
    QR-Erase's and SVD-UNLEARN's values, the gap relative to SVD's and whether it is within 5 %; the time row
    gives QR-Erase's time as a fraction of SVD's."""
    methods, langs, cell = _cells(comp)
    if qr not in methods or svd not in methods:
        raise ValueError(f"compare.json has no rows of {qr!r} and {svd!r}")
    out = []
    for lang in langs:
        for header, key in (
            ("forget quality", "forget_quality"),
            ("forget ROUGE-L drop", "rouge_drop"),
            ("model utility", "model_utility"),
        ):
            a, b = _num(cell[(qr, lang)].get(key)), _num(cell[(svd, lang)].get(key))
            gap = _gap(a, b)
            out.append(
                {
                    "metric": f"{header} ({lang})",
                    "qr": a,
                    "svd": b,
                    "gap": gap,
                    "within": None if gap is None else gap <= MAX_RELATIVE_GAP,
                }
            )
    seconds = [_num(cell[(m, langs[0])].get("total_seconds")) for m in (qr, svd)]
    ratio = seconds[0] / seconds[1] if None not in seconds and seconds[1] else None
    out.append(
        {
            "metric": "extraction + sweep + edit, s (QR / SVD)",
            "qr": seconds[0],
            "svd": seconds[1],
            "gap": ratio,
            "within": None,
        }
    )
    return out


COLUMNS = {
    "criterion": [
        ["lang", "lang"],
        ["script", "script"],
        ["criterion", "criterion"],
        ["target FQ", "target_fq"],
        ["target forget ROUGE-L", "target_rouge"],
        ["retain forget ROUGE-L", "retain_rouge"],
        ["target forget prob", "target_prob"],
        ["retain forget prob", "retain_prob"],
        ["target MU", "target_mu"],
        ["forget criterion met", "forget_met"],
        ["MU >= 0.9x target's", "mu_kept"],
        ["both", "both"],
    ],
    "scripts": [
        ["method", "method"],
        ["rel. ROUGE-L drop, forget lang", "drop_forget"],
        ["other Latin", "drop_latin"],
        ["non-Latin", "drop_non_latin"],
        ["transfer, Latin", "transfer_latin"],
        ["transfer, non-Latin", "transfer_non_latin"],
        ["Latin langs", "latin"],
        ["non-Latin langs", "non_latin"],
    ],
    "qr_vs_svd": [
        ["metric", "metric"],
        ["qr-erase", "qr"],
        ["svd-unlearn", "svd"],
        ["gap / SVD (time: QR / SVD)", "gap"],
        ["within 5 %", "within"],
    ],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("compare", type=Path, help="A finished `ctofu compare` folder's compare.json.")
    p.add_argument("out", type=Path, help="Folder for criterion.json, scripts.json and qr_vs_svd.json.")
    p.add_argument(
        "--criterion",
        default="auto",
        help="auto (FQ when it separates target and retain model in every language, else ROUGE-L), fq or rouge.",
    )
    args = p.parse_args()
    comp = json.loads(args.compare.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    tables = {
        "criterion": criterion_rows(comp, args.criterion),
        "scripts": script_rows(comp),
        "qr_vs_svd": qr_vs_svd_rows(comp),
    }
    print("forget quality separates target and retain model in every language:", fq_separates(comp))
    for name, rows in tables.items():
        path = write_text_atomic(
            args.out / f"{name}.json", json.dumps({"columns": COLUMNS[name], "rows": rows}, indent=2)
        )
        print(f"{len(rows)} rows -> {path}")


if __name__ == "__main__":
    main()
