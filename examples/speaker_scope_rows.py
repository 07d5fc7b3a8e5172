"""One table of QR-Erase runs in several scopes (issue 24, item 4): each scope's ``speaker.json`` and ``AUDIT.json``
(``voxceleb2 speaker --audit --out <run>/<scope>``) merged into rows for ``mmunlearn report record``:

    python examples/speaker_scope_rows.py runs/fsdd3 head,embedding runs/fsdd3/scopes_rows.json

The original and retrained rows come from the first scope's run, with their own audit figures (the probe's accuracy,
the retrained model's share of the forgotten gap recovered by relearning).
"""

import json
import sys
from pathlib import Path

run, scopes, out = Path(sys.argv[1]), sys.argv[2].split(","), Path(sys.argv[3])
rows = []
for i, scope in enumerate(scopes):
    speaker = json.loads((run / scope / "speaker.json").read_text())
    audit = {r["method"]: r for r in json.loads((run / scope / "AUDIT.json").read_text())["rows"]}
    for r in speaker["rows"]:
        reference = {"original model": "target model", "retrained model": "retain model"}.get(r["method"])
        if reference is not None and i > 0:
            continue
        a = audit[reference or r["method"]]
        rows.append(
            {
                **r,
                "method": r["method"] if reference else f"{r['method']} ({scope})",
                "kept_relearn": None if reference else a.get("kept_relearn"),
                "probe_accuracy": a.get("probe_accuracy"),
                "relearn_recovered": a.get("relearn_recovered"),
            }
        )
out.write_text(json.dumps({"rows": rows}, indent=1))
