"""The shared training loop: learning, accumulation, parameter subsets, resume, paired data, schedules."""

import math

import pytest
import torch
from torch import nn

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.data.tofu import load_split
from mmunlearn.train import TrainConfig, causal_lm_loss, train
from tests.tiny import tiny_causal_lm, tiny_tokenizer

QUIET = dict(progress=False, device="cpu")


@pytest.fixture(scope="module")
def qa():
    return load_split("synthetic:n_authors=10", "full")[:40]


def _lm(seed=0):
    model = tiny_causal_lm("llama", vocab=512, hidden=32, seed=seed)
    return model, TextLLMAdapter(model, tiny_tokenizer())


def _regression(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [0.0], [3.0]]) + 0.1 * torch.randn(n, 1, generator=g)
    return [(x[i], y[i]) for i in range(n)]


def _mse(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_loss_goes_down_and_result_is_consistent(qa):
    model, ad = _lm()
    res = train(model, causal_lm_loss, qa, ad.collate, epochs=4, batch_size=8, lr=5e-3, schedule="onecycle", **QUIET)
    assert res.steps == 4 * math.ceil(len(qa) / 8) == len(res.losses) == len(res.lrs)
    assert res.epochs == pytest.approx(4.0)
    assert res.final_loss < res.losses[0] - 1.0  # from ~ln(512) = 6.2 well down
    assert res.final_loss == pytest.approx(sum(res.losses[-5:]) / 5)
    assert not model.training and all(p.requires_grad for p in model.parameters())


def test_grad_accumulation_equals_the_big_batch():
    data = _regression()
    cfg = TrainConfig(epochs=3, lr=0.1, optimizer="sgd", schedule="constant", max_grad_norm=None, seed=3)
    torch.manual_seed(0)
    small, big = nn.Linear(5, 1), nn.Linear(5, 1)
    big.load_state_dict(small.state_dict())
    a = train(small, _mse, data, None, cfg, batch_size=4, grad_accum=3, **QUIET)
    b = train(big, _mse, data, None, cfg, batch_size=12, grad_accum=1, **QUIET)
    assert a.steps == b.steps == 6
    assert torch.allclose(small.weight, big.weight, atol=1e-6) and torch.allclose(small.bias, big.bias, atol=1e-6)
    assert a.losses == pytest.approx(b.losses, abs=1e-5)
    # and the run did move the weights (the comparison is not between two untouched models)
    assert not torch.allclose(small.weight, nn.Linear(5, 1).weight)


def test_params_subset_leaves_the_rest_bitwise_unchanged(qa):
    model, ad = _lm()
    chosen = ["model.layers.1.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"]
    model.model.layers[0].mlp.up_proj.weight.requires_grad_(False)  # a flag the loop must restore
    before = _state(model)
    train(model, causal_lm_loss, qa[:16], ad.collate, steps=3, batch_size=8, lr=1e-2, params=chosen, **QUIET)
    after = model.state_dict()
    for name, value in before.items():
        if name in chosen:
            assert not torch.equal(value, after[name]), name
        else:
            assert torch.equal(value, after[name]), name
    assert not model.model.layers[0].mlp.up_proj.weight.requires_grad
    assert model.model.layers[1].mlp.up_proj.weight.requires_grad
    with pytest.raises(KeyError, match="no parameter named"):
        train(model, causal_lm_loss, qa, ad.collate, steps=1, params=["nope.weight"], **QUIET)
    with pytest.raises(ValueError, match="parameter of the model"):
        train(model, causal_lm_loss, qa, ad.collate, steps=1, params=[nn.Parameter(torch.zeros(2))], **QUIET)


def test_resume_after_interruption_equals_an_uninterrupted_run(qa, tmp_path):
    from mmunlearn.presets.models import MICRO  # tied embeddings: checkpoints must handle shared tensors

    tok = tiny_tokenizer()
    cfg = TrainConfig(epochs=2, batch_size=4, grad_accum=2, lr=3e-3, schedule="onecycle", weight_decay=0.01, seed=5)

    def run(seed, **kw):
        model = MICRO.arch.build(tok, seed=seed)
        res = train(model, causal_lm_loss, qa[:36], TextLLMAdapter(model, tok).collate, cfg, **QUIET, **kw)
        return model, res

    ref, ref_res = run(0)
    assert ref_res.steps == 10  # 9 micro-batches per epoch -> 5 optimizer steps (the last one short)
    ck = tmp_path / "ck"
    _, cut = run(0, checkpoint_dir=ck, checkpoint_every=3, on_step=lambda step, loss: step == 7)
    assert cut.steps == 7 and [p.name for p in ck.iterdir()] == ["step_00000006"]
    with pytest.raises(FileExistsError, match="resume=True"):
        run(0, checkpoint_dir=ck, checkpoint_every=3)
    resumed, res = run(1, checkpoint_dir=ck, checkpoint_every=3, resume=True)  # other init: weights come from ck
    assert res.resumed_from == 6 and res.steps == 10
    assert res.losses == pytest.approx(ref_res.losses, abs=1e-5) and res.lrs == pytest.approx(ref_res.lrs)
    for (name, a), b in zip(ref.state_dict().items(), resumed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name
    with pytest.raises(ValueError, match="different run"):
        run(0, checkpoint_dir=ck, checkpoint_every=3, resume=True, lr=1e-3)


def test_two_datasets_are_paired_and_the_second_cycles():
    seen = []

    def loss_fn(model, batch, batch2):
        seen.append((batch.tolist(), batch2.tolist()))
        return model(batch.float().unsqueeze(1)).mean() + 0.0 * batch2.sum()

    first = [torch.tensor(i) for i in range(10)]
    second = [torch.tensor(100 + j) for j in range(4)]
    res = train(nn.Linear(1, 1), loss_fn, first, data2=second, epochs=2, batch_size=3, **QUIET)
    assert res.steps == 8 and len(seen) == 8
    assert all(len(a) == len(b) for a, b in seen)
    drawn1 = [i for a, _ in seen for i in a]
    drawn2 = [j for _, b in seen for j in b]
    assert sorted(drawn1[:10]) == sorted(drawn1[10:]) == list(range(10))  # each epoch covers data once
    assert drawn1[:10] != drawn1[10:]  # reshuffled per epoch
    for c in range(5):  # 20 draws of the second dataset = 5 full cycles of its 4 items
        assert sorted(drawn2[4 * c : 4 * c + 4]) == [100, 101, 102, 103]


def test_same_seed_same_run_other_seed_other_order(qa):
    runs = []
    for seed in (0, 0, 1):
        model, ad = _lm()
        res = train(model, causal_lm_loss, qa[:16], ad.collate, epochs=1, batch_size=4, seed=seed, **QUIET)
        runs.append((res.losses, _state(model)))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(runs[0][1][k], runs[1][1][k]) for k in runs[0][1])
    assert runs[0][0] != runs[2][0]


def test_schedules_follow_their_shape():
    data = _regression(16)
    lin = train(
        nn.Linear(5, 1), _mse, data, None, steps=8, batch_size=4, lr=0.1, schedule="linear", warmup=0.25, **QUIET
    ).lrs
    assert lin == pytest.approx([0.0, 0.05, 0.1, 0.1 * 5 / 6, 0.1 * 4 / 6, 0.1 * 3 / 6, 0.1 * 2 / 6, 0.1 / 6])
    one = train(nn.Linear(5, 1), _mse, data, None, steps=10, batch_size=4, lr=0.1, schedule="onecycle", **QUIET).lrs
    assert one[0] == pytest.approx(0.1 / 25) and max(one) == pytest.approx(0.1, rel=1e-3)
    assert one.index(max(one)) == 2 and one[-1] < one[0]  # peak at 30% of the steps, ends below the start
    const = train(nn.Linear(5, 1), _mse, data, None, steps=5, batch_size=4, lr=0.1, **QUIET)
    assert const.lrs == pytest.approx([0.1] * 5) and const.epochs == pytest.approx(5 / 4)


def test_mixed_precision_options_on_cpu(qa):
    model, ad = _lm()
    res = train(model, causal_lm_loss, qa[:8], ad.collate, steps=2, batch_size=4, mixed_precision="bf16", **QUIET)
    assert all(math.isfinite(x) for x in res.losses)
    assert "forward" not in model.__dict__  # the autocast wrapper is removed after the run
    assert next(model.parameters()).dtype == torch.float32
    with pytest.raises(ValueError, match="fp16.*CUDA"):
        train(model, causal_lm_loss, qa[:8], ad.collate, steps=1, mixed_precision="fp16", **QUIET)


def test_bad_arguments_are_rejected(qa):
    model, ad = _lm()
    with pytest.raises(ValueError, match="exactly one of epochs and steps"):
        TrainConfig(epochs=1, steps=2)
    with pytest.raises(TypeError, match="unknown training option"):
        train(model, causal_lm_loss, qa, ad.collate, epochs=1, learning_rate=1e-3, **QUIET)
    with pytest.raises(ValueError, match="empty"):
        train(model, causal_lm_loss, [], ad.collate, epochs=1, **QUIET)
    with pytest.raises(ValueError, match="schedule must be one of"):
        TrainConfig(epochs=1, schedule="warmup")
    with pytest.raises(TypeError, match="scalar tensor"):
        train(model, lambda m, b: torch.zeros(2), qa[:4], ad.collate, steps=1, **QUIET)
    assert TrainConfig(epochs=3).replace(steps=5).epochs is None
