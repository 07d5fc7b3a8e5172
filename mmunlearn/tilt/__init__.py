"""T3 (temper-then-tilt): hidden-state cache, low-rank tilt head, LogitsProcessor, tilted model."""

from mmunlearn.adapters.base import HiddenStateTap
from mmunlearn.tilt.head import TiltHead
from mmunlearn.tilt.model import TiltedCausalLM
from mmunlearn.tilt.processor import TemperThenTilt, tilt_logprobs

__all__ = ["HiddenStateTap", "TemperThenTilt", "TiltHead", "TiltedCausalLM", "tilt_logprobs"]
