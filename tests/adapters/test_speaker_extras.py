"""A SpeechBrain folder in the spkrec layout keeps every module its hyperparams.yaml names: ``mean_var_norm_emb`` and
its checkpoint reach the output unchanged, and SpeechBrain's ``encode_batch(normalize=True)`` and ``classify_file``
run on it (real SpeechBrain modules, a tiny ECAPA built here)."""

import pytest
import torch

from mmunlearn.adapters.speaker.adapter import SpeakerAdapter
from mmunlearn.api.restore import restore_folder
from mmunlearn.methods import UnlearnRequest, run_unlearning
from tests.adapters.test_speaker import SB_YAML

SPEAKERS = ["id10001", "id10002", "id10003"]


@pytest.fixture(scope="module")
def spkrec_dir(tmp_path_factory):
    """Tiny ECAPA + Classifier + a global embedding normaliser with statistics, as speechbrain/spkrec-ecapa-voxceleb
    ships them (hyperparams.yaml, the three .ckpt files, label_encoder.txt)."""
    from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN, Classifier
    from speechbrain.processing.features import InputNormalization

    root = tmp_path_factory.mktemp("spkrec")
    torch.manual_seed(7)
    ecapa = ECAPA_TDNN(
        24, lin_neurons=16, channels=[16, 16, 16, 16, 48], attention_channels=8, se_channels=8, res2net_scale=4
    ).eval()
    norm = InputNormalization(norm_type="global", std_norm=False).train()
    for _ in range(3):  # running statistics of some embeddings, as SpeechBrain's training computes them
        norm(2.0 + torch.randn(5, 1, 16), torch.ones(5))
    (root / "hyperparams.yaml").write_text(SB_YAML)
    torch.save(ecapa.state_dict(), root / "embedding_model.ckpt")
    torch.save(Classifier(input_size=16, out_neurons=3).state_dict(), root / "classifier.ckpt")
    norm._save(root / "mean_var_norm_emb.ckpt")
    (root / "label_encoder.txt").write_text(
        "'id10001' => 0\n'id10002' => 1\n'id10003' => 2\n================\n'starting_index' => 0\n"
    )
    return root


def _clips(n: int, seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    return [
        {"ID": f"u{seed}-{i}", "wav": 0.1 * torch.randn(8000, generator=gen), "spk_id": SPEAKERS[i % 3]}
        for i in range(n)
    ]


def _speechbrain(folder, savedir, **kwargs):
    from speechbrain.inference.speaker import EncoderClassifier

    return EncoderClassifier.from_hparams(
        source=str(folder), savedir=str(savedir), run_opts={"device": "cpu"}, **kwargs
    )


def test_the_output_keeps_every_module_and_its_checkpoint(spkrec_dir, tmp_path):
    import soundfile as sf

    adapter = SpeakerAdapter.load(spkrec_dir, device="cpu")
    assert [e.name for e in adapter.spec.extras] == ["mean_var_norm_emb"]
    forget = [c for c in _clips(12, 1) if c["spk_id"] == SPEAKERS[0]]
    retain = [c for c in _clips(12, 2) if c["spk_id"] != SPEAKERS[0]]
    run_unlearning(
        UnlearnRequest(
            "grad_ascent",
            "speaker",
            size="tiny",
            overrides={"epochs": 1},
            out=tmp_path / "out",
            inputs=[spkrec_dir],
            progress=False,
        ),
        adapter,
        forget,
        retain,
    )
    out = tmp_path / "out"
    original = (spkrec_dir / "mean_var_norm_emb.ckpt").read_bytes()
    assert (out / "mean_var_norm_emb.ckpt").read_bytes() == original  # copied unchanged
    assert (out / "classifier.ckpt").read_bytes() != (spkrec_dir / "classifier.ckpt").read_bytes()  # edited
    # SpeechBrain loads the output with every module; the normalised embeddings use the input's statistics
    mine = _speechbrain(out, tmp_path / "sb_out")
    theirs = _speechbrain(spkrec_dir, tmp_path / "sb_in", overrides={"pretrained_path": str(spkrec_dir)})
    stats = torch.load(spkrec_dir / "mean_var_norm_emb.ckpt", weights_only=True)
    wavs = 0.1 * torch.randn(2, 12000, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        raw = mine.encode_batch(wavs)
        normalised = mine.encode_batch(wavs, normalize=True)
        assert torch.allclose(normalised, raw - stats["glob_mean"], atol=1e-5)
        assert not torch.allclose(normalised, raw, atol=1e-2)
        # the embedding model is the input's (grad_ascent on the default scope may edit it: compare through it)
        assert torch.allclose(
            theirs.encode_batch(wavs, normalize=True) - theirs.encode_batch(wavs), normalised - raw, atol=1e-5
        )
    sf.write(tmp_path / "u.wav", wavs[0].numpy(), 16000, subtype="FLOAT")
    _, _, index, labels = mine.classify_file(str(tmp_path / "u.wav"))
    assert labels[0] in SPEAKERS
    again = SpeakerAdapter.load(out, device="cpu")  # and mmunlearn reads its own output with the module
    assert again.spec.extras == adapter.spec.extras
    restored = restore_folder(out, tmp_path / "restored")
    assert (restored / "mean_var_norm_emb.ckpt").read_bytes() == original
    assert (restored / "classifier.ckpt").is_file()


def test_a_carried_checkpoint_holding_code_is_refused(spkrec_dir, tmp_path):
    import shutil

    bad = shutil.copytree(spkrec_dir, tmp_path / "bad")
    torch.save({"count": 3, "glob_mean": torch.zeros(16), "hook": print}, bad / "mean_var_norm_emb.ckpt")
    with pytest.raises(ValueError, match="mean_var_norm_emb.ckpt: not a weights-only"):
        SpeakerAdapter.load(bad, device="cpu")


@pytest.mark.parametrize(
    "old, new, why",
    [
        (
            "    mean_var_norm_emb: !ref <mean_var_norm_emb>\n    classifier",
            "    extra: !ref <classifier>\n    classifier",
            "'extra' .* must be defined at the top level",
        ),
        (
            "mean_var_norm_emb: !new:speechbrain.processing.features.InputNormalization",
            "mean_var_norm_emb: !new:speechbrain.utils.parameter_transfer.Pretrainer",
            "Pretrainer is not allowed",
        ),
    ],
)
def test_a_carried_module_must_be_an_allowed_module_defined_by_name(spkrec_dir, tmp_path, old, new, why):
    import shutil

    bad = shutil.copytree(spkrec_dir, tmp_path / "bad")
    text = (bad / "hyperparams.yaml").read_text()
    assert old in text
    (bad / "hyperparams.yaml").write_text(text.replace(old, new, 1))
    with pytest.raises(ValueError, match=why):
        SpeakerAdapter.load(bad, device="cpu")
