"""cTOFU comparison JSON -> row files for ``mmunlearn report record`` (docs/ctofu.md's three tables):

    python examples/ctofu_record_rows.py runs/ctofu_mini/compare.json runs/ctofu_mini/records

writes ``fq.json``, ``rouge_drop.json``, ``prob_ratio.json`` (the forget-set probability after / before,
Multilingual Amnesia's measure) and ``utility.json`` (one row per method, one column per language: the comparison's
method x language matrices) and ``transfer.json`` (the transfer summary rows as they are).
"""

import json
import sys
from pathlib import Path

run, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
rows = run["rows"]
methods = list(dict.fromkeys(r["method"] for r in rows))
langs = list(dict.fromkeys(r["lang"] for r in rows))
matrices = (("forget_quality", "fq"), ("rouge_drop", "rouge_drop"), ("prob_ratio", "prob_ratio"))
for key, name in (*matrices, ("model_utility", "utility")):
    cell = {(r["method"], r["lang"]): r.get(key) for r in rows}
    table = [{"method": m, **{lang: cell.get((m, lang)) for lang in langs}} for m in methods]
    (out / f"{name}.json").write_text(
        json.dumps({"rows": table, "columns": [["method", "method"]] + [[lang, lang] for lang in langs]}, indent=1)
    )
(out / "transfer.json").write_text(json.dumps({"rows": run["transfer"]}, indent=1))
print(f"{len(methods)} methods x {len(langs)} languages -> {out}")
