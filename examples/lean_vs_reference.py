"""How far the lean TOFU evaluation moves the figures: two comparisons of the same models, side by side.

Reads the ``compare.json`` of a run evaluated with the reference settings (200 new tokens, every real-authors /
world-facts item) and of one evaluated with the lean ones (``--max-new-tokens auto --utility-items N``), both
written by ``examples/lean_vs_reference.sh``, and writes one JSON (rows per model: forget quality, model utility
and forget ROUGE-L under each setting, their differences, evaluation seconds) that ``mmunlearn report record``
turns into the docs table::

    python examples/lean_vs_reference.py runs/mini_reference runs/mini_lean --json runs/lean_vs_reference.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

#: (key in a compare row, short name in the output)
MEASURES = (("forget_quality", "fq"), ("model_utility", "mu"), ("forget_Q_A_ROUGE", "forget_rouge"))


def _rows(run: Path) -> tuple[dict[str, dict], dict]:
    path = run / "compare.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run examples/lean_vs_reference.sh first")
    data = json.loads(path.read_text())
    return {r["method"]: r for r in data["rows"]}, data


def side_by_side(reference: Path, lean: Path) -> dict:
    """Rows of both runs for every model they share, the lean minus the reference figure beside each pair."""
    ref_rows, ref = _rows(reference)
    lean_rows, lean_data = _rows(lean)
    shared = [m for m in ref_rows if m in lean_rows]
    if not shared:
        raise ValueError(f"{reference} and {lean} share no model rows")
    rows = []
    for method in shared:
        row: dict = {"method": method}
        for key, short in MEASURES:
            a, b = ref_rows[method].get(key), lean_rows[method].get(key)
            row[f"{short}_reference"], row[f"{short}_lean"] = a, b
            row[f"{short}_change"] = b - a if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None
        row["eval_seconds_reference"] = ref_rows[method].get("eval_seconds")
        row["eval_seconds_lean"] = lean_rows[method].get("eval_seconds")
        rows.append(row)
    walls = {"reference": ref["context"].get("wall_seconds"), "lean": lean_data["context"].get("wall_seconds")}
    settings = {
        name: {k: d["context"].get(k) for k in ("max_new_tokens", "utility_items", "precision")}
        for name, d in (("reference", ref), ("lean", lean_data))
    }
    return {
        "rows": rows,
        "wall_seconds": walls,
        "settings": settings,
        "runs": {"reference": str(reference), "lean": str(lean)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", type=Path, help="Run folder evaluated with the reference settings.")
    parser.add_argument("lean", type=Path, help="Run folder of the same models evaluated with the lean settings.")
    parser.add_argument("--json", type=Path, required=True, help="Where to write the side-by-side rows.")
    args = parser.parse_args()
    result = side_by_side(args.reference, args.lean)
    tmp = args.json.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(args.json)
    for r in result["rows"]:
        print(
            f"{r['method']:<14} FQ {r['fq_reference']!s:>10} -> {r['fq_lean']!s:<10} "
            f"MU {r['mu_reference']!s:>10} -> {r['mu_lean']!s:<10}"
        )
    print(f"wall seconds: {result['wall_seconds']}; wrote {args.json}")


if __name__ == "__main__":
    main()
