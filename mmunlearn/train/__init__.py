"""The shared training loop (accelerate) and its configuration, used by every trainer in the toolkit."""

from mmunlearn.train.config import TrainConfig
from mmunlearn.train.loop import TrainResult, causal_lm_loss, train

__all__ = ["TrainConfig", "TrainResult", "causal_lm_loss", "train"]
