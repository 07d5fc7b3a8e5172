"""The steps of the VoxCeleb2 recipe: built-in corpus, cached classifiers and evaluations, one method's row
(through :func:`recipes.runner.run_method`, with the per-scope sweep as its ``unlearn`` hook).

Trained classifiers are cached under ``<cache>/models/<name>-<key>``, the key hashing the training
rows (IDs, files and their size/mtime), the label space, the preset, the training settings and the
seed, so ``train``, ``speaker`` and ``sample`` share them; evaluations of the original and retrained
models are cached beside them (``evals/<key>.json``). Tables and plots live in
:mod:`recipes.voxceleb2.report`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from data_prep.synth_speakers import synthesize_corpus
from data_prep.voxceleb2 import prepare
from mmunlearn.adapters.speaker.adapter import SCORING_VERSION  # how batches are trained on and scored
from mmunlearn.adapters.speaker.training import training_rows
from mmunlearn.data.manifest import SPLIT_NAMES
from mmunlearn.data.utterances import LEVELS, split_rows
from mmunlearn.eval.speaker import evaluate_speaker_unlearning
from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.files.undo_store import default_undo_dir
from mmunlearn.kinds import kind_of
from mmunlearn.methods import mean_nll
from mmunlearn.methods.rule import SweepPoint, choose
from mmunlearn.train import TrainConfig, TrainResult
from recipes.runner import RUN_JSON, Harness, Unlearned, run_method
from recipes.voxceleb2 import settings

#: Partitions each level unlearns with: (forget split, retain split), and the retrained model's rows.
PARTITIONS = {"speaker": ("spk_forget_train", "spk_retain_train"), "sample": ("sample_forget", "sample_retain")}
RETRAIN_NAME = {"speaker": "retrain-speaker", "sample": "retrain-sample"}
#: What the cached evaluations hold (part of their key): 2 = MIA intervals by recording, forgetting counted
#: as "any forgotten speaker" and the concentration on single retained speakers.
EVAL_VERSION = 2


def builtin_manifests(
    workdir: Path,
    *,
    speakers: int = 20,
    utterances: int = 30,
    videos: int = 3,
    forget_speakers: int = 2,
    forget_fraction: float = 0.1,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """Synthesise (or reuse) the espeak-ng corpus in ``workdir/corpus`` and prepare (or reuse) its
    manifests in ``workdir/manifests``; returns the manifest directory."""
    root = synthesize_corpus(Path(workdir) / "corpus", speakers, utterances, videos, seed, progress=progress)
    return prepare(
        root,
        Path(workdir) / "manifests",
        forget_speakers=forget_speakers,
        forget_fraction=forget_fraction,
        seed=seed,
        progress=progress,
    ).out


def rows_digest(rows: list[dict]) -> str:
    """Digest of manifest rows: their IDs, spans, speakers and audio files (path, size, mtime)."""
    h = hashlib.sha256()
    for r in rows:
        wav = str(r["wav"])
        try:
            st = os.stat(wav)
            stamp = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError as exc:
            raise FileNotFoundError(f"row {r.get('ID')}: audio file {wav} is not readable") from exc
        h.update(f"{r.get('ID')}\0{wav}\0{r.get('start')}\0{r.get('stop')}\0{r['spk_id']}\0{stamp}\n".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class ModelSpec:
    """What a trained classifier depends on (its cache key)."""

    name: str  # original | retrain-speaker | retrain-sample
    preset: str
    train: dict  # TrainConfig.to_dict()
    crop_seconds: float | None
    seed: int
    model: str = "classifier"  # --model: ECAPA's alias (keys as before this field) or a classifier kind's name

    def key(self, rows: list[dict], speakers: list[str]) -> str:
        fields = {k: v for k, v in asdict(self).items() if k != "model" or self.model not in settings.MODEL_ALIASES}
        spec = json.dumps([fields, rows_digest(rows), speakers, SCORING_VERSION], sort_keys=True, default=str)
        return hashlib.sha256(spec.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Family:
    """The classifier family ``--model`` names, read from its kind (the recipe asks it, never compares family names):
    the kind's name and its trainer module's functions (:data:`mmunlearn.kinds.TRAINER_API`)."""

    kind: str
    trainer: Callable[..., tuple[Any, TrainResult]]
    train_config: Callable[..., TrainConfig]  # (preset, *, epochs, lr) -> the original/retrained models' training
    describe: Callable[[str], dict]  # preset -> what the context records about the model
    #: the recipe's model before ``--model`` existed: cache keys without the field, results directly under --workdir
    #: (the others' default --out: --workdir/<model>/<level>)
    unprefixed: bool = False


def family(model: str) -> Family:
    """The classifier family of ``--model`` (any registered classifier kind with a trainer; a ValueError otherwise)."""
    kind = settings.model_kind(model)
    if not kind.is_classifier:
        raise ValueError(f"--model {model}: not a classifier kind")
    module = kind.trainer_module()
    return Family(
        kind.name, module.train, module.train_config, module.describe, unprefixed=model in settings.MODEL_ALIASES
    )


def load_classifier(path: Path, device: str, scope: str = "all"):
    """The adapter of a classifier folder of any registered classifier kind (asked of :mod:`mmunlearn.kinds`)."""
    kind = kind_of(path)
    if kind is None or not kind.is_classifier:
        raise ValueError(f"{path}: not a speaker classifier folder of a registered kind")
    return kind.load(path, device=device, scope=scope)


def trained_model(
    manifests: Path, spec: ModelSpec, cache_dir: Path, *, device: str = "cpu", progress: bool = True
) -> Path:
    """Directory of the classifier ``spec`` trained on ``manifests`` (trained now unless cached).

    ``original`` trains on ``train`` (retain + forget); ``retrain-speaker`` on ``spk_retain_train``;
    ``retrain-sample`` on ``sample_retain``. All share the label space of ``train``.
    """
    if spec.name == "original":
        rows, speakers = training_rows(manifests, "speaker", retain_only=False)
    elif spec.name in RETRAIN_NAME.values():
        level = next(k for k, v in RETRAIN_NAME.items() if v == spec.name)
        rows, speakers = training_rows(manifests, level, retain_only=True)
    else:
        raise ValueError(f"unknown model {spec.name!r}; choose original, {' or '.join(RETRAIN_NAME.values())}")
    out = Path(cache_dir) / "models" / f"{spec.name}-{spec.key(rows, speakers)}"
    if (out / "train_log.json").is_file():
        return out
    start = time.perf_counter()
    trainer = family(spec.model).trainer
    adapter, result = trainer(
        rows,
        speakers=speakers,
        preset=spec.preset,
        crop_seconds=spec.crop_seconds,
        config=TrainConfig(**spec.train),
        seed=spec.seed,
        device=device,
        progress=progress,
        desc=f"train {spec.name}",
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        adapter.save(tmp / "model", overwrite=True)
        log = {
            "spec": asdict(spec),
            "rows": len(rows),
            "speakers": len(speakers),
            "manifests": str(manifests),
            "final_loss": result.final_loss,
            "steps": result.steps,
            "seconds": time.perf_counter() - start,
        }
        write_text_atomic(tmp / "model" / "train_log.json", json.dumps(log, indent=2))
        if out.exists():  # an unfinished earlier attempt
            shutil.rmtree(out)
        os.replace(tmp / "model", out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


@dataclass
class EvalOptions:
    """Options of :func:`mmunlearn.eval.speaker.evaluate_speaker_unlearning`."""

    batch_size: int = 16
    segment_seconds: float | None = None
    max_trials: int | None = 20000
    seed: int = 0


def evaluate(adapter, manifests: Path, level: str, opts: EvalOptions, progress: bool = True) -> dict[str, float]:
    return evaluate_speaker_unlearning(adapter, manifests, level, progress=progress, **asdict(opts))


def cached_eval(
    model_dir: Path, manifests: Path, level: str, opts: EvalOptions, device: str, progress: bool = True
) -> dict[str, float]:
    """Evaluate a cached classifier once per (manifests content, level, options)."""
    digest = hashlib.sha256()
    for name in SPLIT_NAMES:
        digest.update(f"{name}:{rows_digest(split_rows(manifests, name))}\n".encode())
    spec = json.dumps([digest.hexdigest(), level, asdict(opts), SCORING_VERSION, EVAL_VERSION], sort_keys=True)
    path = Path(model_dir) / "evals" / f"{hashlib.sha256(spec.encode()).hexdigest()[:12]}.json"
    if path.is_file():
        return json.loads(path.read_text())
    metrics = evaluate(load_classifier(Path(model_dir), device), manifests, level, opts, progress)
    write_text_atomic(path, json.dumps(metrics, indent=2))
    return metrics


@dataclass
class SpeakerSetup:
    """One level's partitions, the original and retrained classifiers and their evaluations; the setup
    :func:`recipes.runner.run_method` runs a method on (:class:`recipes.runner.Setup`)."""

    level: str
    manifests: Path
    original: Path
    retrained: Path
    forget: list[dict]
    retain: list[dict]
    eval_opts: EvalOptions
    device: str
    reference: dict[str, dict] = field(default_factory=dict)  # "original model" / "retrained model" -> metrics
    base_nll: dict[str, float] = field(default_factory=dict)  # the original's forget/retain NLL
    preset: str = "small"  # the classifier preset (run_method is given the method preset's size)
    cache_dir: Path | None = None  # no method that applies to a classifier caches hidden states
    progress: bool = True

    @property
    def built(self) -> SimpleNamespace:
        """The models as the runner names them: the original is the target; no base (task vectors from the target)."""
        return SimpleNamespace(target=self.original, retain=self.retrained, base=None)

    def adapter(self, path: Path, device: str, scope: str = "all") -> Any:
        """A classifier folder loaded to edit the weights of ``scope``."""
        return load_classifier(Path(path), device, scope)

    def evaluate(self, adapter: Any, folder: Path, method: str) -> list[dict]:
        """The level's speaker metrics of an unlearned classifier: one row (kept in ``folder/run.json``)."""
        return [{"method": method, **evaluate(adapter, self.manifests, self.level, self.eval_opts, self.progress)}]

    def evaluated(self, folder: Path) -> bool:
        """The metrics are ``run.json``'s row: a finished ``run.json`` is a finished evaluation."""
        return (Path(folder) / RUN_JSON).is_file()

    def reference_rows(self) -> list[dict]:
        return [{"method": name, **metrics} for name, metrics in self.reference.items()]

    def describe(self) -> dict:
        return {
            "level": self.level,
            "manifests": str(self.manifests),
            "original": str(self.original),
            "retrained": str(self.retrained),
            "forget_items": len(self.forget),
            "retain_items": len(self.retain),
            "eval": asdict(self.eval_opts),
            "device": self.device,
            "original_training": original_training(self.manifests),
        }


def original_training(manifests: Path) -> dict | None:
    """What ``prepare`` recorded about the original model's training set (its size, and whether another
    ``--forget-speakers`` would change it); None for manifests written before it was recorded."""
    try:
        return json.loads((Path(manifests) / "prepare_report.json").read_text()).get("original_training")
    except (OSError, ValueError):
        return None


def make_context(
    level: str,
    manifests: Path,
    original: Path,
    retrained: Path,
    eval_opts: EvalOptions,
    device: str,
    progress: bool = True,
    preset: str = "small",
) -> SpeakerSetup:
    """Partitions of ``level`` and the (cached) evaluations of the two reference models."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    forget_name, retain_name = PARTITIONS[level]
    forget, retain = split_rows(manifests, forget_name), split_rows(manifests, retain_name)
    if not forget or not retain:
        raise ValueError(
            f"{manifests}: the {forget_name} and {retain_name} manifests must not be empty "
            f"(got {len(forget)} and {len(retain)} rows)"
        )
    ctx = SpeakerSetup(
        level,
        Path(manifests),
        Path(original),
        Path(retrained),
        forget,
        retain,
        eval_opts,
        device,
        preset=preset,
        progress=progress,
    )
    for name, path in (("original model", original), ("retrained model", retrained)):
        ctx.reference[name] = cached_eval(path, manifests, level, eval_opts, device, progress)
    target = load_classifier(Path(original), device)
    ctx.base_nll = {"forget": mean_nll(target, forget), "retain": mean_nll(target, retain)}
    ctx.reference["original model"].update(forget_nll=ctx.base_nll["forget"], retain_nll=ctx.base_nll["retain"])
    return ctx


def run_method_row(
    method: str,
    ctx: SpeakerSetup,
    size: str,
    options: dict,
    rule: Any,
    out: Path,
    progress: bool = True,
    scopes: Sequence[str] = ("all",),
    scope_options: Mapping[str, dict] | None = None,
    method_options: Mapping[str, Any] | None = None,
    resume: bool = False,
) -> dict:
    """Unlearn with ``method`` on a fresh copy of the original classifier through :func:`recipes.runner.run_method`
    (``out/model``: the classifier's own layout -- SpeechBrain's, or ``save_pretrained`` for ``hf-audio`` -- plus the
    harness's reports and undo patch), evaluate it; the row (also ``out/run.json``).

    ``scopes``: the weights the method may edit (:attr:`~mmunlearn.adapters.speaker.adapter.SpeakerAdapter.scope`);
    with several (and a sweep ``rule``), the method runs once per scope (``out/scopes/<scope>/model``,
    ``scope_options[scope]`` added to ``options``) and the rule chooses among them on the training partitions
    alone -- the reached target with the smallest retain loss, else the closest -- before anything is
    evaluated on held-out audio; the chosen folder is copied to ``out/model`` (:func:`scope_sweep`).
    ``method_options``: the method's own settings among ``options`` (recorded in the stage key); ``resume``: a
    stage finished with the same key is reused (its row marked ``reused``).
    """
    if not scopes or (len(scopes) > 1 and rule is None):
        raise ValueError("several scopes need a sweep rule to choose among them")
    ctx.progress = progress
    (row,) = run_method(
        method,
        ctx,
        out,
        options={**options, "scopes": list(scopes)},
        overrides=options,
        rule=rule,
        base="target",
        device=ctx.device,
        resume=resume,
        size=size,
        method_options=method_options,
        kind=kind_of(ctx.original).name,
        unlearn=scope_sweep(ctx, out, scopes, scope_options, rule),
        progress=progress,
    )
    return row


def scope_sweep(
    ctx: SpeakerSetup, out: Path, scopes: Sequence[str], scope_options: Mapping[str, dict] | None, rule: Any
) -> Callable[[Harness], Unlearned]:
    """The runner's ``unlearn`` hook of one method: the harness once per scope (:func:`run_method_row`), the
    rule's choice in ``out/model``; the row's columns (the NLLs after, the sweep time over every scope, whether the
    rule's bound held, the scope) and run.json's ``info`` (its forget measure named) and ``scopes_tried``."""

    def unlearn(harness: Harness) -> Unlearned:
        candidates = []
        for scope in scopes:
            folder = out / "model" if len(scopes) == 1 else out / "scopes" / scope / "model"
            outcome = harness(
                ctx.adapter(ctx.original, ctx.device, scope),
                folder,
                dict((scope_options or {}).get(scope, {})),
                {"level": ctx.level, "scope": scope},
            )
            candidates.append((scope, outcome, folder))
        scope, outcome, folder = candidates[0]
        tried = None
        if len(candidates) > 1:
            rules = [o.report["rule"] for _, o, _ in candidates]
            points = [SweepPoint(i, 0.0, r["forget"], r["retain"]) for i, r in enumerate(rules)]
            best = choose(
                points, rules[0]["base_forget"], rules[0]["base_retain"], rule.forget_target, rule.retain_bound
            )
            scope, outcome, folder = candidates[best.rank]
            tried = {
                s: {
                    "forget": o.report["rule"]["forget"],
                    "retain": o.report["rule"]["retain"],
                    "target_reached": o.report["target_reached"],
                    "seconds": o.report["unlearn_seconds"] + o.report["extract_seconds"],
                }
                for s, o, _ in candidates
            }
            _replace_tree(folder, out / "model")
        rep = outcome.report
        measure = measure_field((rep.get("rule") or {}).get("forget_measure"))
        columns = {
            "forget_nll": rep["forget_nll"]["after"],
            "retain_nll": rep["retain_nll"]["after"],
            "sweep_seconds": sum(o.report["unlearn_seconds"] + o.report["extract_seconds"] for _, o, _ in candidates),
            "within_bound": within_bound(rep.get("rule")),
            "scope": scope,
        }
        return Unlearned(outcome, columns, {"info": rename_measure(rep["info"], measure), "scopes_tried": tried})

    return unlearn


def _replace_tree(src: Path, dst: Path) -> None:
    """``dst`` becomes a copy of the folder ``src`` (staged beside ``dst``, then renamed into place), and so does its
    undo folder beside it (``<dst>.undo``, which the copied report names as a sibling: mmunlearn.files.undo_store)."""
    for a, b in ((default_undo_dir(src), default_undo_dir(dst)), (src, dst)):  # the undo folder first
        if not a.exists():
            continue
        tmp = Path(tempfile.mkdtemp(dir=b.parent, prefix=".model-tmp-"))
        try:
            shutil.copytree(a, tmp / "model")
            if b.exists():
                shutil.rmtree(b)
            os.replace(tmp / "model", b)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def within_bound(rule: Mapping | None) -> bool | None:
    """Whether the chosen model's retain measure stayed within the rule's bound (None without a rule)."""
    if not rule:
        return None
    return rule["retain"] - rule["base_retain"] <= rule["retain_bound"]


def measure_field(name: str | None) -> str:
    """The field name of a sweep point's forget value in ``run.json``: ``forget_<measure>`` (e.g.
    ``forget_worst_speaker_error_rate`` at the speaker level, ``forget_log_loss_gap`` at the sample level)."""
    return f"forget_{name}" if name and name != "mean_nll" else "forget_nll"


def rename_measure(info: dict, field_name: str) -> dict:
    """``info`` with each sweep point's ``forget_nll`` (the harness's generic name for the rule's forget measure)
    stored as ``field_name``, so ``run.json`` says what the value is."""
    if field_name == "forget_nll" or not isinstance(info.get("sweep"), list):
        return info
    points = [
        {(field_name if k == "forget_nll" else k): v for k, v in p.items()} if isinstance(p, dict) else p
        for p in info["sweep"]
    ]
    return {**info, "sweep": points, "forget_field": field_name}


def sweep_points(run: Mapping) -> list[dict]:
    """The sweep points of a ``run.json`` with the forget measure under ``forget`` and the retain measure under
    ``retain`` (reads files written before and after the measure was named)."""
    info = run.get("info") or {}
    key = info.get("forget_field", "forget_nll")
    return [
        {**{k: v for k, v in p.items() if k not in (key, "retain_nll")}, "forget": p[key], "retain": p["retain_nll"]}
        for p in info.get("sweep", [])
    ]
