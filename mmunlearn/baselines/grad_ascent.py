"""GradAscent: maximise the NLL of the forget set (Jang et al., 2023; the TOFU baseline)."""

from mmunlearn.baselines.base import register


@register("grad_ascent", needs_retain=False)
def grad_ascent_loss(ctx, model, forget, retain=None):
    """-NLL(forget)."""
    return -ctx.adapter.loss(forget, model=model)
