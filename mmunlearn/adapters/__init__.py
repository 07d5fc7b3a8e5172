"""Model-family adapters: the only code that knows a family's layout (text LLM, speech LLM, speaker)."""

from mmunlearn.adapters.base import LayerWeight, ModalityAdapter, resolve_device, resolve_dtype

__all__ = ["LayerWeight", "ModalityAdapter", "resolve_device", "resolve_dtype"]
