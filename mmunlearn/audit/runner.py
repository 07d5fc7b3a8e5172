"""Run the robustness audits of one unlearned model against its target and retain models; the table row the
recipes show and the AUDIT.json / AUDIT.md files come from :mod:`mmunlearn.audit.table`.

Every attack is applied the same way to three models: the **target** (trained on everything), the **retain**
model (never saw the forget data: what retraining gives) and the **unlearned** model. Each attack reports the
models' forget measures (:mod:`mmunlearn.audit.measures`) and the forgetting *kept* under the attack,
``(target - unlearned) / (target - retain)`` measured after the attack on all three: 1.0 = as forgotten as
retraining, 0.0 = back at the target. The attacks: ``none`` (the plain measures, for comparison),
``paraphrase`` (paraphrased questions; speakers: held-out recordings), ``quantise_8bit``/``quantise_4bit``,
``relearn`` (also the fraction of its own gap each model recovered, and that fraction over the retain
model's: the recovery ratio, 1.0 = relearns like a model that never saw the data) and ``probe``.

T3 (:mod:`mmunlearn.tilt`) leaves the weights untouched: its output-level measures use the tilted model, and
the attacks that need the weights (relearning, probing) run on its base, the target's weights bit for bit, so
they find everything still there; ``white_box`` in the result says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from mmunlearn.adapters.speaker.adapter import KIND as SPEAKER
from mmunlearn.adapters.text.adapter import KIND as TEXT
from mmunlearn.audit.measures import (
    NLL_KEYS,
    SPEAKER_KEYS,
    TEXT_KEYS,
    kept,
    nll_measures,
    recovered,
    speaker_measures,
    text_measures,
)
from mmunlearn.audit.options import AuditOptions
from mmunlearn.audit.paraphrase import has_paraphrases, paraphrased
from mmunlearn.audit.probe import answer_states, nearest_centroid_accuracy, text_probe
from mmunlearn.audit.quantise import FORMATS, quantised
from mmunlearn.audit.relearn import relearn_attack, split_forget
from mmunlearn.audit.table import summary
from mmunlearn.eval.speaker import score_rows

log = logging.getLogger(__name__)
ROLES = ("target", "retain", "unlearned")
T3_NOTE = (
    "T3 leaves the weights untouched: its base is the target's weights, so relearning and probes on "
    "them find everything still there; its forgetting holds at the output only (a served model), not "
    "for released weights."
)


def _weights_equal(a: Any, b: Any) -> bool:
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k].cpu(), sb[k].cpu()) for k in sa)


def _tilt_parts(adapter: Any):
    """(weights adapter, rewrap) for a T3-tilted adapter; (adapter, None) otherwise."""
    from mmunlearn.tilt import TiltedCausalLM  # deferred: tilt imports transformers, kept out of CLI start

    model = adapter.model
    if not isinstance(model, TiltedCausalLM):
        return adapter, None

    def rewrap(base_adapter: Any) -> Any:
        return adapter.with_model(
            TiltedCausalLM(
                base_adapter.model,
                model.head,
                model.temperature,
                base_path=model.base_path,
                strength=model.strength,
                spare_seen=model.spare_seen,
            )
        )

    return adapter.with_model(model.base), rewrap


def _kept_all(result: Mapping[str, Mapping[str, Any]], keys: Sequence[str]) -> dict[str, float | None]:
    return {k: kept(result["target"].get(k), result["unlearned"].get(k), result["retain"].get(k)) for k in keys}


class _Cache:
    """Results of the target and retain models, shared by the audits of several methods on one context."""

    def __init__(self, store: dict | None):
        self.store = store if store is not None else {}

    def get(self, key: tuple, make):
        if key not in self.store:
            self.store[key] = make()
        return self.store[key]


def audit_text(
    unlearned: Any,
    target: Any,
    retain: Any,
    forget: Sequence[Any],
    holdout: Sequence[Any] | None,
    *,
    method: str,
    options: AuditOptions | None = None,
    retain_items: Sequence[Any] | None = None,
    languages: Mapping[str, Sequence[Any]] | None = None,
    cache: dict | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Audit a text LLM (``unlearned``, a :class:`~mmunlearn.adapters.text.adapter.TextLLMAdapter`, T3's tilted one
    included) against ``target`` and ``retain`` adapters on the ``forget`` QA items.

    holdout: never-seen QA items for the probe (TOFU's ``holdoutPP``; None skips the probe).
    retain_items: the retain data of ``relearn_on='retain'``. languages: language -> forget items in it (cTOFU),
    each measured as a paraphrase. cache: a dict shared between calls on the same models and data (the
    target's and retain model's results are computed once). Returns the JSON-able result (``summary``: the row).
    """
    opts = options or AuditOptions()
    memo = _Cache(cache)
    weights, rewrap = _tilt_parts(unlearned)
    roles = {"target": target, "retain": retain, "unlearned": unlearned}
    attack_roles = {"target": target, "retain": retain, "unlearned": weights}  # who an attacker holds
    forget = list(forget)
    start = time.perf_counter()
    measures = _TextMeasures(memo, roles, opts, progress)
    result: dict[str, Any] = {
        "method": method,
        "model_kind": TEXT.name,
        "options": opts.to_dict(),
        "forget_items": len(forget),
        "attacks": {},
    }
    attacks = result["attacks"]
    attacks["none"] = measures.three("none", forget)
    if "paraphrase" in opts.attacks:
        if has_paraphrases(forget):
            attacks["paraphrase"] = measures.three("paraphrase", paraphrased(forget))
        else:
            log.warning("audit: the forget items have no paraphrased_question; paraphrase attack skipped")
        for lang, items in (languages or {}).items():
            attacks[f"language_{lang}"] = measures.three(f"language_{lang}", list(items))
    if "quantise" in opts.attacks:
        for bits in opts.bits:
            tag = f"quantise_{bits}bit"
            q = quantised(weights, bits)
            models = _quantised_models(memo, target, retain, bits, lambda q=q: rewrap(q) if rewrap else q)
            attacks[tag] = measures.three(tag, forget, models)
            attacks[tag]["format"] = FORMATS[bits]
    if "relearn" in opts.attacks:
        attacks["relearn"] = _relearn(
            attack_roles,
            forget,
            retain_items,
            opts,
            memo,
            measures.measure,
            measures.reference_ratios,
            TEXT_KEYS,
            progress,
            before_unlearned=(unlearned if rewrap else None),
        )
    if "probe" in opts.attacks and holdout:
        attacks["probe"] = _text_probe(memo, attack_roles, forget, list(holdout), opts)
    result["white_box"] = {
        "weights_equal_target": _weights_equal(weights.model, target.model),
        "output_level_only": rewrap is not None,
        "note": T3_NOTE if rewrap else None,
    }
    result["seconds"] = time.perf_counter() - start
    result["summary"] = summary(result, "forget_prob")
    return result


class _TextMeasures:
    """A text audit's measures, forget quality against the retain model's truth ratios (once per item set)."""

    def __init__(self, memo: _Cache, roles: Mapping[str, Any], opts: AuditOptions, progress: bool):
        self.memo, self.roles, self.progress = memo, roles, progress
        self.kw = dict(max_new_tokens=opts.max_new_tokens, batch_size=opts.batch_size)
        # the retain model's truth ratios: forget quality of every other model on the same items
        self.ref_ratios: dict[int, np.ndarray | None] = {}

    def measure(self, adapter: Any, items: Sequence[Any], desc: str, rt_key: Any = None) -> dict:
        """``adapter``'s text measures on ``items``."""
        ratios = self.ref_ratios.get(id(items)) if rt_key is None else rt_key
        values, _ = text_measures(
            adapter, items, retain_truth_ratios=ratios, desc=desc if self.progress else None, **self.kw
        )
        return values

    def reference_ratios(self, items: Sequence[Any], tag: str) -> None:
        """Compute (or take from the cache) the retain model's truth ratios on ``items``."""
        self.ref_ratios[id(items)] = self.memo.get(
            ("retain_ratios", tag),
            lambda: text_measures(
                self.roles["retain"], items, desc=f"retain: {tag}" if self.progress else None, **self.kw
            )[1],
        )

    def three(self, tag: str, items: Sequence[Any], models: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The measures of the three models (target's and retain's cached) on ``items`` and the forgetting kept."""
        self.reference_ratios(items, tag)
        models = models or self.roles
        out = {}
        for role in ROLES:
            make = lambda role=role: self.measure(models[role], items, f"{role}: {tag}")  # noqa: E731
            out[role] = self.memo.get((tag, role), make) if role != "unlearned" else make()
        out["kept"] = _kept_all(out, TEXT_KEYS)
        return out


def _quantised_models(
    memo: _Cache, target: Any, retain: Any, bits: int, unlearned: Callable[[], Any]
) -> dict[str, Any]:
    """The three models after a ``bits``-bit round trip (target's and retain's cached; ``unlearned()`` made last)."""
    return {
        "target": memo.get(("q_model", "target", bits), lambda: quantised(target, bits)),
        "retain": memo.get(("q_model", "retain", bits), lambda: quantised(retain, bits)),
        "unlearned": unlearned(),
    }


def _text_probe(
    memo: _Cache, attack_roles: Mapping[str, Any], forget: list, holdout: list, opts: AuditOptions
) -> dict[str, Any]:
    """The probe attack on a text LLM: the answer states of forget and holdout items, probed on each model."""
    states = {
        r: memo.get(("states", r), lambda r=r: answer_states(attack_roles[r], forget + holdout, opts.batch_size))
        if r != "unlearned"
        else answer_states(attack_roles[r], forget + holdout, opts.batch_size)
        for r in ROLES
    }
    probe = text_probe(states, len(forget), len(holdout), k=opts.probe_folds, seed=opts.seed)
    probe["kept"] = {
        "accuracy": kept(probe["target"]["accuracy"], probe["unlearned"]["accuracy"], probe["retain"]["accuracy"]),
        "transfer_accuracy": kept(
            probe["target"]["transfer_accuracy"],
            probe["unlearned"]["transfer_accuracy"],
            probe["retain"]["transfer_accuracy"],
        ),
    }
    return probe


def _relearn(
    models: Mapping[str, Any],
    forget: list,
    retain_items: Sequence[Any] | None,
    opts: AuditOptions,
    memo: _Cache,
    measure,
    reference_ratios,
    keys: Sequence[str],
    progress: bool,
    *,
    before_unlearned: Any = None,
    train_mode: bool = True,
) -> dict[str, Any]:
    train, test = split_forget(forget, opts.relearn_fraction)
    if opts.relearn_on == "retain":
        if not retain_items:
            raise ValueError("relearn_on='retain' needs the retain items")
        train = list(retain_items)
    reference_ratios(test, "relearn")
    out: dict[str, Any] = {"train_items": len(train), "test_items": len(test), "on": opts.relearn_on}
    for role in ROLES:

        def run(role=role) -> dict:
            before = None
            if role == "unlearned" and before_unlearned is not None:  # T3: the tilted outputs before the attack
                before = {role: measure(before_unlearned, test, "unlearned (tilted) before relearning")}
            return relearn_attack(
                {role: models[role]},
                train,
                test,
                measure,
                opts,
                train_mode=train_mode,
                before=before,
                progress=progress,
            )[role]

        out[role] = memo.get(("relearn", role), run) if role != "unlearned" else run()
    after = {r: out[r]["after"] for r in ROLES}
    out["kept"] = _kept_all(after, keys)
    target_level = out["target"]["before"]
    retain_level = out["retain"]["before"]
    out["recovered"] = {
        r: {
            k: recovered(
                out[r]["before"].get(k),
                out[r]["after"].get(k),
                target_level.get(k),
                retain_level.get(k) if r == "unlearned" else None,
            )
            for k in keys
        }
        for r in ("retain", "unlearned")
    }
    out["recovery_ratio"] = {
        k: (
            None
            if out["recovered"]["retain"][k] in (None, 0.0) or out["recovered"]["unlearned"][k] is None
            else out["recovered"]["unlearned"][k] / out["recovered"]["retain"][k]
        )
        for k in keys
    }
    return out


def audit_speaker(
    unlearned: Any,
    target: Any,
    retain: Any,
    forget_rows: Sequence[Mapping[str, Any]],
    *,
    method: str,
    heldout_forget: Sequence[Mapping[str, Any]] | None = None,
    probe_rows: Sequence[Mapping[str, Any]] | None = None,
    forget_speakers: Sequence[str] | None = None,
    retain_rows: Sequence[Mapping[str, Any]] | None = None,
    options: AuditOptions | None = None,
    cache: dict | None = None,
    progress: bool = True,
    model_kind: str = SPEAKER.name,
) -> dict[str, Any]:
    """Audit a speaker classifier (:class:`~mmunlearn.adapters.speaker.adapter.SpeakerAdapter`): forget-speaker accuracy
    on ``forget_rows`` plain, on ``heldout_forget`` (other recordings of the forget speakers: the paraphrase
    analogue), after 8/4-bit round trips and after relearning on part of ``forget_rows``; the probe identifies
    the ``forget_speakers`` among all speakers of ``probe_rows`` (held-out recordings) by nearest centroid.
    ``model_kind``: the registered classifier kind the result names (any classifier adapter is audited alike)."""
    opts = options or AuditOptions()
    memo = _Cache(cache)
    roles = {"target": target, "retain": retain, "unlearned": unlearned}
    forget_rows = list(forget_rows)
    start = time.perf_counter()

    def measure(adapter: Any, rows: Sequence[Mapping[str, Any]], desc: str) -> dict:
        return speaker_measures(adapter, rows, batch_size=opts.batch_size, desc=desc if progress else None)

    def three(tag: str, rows: Sequence[Mapping[str, Any]], models: Mapping[str, Any] | None = None) -> dict:
        models = models or roles
        out = {}
        for role in ROLES:
            make = lambda role=role: measure(models[role], rows, f"{role}: {tag}")  # noqa: E731
            out[role] = memo.get((tag, role), make) if role != "unlearned" else make()
        out["kept"] = _kept_all(out, SPEAKER_KEYS)
        return out

    result: dict[str, Any] = {
        "method": method,
        "model_kind": model_kind,
        "options": opts.to_dict(),
        "forget_items": len(forget_rows),
        "attacks": {},
    }
    attacks = result["attacks"]
    attacks["none"] = three("none", forget_rows)
    if "paraphrase" in opts.attacks and heldout_forget:
        attacks["paraphrase"] = three("paraphrase", list(heldout_forget))
        attacks["paraphrase"]["what"] = "held-out recordings of the forget speakers"
    if "quantise" in opts.attacks:
        for bits in opts.bits:
            tag = f"quantise_{bits}bit"
            models = _quantised_models(memo, target, retain, bits, lambda bits=bits: quantised(unlearned, bits))
            attacks[tag] = three(tag, forget_rows, models)
            attacks[tag]["format"] = FORMATS[bits]
    if "relearn" in opts.attacks:
        attacks["relearn"] = _relearn(
            roles,
            forget_rows,
            retain_rows,
            opts,
            memo,
            measure,
            lambda *_: None,
            SPEAKER_KEYS,
            progress,
            train_mode=False,
        )
    if "probe" in opts.attacks and probe_rows and forget_speakers:
        attacks["probe"] = _speaker_probe(memo, roles, probe_rows, forget_speakers, opts, progress)
    result["white_box"] = {
        "weights_equal_target": _weights_equal(unlearned.model, target.model),
        "output_level_only": False,
        "note": None,
    }
    result["seconds"] = time.perf_counter() - start
    result["summary"] = summary(result, "forget_acc")
    return result


def _speaker_probe(
    memo: _Cache,
    roles: Mapping[str, Any],
    probe_rows: Sequence[Mapping[str, Any]],
    forget_speakers: Sequence[str],
    opts: AuditOptions,
    progress: bool,
) -> dict[str, Any]:
    """The probe attack on a classifier: each model's nearest-centroid identification of the forget speakers."""
    probe: dict[str, Any] = {
        "what": "nearest-centroid identification of the forget speakers' held-out "
        "recordings among all speakers (cosine on embeddings)"
    }
    for role in ROLES:

        def acc(role=role) -> dict:
            scores = score_rows(
                roles[role],
                probe_rows,
                batch_size=opts.batch_size,
                desc=f"{role}: probe embeddings" if progress else None,
            )
            return {"accuracy": nearest_centroid_accuracy(scores.embeddings, scores.speakers, only=forget_speakers)}

        probe[role] = memo.get(("probe", role), acc) if role != "unlearned" else acc()
    probe["kept"] = {
        "accuracy": kept(probe["target"]["accuracy"], probe["unlearned"]["accuracy"], probe["retain"]["accuracy"])
    }
    return probe


def audit_nll(
    unlearned: Any,
    target: Any,
    retain: Any,
    forget: Sequence[Any],
    *,
    method: str,
    model_kind: str,
    options: AuditOptions | None = None,
    retain_items: Sequence[Any] | None = None,
    cache: dict | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Audit any other model family (speech LLMs: spoken-QA examples) on teacher-forced answer NLLs only: the
    quantisation round trips and relearning (paraphrase and probes need the family's own data and states and
    are not run; ``skipped`` says so). T3's tilted speech LLM is audited like the text one (weights: its base)."""
    opts = options or AuditOptions()
    memo = _Cache(cache)
    weights, rewrap = _tilt_parts(unlearned)
    roles = {"target": target, "retain": retain, "unlearned": unlearned}
    forget = list(forget)
    start = time.perf_counter()

    def measure(adapter: Any, items: Sequence[Any], desc: str) -> dict:
        return nll_measures(adapter, items, batch_size=opts.batch_size, desc=desc if progress else None)

    def three(tag: str, models: Mapping[str, Any] | None = None) -> dict:
        models = models or roles
        out = {}
        for role in ROLES:
            make = lambda role=role: measure(models[role], forget, f"{role}: {tag}")  # noqa: E731
            out[role] = memo.get((tag, role), make) if role != "unlearned" else make()
        out["kept"] = _kept_all(out, NLL_KEYS)
        return out

    result: dict[str, Any] = {
        "method": method,
        "model_kind": model_kind,
        "options": opts.to_dict(),
        "forget_items": len(forget),
        "attacks": {},
        "skipped": [a for a in ("paraphrase", "probe") if a in opts.attacks],
    }
    attacks = result["attacks"]
    attacks["none"] = three("none")
    if "quantise" in opts.attacks:
        for bits in opts.bits:
            q = quantised(weights, bits)
            models = _quantised_models(memo, target, retain, bits, lambda q=q: rewrap(q) if rewrap else q)
            attacks[f"quantise_{bits}bit"] = three(f"quantise_{bits}bit", models)
            attacks[f"quantise_{bits}bit"]["format"] = FORMATS[bits]
    if "relearn" in opts.attacks:
        attacks["relearn"] = _relearn(
            {"target": target, "retain": retain, "unlearned": weights},
            forget,
            retain_items,
            opts,
            memo,
            measure,
            lambda *_: None,
            NLL_KEYS,
            progress,
            before_unlearned=(unlearned if rewrap else None),
        )
    result["white_box"] = {
        "weights_equal_target": _weights_equal(weights.model, target.model),
        "output_level_only": rewrap is not None,
        "note": T3_NOTE if rewrap else None,
    }
    result["seconds"] = time.perf_counter() - start
    result["summary"] = summary(result, "forget_prob")
    return result
