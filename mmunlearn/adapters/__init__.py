"""Model-family adapters: the only code that knows a family's layout. One folder per family (speaker/, hf_audio/,
speech_llm/, text/), each with its adapter and kind (adapter.py) and, for a classifier, its trainer (training.py);
the protocol every adapter implements (base.py) and the checks of a Hugging Face folder before it is read
(hf_checks.py) sit here."""

from mmunlearn.adapters.base import LayerWeight, ModalityAdapter, resolve_device, resolve_dtype

__all__ = ["LayerWeight", "ModalityAdapter", "resolve_device", "resolve_dtype"]
