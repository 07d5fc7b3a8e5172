"""Rows of several ``voxceleb2 speaker --audit`` runs in one table, for ``mmunlearn report record``:

    python examples/speaker_runs_rows.py OUT.json "built-in, 3 of 20=runs/builtin3/head" "FSDD, 3 of 6=runs/fsdd3/head"

Each ``LABEL=RUN`` adds the run's original, retrained and method rows (``RUN/speaker.json``) with the audit's figures
(``RUN/AUDIT.json``: probe accuracy, share of the forgotten gap relearning brings back, kept after relearning) and a
``corpus`` column holding the label, and the worst forgotten speaker's share predicted as any forgotten speaker.
"""

import json
import sys
from pathlib import Path

out, rows = Path(sys.argv[1]), []
for item in sys.argv[2:]:
    label, run = item.split("=", 1)
    speaker = json.loads((Path(run) / "speaker.json").read_text())
    audit = {r["method"]: r for r in json.loads((Path(run) / "AUDIT.json").read_text())["rows"]}
    for r in speaker["rows"]:
        reference = {"original model": "target model", "retrained model": "retain model"}.get(r["method"])
        a = audit[reference or r["method"]]
        per = r.get("forget_per_speaker") or {}
        worst = max((v["any_forgotten"] for v in per.values()), default=None)  # the rule counts the worst speaker
        rows.append(
            {
                "corpus": label,
                **r,
                "worst_speaker_any_forgotten": worst,
                "kept_relearn": None if reference else a.get("kept_relearn"),
                "probe_accuracy": a.get("probe_accuracy"),
                "relearn_recovered": a.get("relearn_recovered"),
            }
        )
out.write_text(json.dumps({"rows": rows}, indent=1))
print(f"{len(rows)} rows -> {out}")
