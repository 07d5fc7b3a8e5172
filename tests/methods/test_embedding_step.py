"""QR-Erase's centroid step (EraseConfig.centroid) on a tiny ECAPA with 3 of 7 speakers forgotten: retained speakers'
mean embeddings stay, the forgotten ones' components outside the retained span are reflected, one undo patch restores
every tensor bit for bit."""

import numpy as np
import pytest
import torch

from mmunlearn.adapters.speaker.adapter import SpeakerAdapter
from mmunlearn.adapters.speaker.training import train_speaker_classifier, training_rows
from mmunlearn.api.restore import restore_folder
from mmunlearn.api.unlearn import unlearn
from mmunlearn.data.utterances import split_rows
from mmunlearn.erase.subspace.centroid import centroid_subspace, class_centroids
from mmunlearn.eval.speaker import score_rows
from tests.speech_corpus import one_thread, three_forgotten_manifests  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def trained(three_forgotten_manifests, tmp_path_factory):
    rows, speakers = training_rows(three_forgotten_manifests, "speaker")
    adapter, _ = train_speaker_classifier(
        rows, speakers=speakers, preset="tiny", epochs=6, lr=5e-3, batch_size=8, device="cpu", progress=False
    )
    path = tmp_path_factory.mktemp("centroid_step") / "original"
    adapter.save(path)
    return path


def _centroids(adapter, rows):
    scored = score_rows(adapter, rows, desc=None)
    return class_centroids(scored.embeddings, scored.speakers)


def _state(folder):
    model = SpeakerAdapter.load(folder, device="cpu").model
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_centroid_step_reflects_the_forgotten_directions_and_restores_bit_for_bit(
    trained, three_forgotten_manifests, tmp_path
):
    forget = split_rows(three_forgotten_manifests, "spk_forget_train")
    retain = split_rows(three_forgotten_manifests, "spk_retain_train")
    original = SpeakerAdapter.load(trained, device="cpu")
    before_f, before_r = _centroids(original, forget), _centroids(original, retain)
    basis = centroid_subspace(before_f, before_r).numpy()
    assert basis.shape[1] >= 1

    out = tmp_path / "out"
    res = unlearn(
        trained,
        forget=forget,
        retain=retain,
        method="qr-erase",
        scope="head",
        out=out,
        device="cpu",
        progress=False,
        rule=None,
        centroid=2.0,
    )  # the preset edit: the step does not depend on it
    facts = res.report["info"]["centroid"]
    assert facts["directions"] == basis.shape[1] and facts["layer"] == "embedding_model.fc.conv.weight"
    edited = SpeakerAdapter.load(out, device="cpu")
    after_f, after_r = _centroids(edited, forget), _centroids(edited, retain)
    for k, v in before_r.items():  # the retained speakers' mean embeddings do not move
        assert np.linalg.norm(after_r[k] - v) <= 1e-4 * np.linalg.norm(v)
    for k, v in before_f.items():  # alpha 2: the forgotten ones' components along U change sign
        assert np.allclose(basis.T @ after_f[k], -(basis.T @ v), atol=1e-4 * np.linalg.norm(v))
    assert facts["retain_centroid_max_rel_change"] <= 1e-4

    state, back = _state(trained), _state(restore_folder(out, tmp_path / "back", progress=False))
    after = _state(out)
    moved = [k for k in state if not torch.equal(state[k], after[k])]
    assert "embedding_model.fc.conv.weight" in moved and "classifier.weight" in moved  # both edits happened
    assert all(torch.equal(state[k], back[k]) for k in state)  # and one patch takes both back


def test_without_the_step_the_embeddings_are_untouched(trained, three_forgotten_manifests):
    forget = split_rows(three_forgotten_manifests, "spk_forget_train")
    retain = split_rows(three_forgotten_manifests, "spk_retain_train")
    res = unlearn(
        trained,
        forget=forget,
        retain=retain,
        method="qr-erase",
        scope="head",
        out=None,
        device="cpu",
        progress=False,
        rule=None,
    )
    assert "centroid" not in res.report["info"]
    assert torch.equal(
        res.adapter.model.embedding_model.fc.conv.weight, _state(trained)["embedding_model.fc.conv.weight"]
    )


def test_the_step_refuses_a_zero_or_a_model_without_an_embedding_layer(trained, three_forgotten_manifests):
    from mmunlearn.methods.embedding_step import erase_centroids

    forget = split_rows(three_forgotten_manifests, "spk_forget_train")
    retain = split_rows(three_forgotten_manifests, "spk_retain_train")
    adapter = SpeakerAdapter.load(trained, device="cpu")
    with pytest.raises(ValueError, match="> 0"):
        erase_centroids(adapter, forget, retain, 0.0)
    adapter.embedding_output = None
    with pytest.raises(ValueError, match="embedding_output"):
        erase_centroids(adapter, forget, retain, 1.0)
