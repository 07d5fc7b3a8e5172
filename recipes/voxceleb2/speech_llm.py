"""VoxCeleb2 forgetting with a speech LLM (the recipe's ``--model speech-llm`` path): build, unlearn, evaluate, table.

The speech LLM answers spoken questions about each utterance (:mod:`mmunlearn.speech.spoken_qa`):
"Who is speaking?" (the knowledge to forget) and a target task that must survive on the same audio
(``gender`` by default, or ``transcript``). Levels, on ``prepare``'s manifests:

* ``speaker``: forget = the speaker question on ``spk_forget_train``; retain = both questions on
  ``spk_retain_train`` plus the target question on the forget speakers' audio. Reported: speaker-ID
  accuracy on forget (``forget_acc``, ``forget_test_acc``) and retained speakers (``retain_acc``,
  ``test_acc`` on held-out recordings), target-task accuracy on the forget audio
  (``target_forget_acc``) and on held-out recordings (``target_acc``).
* ``sample``: forget = both questions on ``sample_forget``; retain = both on ``sample_retain``.
  Reported: speaker-ID accuracy on ``sample_forget`` / ``sample_holdout`` / ``sample_retain`` / held-out
  recordings, ``target_acc``, and ``mia_auc`` (loss attack on the speaker answer: forget vs holdout).

Models (TOFU-like, cached): a preset (``tiny``, ``mini``: Qwen2.5-Omni-thinker-shaped, built from config)
gives three models per level: ``base`` (audio tower warmed up as a speaker classifier, then both
questions, on the retain rows only), ``target`` (the base fine-tuned on all training rows: the model to
unlearn from) and ``retrain`` (the base fine-tuned on the retain rows only: the gold standard). The
erasure methods take their task vectors from the base (the model before it heard the forget part).
A model directory (``--model DIR``) works the same, with ``--reference`` the model it was fine-tuned
from (default: itself) and ``--retrained`` the same model trained without the forgotten data (default: no row).

Every method of :mod:`mmunlearn.methods` that applies to a speech LLM runs on a fresh copy of the original
through the harness (:func:`recipes.runner.run_method`, the setup :class:`SpeechLLMSetup`); ``--where`` limits
erasure and training to the ``audio`` tower, the ``text`` model or ``both``. Outputs in ``--out/<level>``:
``results.json``, ``results.md`` and one folder per method in the runner's layout: ``model/`` (the harness's folder:
the model, ``unlearn_report.json``, the undo patch and, for the erasure methods, the erase report and
``layer_energy.png`` across audio-tower and language-model layers) and ``run.json``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from data_prep.synth_speakers import synthesize_corpus
from data_prep.voxceleb2 import prepare
from mmunlearn.adapters.base import resolve_device
from mmunlearn.adapters.speech_llm.adapter import KIND, SpeechLLMAdapter
from mmunlearn.adapters.speech_llm.build import arch_for, arch_summary
from mmunlearn.api.rules import NLL_RETAIN_BOUND, nll_rule
from mmunlearn.config import applicable_overrides
from mmunlearn.data.utterances import LEVELS, split_rows
from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.methods import get, mean_nll
from mmunlearn.metrics.mia import mia_auc
from mmunlearn.presets.cache import cache_key, default_cache_dir, is_built, texts_digest, write_log
from mmunlearn.report import table
from mmunlearn.speech.spoken_qa import (
    DEFAULT_TRAIN,
    DEFAULT_WARM_UP,
    answer_nll,
    spoken_qa,
    task_accuracy,
    texts_of,
    train_speech_llm,
    warm_up_audio_tower,
)
from mmunlearn.train import TrainConfig
from recipes.runner import RUN_JSON, Comparison, Harness, Stages, Unlearned, run_comparison, run_method
from recipes.voxceleb2.config import VoxCelebConfig
from recipes.voxceleb2.settings import SPEECH_LLM_METHODS

FINETUNE = TrainConfig(epochs=6, batch_size=16, lr=1e-3, schedule="onecycle", weight_decay=0.0)
#: (audio warm-up, spoken-QA training of the base, fine-tuning of target and retrain from the base)
TRAIN_PLANS: dict[str, tuple[TrainConfig, TrainConfig, TrainConfig]] = {
    "tiny": (DEFAULT_WARM_UP.replace(epochs=2), DEFAULT_TRAIN.replace(epochs=2), FINETUNE.replace(epochs=1)),
    "mini": (DEFAULT_WARM_UP, DEFAULT_TRAIN, FINETUNE),
}


# ---------------------------------------------------------------------------------------------- data
def make_corpus(
    root: str | os.PathLike,
    *,
    speakers: int = 10,
    utterances: int = 30,
    videos: int = 3,
    forget_speakers: int = 2,
    forget_fraction: float = 0.1,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """The built-in synthetic corpus in ``root/vox`` and its manifests in ``root/manifests`` (both reused)."""
    audio = synthesize_corpus(Path(root) / "vox", speakers, utterances, videos, seed, progress=progress)
    return prepare(
        audio,
        Path(root) / "manifests",
        forget_speakers=forget_speakers,
        forget_fraction=forget_fraction,
        seed=seed,
        progress=progress,
    ).out


def training_rows(manifests, level: str = "speaker", retain_only: bool = False) -> list[dict[str, Any]]:
    """Rows of the original model (``train``) or of the retrained reference (retain part of ``level``)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    name = ("spk_retain_train" if level == "speaker" else "sample_retain") if retain_only else "train"
    return split_rows(manifests, name)


def partitions(manifests, level: str, target: str = "gender") -> tuple[list[dict], list[dict]]:
    """(forget, retain) spoken-QA examples of a level (see the module notes)."""
    tasks = ("speaker", target)
    if level == "speaker":
        forget_rows = split_rows(manifests, "spk_forget_train")
        retain = spoken_qa(split_rows(manifests, "spk_retain_train"), tasks) + spoken_qa(forget_rows, (target,))
        return spoken_qa(forget_rows, ("speaker",)), retain
    if level == "sample":
        return spoken_qa(split_rows(manifests, "sample_forget"), tasks), spoken_qa(
            split_rows(manifests, "sample_retain"), tasks
        )
    raise ValueError(f"level must be one of {LEVELS}, got {level!r}")


def evaluate(
    adapter, manifests, level: str, target: str = "gender", *, batch_size: int = 32, progress: bool = True
) -> dict[str, float]:
    """The level's accuracies (greedy answers) and, for ``sample``, the loss-attack MIA AUC."""

    def acc(name: str, examples: list[dict]) -> float:
        return task_accuracy(adapter, examples, batch_size=batch_size, desc=name if progress else None)[0]

    def qa(*splits: str, task: str = "speaker") -> list[dict]:
        return spoken_qa([r for s in splits for r in split_rows(manifests, s)], (task,))

    out: dict[str, float] = {}
    if level == "speaker":
        out["forget_acc"] = acc("forget", qa("spk_forget_train"))
        forget_test = qa("spk_forget_test")
        if forget_test:
            out["forget_test_acc"] = acc("forget test", forget_test)
        out["retain_acc"] = acc("retain", qa("spk_retain_train"))
        out["test_acc"] = acc("test", qa("spk_retain_test"))
        out["target_forget_acc"] = acc("target on forget audio", qa("spk_forget_train", "spk_forget_test", task=target))
        out["target_acc"] = acc("target", qa("spk_retain_test", task=target))
        return out
    forget, holdout = qa("sample_forget"), qa("sample_holdout")
    out["forget_acc"], out["holdout_acc"] = acc("forget", forget), acc("holdout", holdout)
    out["retain_acc"] = acc("retain", qa("sample_retain"))
    out["test_acc"] = acc("test", qa("spk_retain_test", "spk_forget_test"))
    out["target_acc"] = acc("target", qa("spk_retain_test", "spk_forget_test", task=target))
    out["mia_auc"] = mia_auc(answer_nll(adapter, forget, batch_size), answer_nll(adapter, holdout, batch_size))
    return out


# ---------------------------------------------------------------------------------------------- models
ROLES = ("base", "target", "retrain")


def build_model(
    manifests,
    *,
    preset: str = "mini",
    family: str = "qwen2_5_omni",
    level: str = "speaker",
    role: str = "target",
    target: str = "gender",
    seed: int = 0,
    device: str = "auto",
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
) -> Path:
    """Train (or find in the cache) one model of the TOFU-like setting, for a level:

    * ``base``: from config, audio warm-up then both questions, on the level's retain rows only (it never
      hears the forget part); the reference the erasure methods take task vectors from;
    * ``target``: the base fine-tuned on all training rows (the model to unlearn from);
    * ``retrain``: the base fine-tuned the same way on the retain rows only (the gold standard).

    The tokenizer is trained on the full training set's texts, so all three share it.
    """
    if preset not in TRAIN_PLANS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(TRAIN_PLANS)}")
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    tasks = ("speaker", target)
    rows = training_rows(manifests, level, retain_only=role != "target")
    warm, plan, finetune = (c.replace(seed=seed) for c in TRAIN_PLANS[preset])
    arch = arch_for(preset, family)
    spec: dict[str, Any] = {
        "kind": KIND.name,
        "role": role,
        "tasks": tasks,
        "seed": seed,
        "rows": texts_digest(f"{r['ID']}|{r['wav']}|{r.get('start')}|{r.get('stop')}|{r['spk_id']}" for r in rows),
    }
    parent = None
    if role == "base":
        texts = texts_of(spoken_qa(split_rows(manifests, "train"), tasks))
        spec |= {
            "arch": arch.__dict__,
            "warm_up": warm.to_dict(),
            "train": plan.to_dict(),
            "texts": texts_digest(texts),
        }
    else:
        parent = build_model(
            manifests,
            preset=preset,
            family=family,
            level=level,
            role="base",
            target=target,
            seed=seed,
            device=device,
            cache_dir=cache_dir,
            progress=progress,
        )
        spec |= {"parent": parent.name, "finetune": finetune.to_dict()}
    key = cache_key(spec)
    out = (Path(cache_dir) if cache_dir else default_cache_dir()) / f"speech-llm-{preset}-{level}-{role}-{key}"
    if is_built(out, key):
        return out
    start = time.perf_counter()
    if parent is None:
        adapter = SpeechLLMAdapter.build(preset, texts=texts, family=family, seed=seed, device=resolve_device(device))
        w = warm_up_audio_tower(adapter, rows, warm, device=device, progress=progress).losses
        t = train_speech_llm(adapter, spoken_qa(rows, tasks), plan, device=device, progress=progress)
    else:
        adapter, w = SpeechLLMAdapter.load(parent, device=device), []
        t = train_speech_llm(
            adapter, spoken_qa(rows, tasks), finetune, device=device, progress=progress, desc=f"fine-tune {role}"
        )
    adapter.save(out, overwrite=True)
    write_log(
        out,
        {
            "key": key,
            "spec": spec,
            "summary": arch_summary(arch, adapter.model),
            "warm_up_losses": w,
            "losses": t.losses,
            "final_loss": t.final_loss,
            "seconds": time.perf_counter() - start,
            "rows": len(rows),
        },
    )
    return out


# ---------------------------------------------------------------------------------------------- runs
#: (header, row key, percent?) per level, as in the speaker-classifier recipe's tables, plus the target task.
COLUMNS: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "speaker": (
        ("forget acc %", "forget_acc", True),
        ("forget test acc %", "forget_test_acc", True),
        ("retain acc %", "retain_acc", True),
        ("test acc %", "test_acc", True),
        ("target on forget audio %", "target_forget_acc", True),
        ("target test %", "target_acc", True),
    ),
    "sample": (
        ("forget acc %", "forget_acc", True),
        ("holdout acc %", "holdout_acc", True),
        ("retain acc %", "retain_acc", True),
        ("test acc %", "test_acc", True),
        ("target test %", "target_acc", True),
        ("MIA AUC", "mia_auc", False),
    ),
}
COMMON = (
    ("forget NLL", "forget_nll", False),
    ("retain NLL", "retain_nll", False),
    ("rule met", "target_reached", False),
    ("unlearn s", "unlearn_seconds", False),
    ("+ extraction s", "total_seconds", False),
    ("params changed", "changed_fraction", False),
)


def table_markdown(rows: Sequence[Mapping[str, Any]], level: str) -> str:
    """The results as a Markdown table (accuracies in %, NLL in nats, times in seconds)."""
    if level not in COLUMNS:
        raise ValueError(f"level must be one of {sorted(COLUMNS)}, got {level!r}")
    return table(rows, [("method", "method"), *COLUMNS[level], *COMMON]) + "\n"


@dataclass
class SpeechLLMSetup:
    """One level's spoken-QA partitions and models, the setup :func:`recipes.runner.run_method` runs a method on
    (:class:`recipes.runner.Setup`): ``built.target`` the original, ``built.base`` the erasure methods' reference
    (None: the original itself), ``built.retain`` the retrained model (None: none)."""

    manifests: Any
    level: str
    target: str
    where: str
    built: SimpleNamespace
    forget: list = field(default_factory=list)
    retain: list = field(default_factory=list)
    batch_size: int = 32
    progress: bool = True
    preset: str = "model_dir"  # run_method is given the method preset's size
    cache_dir: Path | None = None  # T3's hidden states are not cached on disk

    def adapter(self, path: str | os.PathLike, device: str) -> Any:
        """A speech-LLM folder loaded to edit ``where``."""
        return SpeechLLMAdapter.load(path, device=device, where=self.where)

    def score(self, adapter: Any) -> dict[str, float]:
        """The level's accuracies and the forget / retain NLL of a model."""
        return {
            **evaluate(
                adapter, self.manifests, self.level, self.target, batch_size=self.batch_size, progress=self.progress
            ),
            "forget_nll": mean_nll(adapter, self.forget),
            "retain_nll": mean_nll(adapter, self.retain),
        }

    def evaluate(self, adapter: Any, folder: Path, method: str) -> list[dict]:
        """The row of an unlearned model (kept in ``folder/run.json``); T3's hidden-state tap removed after."""
        row = {"method": method, **self.score(adapter)}
        if getattr(adapter.model, "tap", None) is not None:
            adapter.model.tap.remove()
        return [row]

    def evaluated(self, folder: Path) -> bool:
        """The metrics are ``run.json``'s row: a finished ``run.json`` is a finished evaluation."""
        return (Path(folder) / RUN_JSON).is_file()

    def describe(self) -> dict:
        return {
            "level": self.level,
            "manifests": str(self.manifests),
            "target_task": self.target,
            "where": self.where,
            "original": str(self.built.target),
            "reference": None if self.built.base is None else str(self.built.base),
            "retrained": None if self.built.retain is None else str(self.built.retain),
            "forget_items": len(self.forget),
            "retain_items": len(self.retain),
        }

    def unlearn(self, folder: Path, device: str) -> Callable[[Harness], Unlearned]:
        """The runner's ``unlearn`` hook for one method: the harness once on the original into ``folder/model``;
        the row gets the layers erasure selected and T3's temperature."""

        def step(harness: Harness) -> Unlearned:
            outcome = harness(
                self.adapter(self.built.target, device),
                folder / "model",
                None,
                {"where": self.where, "level": self.level},
            )
            info = outcome.report["info"]
            return Unlearned(outcome, {k: info[k] for k in ("selected_layers", "temperature") if k in info})

        return step


def run(
    manifests,
    model_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    level: str = "speaker",
    methods: Sequence[str] = SPEECH_LLM_METHODS,
    where: str = "both",
    target: str = "gender",
    size: str = "model_dir",
    options: Mapping[str, Any] | None = None,
    method_options: Mapping[str, Mapping[str, Any]] | None = None,
    retrain_dir: str | os.PathLike | None = None,
    reference_dir: str | os.PathLike | None = None,
    sweep: bool = False,
    retain_bound: float = NLL_RETAIN_BOUND,
    resume: bool = False,
    device: str = "auto",
    batch_size: int = 32,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Evaluate the original (and the retrained model), run every method on a fresh copy through
    :func:`recipes.runner.run_method` (``out/<method>/model``: the model, its reports and undo patch;
    ``out/<method>/run.json``), write the table.

    ``reference_dir``: the model the erasure methods take task vectors from (the base the original was
    fine-tuned from; None: the original itself). ``sweep``: each method swept by the NLL rule on the training
    partitions (:func:`mmunlearn.api.rules.nll_rule`: the forget answers' NLL up to the retrained model's, else up
    by a stated rise; the retain NLL rising by at most ``retain_bound`` nats). ``options``: overrides of the methods'
    configs (each method takes those its config has); ``method_options``: per method, settings of its own config (over
    ``options``). ``resume``: a method's stage finished in ``out`` with the same key (method, options, rule, models and
    their weights) is reused (:func:`recipes.runner.run_method`).
    """
    for m in methods:
        get(m, KIND.name)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    forget, retain = partitions(manifests, level, target)
    built = SimpleNamespace(
        target=Path(model_dir),
        base=Path(reference_dir) if reference_dir else None,
        retain=Path(retrain_dir) if retrain_dir else None,
    )
    setup = SpeechLLMSetup(manifests, level, target, where, built, forget, retain, batch_size, progress)
    start = time.perf_counter()
    original = setup.adapter(model_dir, device)
    retrained = None if retrain_dir is None else setup.adapter(retrain_dir, device)
    refs = [{"method": "original", **setup.score(original)}]
    if retrained is not None:
        refs.append({"method": "retrain", **setup.score(retrained)})
    shared = {k: v for k, v in dict(options or {}).items() if v is not None}
    rule, rule_source = _rule(original, forget, retrained, retain_bound) if sweep else (None, None)
    del original, retrained  # every method loads the original afresh

    def method_rows(method: str) -> list[dict]:
        own = dict((method_options or {}).get(method, {}))
        overrides = {**applicable_overrides(get(method).config, shared), **own}
        return run_method(
            method,
            setup,
            out / method,
            options=shared,
            overrides=overrides,
            rule=rule,
            base="target" if reference_dir is None else str(reference_dir),
            device=device,
            resume=resume,
            size=size,
            method_options=own,
            kind=KIND.name,
            unlearn=setup.unlearn(out / method, device),
            progress=progress,
        )

    def write(so_far: list[dict]) -> None:
        write_text_atomic(
            out / "results.json",
            json.dumps(
                {
                    "level": level,
                    "where": where,
                    "target": target,
                    "rows": refs + so_far,
                    "rule": None if rule is None else {**rule.describe(), "target_source": rule_source},
                },
                indent=2,
                default=str,
            ),
        )

    stages = Stages(len(methods), start, say=print if progress else (lambda _line: None))
    rows = refs + run_comparison(Comparison(list(methods), method_rows, write), stages)[0]
    write_text_atomic(out / "results.md", table_markdown(rows, level))
    return rows


def _rule(original: Any, forget: Sequence[Any], retrained: Any | None, retain_bound: float) -> tuple[Any, str]:
    """The sweep rule of a speech-LLM run and where its forget target comes from (the retrained model's NLL on the
    forget answers when there is one)."""
    rule, source = nll_rule(original, forget, reference=retrained, retain_bound=retain_bound)
    return rule, source.replace("the reference model", "the retrained model") if retrained is not None else source


# ---------------------------------------------------------------------------------------------- CLI
def run_level(
    level: str, cfg: VoxCelebConfig, device: str, *, retrain: bool = True, progress: bool = True
) -> list[dict]:
    """What ``mmunlearn voxceleb2 <level> --model speech-llm`` does for the config ``cfg`` (``device`` resolved):
    the corpus (``manifests``, or the built-in one in ``workdir/speech_llm_corpus`` sized by the corpus settings,
    :func:`make_corpus`), the models (``llm``: a preset's base, target and retrain, trained and cached in
    ``cache_dir``; or a directory, with ``reference`` the model it was fine-tuned from and ``retrained`` the model
    trained without the forgotten data, if any), every chosen method (the knobs, ``method_options``, ``sweep``, the
    retain bound, ``resume``: :func:`run`'s; ``where``, ``keep_task``), the table in :func:`level_out`. The config
    refuses the settings this path has no use for (:data:`recipes.voxceleb2.config.CLASSIFIER_ONLY`)."""
    corpus = dict(
        speakers=cfg.speakers,
        utterances=cfg.utterances,
        videos=cfg.videos,
        forget_speakers=cfg.forget_speakers,
        forget_fraction=cfg.forget_fraction,
    )
    man = (
        Path(cfg.manifests)
        if cfg.manifests
        else make_corpus(str(cfg.workdir / "speech_llm_corpus"), seed=cfg.seed, progress=progress, **corpus)
    )
    model, is_dir = cfg.llm, Path(cfg.llm).is_dir()
    opts = dict(
        preset=model,
        level=level,
        target=cfg.keep_task,
        seed=cfg.seed,
        device=device,
        cache_dir=str(cfg.cache_dir) if cfg.cache_dir else None,
        progress=progress,
    )
    model_dir = Path(model) if is_dir else build_model(man, role="target", **opts)
    reference_dir = Path(cfg.reference) if cfg.reference else None if is_dir else build_model(man, role="base", **opts)
    retrain_dir = (
        Path(cfg.retrained)
        if cfg.retrained
        else build_model(man, role="retrain", **opts)
        if retrain and not is_dir
        else None
    )
    return run(
        man,
        model_dir,
        level_out(cfg) / level,
        level=level,
        methods=cfg.chosen(),
        where=cfg.where,
        target=cfg.keep_task,
        size=KIND.size_for("model_dir" if is_dir else model),
        options=cfg.knobs(),
        method_options=cfg.method_options,
        retrain_dir=retrain_dir,
        reference_dir=reference_dir,
        sweep=cfg.sweep,
        retain_bound=cfg.resolved_retain_bound(),
        resume=cfg.resume,
        device=device,
        progress=progress,
    )


def level_out(cfg: VoxCelebConfig) -> Path:
    """The folder the speech-LLM levels' tables go in (``<it>/<level>``): ``out``, else ``workdir/speech_llm``."""
    return Path(cfg.out) if cfg.out else cfg.workdir / "speech_llm"
