"""GradDiff: gradient ascent on the forget set, descent on the retain set (Liu et al., 2022; TOFU)."""

from mmunlearn.baselines.base import register


@register("grad_diff")
def grad_diff_loss(ctx, model, forget, retain):
    """-gamma * NLL(forget) + alpha * NLL(retain)."""
    cfg = ctx.config
    return -cfg.gamma * ctx.adapter.loss(forget, model=model) + cfg.alpha * ctx.adapter.loss(retain, model=model)
