"""Layer energy and layer selection."""

import math

import pytest
import torch

from mmunlearn.erase import group_of, layer_energy, select_layers


@pytest.mark.parametrize(
    "name, group",
    [
        ("model.layers.3.mlp.up_proj.weight", "model.layers.3"),
        ("model.layers.12.self_attn.q_proj.weight", "model.layers.12"),
        ("transformer.h.0.attn.c_attn.weight", "transformer.h.0"),
        ("thinker.audio_tower.layers.2.fc1.weight", "thinker.audio_tower.layers.2"),
        ("lm_head.weight", "lm_head"),
        ("embedding_model.blocks.1.conv.conv.weight", "embedding_model.blocks.1"),
    ],
)
def test_group_of_parameter_names(name, group):
    assert group_of(name) == group


def test_energy_is_normalised_frobenius_share_per_layer():
    tm = {
        "m.layers.0.a.weight": torch.full((2, 2), 1.0),  # ||.|| = 2
        "m.layers.0.b.weight": torch.full((1, 4), 1.0),  # ||.|| = 2 -> layer 0: sqrt(8)
        "m.layers.1.a.weight": torch.full((3, 3), 2.0),  # ||.|| = 6
    }
    e = layer_energy(tm)
    total = math.sqrt(8) + 6
    assert e == pytest.approx({"m.layers.0": math.sqrt(8) / total, "m.layers.1": 6 / total})
    assert sum(e.values()) == pytest.approx(1.0)


def test_custom_grouping():
    tm = {"x.weight": torch.ones(2, 2), "y.weight": torch.ones(2, 2)}
    assert layer_energy(tm, {"x.weight": "g", "y.weight": "g"}) == {"g": 1.0}
    assert set(layer_energy(tm, lambda n: n[0])) == {"x", "y"}


def test_selection_rules():
    e = {"a": 0.1, "b": 0.4, "c": 0.3, "d": 0.2}
    assert select_layers(e) == ["b", "c"]  # >= 1/4
    assert select_layers(e, top=1) == ["b"]
    assert select_layers(e, "top", top=3) == ["b", "c", "d"]
    assert select_layers(e, threshold=0.2) == ["b", "c", "d"]
    assert select_layers(e, "all") == ["a", "b", "c", "d"]


def test_uniform_energy_selects_every_layer():
    assert select_layers({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}) == ["a", "b", "c"]


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (({"a": 0.5, "b": 0.5}, "threshold"), {"threshold": 0.9}, "selected no layer"),
        (({"a": 1.0}, "median"), {}, "unknown selection rule"),
        (({"a": 1.0}, "top"), {"top": 0}, "top >= 1"),
        (({},), {}, "no layer energies"),
    ],
)
def test_selection_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        select_layers(*args, **kwargs)


def test_energy_errors():
    with pytest.raises(ValueError, match="no task matrices"):
        layer_energy({})
    with pytest.raises(ValueError, match="every task matrix is zero"):
        layer_energy({"l.0.w": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match="NaN or Inf"):
        layer_energy({"l.0.w": torch.tensor([[float("nan")]])})
