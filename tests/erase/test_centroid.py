"""Centroid erasure of an embedding layer: after the edit the forgotten classes' mean embeddings have no component
along the erased directions (alpha 1) or its sign flipped (alpha 2), the kept classes' mean embeddings are unchanged,
and a forgotten centroid inside the kept span gives nothing to erase."""

import numpy as np
import pytest
import torch

from mmunlearn.erase.subspace.centroid import centroid_subspace, class_centroids, project_output


def _layer_and_inputs(seed=0, d=16, n_in=24, classes=7, per_class=30):
    g = torch.Generator().manual_seed(seed)
    layer = torch.nn.Conv1d(n_in, d, 1)  # e = W z + b, as ECAPA's last layer
    with torch.no_grad():
        layer.weight.copy_(torch.randn(d, n_in, 1, generator=g))
        layer.bias.copy_(torch.randn(d, generator=g))
    means = torch.randn(classes, n_in, generator=g) * 3
    z = torch.cat([means[c] + torch.randn(per_class, n_in, generator=g) for c in range(classes)])
    labels = [f"s{c}" for c in range(classes) for _ in range(per_class)]
    return layer, z, labels


def _embed(layer, z):
    with torch.no_grad():
        return layer(z.unsqueeze(-1)).squeeze(-1).double().numpy()


@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_forgotten_centroids_lose_the_directions_and_kept_centroids_stay(alpha):
    layer, z, labels = _layer_and_inputs()
    forget = {"s0", "s1"}
    cents = class_centroids(_embed(layer, z), labels)
    gone = {k: v for k, v in cents.items() if k in forget}
    kept = {k: v for k, v in cents.items() if k not in forget}
    u = centroid_subspace(gone, kept)
    assert u.shape == (16, 2)
    assert torch.allclose(u.T @ u, torch.eye(2, dtype=torch.float64), atol=1e-10)
    along_before = {k: u.numpy().T @ v for k, v in gone.items()}
    assert min(np.linalg.norm(a) for a in along_before.values()) > 1e-3  # there was something to erase
    project_output(layer.weight, layer.bias, u, alpha)
    after = class_centroids(_embed(layer, z), labels)
    for k, v in kept.items():  # kept centroids are orthogonal to U: unchanged
        assert np.linalg.norm(after[k] - v) <= 1e-4 * np.linalg.norm(v)
    for k in forget:  # alpha 1: no component left; alpha 2: reflected
        along = u.numpy().T @ after[k]
        assert np.allclose(along, (1 - alpha) * along_before[k], atol=1e-4 * np.linalg.norm(gone[k]))
        inside = after[k] - u.numpy() @ along
        assert np.allclose(inside, gone[k] - u.numpy() @ along_before[k], atol=1e-4 * np.linalg.norm(gone[k]))


def test_a_forgotten_centroid_inside_the_kept_span_gives_nothing_to_erase():
    keep = {"a": np.array([1.0, 0.0, 0.0]), "b": np.array([0.0, 1.0, 0.0])}
    assert centroid_subspace({"f": np.array([2.0, -1.0, 0.0])}, keep).shape == (3, 0)
    assert centroid_subspace({"f": np.array([2.0, -1.0, 0.5])}, keep).abs()[2, 0] == pytest.approx(1.0)


def test_bad_inputs_are_refused():
    keep = {"a": np.ones(3)}
    with pytest.raises(ValueError, match="both forgotten and kept"):
        centroid_subspace({"a": np.ones(3)}, keep)
    with pytest.raises(ValueError, match="alpha"):
        project_output(torch.zeros(3, 2), None, torch.zeros(3, 1, dtype=torch.float64), alpha=3.0)
    with pytest.raises(ValueError, match="basis"):
        project_output(torch.zeros(3, 2), None, torch.zeros(4, 1, dtype=torch.float64))
