"""The speaker recipe's scopes and sweep grid follow what a method declares it needs, not a list of names."""

import pytest

from mmunlearn.methods import REGISTRY, register
from mmunlearn.methods.erasure import EraseConfig, run
from recipes.voxceleb2 import settings as cfg


@pytest.fixture()
def new_erasure():
    """An erasure method registered after the recipe's settings were imported (removed again afterwards)."""
    register("my-erase", EraseConfig, run, needs=("task_vectors",), help="test method")
    yield "my-erase"
    REGISTRY.pop("my-erase")


def test_a_method_declaring_task_vectors_gets_the_scopes_and_the_sweep_grid(new_erasure):
    assert cfg.is_erasure(new_erasure) and new_erasure not in cfg.ERASURE_METHODS  # not in the import-time list
    assert cfg.scopes_for(new_erasure, "sweep", True) == cfg.SWEEP_SCOPES
    assert cfg.sweep_defaults(new_erasure, {})["sweep_scales"] == cfg.SWEEP_ERASURE["sweep_scales"]


@pytest.mark.parametrize("method", ["grad_diff", "npo"])
def test_a_trained_method_gets_every_weight_and_no_grid(method):
    assert not cfg.is_erasure(method)
    assert cfg.scopes_for(method, "sweep", True) == ("all",)
    assert cfg.sweep_defaults(method, {"lr": 1e-3}) == {"lr": 1e-3}


def test_the_built_in_erasure_methods_are_the_task_vector_ones():
    assert set(cfg.ERASURE_METHODS) == {"qr-erase", "qr-erase-rows", "svd-unlearn"}
