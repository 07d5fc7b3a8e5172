"""One table for issue 24 item 4: the head-only QR-Erase row of a scope run beside the centroid-erasure variants of
``examples/speaker_centroid_erase.py`` (and, optionally, the embedding-only variants of an earlier run of it):

    python examples/speaker_centroid_rows.py OUT.json runs/builtin3 [runs/builtin3/centroid_old/results.json]

Rows: the original and retrained models and ``qr-erase (head)`` from ``RUN/scopes_rows.json``, then every variant in
``RUN/centroid/results.json`` (and the ``centroid erase`` rows of the earlier file).
"""

import json
import sys
from pathlib import Path

out, run = Path(sys.argv[1]), Path(sys.argv[2])
scopes = json.loads((run / "scopes_rows.json").read_text())["rows"]
rows = [r for r in scopes if r["method"] in ("original model", "retrained model", "qr-erase (head)")]
rows = [{**r, "method": "head edit only" if r["method"] == "qr-erase (head)" else r["method"]} for r in rows]
if len(sys.argv) > 3:
    rows += [r for r in json.loads(Path(sys.argv[3]).read_text())["rows"] if r["method"].startswith("centroid erase")]
rows += json.loads((run / "centroid" / "results.json").read_text())["rows"]
out.write_text(json.dumps({"rows": rows}, indent=1))
print(f"{len(rows)} rows -> {out}")
