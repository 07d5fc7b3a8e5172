"""Task-vector extraction (finetune, lora, gradient): shapes, model left untouched, defining properties."""

import pytest
import torch

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.data.tofu import load_split
from mmunlearn.erase.norms import sq_norm
from mmunlearn.taskvec import LowRank, load_task_matrices, save_task_matrices
from mmunlearn.taskvec.extract import ExtractConfig, extract_task_matrices
from tests.tiny import tiny_causal_lm, tiny_tokenizer


@pytest.fixture
def adapter():
    return TextLLMAdapter(tiny_causal_lm(layers=2), tiny_tokenizer())


@pytest.fixture(scope="module")
def forget():
    return load_split("synthetic:n_authors=10", "forget10")[:12]


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind", ["finetune", "lora", "gradient"])
def test_every_kind_leaves_model_bitwise_unchanged(adapter, forget, kind):
    before = state(adapter.model)
    tm = extract_task_matrices(adapter, forget, kind=kind, steps=3, lr=1e-2, batch_size=4, progress=False)
    after = state(adapter.model)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    names = [lw.name for lw in adapter.layers()]
    assert set(tm) == set(names)
    params = dict(adapter.model.named_parameters())
    for n in names:
        t = tm[n].dense() if kind == "lora" else tm[n]
        assert t.shape == params[n].shape and torch.isfinite(t).all()
    assert sum(sq_norm(t) for t in tm.values()) > 0
    assert tm.meta["kind"] == kind and tm.meta["examples"] == len(forget)


def test_lora_task_matrices_stay_factored_with_rank_r(adapter, forget):
    tm = extract_task_matrices(
        adapter, forget, kind="lora", steps=4, lr=5e-2, lora_rank=2, batch_size=4, progress=False
    )
    params = dict(adapter.model.named_parameters())
    for n, t in tm.items():
        assert isinstance(t, LowRank) and t.rank == 2 and t.shape == params[n].shape
        assert t.B.shape == (params[n].shape[0], 2) and t.A.shape == (2, params[n].shape[1])
        assert torch.linalg.matrix_rank(t.dense().double(), rtol=1e-5) <= 2
        assert sq_norm(t) == pytest.approx(float(t.dense().double().pow(2).sum()), rel=1e-5)


def test_gradient_is_minus_lr_times_summed_gradients(adapter, forget):
    name = next(adapter.layers()).name
    tm = extract_task_matrices(adapter, forget, kind="gradient", lr=0.5, batch_size=6, layers=[name], progress=False)
    assert list(tm) == [name]
    p = dict(adapter.model.named_parameters())[name]
    manual = torch.zeros_like(p)
    for i in range(0, len(forget), 6):
        adapter.model.zero_grad()
        adapter.loss(adapter.collate(forget[i : i + 6])).backward()
        manual += p.grad
    assert torch.allclose(tm[name], -0.5 * manual, atol=1e-6)


def test_finetune_delta_lowers_the_partition_loss_when_added(adapter, forget):
    tm = extract_task_matrices(adapter, forget, kind="finetune", steps=8, lr=1e-2, batch_size=6, progress=False)
    batch = adapter.collate(forget)
    with torch.no_grad():
        before = float(adapter.loss(batch))
        params = dict(adapter.model.named_parameters())
        for n, t in tm.items():
            params[n].add_(t)
        after = float(adapter.loss(batch))
    assert after < before


def test_roundtrip_and_errors(adapter, forget, tmp_path):
    tm = extract_task_matrices(adapter, forget, kind="gradient", progress=False)
    save_task_matrices(tmp_path / "f.safetensors", tm, tm.meta)
    back = load_task_matrices(tmp_path / "f.safetensors")
    assert back.meta["kind"] == "gradient" and all(torch.equal(back[k], tm[k]) for k in tm)
    with pytest.raises(ValueError, match="empty"):
        extract_task_matrices(adapter, [], progress=False)
    with pytest.raises(ValueError, match="unknown task-vector kind"):
        ExtractConfig(kind="svd")
    with pytest.raises(KeyError, match="not layers"):
        extract_task_matrices(adapter, forget, layers=["lm_head.weight"], progress=False)


class _BNAdapter:
    """A minimal adapter around a BatchNorm classifier (real torch modules)."""

    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3)).eval()

    def layers(self):
        from mmunlearn.adapters.base import LayerWeight

        for name, p in self.model.named_parameters():
            if p.dim() == 2:
                yield LayerWeight(name, name.split(".")[0], p)

    def collate(self, examples):
        return {"x": torch.stack([e[0] for e in examples]), "y": torch.tensor([e[1] for e in examples])}

    def loss(self, batch, model=None):
        return torch.nn.functional.cross_entropy((model or self.model)(batch["x"]), batch["y"])


@pytest.mark.parametrize("kind", ["finetune", "gradient"])
def test_batchnorm_statistics_are_restored(kind):
    ad = _BNAdapter()
    data = [(torch.randn(6), i % 3) for i in range(12)]
    before = {k: v.clone() for k, v in ad.model.state_dict().items()}
    extract_task_matrices(ad, data, kind=kind, steps=3, batch_size=4, progress=False)
    after = ad.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # running_mean/var and num_batches_tracked too
