"""Where each forgotten speaker's audio goes after sequential deletion requests (QR-Erase on the class weights):

    python examples/requests_per_speaker.py runs/fsdd3/manifests runs/bench_requests_fsdd runs/requests_per_speaker.json

reuses the speaker classifier ``mmunlearn bench requests --manifests ... --workdir ...`` trained (its
``model-*`` folder), applies one request per forget speaker in order with the same settings as the bench (gradient
extraction, auto scales, no retain subspace, the speaker rule on 32 retain utterances, one thread, each request
written to its folder under ``WORKDIR/per_speaker`` and the next one read from there), and after each
request writes one row per speaker forgotten so far: their utterances (training and held-out), the share still
predicted as themselves, the share predicted as any forgotten speaker, and the three classes that receive most of
their audio. The JSON's ``rows`` go to ``mmunlearn report record``.
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from mmunlearn.adapters.speaker.adapter import SpeakerAdapter
from mmunlearn.api.rules import chance_error_rate, speaker_rule
from mmunlearn.data.utterances import split_rows
from mmunlearn.eval.speaker import forgotten_counts, score_rows
from mmunlearn.methods import UnlearnRequest
from mmunlearn.requests import History, read_history, run_request

man, work, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
torch.set_num_threads(1)
models = sorted(work.glob("model-*"))
if not models:
    sys.exit(f"no model-* folder in {work}: run mmunlearn bench requests --workdir {work} first")
forget, retain = split_rows(man, "spk_forget_train"), split_rows(man, "spk_retain_train")
heard = forget + split_rows(man, "spk_forget_test")
speakers = sorted({r["spk_id"] for r in forget})
model = SpeakerAdapter.load(models[0], device="cpu")
model.scope = "head"
scored = [retain[round(i * (len(retain) - 1) / 31)] for i in range(32)]  # the bench's --score-retain default
n_classes = len(model.speakers)
rule = replace(
    speaker_rule(n_classes, 0.05, chance_error_rate(n_classes)), retain_items=scored, checks_per_epoch=1
)  # as the bench
history, rows = History(work), []
for i, spk in enumerate(speakers, 1):
    ask = [r for r in forget if r["spk_id"] == spk]
    folder = work / "per_speaker" / f"request-{i}"  # each request's folder, as the bench writes it
    request = UnlearnRequest(
        "qr-erase",
        "speaker",
        size="small",
        rule=rule,
        out=folder,
        overwrite=True,
        progress=False,
        overrides={"extract_kind": "gradient", "sweep_scales": "auto", "retain_rank": 0},
    )
    result = run_request(request, model, ask, retain, history=history)
    history = read_history(folder)
    gone = speakers[:i]
    scores = score_rows(model, [r for r in heard if r["spk_id"] in gone], desc=None)
    counted = forgotten_counts(scores, forget_classes=[model.index[s] for s in gone])
    for who, v in counted["per_speaker"].items():
        mine = scores.predictions[scores.labels == model.index[who]]
        top = sorted(((int((mine == k).sum()), model.speakers[k]) for k in set(mine.tolist())), reverse=True)[:3]
        rows.append(
            {
                "request": i,
                "request_speaker": spk,
                "rule_met": result.report["target_reached"],
                "speaker": who,
                "utterances": v["utterances"],
                "own": v["acc"],
                "any_forgotten": v["any_forgotten"],
                "goes_to": ", ".join(f"{name} {n / len(mine):.2f}" for n, name in top),
            }
        )
        print(rows[-1])
out.write_text(json.dumps({"rows": rows, "speakers": speakers, "model": str(models[0])}, indent=1))
print(f"wrote {out}")
