"""Centroid erasure of a speaker classifier's embeddings (issue 24, item 4), measured against the item's goal.

Run on a workdir of ``voxceleb2 speaker --forget-speakers 3`` with the head scope done (``<workdir>/head``):

    python examples/speaker_centroid_erase.py runs/builtin3 emb:1,head+emb:1,emb:2,head+emb:2

Each variant ``BASE:ALPHA`` starts from the original model (``emb``) or the head-scope QR-Erase output (``head+emb``),
erases the forgotten speakers' centroid directions outside the retained speakers' centroid span from the embedding
model's last layer (:mod:`mmunlearn.erase.subspace.centroid`; centroids of the training utterances), saves the model
under
``<workdir>/centroid/<variant>/model``, evaluates it as the recipe does and audits it with ``mmunlearn audit``
(relearning and probe, the recipe's defaults). ``<workdir>/centroid/results.json`` holds every variant and table rows.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import mmunlearn  # noqa: F401  (torchaudio stand-in before SpeechBrain)
from mmunlearn.adapters.speaker.adapter import SpeakerAdapter
from mmunlearn.data.utterances import split_rows
from mmunlearn.erase.subspace.centroid import centroid_subspace, class_centroids, project_output
from mmunlearn.eval.speaker import evaluate_speaker_unlearning, score_rows

torch.set_num_threads(1)
root = Path(sys.argv[1])
variants = [v.split(":") for v in sys.argv[2].split(",")]
out, man = root / "centroid", root / "manifests"
original = next((root / "models").glob("original-*"))
retrained = next((root / "models").glob("retrain-speaker-*"))
forget, retain = split_rows(man, "spk_forget_train"), split_rows(man, "spk_retain_train")
forgotten = sorted({r["spk_id"] for r in forget})


def centroids(adapter, rows):
    scored = score_rows(adapter, rows, desc=None)
    return class_centroids(scored.embeddings, scored.speakers)


results, rows = {}, []
for base, alpha in variants:
    name = f"{base}-a{alpha}"
    src = root / "head" / "qr-erase" / "model" if base.startswith("head") else original
    model = SpeakerAdapter.load(src, device="cpu")
    t0 = time.perf_counter()
    before_f, before_r = centroids(model, forget), centroids(model, retain)
    basis = centroid_subspace(before_f, before_r)
    fc = model.model.embedding_model.fc.conv  # ECAPA's last layer: the embeddings
    project_output(fc.weight, fc.bias, basis, float(alpha))
    seconds = time.perf_counter() - t0
    folder = out / name / "model"
    model.save(folder, overwrite=True)
    edited = SpeakerAdapter.load(folder, device="cpu")
    after = centroids(edited, forget + retain)
    u = basis.numpy()
    facts = {
        "dim": int(u.shape[0]),
        "erased_directions": int(u.shape[1]),
        "forget_share_outside_retain_span": {
            k: float(np.linalg.norm(u.T @ v) / np.linalg.norm(v)) for k, v in before_f.items()
        },
        "retain_centroid_max_rel_change": max(
            float(np.linalg.norm(after[k] - v) / np.linalg.norm(v)) for k, v in before_r.items()
        ),
        "forget_centroid_max_share_along_erased": max(
            float(np.linalg.norm(u.T @ after[k]) / np.linalg.norm(after[k])) for k in forgotten
        ),
    }
    ev = evaluate_speaker_unlearning(edited, man, "speaker", progress=False)
    subprocess.run(
        [
            str(Path(sys.executable).parent / "mmunlearn"),
            "audit",
            "--model",
            str(folder),
            "--target",
            str(original),
            "--retain-model",
            str(retrained),
            "--data",
            str(man),
            "--out",
            str(out / name),
            "--attacks",
            "relearn,probe",
            "--threads",
            "1",
            "--device",
            "cpu",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    audit = json.loads((out / name / "AUDIT.json").read_text())
    summary = {r["method"]: r for r in audit["rows"]}
    mine = audit["results"][0]["summary"]
    results[name] = {
        "base": str(src),
        "alpha": float(alpha),
        "edit_seconds": seconds,
        "centroids": facts,
        "eval": ev,
        "audit": {"unlearned": mine, "retain model": summary["retain model"]},
    }
    rows.append(
        {
            "method": f"{'head edit + ' if base.startswith('head') else ''}centroid erase, alpha {alpha}",
            **{
                k: ev[k]
                for k in ("forget_acc", "forget_test_acc", "forget_any_acc", "forget_test_any_acc", "test_acc", "eer")
            },
            "relearn_recovered": mine.get("relearn_recovered"),
            "kept_relearn": mine.get("kept_relearn"),
            "probe_accuracy": mine.get("probe_accuracy"),
            "retain_centroid_change": facts["retain_centroid_max_rel_change"],
            "forget_share_outside_retain_span": max(facts["forget_share_outside_retain_span"].values()),
        }
    )
    print(json.dumps(rows[-1]), flush=True)
(out / "results.json").write_text(json.dumps({"variants": results, "rows": rows}, indent=1, default=str))
