"""KL-minimisation: gradient ascent on the forget set plus KL to the original model on the retain
set (the TOFU baseline, Maini et al., 2024)."""

import torch

from mmunlearn.baselines.base import register


@register("kl", needs_reference=True)
def kl_loss(ctx, model, forget, retain):
    """-gamma * NLL(forget) + alpha * KL(p_original || p_theta) over retain answer positions."""
    cfg = ctx.config
    with torch.no_grad():
        ref = ctx.adapter.target_distributions(retain, model=ctx.reference)
    cur = ctx.adapter.target_distributions(retain, model=model)
    kl = torch.nn.functional.kl_div(cur, ref, log_target=True, reduction="batchmean")
    return -cfg.gamma * ctx.adapter.loss(forget, model=model) + cfg.alpha * kl
