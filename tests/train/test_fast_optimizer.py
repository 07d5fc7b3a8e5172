"""The training loop's AdamW is torch's fused one on CPU float parameters, and it updates as the default one does."""

import torch

from mmunlearn.train.config import TrainConfig
from mmunlearn.train.schedule import make_optimizer


def test_fused_adamw_on_cpu_takes_the_default_implementations_steps():
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(8, 4)), torch.nn.Parameter(torch.randn(4))]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    start = [p.detach().clone() for p in a]
    cfg = TrainConfig(epochs=1, lr=1e-2, weight_decay=0.1)
    fast = make_optimizer(a, cfg)
    assert fast.defaults["fused"] is True
    plain = torch.optim.AdamW(
        [{"params": [b[0]], "weight_decay": 0.1}, {"params": [b[1]], "weight_decay": 0.0}], lr=1e-2, betas=cfg.betas
    )
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        for pa, pb in zip(a, b):
            pa.grad = torch.randn(pa.shape, generator=g)
            pb.grad = pa.grad.clone()
        fast.step()
        plain.step()
    for pa, pb, p0 in zip(a, b, start):
        assert bool((pa != p0).all())  # every entry moved
        torch.testing.assert_close(pa, pb, rtol=1e-6, atol=1e-7)
