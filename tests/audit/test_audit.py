"""Robustness audits on micro models: each test asserts a property that breaks when an attack is wrong."""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.audit import AuditOptions, audit_text, write_audit
from mmunlearn.audit.measures import kept, recovered, text_measures
from mmunlearn.audit.paraphrase import paraphrased
from mmunlearn.audit.probe import nearest_centroid_accuracy, probe_accuracy
from mmunlearn.audit.quantise import quantised, round_trip
from mmunlearn.audit.relearn import relearned, split_forget
from mmunlearn.data.tofu import load_split
from tests.tiny import tiny_causal_lm, tiny_tokenizer

SRC = "synthetic:n_authors=10"
FAST = dict(max_new_tokens=8, relearn_steps=6, relearn_batch_size=4, probe_folds=3)


def _trained(rows, seed=1):
    from mmunlearn.train import TrainConfig, train

    ad = TextLLMAdapter(tiny_causal_lm(layers=2, seed=seed), tiny_tokenizer())
    train(
        ad.model,
        lambda m, b: ad.loss(b, model=m),
        rows,
        ad.collate,
        TrainConfig(epochs=8, lr=3e-3, batch_size=8, seed=0),
        progress=False,
    )
    ad.model.eval()
    return ad


@pytest.fixture(scope="module")
def world():
    forget = load_split(SRC, "forget10_perturbed")[:12]
    holdout = load_split(SRC, "holdout10")[:12]
    retain_rows = load_split(SRC, "retain90")[:20]
    return {
        "forget": forget,
        "holdout": holdout,
        "retain_rows": retain_rows,
        "target": _trained(forget + retain_rows),
        "retain": _trained(retain_rows),
    }


def _weights(adapter):
    return {k: v.clone() for k, v in adapter.model.state_dict().items()}


def test_relearning_the_target_recovers_nothing(world):
    t, r = world["target"], world["retain"]
    before = _weights(t)
    res = audit_text(
        t.clone(),
        t,
        r,
        world["forget"],
        None,
        method="target itself",
        progress=False,
        options=AuditOptions(attacks=("relearn",), **FAST),
    )
    rel = res["attacks"]["relearn"]
    # the attack works on copies: the target given in is unchanged bit for bit
    assert all(torch.equal(before[k], v) for k, v in t.model.state_dict().items())
    gain_t = rel["target"]["after"]["forget_prob"] - rel["target"]["before"]["forget_prob"]
    assert abs(gain_t) < 0.1 * rel["target"]["before"]["forget_prob"], gain_t  # nothing to regain
    assert rel["recovered"]["unlearned"]["forget_prob"] is None  # no forgotten gap: recovery undefined
    assert res["summary"]["kept_relearn"] == pytest.approx(0.0) and res["summary"]["kept_none"] == 0.0
    assert res["white_box"]["weights_equal_target"] is True


def test_the_retain_model_relearns_at_its_own_rate(world):
    t, r = world["target"], world["retain"]
    res = audit_text(
        r.clone(),
        t,
        r,
        world["forget"],
        world["holdout"],
        method="retain itself",
        progress=False,
        options=AuditOptions(**FAST),
    )
    s = res["summary"]
    for key in ("kept_none", "kept_paraphrase", "kept_quantise_8bit", "kept_quantise_4bit", "kept_relearn"):
        assert s[key] == pytest.approx(1.0, abs=1e-9), key
    assert s["relearn_recovery_ratio"] == pytest.approx(1.0, abs=1e-9)
    assert res["attacks"]["relearn"]["recovered"]["retain"]["forget_prob"] > 0  # relearning did something
    assert s["relearn_recovered"] == res["attacks"]["relearn"]["recovered"]["retain"]["forget_prob"]
    assert s["weights_equal_target"] is False and res["white_box"]["output_level_only"] is False


def test_split_forget_trains_on_every_author_and_tests_on_the_rest(world):
    items = load_split(SRC, "forget10_perturbed")
    train, test = split_forget(items, 0.25)
    assert {it.author for it in train} == {it.author for it in items}
    assert not {id(x) for x in train} & {id(x) for x in test} and len(train) + len(test) == len(items)
    assert len(train) == 5  # ceil(0.25 * 20) of the one forget author


def test_relearned_copy_is_trained_and_the_input_untouched(world):
    r = world["retain"]
    before = _weights(r)
    twin = relearned(r, world["forget"][:4], AuditOptions(relearn_steps=5, relearn_lr=3e-3), progress=False)
    assert all(torch.equal(before[k], v) for k, v in r.model.state_dict().items())
    nll = lambda a: float(a.answer_nll(world["forget"][:4]).mean())  # noqa: E731
    assert nll(twin) < nll(r) - 0.05


def test_round_trip_error_is_within_the_block_step_and_shapes_survive():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 70, generator=g)  # 70: not a multiple of the 32-weight block (padded)
    for bits, levels in ((8, 127), (4, 8)):
        back = round_trip(w, bits)
        assert back.shape == w.shape and back.dtype == w.dtype
        for row in range(w.shape[0]):
            for start in range(0, 70, 32):
                blk = w[row, start : start + 32]
                err = (back[row, start : start + 32] - blk).abs().max()
                assert err <= blk.abs().max() / levels + 1e-6, (bits, row, start)
        assert not torch.equal(back, w)
    assert torch.equal(round_trip(torch.zeros(4, 32), 4), torch.zeros(4, 32))
    kernel = torch.randn(5, 3, 7, generator=g)  # a Conv1d kernel: rows = output channels
    assert round_trip(kernel, 8).shape == kernel.shape
    with pytest.raises(ValueError):
        round_trip(torch.randn(10), 8)


def test_quantising_an_unedited_model_keeps_its_forget_metrics(world):
    t = world["target"]
    items = world["forget"]
    plain, _ = text_measures(t, items, max_new_tokens=8)
    q8, _ = text_measures(quantised(t, 8), items, max_new_tokens=8)
    q4 = quantised(t, 4)
    assert q8["forget_prob"] == pytest.approx(plain["forget_prob"], rel=0.02)
    assert q8["forget_rouge"] == pytest.approx(plain["forget_rouge"], abs=0.1)
    m4, _ = text_measures(q4, items, max_new_tokens=8)
    assert m4["forget_prob"] == pytest.approx(plain["forget_prob"], rel=0.25)
    # only the adapter's layers were rounded: embeddings untouched, the input model untouched
    emb = t.model.get_input_embeddings().weight
    assert torch.equal(q4.model.get_input_embeddings().weight, emb)
    name, w = next((lw.name, lw.weight) for lw in t.layers())
    assert not torch.equal(dict(q4.model.named_parameters())[name], w)


def test_probe_on_random_labels_stays_at_chance_and_reads_real_signal():
    rng = np.random.default_rng(0)
    chance = [probe_accuracy(rng.normal(size=(400, 16)), rng.integers(0, 2, 400), k=5, seed=s) for s in range(5)]
    assert abs(np.mean(chance) - 0.5) < 0.05 and max(abs(a - 0.5) for a in chance) < 0.15, chance
    x = rng.normal(size=(400, 16))
    y = rng.integers(0, 2, 400)
    signal = x + 1.5 * y[:, None] * np.eye(16)[0]
    assert probe_accuracy(signal, y, k=5) > 0.75
    with pytest.raises(ValueError):
        probe_accuracy(x, np.zeros(400, dtype=int))


def test_probe_on_hidden_states_with_random_labels_is_near_chance(world):
    from mmunlearn.audit.probe import answer_states

    items = load_split(SRC, "retain90")[:80]
    states = answer_states(world["target"], items)
    assert states.shape[:2] == (3, 80)  # embeddings + 2 layers
    labels = np.random.default_rng(1).integers(0, 2, 80)
    assert abs(probe_accuracy(states[-1], labels, k=4) - 0.5) < 0.2


def test_nearest_centroid_identifies_clustered_speakers_and_not_scrambled_ones():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 8)) * 5
    speakers = [f"s{i}" for i in range(4) for _ in range(6)]
    emb = np.repeat(centres, 6, axis=0) + rng.normal(size=(24, 8))
    assert nearest_centroid_accuracy(emb, speakers) == 1.0
    assert nearest_centroid_accuracy(emb, speakers, only=["s1"]) == 1.0
    noise = rng.normal(size=(24, 8))
    assert nearest_centroid_accuracy(noise, speakers) < 0.8
    assert nearest_centroid_accuracy(emb, speakers, only=["nobody"]) is None


def test_paraphrase_asks_the_paraphrased_question():
    items = load_split(SRC, "forget10_perturbed")[:3]
    para = paraphrased(items)
    assert [p.question for p in para] == [it.paraphrased_question for it in items]
    assert [p.answer for p in para] == [it.answer for it in items]
    with pytest.raises(ValueError, match="paraphrased_question"):
        paraphrased(load_split(SRC, "forget10")[:2])


def test_kept_and_recovered_ratios():
    assert kept(0.9, 0.9, 0.1) == 0.0 and kept(0.9, 0.1, 0.1) == 1.0 and kept(0.9, 0.5, 0.1) == pytest.approx(0.5)
    assert kept(0.5, 0.2, 0.5) is None and kept(None, 0.2, 0.1) is None
    assert recovered(0.1, 0.5, 0.9) == pytest.approx(0.5) and recovered(0.9, 0.9, 0.9) is None
    # the target audited as if unlearned: its "gap" of 0.01 against a retain gap of 0.8 is noise, not a share
    assert recovered(0.89, 0.9, 0.9, retain=0.1) is None and recovered(0.89, 0.9, 0.9) == pytest.approx(1.0)
    assert recovered(0.5, 0.7, 0.9, retain=0.1) == pytest.approx(0.5)  # half the retain gap forgotten: a real share


def test_options_are_validated():
    with pytest.raises(ValueError, match="attack"):
        AuditOptions(attacks=("nope",))
    with pytest.raises(ValueError, match="bits"):
        AuditOptions(bits=(3,))
    with pytest.raises(ValueError, match="relearn_on"):
        AuditOptions(relearn_on="both")


@pytest.fixture(scope="module")
def t3_folder(world, tmp_path_factory):
    from mmunlearn.methods import UnlearnRequest, run_unlearning
    from tests.tiny import fast

    root = tmp_path_factory.mktemp("audit_t3")
    world["target"].save(root / "target")
    world["retain"].save(root / "retain")
    target = TextLLMAdapter.from_pretrained(root / "target", device="cpu")
    request = UnlearnRequest(
        "t3",
        "text",
        size="micro",
        overrides=fast("t3"),
        out=root / "t3" / "model",
        inputs=[root / "target"],
        progress=False,
    )
    run_unlearning(request, target, world["forget"], world["retain_rows"])
    return root


def test_t3_audit_reports_that_its_weights_still_hold_everything(world, t3_folder):
    from mmunlearn.audit.folder import load_text_unlearned

    tilted = load_text_unlearned(t3_folder / "t3" / "model", device="cpu")
    res = audit_text(
        tilted,
        world["target"],
        world["retain"],
        world["forget"],
        world["holdout"],
        method="t3",
        progress=False,
        options=AuditOptions(attacks=("quantise", "probe"), bits=(8,), **FAST),
    )
    assert res["white_box"]["weights_equal_target"] is True and res["white_box"]["output_level_only"] is True
    assert "output" in res["white_box"]["note"]
    probe = res["attacks"]["probe"]
    assert probe["unlearned"]["accuracy_by_layer"] == probe["target"]["accuracy_by_layer"]  # same states
    assert res["summary"]["kept_probe"] in (0.0, None)
    # the output-level measures are the tilted model's (its forget prob differs from the target's)
    assert res["attacks"]["none"]["unlearned"]["forget_prob"] != res["attacks"]["none"]["target"]["forget_prob"]


def test_audit_command_writes_audit_json_and_table(world, t3_folder, tmp_path):
    from mmunlearn.cli import app

    args = [
        "audit",
        "--model",
        str(t3_folder / "t3" / "model"),
        "--target",
        str(t3_folder / "target"),
        "--retain-model",
        str(t3_folder / "retain"),
        "--data",
        SRC,
        "--out",
        str(tmp_path),
        "--device",
        "cpu",
        "--attacks",
        "paraphrase,quantise",
        "--bits",
        "8",
        "--max-new-tokens",
        "4",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    saved = json.loads((tmp_path / "AUDIT.json").read_text())
    assert saved["results"][0]["method"] == "t3" and "paraphrase" in saved["results"][0]["attacks"]
    assert [r["method"] for r in saved["rows"]] == ["target model", "retain model", "t3"]
    table = (tmp_path / "AUDIT.md").read_text()
    assert "| t3 |" in table and "kept: 8-bit" in table and "output" in table
    bad = CliRunner().invoke(app, [*args[:-6], "--attacks", "melt"])
    assert bad.exit_code != 0 and "melt" in bad.output


def test_write_audit_is_atomic_and_complete(world, tmp_path):
    t, r = world["target"], world["retain"]
    res = audit_text(
        r.clone(),
        t,
        r,
        world["forget"][:6],
        None,
        method="m",
        progress=False,
        options=AuditOptions(attacks=("paraphrase",), **FAST),
    )
    path = write_audit(tmp_path, [res], {"k": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["AUDIT.json", "AUDIT.md"]  # no temporary left
    assert json.loads(path.read_text())["context"] == {"k": 1}
