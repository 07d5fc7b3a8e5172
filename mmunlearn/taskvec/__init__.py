"""Task matrices per layer: extraction from a partition (later issues) and safetensors storage."""

from mmunlearn.taskvec.lowrank import LowRank
from mmunlearn.taskvec.store import TaskMatrices, load_task_matrices, save_task_matrices

__all__ = ["LowRank", "TaskMatrices", "load_task_matrices", "save_task_matrices"]
