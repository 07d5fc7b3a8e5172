"""Bring your own classifier: mmunlearn.unlearn's defaults on two FSDD speaker classifiers,
read back by their own tools.

Read top to bottom; one progress line per stage; re-runnable (a stage whose output exists is reused, and says so):

1. FSDD (real speech, 6 speakers) into manifests (``mmunlearn voxceleb2 prepare-corpus``), then ``path,label`` CSVs:
   the forgotten speaker's training clips (forget), the other speakers' (retain), both speakers' held-out clips.
2. Two classifiers a user could bring, each with a reference retrained without the forgotten speaker: a SpeechBrain
   ECAPA-TDNN (``mmunlearn voxceleb2 train``, the ``small`` preset) and a wav2vec2 built and trained with plain
   transformers (``examples/byo_fsdd_wav2vec2.py``).
3. ``mmunlearn.unlearn(model, forget=..., retain=..., method=M, out=...)`` with the API's defaults (scope "sweep",
   rule "auto") for M in qr-erase, grad_diff, npo, timed.
4. Every folder read back with the user's own tools: SpeechBrain's ``EncoderClassifier.classify_file`` and
   transformers' ``pipeline("audio-classification")``, on the forgotten speaker's and the kept speakers' held-out clips.
5. One JSON (rows for ``mmunlearn report record``, the goals, the commands, every wall time, each run's report).

    python examples/byo_fsdd.py --fsdd ../shared/data/fsdd --work runs/byo --out runs/byo/results.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np  # noqa: E402  (after mmunlearn on purpose, see above)
import soundfile as sf  # noqa: E402
import torch  # noqa: E402

import mmunlearn  # first: makes torchaudio (and so SpeechBrain) importable beside a CPU-only torch
from mmunlearn.report import git_commit, machine_facts

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
SPLITS = {
    "train": "train",
    "forget": "spk_forget_train",
    "retain": "spk_retain_train",
    "forget_test": "spk_forget_test",
    "kept_test": "spk_retain_test",
}
#: the goals: the forgotten speaker named no more often than by the retrained model + 5 points; kept within 3 points
FORGET_SLACK, KEPT_SLACK = 0.05, 0.03
COLUMNS = [
    ["model", "model"],
    ["folder", "name"],
    ["forget test -> forgotten", "forget_named"],
    ["kept test acc", "kept_acc"],
    ["read back by", "reader"],
    ["unlearn s", "unlearn_wall_s"],
    ["scope chosen", "scope"],
    ["rule met", "rule_met"],
    ["forget goal", "forget_goal"],
    ["kept goal", "kept_goal"],
]


def here(path: str) -> str:
    """``path`` relative to the working directory when it lies below it (a record holds no machine's absolute paths)."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_cmd(cmd: list[str], log: Path) -> float:
    """Run a command (one torch thread), its output to ``log``; its wall seconds."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({done.returncode}); see {log}")
    return round(time.perf_counter() - t0, 1)


class Stages:
    """Wall times and commands of the stages, kept in ``stages.json`` so a re-run reuses what is done."""

    def __init__(self, path: Path):
        self.path = path
        self.done = json.loads(path.read_text()) if path.is_file() else {}

    def run(self, name: str, ready: Path, cmd: list[str], log: Path) -> dict:
        if ready.exists():
            entry = self.done.get(name, {"command": shlex.join(cmd), "wall_s": None, "log": None})
            say(f"{name}: reused ({ready}; made in {entry['wall_s']} s)")
            return {**entry, "reused": True}
        say(f"{name}: {shlex.join(cmd)}")
        entry = {"command": shlex.join(cmd), "wall_s": run_cmd(cmd, log), "log": str(log)}
        self.save(name, entry)
        say(f"{name}: done in {entry['wall_s']} s")
        return {**entry, "reused": False}

    def save(self, name: str, entry: dict) -> None:
        if self.path.is_file():  # another invocation on the same folder may have saved stages since
            self.done = {**json.loads(self.path.read_text()), **self.done}
        self.done[name] = entry
        self.path.write_text(json.dumps(self.done, indent=2) + "\n")


def write_csvs(manifests: Path, data: Path) -> dict[str, Path]:
    """The manifests' splits as ``path,label`` CSVs (the two-column list form a user writes)."""
    data.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, split in SPLITS.items():
        with open(manifests / f"{split}.csv", newline="") as f:
            rows = [(r["wav"], r["spk_id"]) for r in csv.DictReader(f)]
        paths[name] = data / f"{name}.csv"
        with open(paths[name], "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["path", "label"])
            w.writerows(rows)
    return paths


def read_csv(path: Path) -> list[tuple[str, str]]:
    with open(path, newline="") as f:
        return [(r["path"], r["label"]) for r in csv.DictReader(f)]


def speechbrain_labels(folder: Path, clips: list[str], cache: Path) -> list[str]:
    """SpeechBrain's own answer for each clip: ``EncoderClassifier.from_hparams(source=folder).classify_file``."""
    from speechbrain.inference.speaker import EncoderClassifier  # deferred: a user's tool, loaded when read back

    sb = EncoderClassifier.from_hparams(
        source=str(folder.resolve()), savedir=str(cache.resolve()), run_opts={"device": "cpu"}
    )
    return [sb.classify_file(c)[3][0] for c in clips]


def pipeline_labels(folder: Path, clips: list[str]) -> list[str]:
    """transformers' own answer for each clip: ``pipeline("audio-classification", model=folder)`` on the waveform."""
    from transformers import pipeline  # deferred: a user's tool, loaded when read back

    pipe = pipeline("audio-classification", model=str(folder), device=-1)
    out = []
    for c in clips:
        wav, rate = sf.read(c, dtype="float32")
        out.append(pipe({"raw": np.asarray(wav), "sampling_rate": rate}, top_k=1)[0]["label"])
    return out


def read_back(model: str, folder: Path, tests: dict[str, list[tuple[str, str]]], forgotten: str, cache: Path) -> dict:
    """Share of the forgotten speaker's held-out clips named as that speaker; accuracy on the kept speakers' ones."""
    t0 = time.perf_counter()
    reader = speechbrain_labels if model == "ecapa" else pipeline_labels
    args = (cache,) if model == "ecapa" else ()
    forget = reader(folder, [p for p, _ in tests["forget_test"]], *args)
    kept = reader(folder, [p for p, _ in tests["kept_test"]], *args)
    return {
        "forget_named": sum(x == forgotten for x in forget) / len(forget),
        "kept_acc": sum(x == y for x, (_, y) in zip(kept, tests["kept_test"])) / len(kept),
        "reader": "classify_file" if model == "ecapa" else "pipeline",
        "read_s": round(time.perf_counter() - t0, 1),
    }


def unlearn_one(model_dir: Path, method: str, csvs: dict[str, Path], out: Path, stages: Stages, key: str) -> dict:
    """``mmunlearn.unlearn`` with the API's defaults (no other options), timed; reused when ``out`` holds its report."""
    call = (
        f"mmunlearn.unlearn({str(model_dir)!r}, forget={str(csvs['forget'])!r}, retain={str(csvs['retain'])!r}, "
        f"method={method!r}, out={str(out)!r})"
    )
    report_path = out / "unlearn_report.json"
    if report_path.is_file() and key in stages.done:
        say(f"{key}: reused ({out}; made in {stages.done[key]['wall_s']} s)")
        return {**stages.done[key], "report": json.loads(report_path.read_text()), "reused": True}
    say(f"{key}: {call}")
    t0 = time.perf_counter()
    result = mmunlearn.unlearn(
        model_dir, forget=csvs["forget"], retain=csvs["retain"], method=method, out=out, progress=False
    )
    entry = {"command": call, "wall_s": round(time.perf_counter() - t0, 1)}
    stages.save(key, entry)
    say(f"{key}: {entry['wall_s']} s; {result.report['verdict']}")
    return {**entry, "report": result.report, "reused": False}


def summary(report: dict) -> dict:
    """What a row needs of an unlearn report, and the sweep's points (for a missed goal: why)."""
    rule = report.get("rule") or {}
    return {
        "verdict": report.get("verdict"),
        "rule_met": report.get("target_reached"),
        "scope": report.get("scope"),
        "scopes_tried": report.get("scopes_tried"),
        "rule_forget": rule.get("forget"),
        "rule_forget_before": rule.get("base_forget"),
        "rule_forget_target": rule.get("forget_target"),
        "rule_retain_rise": (rule["retain"] - rule["base_retain"]) if "retain" in rule else None,
        "rule_retain_bound": rule.get("retain_bound"),
        "changed_fraction": report.get("changed_fraction"),
        "extract_seconds": report.get("extract_seconds"),
        "unlearn_seconds": report.get("unlearn_seconds"),
        "info": report.get("info"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fsdd", type=Path, default=Path("../shared/data/fsdd"), help="FSDD (the folder of recordings/)")
    ap.add_argument("--work", type=Path, default=Path("runs/byo"), help="where everything is made and reused")
    ap.add_argument("--out", type=Path, default=None, help="the results JSON (default WORK/results.json)")
    ap.add_argument("--methods", default="qr-erase,grad_diff,npo", help="methods to run, comma-separated")
    ap.add_argument("--models", default="ecapa,wav2vec2", help="models to bring, comma-separated: ecapa, wav2vec2")
    args = ap.parse_args()
    torch.set_num_threads(1)
    work, started = args.work, time.time()
    work.mkdir(parents=True, exist_ok=True)
    out_json = args.out or work / "results.json"
    stages = Stages(work / "stages.json")
    cli = here(str(BIN / "mmunlearn"))
    record: dict = {"stages": {}}

    manifests = work / "manifests"
    record["stages"]["prepare"] = stages.run(
        "prepare",
        manifests / "train.csv",
        [cli, "voxceleb2", "prepare-corpus", "--root", str(args.fsdd), "--out", str(manifests), "--jobs", "1"],
        work / "prepare.log",
    )
    csvs = write_csvs(manifests, work / "data")
    forgotten = sorted({label for _, label in read_csv(csvs["forget"])})
    if len(forgotten) != 1:
        raise ValueError(f"expected one forgotten speaker in {csvs['forget']}, got {forgotten}")
    forgotten_spk = forgotten[0]
    tests = {k: read_csv(csvs[k]) for k in ("forget_test", "kept_test")}
    say(
        f"data: forget {forgotten_spk} ({len(read_csv(csvs['forget']))} clips), retain "
        f"{len(read_csv(csvs['retain']))}, held out {len(tests['forget_test'])} + {len(tests['kept_test'])}"
    )

    train = [
        cli,
        "voxceleb2",
        "train",
        "--manifests",
        str(manifests),
        "--workdir",
        str(work),
        "--preset",
        "small",
        "--threads",
        "1",
    ]
    w2v = [
        here(sys.executable),
        here(str(HERE / "byo_fsdd_wav2vec2.py")),
        "--train",
        str(csvs["train"]),
        "--test",
        str(csvs["kept_test"]),
    ]
    makers = {
        "ecapa": (lambda d, ref: train + (["--retain-only"] if ref else []) + ["--out", str(d)], "hyperparams.yaml"),
        "wav2vec2": (
            lambda d, ref: w2v + (["--exclude", forgotten_spk] if ref else []) + ["--out", str(d)],
            "training.json",
        ),
    }
    rows, runs = [], {}
    for model in args.models.split(","):
        make, marker = makers[model]
        folders = {"original": work / model, "retrained": work / f"{model}_retrained"}
        for name in ("original", *args.methods.split(","), "retrained"):  # the reference last: unlearning needs none
            d = folders.setdefault(name, work / "unlearned" / f"{model}_{name}")
            if name in ("original", "retrained"):
                record["stages"][f"{model}/{name}"] = stages.run(
                    f"train {model} {name}", d / marker, make(d, name == "retrained"), work / f"{model}_{name}.log"
                )
            else:
                runs[f"{model}/{name}"] = unlearn_one(
                    folders["original"], name, csvs, d, stages, f"unlearn {model} {name}"
                )
        base: dict = {}
        for name in ("original", "retrained", *args.methods.split(",")):
            d = folders[name]
            key = f"read {model} {name}"
            if key in stages.done:  # the folders are never remade once they exist, so neither is what they answer
                measured = {**stages.done[key], "reused": True}
            else:
                measured = read_back(model, d, tests, forgotten_spk, work / "sb_cache" / f"{model}_{name}")
                stages.save(key, measured)
            row = {
                "model": model,
                "name": name,
                **measured,
                "unlearn_wall_s": None,
                "scope": None,
                "rule_met": None,
                "forget_goal": None,
                "kept_goal": None,
            }
            if name in ("original", "retrained"):
                base[name] = measured
            else:
                run = runs[f"{model}/{name}"]
                row.update(
                    unlearn_wall_s=run["wall_s"],
                    scope=run["report"].get("scope"),
                    rule_met=run["report"].get("target_reached"),
                    forget_goal=measured["forget_named"] <= base["retrained"]["forget_named"] + FORGET_SLACK,
                    kept_goal=measured["kept_acc"] >= base["original"]["kept_acc"] - KEPT_SLACK,
                )
            rows.append(row)
            say(
                f"read back {model} {name} ({row['reader']}, {measured['read_s']} s): {forgotten_spk} named on "
                f"{measured['forget_named']:.2f} of its held-out clips, kept accuracy {measured['kept_acc']:.3f}"
            )

    record.update(
        {
            "title": f"FSDD, 1 of 6 speakers forgotten ({forgotten_spk}): mmunlearn.unlearn with its defaults on a "
            "SpeechBrain ECAPA and a plain-transformers wav2vec2, read back by classify_file and pipeline",
            "columns": COLUMNS,
            "rows": rows,
            "machine": machine_facts(),
            # everything beside the rows goes in the context, which `mmunlearn report record` keeps with them
            "context": {
                "forgotten": forgotten_spk,
                "csvs": {k: str(v) for k, v in csvs.items()},
                "commit": git_commit(),
                "invocation": shlex.join([here(sys.executable), *sys.argv]),
                "goals": {
                    "forget": f"forget test -> forgotten <= retrained's + {FORGET_SLACK}",
                    "kept": f"kept test acc >= original's - {KEPT_SLACK}",
                },
                "stages": record.pop("stages"),
                "runs": {
                    k: {**{x: v[x] for x in ("command", "wall_s", "reused")}, **summary(v["report"])}
                    for k, v in runs.items()
                },
                "total_wall_s": round(time.time() - started, 1),
            },
        }
    )
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(record, indent=2, default=str) + "\n")
    say(f"done in {record['context']['total_wall_s']} s: {out_json}")


if __name__ == "__main__":
    main()
