"""Speaker-classifier folders from strangers: hyperparams.yaml is parsed as data (nothing it names runs), pickled
checkpoints are refused, and saved folders carry a generated hyperparams.yaml that SpeechBrain loads after a move."""

import os
import shutil

import pytest
import torch

from mmunlearn.adapters.speaker.adapter import SpeakerAdapter
from mmunlearn.adapters.speaker.io import (
    HPARAMS,
    check_hparams_tags,
    parse_hparams,
    read_speaker_dir,
    spec_from_hparams,
)
from mmunlearn.adapters.speaker.model import SpeakerConfig
from mmunlearn.adapters.speaker.write_hparams import hparams_yaml
from tests.reliability.untrusted import digest_tree

SPEAKERS = ["id00001", "id00002", "id00003"]


@pytest.fixture(scope="module")
def adapter():
    return SpeakerAdapter.build(SPEAKERS, preset="tiny", device="cpu", seed=1)


@pytest.fixture
def model_dir(adapter, tmp_path):
    return adapter.save(tmp_path / "model")


def _batch():
    gen = torch.Generator().manual_seed(5)
    wavs = 0.1 * torch.randn(2, 12000, generator=gen)
    return {"wavs": wavs, "wav_lens": torch.tensor([1.0, 0.75]), "labels": torch.zeros(2, dtype=torch.long)}


# Each payload would create the marker file if HyperPyYAML (or PyYAML's unsafe loader) instantiated it.
PAYLOADS = {
    "apply os.system": 'pwn: !apply:os.system ["touch {marker}"]\n',
    "new of a class outside the allow-list": 'pwn: !new:subprocess.Popen [["touch", "{marker}"]]\n',
    "name of eval": "pwn: !name:builtins.eval\n",
    "module": "pwn: !module:os\n",
    "applyref": 'pwn: !applyref:os.system ["touch {marker}"]\n',
    "python/object/apply": 'pwn: !!python/object/apply:os.system ["touch {marker}"]\n',
    "include": "pwn: !include:{marker}.yaml\n",
}


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_unknown_tags_are_refused_before_anything_runs(model_dir, tmp_path, name):
    marker = tmp_path / "MARKER"
    payload = PAYLOADS[name].format(marker=marker)
    yaml_file = model_dir / HPARAMS
    yaml_file.write_text(yaml_file.read_text() + payload)
    before = digest_tree(tmp_path)
    with pytest.raises(ValueError) as err:
        SpeakerAdapter.load(model_dir, device="cpu")
    message = str(err.value)
    assert str(yaml_file) in message and "key 'pwn'" in message and "refused" in message
    tag = payload.split()[1].replace("!!python/", "tag:yaml.org,2002:python/")
    assert tag in message and "trust_hparams=True" in message
    assert not marker.exists()
    assert digest_tree(tmp_path) == before  # the folder is byte-identical and nothing was written anywhere


def test_a_payload_inside_a_module_argument_is_refused(model_dir, tmp_path):
    marker = tmp_path / "MARKER"
    yaml_file = model_dir / HPARAMS
    text = yaml_file.read_text().replace("    out_neurons: 3", f'    out_neurons: !apply:os.system ["touch {marker}"]')
    yaml_file.write_text(text)
    with pytest.raises(ValueError, match=r"key 'classifier\[out_neurons\]' \(line \d+\) uses !apply:os.system"):
        read_speaker_dir(model_dir)
    # a tuple string: HyperPyYAML would hand its contents to PyYAML's unsafe loader
    yaml_file.write_text(
        text.replace(f'!apply:os.system ["touch {marker}"]', f'(3, !!python/object/apply:os.system ["touch {marker}"])')
    )
    with pytest.raises(ValueError, match="hyperparams.yaml"):
        read_speaker_dir(model_dir)
    assert not marker.exists()


def test_trust_hparams_runs_the_file_and_the_output_is_generated(model_dir, tmp_path):
    marker = tmp_path / "MARKER"
    yaml_file = model_dir / HPARAMS
    yaml_file.write_text(yaml_file.read_text() + f'pwn: !apply:os.system ["touch {marker}"]\n')
    trusted = SpeakerAdapter.load(model_dir, device="cpu", trust_hparams=True)
    assert marker.exists()  # the escape hatch does what it says: it runs the code the file names
    marker.unlink()
    out = trusted.save(tmp_path / "resaved")
    text = (out / HPARAMS).read_text()
    assert "os.system" not in text and "pwn" not in text and text == hparams_yaml(trusted.spec)
    again = SpeakerAdapter.load(out, device="cpu")  # the output is safe to load: nothing runs again
    assert not marker.exists()
    with torch.no_grad():
        assert torch.equal(again.logits(_batch()), trusted.logits(_batch()))


def _evil_pickle(path, marker):
    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))  # unpickling creates the marker

    torch.save({"weight": torch.zeros(1), "evil": Evil()}, path)


@pytest.mark.parametrize("ckpt", ["embedding_model.ckpt", "classifier.ckpt"])
def test_a_pickled_payload_in_a_checkpoint_is_refused(model_dir, tmp_path, ckpt):
    marker = tmp_path / "MARKER"
    _evil_pickle(model_dir / ckpt, marker)
    proof = tmp_path / "proof.ckpt"
    _evil_pickle(proof, tmp_path / "PROOF")
    torch.load(proof, weights_only=False)  # unpickled the unsafe way, the payload does run ...
    assert (tmp_path / "PROOF").exists()
    proof.unlink()
    (tmp_path / "PROOF").unlink()
    before = digest_tree(tmp_path)
    with pytest.raises(ValueError, match=rf"{model_dir / ckpt}: not a weights-only PyTorch checkpoint, refused"):
        SpeakerAdapter.load(model_dir, device="cpu")  # ... loading the folder never does
    assert not marker.exists()
    assert digest_tree(tmp_path) == before


def test_a_saved_folder_loads_in_speechbrain_after_a_move(adapter, tmp_path):
    from speechbrain.inference.speaker import EncoderClassifier

    out = adapter.save(tmp_path / "build" / "model.tmp")
    assert str(tmp_path) not in (out / HPARAMS).read_text()  # no absolute path to go stale
    final = tmp_path / "elsewhere" / "final"
    final.parent.mkdir()
    os.replace(out, final)  # as the recipe's cache does: write beside, then rename
    shutil.rmtree(tmp_path / "build")
    sb = EncoderClassifier.from_hparams(source=str(final), savedir=str(tmp_path / "sb"), run_opts={"device": "cpu"})
    batch = _batch()
    with torch.no_grad():
        # SpeechBrain reads a padded batch's padding (see speaker_batches.by_length); each utterance alone, cut to
        # its own length, is what the adapter scores whatever batch it sits in.
        n = [round(float(r) * batch["wavs"].shape[1]) for r in batch["wav_lens"]]
        alone = [sb.classify_batch(batch["wavs"][i : i + 1, : n[i]], torch.ones(1)) for i in range(len(n))]
        probs = torch.cat([a[0] for a in alone])
        labels = [label for a in alone for label in a[3]]
        mine = adapter.cosine(batch)
        loaded = SpeakerAdapter.load(final, device="cpu").cosine(batch)
    assert torch.allclose(probs, mine, atol=1e-6) and torch.equal(loaded, mine)
    assert labels == adapter.speaker_of(mine.argmax(-1))


HUB_LIKE = """# SECRET-COMMENT: a hub-style file, with keys the adapter does not use
pretrained_path: speechbrain/spkrec-ecapa-voxceleb
n_mels: 24
half: 8
extra_key: !new:speechbrain.dataio.encoder.CategoricalEncoder
compute_features: !new:speechbrain.lobes.features.Fbank
    n_mels: !ref <n_mels>
mean_var_norm: !new:speechbrain.processing.features.InputNormalization
    norm_type: sentence
    std_norm: False
embedding_model: !new:speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN
    input_size: !ref <n_mels>
    channels: [16, 16, 16, 16, 48]
    kernel_sizes: [5, 3, 3, 3, 1]
    dilations: [1, 2, 3, 4, 1]
    attention_channels: 8
    se_channels: 8
    res2net_scale: 4
    lin_neurons: !ref <half> * 2
    activation: !name:torch.nn.ReLU
classifier: !new:speechbrain.lobes.models.ECAPA_TDNN.Classifier
    input_size: !ref <embedding_model[lin_neurons]>
    out_neurons: 3
mean_var_norm_emb: !new:speechbrain.processing.features.InputNormalization
    norm_type: global
    std_norm: False
label_encoder: !new:speechbrain.dataio.encoder.CategoricalEncoder
pretrainer: !new:speechbrain.utils.parameter_transfer.Pretrainer
    loadables:
        embedding_model: !ref <embedding_model>
        classifier: !ref <classifier>
        label_encoder: !ref <label_encoder>
    paths:
        embedding_model: !ref <pretrained_path>/embedding_model.ckpt
        classifier: !ref <pretrained_path>/classifier.ckpt
        label_encoder: !ref <pretrained_path>/label_encoder.txt
"""


def test_output_yaml_is_generated_not_copied(adapter, tmp_path):
    src = tmp_path / "hub"
    shutil.copytree(adapter.save(tmp_path / "m"), src)
    (src / HPARAMS).write_text(HUB_LIKE)
    loaded = SpeakerAdapter.load(src, device="cpu")
    out = loaded.save(tmp_path / "out")
    text = (out / HPARAMS).read_text()
    assert "SECRET" not in text and "extra_key" not in text and "pretrained_path" not in text
    assert "activation: !name:torch.nn.ReLU" in text and "lin_neurons: 16" in text
    resaved = SpeakerAdapter.load(out, device="cpu")
    assert resaved.save(tmp_path / "again").joinpath(HPARAMS).read_text() == text  # a fixed point
    with torch.no_grad():
        assert torch.equal(resaved.logits(_batch()), adapter.logits(_batch()))


def test_huge_modules_are_refused_without_allocating_them(model_dir):
    yaml_file = model_dir / HPARAMS
    original = yaml_file.read_text()
    yaml_file.write_text(
        original.replace("channels: [16, 16, 16, 16, 48]", "channels: [60000, 60000, 60000, 60000, 60000]")
    )
    with pytest.raises(
        ValueError,
        match=rf"{model_dir / 'embedding_model.ckpt'} does not fit the modules "
        rf"{model_dir / HPARAMS} describes",
    ):
        read_speaker_dir(model_dir)  # on the meta device: seconds, not 10^10 floats
    yaml_file.write_text(
        original.replace("channels: [16, 16, 16, 16, 48]", "channels: [4000000, 4000000, 4000000, 4000000, 12000000]")
    )
    with pytest.raises(
        ValueError,
        match=rf"{model_dir / HPARAMS}: embedding_model\[channels\]\[0\]: 4000000 is "
        r"refused: expected a whole number in 1\.\.65536",
    ):
        read_speaker_dir(model_dir)  # out of range: refused before even the meta device


def test_references_arithmetic_and_aliases():
    tree = parse_hparams(HUB_LIKE)
    check_hparams_tags(tree)
    spec = spec_from_hparams(tree)
    assert spec.embedding_model.kwargs["lin_neurons"] == 16 and spec.classifier.kwargs["input_size"] == 16
    assert spec == spec_from_hparams(parse_hparams(hparams_yaml(spec)))
    assert (
        spec_from_hparams(parse_hparams(hparams_yaml(SpeakerConfig.from_preset(3, "tiny"))))
        == SpeakerConfig.from_preset(3, "tiny").spec()
    )
    with pytest.raises(ValueError, match="circular reference"):
        spec_from_hparams(parse_hparams(HUB_LIKE.replace("n_mels: 24", "n_mels: !ref <n_mels>")))
    with pytest.raises(ValueError, match="attribute references"):
        spec_from_hparams(parse_hparams(HUB_LIKE.replace("out_neurons: 3", "out_neurons: !ref <n_mels.real>")))
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(  # 10^8 values once expanded
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefg", "bcdefgh")
    )
    with pytest.raises(ValueError, match="more than 100000 values"):
        check_hparams_tags(parse_hparams(bomb))
    refs = HUB_LIKE.replace(
        "half: 8",
        "half: 8\nr0: [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
        + "".join(f"r{i + 1}: [{', '.join([f'!ref <r{i}>'] * 10)}]\n" for i in range(7)),
    )
    with pytest.raises(ValueError, match="more than 100000 values after resolving references"):
        spec_from_hparams(parse_hparams(refs.replace("dilations: [1, 2, 3, 4, 1]", "dilations: !ref <r7>")))
