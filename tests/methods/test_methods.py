"""Every registered method through the harness on a tiny causal LM: one row per method.

Each row checks what breaks if a method or the harness is wrong: the forget NLL rises more than the retain
NLL, the output folder is in the one layout (model + unlearn_report.json, an undo patch when weights
changed), and ``mmunlearn restore`` gives the input back bit for bit from that folder.
"""

import json

import pytest
import torch

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.api.restore import restore_folder
from mmunlearn.data.tofu import load_split
from mmunlearn.files.checkpoint import load_checkpoint
from mmunlearn.methods import (
    MAKES,
    NEEDS,
    UnlearnRequest,
    artefact_files,
    get,
    load_unlearned,
    mean_nll,
    model_folder,
    names,
    run_unlearning,
)
from tests.tiny import fast, tiny_causal_lm, tiny_tokenizer

SRC = "synthetic:n_authors=10"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama fine-tuned briefly on the synthetic forget and retain rows, saved once."""
    from mmunlearn.train import TrainConfig, train

    ad = TextLLMAdapter(tiny_causal_lm(layers=3, seed=1), tiny_tokenizer())
    rows = load_split(SRC, "forget10")[:8] + load_split(SRC, "retain90")[:24]
    train(
        ad.model,
        lambda m, b: ad.loss(b, model=m),
        rows,
        ad.collate,
        TrainConfig(epochs=8, lr=3e-3, batch_size=8, seed=0),
        progress=False,
    )
    path = tmp_path_factory.mktemp("methods") / "target"
    ad.model.eval()
    ad.save(path)
    return path


@pytest.mark.parametrize(
    "method",
    [
        "qr-erase",
        "qr-erase-rows",
        "svd-unlearn",
        "grad_ascent",
        "grad_diff",
        "kl",
        "npo",
        "simnpo",
        "t3",
        "t3-port",
        "rmu",
    ],
)
def test_method_through_the_harness(method, model_dir, tmp_path):
    assert method in names("text")
    forget, retain = load_split(SRC, "forget10")[:8], load_split(SRC, "retain90")[:24]
    target = TextLLMAdapter.from_pretrained(model_dir, device="cpu")
    options = fast(method, epochs=3, lr=2e-3, scale=4.0, steering=8.0)
    request = UnlearnRequest(
        method, "text", size="micro", overrides=options, out=tmp_path / "out", inputs=[model_dir], progress=False
    )
    outcome = run_unlearning(request, target, forget, retain)
    rep = outcome.report
    rise_f = rep["forget_nll"]["after"] - rep["forget_nll"]["before"]
    rise_r = rep["retain_nll"]["after"] - rep["retain_nll"]["before"]
    assert rise_f > 0 and rise_f > rise_r, (method, rise_f, rise_r)
    saved = json.loads((tmp_path / "out" / "unlearn_report.json").read_text())
    assert saved["method"] == method and saved["config"] == json.loads(json.dumps(saved["config"]))
    edits = get(method).edits_weights
    assert not (tmp_path / "out" / "undo_patch.safetensors").exists()  # never in the folder a user ships
    assert (tmp_path / "out.undo" / "undo_patch.safetensors").is_file() == edits  # kept apart, beside it
    assert ("undo" in saved) == edits and (saved.get("undo") or {}).get("folder", "out.undo") == "out.undo"
    assert (rep["changed_fraction"] > 0) == edits and rep["changed_fraction"] <= 1.0
    # the method's own files: written by its artefacts, and reading the folder back gives the unlearned model
    spec = get(method)
    assert set(spec.needs) <= set(NEEDS) and spec.needs and spec.makes == (("weights",) if edits else ("head",))
    assert set(spec.makes) <= set(MAKES)
    own = set(spec.artefacts.files) if spec.artefacts else set()
    assert {f for f in artefact_files() if (tmp_path / "out" / f).exists()} == own
    weights = model_folder(tmp_path / "out")  # T3: its base/, every other method: the folder itself
    assert (weights == tmp_path / "out" / "base") == (not edits)
    reread = load_unlearned(tmp_path / "out", TextLLMAdapter.from_pretrained(weights, device="cpu"))
    assert mean_nll(reread, forget) == pytest.approx(mean_nll(outcome.adapter, forget), rel=1e-5)
    assert mean_nll(reread, forget) > rep["forget_nll"]["before"]
    restored = restore_folder(tmp_path / "out", tmp_path / "restored")
    original, back = load_checkpoint(model_dir).tensors, load_checkpoint(restored).tensors
    assert back.keys() == original.keys() and all(torch.equal(back[k], original[k]) for k in original)
    assert not any((restored / f).exists() for f in artefact_files())  # restore leaves every method's extras


def test_tied_weights_count_once(tmp_path):
    from mmunlearn.methods.harness import changed_fraction

    model = tiny_causal_lm(layers=1)
    model.lm_head.weight = model.model.embed_tokens.weight  # tie
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        model.model.embed_tokens.weight.add_(1.0)
    unique = sum(p.numel() for p in model.parameters())  # tied tensors once
    assert changed_fraction(before, model) == pytest.approx(model.model.embed_tokens.weight.numel() / unique)


def test_t3_sweep_tries_the_weakest_tilt_first_and_stops_at_the_rule(model_dir):
    from mmunlearn.methods import SweepRule, mean_nll

    forget, retain = load_split(SRC, "forget10")[:8], load_split(SRC, "retain90")[:24]
    target = TextLLMAdapter.from_pretrained(model_dir, device="cpu")
    rule = SweepRule(forget_target=mean_nll(target, forget) + 0.05, retain_bound=2.0)
    out = run_unlearning(
        UnlearnRequest(
            "t3", "text", size="micro", overrides={**fast("t3"), "sweep_pick": "first"}, rule=rule, progress=False
        ),
        target,
        forget,
        retain,
    )
    sweep, info = out.report["info"]["sweep"], out.report["info"]
    strengths = [p["strength"] for p in sweep if p["temperature"] == 1.0]
    assert strengths == sorted(strengths)  # weakest intervention first
    meets = [
        p["forget_nll"] >= rule.forget_target and p["retain_nll"] - out.report["rule"]["base_retain"] <= 2.0
        for p in sweep
    ]
    assert not any(meets[:-1])  # it stopped at the first point meeting the rule ...
    if meets[-1]:  # ... which is the one applied, and the report says the rule is met
        assert (info["temperature"], info["strength"]) == (sweep[-1]["temperature"], sweep[-1]["strength"])
        assert out.report["target_reached"] is True
    out.adapter.model.tap.remove()


def test_t3_picks_the_weakest_tilt_whose_retain_is_within_the_tolerance_of_the_lowest():
    """SmolLM2 TOFU at 20 authors: full strength kept retain 3e-4 nats lower than half strength, at a fourfold
    forget overshoot; within the 0.01 tolerance half strength is applied, with tolerance 0 the lowest."""
    from mmunlearn.methods.rule import SweepPoint
    from mmunlearn.methods.t3 import weakest_keeping_retain

    half, full, hot = (
        SweepPoint(None, 1.0, 2.52, 0.01525),
        SweepPoint(None, 1.0, 9.78, 0.01494),
        SweepPoint(None, 1.25, 11.5, 0.0399),
    )
    assert weakest_keeping_retain([half, full, hot], 0.01) is half
    assert weakest_keeping_retain([half, full, hot], 0.0) is full
    assert weakest_keeping_retain([], 0.01) is None


def test_t3_refines_the_strength_it_picks_to_the_weakest_meeting_the_rule(model_dir):
    """With the forget target between the forget NLLs at strengths 1/4 and 1/2, the grid picks 1/2; two bisection
    steps then try 3/8 and the next midpoint, keep each that meets the rule, and apply the weakest kept."""
    from mmunlearn.methods import SweepRule

    forget, retain = load_split(SRC, "forget10")[:8], load_split(SRC, "retain90")[:24]
    target = TextLLMAdapter.from_pretrained(model_dir, device="cpu")

    def sweep(rule, refine):
        grid = {"sweep_strengths": (0.25, 0.5, 1.0), "sweep_temperatures": (), "sweep_retain_tolerance": 1e6}
        over = {**fast("t3"), **grid, "sweep_refine": refine}
        request = UnlearnRequest("t3", "text", size="micro", overrides=over, rule=rule, progress=False)
        out = run_unlearning(request, target, forget, retain)
        out.adapter.model.tap.remove()
        return out.report["info"], out.adapter.model.strength

    probe, _ = sweep(SweepRule(forget_target=1e9, retain_bound=1e6), 0)
    nll = {p["strength"]: p["forget_nll"] for p in probe["sweep"]}
    assert nll[0.25] < nll[0.5]  # the tilt raises the forget NLL: a target between the two is reachable at 1/2
    rule = SweepRule(forget_target=(nll[0.25] + nll[0.5]) / 2, retain_bound=1e6)
    info, applied = sweep(rule, 2)
    grid, mids = info["sweep"][:3], info["sweep"][3:]
    assert [p["strength"] for p in grid] == [0.25, 0.5, 1.0] and len(mids) == 2
    assert mids[0]["strength"] == 0.375
    lo, hi = 0.25, 0.5
    for p in mids:  # each midpoint kept exactly when it meets the rule; the next one halves the gap left
        assert p["strength"] == (lo + hi) / 2
        lo, hi = (lo, p["strength"]) if p["forget_nll"] >= rule.forget_target else (p["strength"], hi)
    assert info["strength"] == hi == applied and 0.25 < applied <= 0.5


def test_t3_spare_seen_reaches_the_model_it_returns_and_changes_what_it_scores(model_dir):
    """spare_seen=True: the tilted model applied (and every sweep point) spares seen tokens, the report says so,
    and the forget rows score differently from the same head without it."""
    from mmunlearn.methods import mean_nll

    forget, retain = load_split(SRC, "forget10")[:8], load_split(SRC, "retain90")[:24]
    target = TextLLMAdapter.from_pretrained(model_dir, device="cpu")
    nll = {}
    for spare in (False, True):
        over = {**fast("t3"), "spare_seen": spare, "strength": 1.0}
        out = run_unlearning(
            UnlearnRequest("t3", "text", size="micro", overrides=over, progress=False), target, forget, retain
        )
        assert out.adapter.model.spare_seen is spare and out.report["info"]["spare_seen"] is spare
        nll[spare] = mean_nll(out.adapter, forget)
        out.adapter.model.tap.remove()
    assert abs(nll[True] - nll[False]) > 1e-4


def test_t3_on_a_real_text_checkpoint_spares_the_seen_words_and_the_port_does_not():
    """A model folder (SmolLM2's size) gets the seen words spared and left out of the head's training, with the
    strength refined; the tiny presets keep the plain tilt, and open-unlearning's port stays as it configures T3."""
    from mmunlearn.methods import get

    real = get("t3").config_for("text", "model_dir")
    assert (real.spare_seen, real.fit_unseen, real.sweep_refine) == (True, True, 2)
    micro = get("t3").config_for("text", "micro")
    assert (micro.spare_seen, micro.fit_unseen, micro.sweep_refine) == (False, False, 0)
    port = get("t3-port").config_for("text", "model_dir")
    assert (port.spare_seen, port.fit_unseen, port.sweep_refine, port.pooling) == (False, False, 0, "cummean")


def test_t3_fit_unseen_reaches_the_head_it_trains(model_dir):
    """fit_unseen=True trains the head without the answer tokens already in the text: the report says so and the
    head (so the forget rows' tilted scores) differs from the one trained on every token."""
    from mmunlearn.methods import mean_nll

    forget, retain = load_split(SRC, "forget10")[:8], load_split(SRC, "retain90")[:24]
    target = TextLLMAdapter.from_pretrained(model_dir, device="cpu")
    nll, bias = {}, {}
    for unseen in (False, True):
        over = {**fast("t3"), "spare_seen": True, "fit_unseen": unseen, "strength": 1.0}
        out = run_unlearning(
            UnlearnRequest("t3", "text", size="micro", overrides=over, progress=False), target, forget, retain
        )
        assert out.report["info"]["fit_unseen"] is unseen
        nll[unseen] = mean_nll(out.adapter, forget)
        bias[unseen] = out.adapter.model.head.B.bias.detach().clone()
        out.adapter.model.tap.remove()
    assert not torch.equal(bias[True], bias[False]) and abs(nll[True] - nll[False]) > 1e-4


def test_t3_sweep_by_default_applies_the_weakest_setting_meeting_the_rule_that_keeps_most_retain(model_dir):
    """The default sweep scores every candidate; of those meeting the rule it applies the weakest whose retain NLL
    is within the tolerance of the lowest (tolerance 0: the lowest itself)."""
    from mmunlearn.methods import SweepRule, mean_nll

    forget, retain = load_split(SRC, "forget10")[:8], load_split(SRC, "retain90")[:24]
    target = TextLLMAdapter.from_pretrained(model_dir, device="cpu")
    rule = SweepRule(forget_target=mean_nll(target, forget) + 0.05, retain_bound=2.0)
    for tolerance in (0.0, 1e6):
        out = run_unlearning(
            UnlearnRequest(
                "t3",
                "text",
                size="micro",
                rule=rule,
                progress=False,
                overrides={**fast("t3"), "sweep_retain_tolerance": tolerance},
            ),
            target,
            forget,
            retain,
        )
        info = out.report["info"]
        sweep, base_retain = info["sweep"], out.report["rule"]["base_retain"]
        assert len(sweep) == 5 + 3  # every strength and every temperature above 1 scored
        meeting = [p for p in sweep if p["forget_nll"] >= rule.forget_target and p["retain_nll"] - base_retain <= 2.0]
        assert meeting  # the rule is reachable here: the choice below is exercised
        # tolerance 0: the lowest retain NLL; a huge one: the weakest meeting the rule (the first)
        best = min(meeting, key=lambda p: p["retain_nll"]) if tolerance == 0 else meeting[0]
        assert (info["temperature"], info["strength"]) == (best["temperature"], best["strength"])
        out.adapter.model.tap.remove()
    with pytest.raises(ValueError, match="sweep_pick"):
        run_unlearning(
            UnlearnRequest(
                "t3", "text", size="micro", overrides={**fast("t3"), "sweep_pick": "best"}, rule=rule, progress=False
            ),
            target,
            forget,
            retain,
        )
