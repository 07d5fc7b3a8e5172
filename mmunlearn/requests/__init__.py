"""Deletion requests at service speed: a retain state computed once, requests that compose, batches."""

from mmunlearn.requests.history import HISTORY_DIR, History, read_history
from mmunlearn.requests.service import run_request, union, widened_rule
from mmunlearn.requests.state import (
    RetainState,
    data_fingerprint,
    load_retain_state,
    model_fingerprint,
    obtain_retain_state,
)

__all__ = [
    "HISTORY_DIR",
    "History",
    "RetainState",
    "data_fingerprint",
    "load_retain_state",
    "model_fingerprint",
    "obtain_retain_state",
    "read_history",
    "run_request",
    "union",
    "widened_rule",
]
