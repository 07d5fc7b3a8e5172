"""NPO: negative preference optimisation (Zhang et al., 2024, arXiv:2404.05868), with retain NLL.

L = -(2/beta) E_f[log sigmoid(-beta (log pi_theta(y|x) - log pi_ref(y|x)))] + alpha NLL(retain).
"""

import torch
import torch.nn.functional as F

from mmunlearn.baselines.base import register


@register("npo", needs_reference=True)
def npo_loss(ctx, model, forget, retain):
    """NPO on the forget set plus alpha * retain NLL."""
    cfg = ctx.config
    with torch.no_grad():
        ref = ctx.adapter.sequence_logprob(forget, model=ctx.reference)
    cur = ctx.adapter.sequence_logprob(forget, model=model)
    forget_term = -(2.0 / cfg.beta) * F.logsigmoid(-cfg.beta * (cur - ref)).mean()
    return cfg.gamma * forget_term + cfg.alpha * ctx.adapter.loss(retain, model=model)
