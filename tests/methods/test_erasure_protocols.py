"""The papers' task-matrix protocols as erasure settings: layer-wise task matrices (UNLEARN), the training update
(target minus base, retain model minus base), subtraction at the task matrix's own size, the top-k layer rule."""

import pytest
import torch

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.data.tofu import load_split
from mmunlearn.erase.energy import group_of
from mmunlearn.methods import RunContext, SweepRule, mean_nll
from mmunlearn.methods.erasure import EraseConfig, run
from mmunlearn.taskvec.extract import ExtractConfig, extract_task_matrices, update_task_matrices
from tests.tiny import tiny_causal_lm, tiny_tokenizer

SRC = "synthetic:n_authors=10"


@pytest.fixture(scope="module")
def data():
    return load_split(SRC, "forget10")[:8], load_split(SRC, "retain90")[:16]


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_layerwise_is_each_block_trained_alone(data):
    forget, _ = data
    ad = TextLLMAdapter(tiny_causal_lm(layers=2), tiny_tokenizer())
    before = _state(ad.model)
    cfg = ExtractConfig(kind="layerwise", steps=3, lr=1e-2, batch_size=4)
    tm = extract_task_matrices(ad, forget, cfg, progress=False)
    after = _state(ad.model)
    assert all(torch.equal(before[k], after[k]) for k in before)  # the model is left as it was
    names = [lw.name for lw in ad.layers()]
    assert set(tm) == set(names) and tm.meta["kind"] == "layerwise"
    # block 1's matrices are those of fine-tuning block 1 alone (same seed, same data, the rest frozen) ...
    block1 = [n for n in names if ".layers.1." in n]
    alone = extract_task_matrices(
        ad, forget, ExtractConfig(kind="finetune", steps=3, lr=1e-2, batch_size=4), layers=block1, progress=False
    )
    assert all(torch.allclose(tm[n], alone[n], atol=1e-7) for n in block1)
    # ... and differ from fine-tuning every block at once (block 1 then trains on block 0's changed output)
    together = extract_task_matrices(
        ad, forget, ExtractConfig(kind="finetune", steps=3, lr=1e-2, batch_size=4), progress=False
    )
    assert any(not torch.allclose(tm[n], together[n], atol=1e-6) for n in block1)


def _trained(ad, rows, steps=4):
    """A copy of ``ad`` fine-tuned on ``rows`` (every block), as a target is made from its base."""
    out = ad.clone()
    tm = extract_task_matrices(
        out, rows, ExtractConfig(kind="finetune", steps=steps, lr=2e-3, batch_size=4), progress=False
    )
    with torch.no_grad():
        params = dict(out.model.named_parameters())
        for n, t in tm.items():
            params[n].add_(t)
    return out


def test_update_is_target_minus_base_and_refuses_a_foreign_or_equal_model(data):
    forget, _ = data
    base = TextLLMAdapter(tiny_causal_lm(layers=2), tiny_tokenizer())
    target = _trained(base, forget)
    tm = update_task_matrices(target, base)
    p_t, p_b = dict(target.model.named_parameters()), dict(base.model.named_parameters())
    assert set(tm) == {lw.name for lw in target.layers()}
    assert all(torch.equal(tm[n], p_t[n].detach() - p_b[n].detach()) for n in tm)
    with pytest.raises(ValueError, match="same weights"):
        update_task_matrices(base, base.clone())
    other = TextLLMAdapter(tiny_causal_lm(layers=2, hidden=48), tiny_tokenizer())
    with pytest.raises(ValueError, match="fine-tuned from"):
        update_task_matrices(target, other)


def test_update_own_size_undoes_the_forget_training_exactly(data):
    """Full rank, no retain projection, every layer, own size: W - (W_target - W_base) is the base itself."""
    forget, retain = data
    base = TextLLMAdapter(tiny_causal_lm(layers=2), tiny_tokenizer())
    target = _trained(base, forget)
    update = update_task_matrices(target, base)
    cfg = EraseConfig(task_matrix="update", subtract="own", rank=64, retain_rank=0, localize=False)
    res = run(target, forget, retain, cfg, RunContext("text", reference=base, progress=False))
    assert res.info["subtract"] == "own" and res.info["chosen"]["scale"] == 1.0
    p_t, p_b = dict(target.model.named_parameters()), dict(base.model.named_parameters())
    # every matrix is back at the base's, up to what CPQR's numerical rank drops (o_proj: ~1e-3 of its update)
    assert all(float((p_t[n].detach() - p_b[n].detach()).norm()) < 5e-3 * float(u.norm()) for n, u in update.items())


def test_update_without_a_reference_says_what_to_name(data):
    forget, retain = data
    ad = TextLLMAdapter(tiny_causal_lm(layers=2), tiny_tokenizer())
    with pytest.raises(ValueError, match="name that model"):
        run(ad, forget, retain, EraseConfig(task_matrix="update"), RunContext("text", progress=False))


def test_update_takes_the_retain_side_from_a_retain_model_folder(data, tmp_path):
    forget, retain = data
    base = TextLLMAdapter(tiny_causal_lm(layers=2), tiny_tokenizer())
    target = _trained(base, forget + retain)
    retained = _trained(base, retain)
    retained.save(tmp_path / "retain")
    cfg = EraseConfig(
        task_matrix="update",
        retain_model=str(tmp_path / "retain"),
        subtract="own",
        rank=4,
        retain_rank=4,
        layer_rule="top",
        top=1,
    )
    rule = SweepRule(forget_target=1e9, retain_bound=0.1)
    before = mean_nll(target, forget)
    res = run(target, forget, retain, cfg, RunContext("text", reference=base, rule=rule, progress=False))
    assert "sweep" not in res.info  # own size: no sweep, one edit
    assert len(res.info["selected_layers"]) == 1  # top-1 block by energy
    energies = res.info["energies"]
    assert res.info["selected_layers"] == [max(energies, key=energies.get)]
    edited = {
        group_of(lw.name)
        for lw in target.layers()
        if not torch.equal(
            dict(target.model.named_parameters())[lw.name],
            dict(_trained(base, forget + retain).model.named_parameters())[lw.name],
        )
    }
    assert edited == set(res.info["selected_layers"])
    assert mean_nll(target, forget) != pytest.approx(before)


def test_settings_are_checked(data):
    with pytest.raises(ValueError, match="task_matrix"):
        EraseConfig(task_matrix="diff")
    with pytest.raises(ValueError, match="subtract"):
        EraseConfig(subtract="half")
    with pytest.raises(ValueError, match="top must be >= 1"):
        EraseConfig(layer_rule="top", top=0)
    forget, retain = data
    ad = TextLLMAdapter(tiny_causal_lm(layers=2), tiny_tokenizer())
    with pytest.raises(ValueError, match="retain_model is read with task_matrix 'update' only"):
        run(ad, forget, retain, EraseConfig(retain_model="x"), RunContext("text", progress=False))
    with pytest.raises(ValueError, match="needs top >= 1"):  # the layer rule's own check, before any edit
        run(
            ad,
            forget,
            retain,
            EraseConfig(layer_rule="top", extract=ExtractConfig(kind="gradient")),
            RunContext("text", progress=False),
        )


def test_layerwise_on_a_speech_llm_trains_each_tower_block_alone():
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter
    from tests.adapters.test_speech_llm import TEXTS, _examples

    ad = SpeechLLMAdapter.build("tiny", texts=TEXTS, family="qwen2_audio", seed=0)
    rows = _examples()
    before = _state(ad.model)
    cfg = ExtractConfig(kind="layerwise", steps=2, lr=1e-2, batch_size=2)
    tm = extract_task_matrices(ad, rows, cfg, progress=False)
    after = _state(ad.model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert set(tm) == {lw.name for lw in ad.layers()}
    block = {lw.name: lw.block for lw in ad.layers()}
    for group in ("audio.layers.1", "text.layers.0"):  # one block of each tower, trained alone
        names = [n for n in tm if block[n] == group]
        alone = extract_task_matrices(
            ad, rows, ExtractConfig(kind="finetune", steps=2, lr=1e-2, batch_size=2), layers=names, progress=False
        )
        assert names and all(torch.allclose(tm[n], alone[n], atol=1e-7) for n in names)
    # every block at once gives other matrices (a block's second step sees the others' first)
    together = extract_task_matrices(
        ad, rows, ExtractConfig(kind="finetune", steps=2, lr=1e-2, batch_size=2), progress=False
    )
    assert any(not torch.allclose(tm[n], together[n], atol=1e-6) for n in tm)
