"""SimNPO: reference-free NPO with length normalisation (Fan et al., 2024, arXiv:2410.07163).

L = -(2/beta) E_f[log sigmoid(beta (NLL_avg(y|x) - delta))] * gamma + alpha NLL(retain), where
NLL_avg is the per-token average NLL of the forget answer and delta the reward margin.
"""

import torch.nn.functional as F

from mmunlearn.baselines.base import register


@register("simnpo")
def simnpo_loss(ctx, model, forget, retain):
    """Length-normalised, reference-free NPO plus alpha * retain NLL."""
    cfg = ctx.config
    avg_nll = -ctx.adapter.sequence_logprob(forget, model=model, average=True)
    forget_term = -(2.0 / cfg.beta) * F.logsigmoid(cfg.beta * (avg_nll - cfg.delta)).mean()
    return cfg.gamma * forget_term + cfg.alpha * ctx.adapter.loss(retain, model=model)
