"""Tests of the speaker-classifier adapter: shapes, layers, scores, SpeechBrain-layout I/O, erasure, training."""

import doctest

import pytest
import torch
from torch import nn

from mmunlearn.adapters.base import ModalityAdapter
from mmunlearn.adapters.speaker.adapter import SpeakerAdapter, block_of
from mmunlearn.adapters.speaker.model import PRESETS, SpeakerConfig
from mmunlearn.adapters.speaker.training import train_speaker_classifier, training_rows
from mmunlearn.erase import erase, restore
from mmunlearn.eval.speaker import accuracy
from tests.speech_corpus import one_thread, speaker_manifests  # noqa: F401  (fixtures)

SPEAKERS = ["id00001", "id00002", "id00003"]


@pytest.fixture(scope="module")
def adapter():
    return SpeakerAdapter.build(SPEAKERS, preset="tiny", device="cpu", seed=1)


def _examples(lengths=(8000, 6000, 7000), speakers=("id00002", "id00001", "id00003")):
    gen = torch.Generator().manual_seed(0)
    return [
        {"ID": f"u{i}", "wav": torch.randn(n, generator=gen) * 0.1, "spk_id": s}
        for i, (n, s) in enumerate(zip(lengths, speakers))
    ]


def test_doctests():
    import mmunlearn.adapters.speaker.batches
    import mmunlearn.adapters.speaker.cache

    for module in (
        mmunlearn.adapters.speaker.adapter,
        mmunlearn.adapters.speaker.batches,
        mmunlearn.adapters.speaker.cache,
    ):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_satisfies_the_protocol_and_seeds_its_init(adapter):
    assert isinstance(adapter, ModalityAdapter)
    same = SpeakerAdapter.build(SPEAKERS, preset="tiny", device="cpu", seed=1)
    other = SpeakerAdapter.build(SPEAKERS, preset="tiny", device="cpu", seed=2)
    w = adapter.model.classifier.weight
    assert torch.equal(w, same.model.classifier.weight) and not torch.equal(w, other.model.classifier.weight)
    assert SpeakerAdapter.build(5, preset="tiny", device="cpu").speakers == ["0", "1", "2", "3", "4"]


def test_layers_cover_every_conv_and_the_classifier_grouped_by_block(adapter):
    layers = list(adapter.layers())
    names = {lw.name for lw in layers}
    convs = {f"{m}.weight" for m, mod in adapter.model.named_modules() if isinstance(mod, (nn.Conv1d, nn.Linear))}
    assert convs and names == convs | {"classifier.weight"}
    for lw in layers:
        assert lw.weight is dict(adapter.model.named_parameters())[lw.name]
        assert lw.weight.dim() == (2 if lw.name == "classifier.weight" else 3)
    blocks = {lw.block for lw in layers}
    expected = {f"embedding_model.blocks.{i}" for i in range(4)} | {
        "embedding_model.mfa",
        "embedding_model.asp",
        "embedding_model.fc",
        "classifier",
    }
    assert blocks == expected
    assert "classifier.weight" not in {lw.name for lw in adapter.layers(include_classifier=False)}
    assert adapter.groups()["embedding_model.blocks.1.se_block.conv2.conv.weight"] == "embedding_model.blocks.1"
    assert block_of("embedding_model.fc.conv.weight") == "embedding_model.fc"


def test_collate_pads_and_labels(adapter):
    batch = adapter.collate(_examples())
    assert batch["wavs"].shape == (3, 8000)
    assert torch.allclose(batch["wav_lens"], torch.tensor([1.0, 0.75, 0.875]))
    assert batch["labels"].tolist() == [1, 0, 2]
    assert torch.all(batch["wavs"][1, 6000:] == 0)
    stranger = _examples(speakers=("id00002", "nobody", "id00003"))
    with pytest.raises(ValueError, match="'nobody' is not one of"):
        adapter.collate(stranger)
    assert adapter.collate(stranger, require_labels=False)["labels"].tolist() == [1, -100, 2]
    with pytest.raises(ValueError, match="empty"):
        adapter.collate([])


def test_scores_agree_with_each_other(adapter):
    batch = adapter.collate(_examples())
    with torch.no_grad():
        cos = adapter.cosine(batch)
        logits = adapter.logits(batch)
        lp, mask = adapter.logprobs(batch)
        dist = adapter.target_distributions(batch)
    assert cos.shape == (3, 3) and cos.abs().max() <= 1.0 + 1e-6
    assert torch.allclose(logits, adapter.scale * cos)
    expected = torch.log_softmax(logits, -1)[torch.arange(3), batch["labels"]]
    assert lp.shape == mask.shape == (3, 1) and mask.all()
    assert torch.allclose(lp.squeeze(1), expected)
    assert torch.allclose(adapter.sequence_logprob(batch).detach(), expected)
    assert torch.allclose(adapter.nll(batch).detach(), -expected)
    assert torch.allclose(dist.exp().sum(-1), torch.ones(3))
    assert torch.equal(adapter.predict(batch), cos.argmax(-1))
    # The training loss is the AAM softmax: with zero margin it is the mean NLL of the scaled cosines.
    no_margin = SpeakerAdapter(adapter.model, SPEAKERS, margin=0.0, scale=adapter.scale)
    assert torch.allclose(no_margin.loss(batch).detach(), -expected.mean(), atol=1e-5)
    assert adapter.loss(batch) > no_margin.loss(batch)  # the margin penalises the target class
    unknown = adapter.collate(_examples(speakers=("x", "id00001", "id00003")), require_labels=False)
    lp_u, mask_u = adapter.logprobs(unknown)
    assert mask_u.squeeze(1).tolist() == [False, True, True] and lp_u[0, 0] == 0
    with pytest.raises(ValueError, match="known speaker label"):
        adapter.loss(unknown)


def test_hidden_states(adapter):
    batch = adapter.collate(_examples())
    frames = adapter.hidden_states(batch, 0).shape[1]
    assert adapter.hidden_states(batch, 0).shape == (3, frames, 16)
    assert adapter.hidden_states(batch, -1).shape == (3, frames, 16)
    assert adapter.hidden_states(batch, "mfa").shape == (3, frames, 48)
    final = adapter.hidden_states(batch, "final")
    assert final.shape == (3, 1, 16) and torch.allclose(final.squeeze(1), adapter.embeddings(batch))
    with pytest.raises(ValueError, match="layer must be"):
        adapter.hidden_states(batch, 4)


def test_save_load_round_trip(adapter, tmp_path):
    out = adapter.save(tmp_path / "model")
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "classifier.ckpt",
        "embedding_model.ckpt",
        "hyperparams.yaml",
        "label_encoder.ckpt",
    ]
    assert "pretrained_path" not in (out / "hyperparams.yaml").read_text()  # nothing to go stale on a move
    loaded = SpeakerAdapter.load(out, device="cpu")
    batch = adapter.collate(_examples())
    with torch.no_grad():
        assert torch.equal(loaded.logits(batch), adapter.logits(batch))
    assert loaded.speakers == SPEAKERS and loaded.margin == adapter.margin and loaded.scale == adapter.scale
    with pytest.raises(FileExistsError):
        adapter.save(out)
    twin = adapter.clone()
    with torch.no_grad():
        twin.model.classifier.weight.mul_(-1)
        assert torch.equal(twin.logits(batch), -adapter.logits(batch))  # the original is untouched
    assert twin.audio_cache is adapter.audio_cache and twin.config == adapter.config
    moved = tmp_path / "moved"
    out.rename(moved)
    assert SpeakerAdapter.load(moved, device="cpu").speakers == SPEAKERS


def test_saved_directory_loads_in_speechbrain(adapter, tmp_path):
    import soundfile as sf
    from speechbrain.inference.speaker import EncoderClassifier

    out = adapter.save(tmp_path / "model")
    sb = EncoderClassifier.from_hparams(source=str(out), savedir=str(tmp_path / "sb"), run_opts={"device": "cpu"})
    wav, lens = torch.randn(2, 12000), torch.tensor([1.0, 0.8])
    batch = {"wavs": wav, "wav_lens": lens, "labels": torch.zeros(2, dtype=torch.long)}
    with torch.no_grad():
        mine = adapter.cosine(batch)
        for i, n in enumerate((12000, 9600)):  # SpeechBrain on each utterance alone = the adapter in any batch
            probs, _, index, labels = sb.classify_batch(wav[i : i + 1, :n])
            assert torch.allclose(probs[0], mine[i], atol=1e-5)
            assert labels == adapter.speaker_of(mine[i : i + 1].argmax(-1))
        # classify_file decodes a saved file itself and agrees too
        sf.write(tmp_path / "u.wav", wav[1, :9600].numpy(), 16000, subtype="FLOAT")
        probs, _, _, labels = sb.classify_file(str(tmp_path / "u.wav"))
        assert torch.allclose(probs[0], mine[1], atol=1e-5) and labels == adapter.speaker_of([int(mine[1].argmax())])
    # SpeechBrain's savedir (symlinks, label_encoder.ckpt) is itself a loadable directory.
    again = SpeakerAdapter.load(tmp_path / "sb", device="cpu")
    with torch.no_grad():
        assert torch.equal(again.cosine(batch), mine)


def test_an_utterance_scores_the_same_alone_and_in_any_batch(adapter):
    lengths = (8000, 2400, 12000, 5000, 2400)
    examples = _examples(lengths, ("id00002", "id00001", "id00003", "id00001", "id00002"))
    with torch.no_grad():
        alone = torch.cat([torch.softmax(adapter.logits(adapter.collate([ex])), -1) for ex in examples])
        together = torch.softmax(adapter.logits(adapter.collate(examples)), -1)
        backwards = torch.softmax(adapter.logits(adapter.collate(examples[::-1])), -1).flip(0)
        nll = adapter.nll(adapter.collate(examples))
        emb = adapter.embeddings(adapter.collate(examples[1:3]))
        # what the batch would give if the padding reached the network: SpeechBrain's padded forward
        batch = adapter.collate(examples)
        padded = torch.softmax(adapter.scale * adapter.model(batch["wavs"], batch["wav_lens"])[0], -1)
    assert (together - alone).abs().max() < 1e-3 and (backwards - alone).abs().max() < 1e-3
    assert torch.allclose(nll, -alone[torch.arange(5), adapter.collate(examples)["labels"]].log(), atol=1e-4)
    assert torch.allclose(emb[0], adapter.embeddings(adapter.collate([examples[1]]))[0], atol=1e-5)
    assert (padded - alone).abs().max() > 1e-3  # zero padding does change the scores of the short clips
    states = adapter.hidden_states(adapter.collate(examples[:2]), 1)  # frames past an utterance's end are 0
    assert states.shape[1] == 8000 // 160 + 1 and states[1, 2400 // 160 + 1 :].abs().sum() == 0
    assert torch.allclose(states[1, : 2400 // 160 + 1], adapter.hidden_states(adapter.collate([examples[1]]), 1)[0])


def test_training_mode_fills_padding_with_the_utterance(adapter):
    from mmunlearn.adapters.speaker.adapter import repeat_pad

    twin = adapter.clone()
    twin.model.train()
    short = {"ID": "s", "wav": torch.randn(3000), "spk_id": "id00001"}
    long = {"ID": "l", "wav": torch.randn(7000), "spk_id": "id00002"}
    padded = twin.collate([short, long])
    tiled = {
        "wavs": repeat_pad(padded["wavs"], padded["wav_lens"]),
        "wav_lens": torch.ones(2),
        "labels": padded["labels"],
    }
    assert torch.equal(tiled["wavs"][0, 3000:6000], short["wav"])
    torch.manual_seed(0)
    a = twin.loss(padded)
    torch.manual_seed(0)
    b = twin.loss(tiled)
    assert torch.allclose(a, b)  # the zero-padded batch trains exactly as the tiled one


SB_YAML = """# like speechbrain/spkrec-ecapa-voxceleb's, scaled down
pretrained_path: speechbrain/spkrec-ecapa-voxceleb
n_mels: 24
out_n_neurons: 3
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
    lin_neurons: 16
classifier: !new:speechbrain.lobes.models.ECAPA_TDNN.Classifier
    input_size: 16
    out_neurons: !ref <out_n_neurons>
mean_var_norm_emb: !new:speechbrain.processing.features.InputNormalization
    norm_type: global
    std_norm: False
modules:
    compute_features: !ref <compute_features>
    mean_var_norm: !ref <mean_var_norm>
    embedding_model: !ref <embedding_model>
    mean_var_norm_emb: !ref <mean_var_norm_emb>
    classifier: !ref <classifier>
label_encoder: !new:speechbrain.dataio.encoder.CategoricalEncoder
pretrainer: !new:speechbrain.utils.parameter_transfer.Pretrainer
    loadables:
        embedding_model: !ref <embedding_model>
        mean_var_norm_emb: !ref <mean_var_norm_emb>
        classifier: !ref <classifier>
        label_encoder: !ref <label_encoder>
    paths:
        embedding_model: !ref <pretrained_path>/embedding_model.ckpt
        mean_var_norm_emb: !ref <pretrained_path>/mean_var_norm_emb.ckpt
        classifier: !ref <pretrained_path>/classifier.ckpt
        label_encoder: !ref <pretrained_path>/label_encoder.txt
"""


@pytest.mark.parametrize("label_file", ["label_encoder.txt", "label_encoder.ckpt"])
def test_loads_a_speechbrain_pretrained_directory(tmp_path, label_file):
    from speechbrain.lobes.features import Fbank
    from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN, Classifier
    from speechbrain.processing.features import InputNormalization

    torch.manual_seed(3)
    ecapa = ECAPA_TDNN(
        24, lin_neurons=16, channels=[16, 16, 16, 16, 48], attention_channels=8, se_channels=8, res2net_scale=4
    ).eval()
    head = Classifier(input_size=16, out_neurons=3)
    (tmp_path / "hyperparams.yaml").write_text(SB_YAML)
    torch.save(ecapa.state_dict(), tmp_path / "embedding_model.ckpt")
    torch.save(head.state_dict(), tmp_path / "classifier.ckpt")
    (tmp_path / label_file).write_text(
        "'id10003' => 2\n'id10001' => 0\n'id10002' => 1\n================\n'starting_index' => 0\n"
    )
    loaded = SpeakerAdapter.load(tmp_path, device="cpu")
    assert loaded.speakers == ["id10001", "id10002", "id10003"]
    assert (loaded.margin, loaded.scale) == (0.2, 30.0)  # SpeechBrain's recipe defaults when the yaml has none
    wav = torch.randn(2, 12000)
    lens = torch.tensor([1.0, 0.8])
    with torch.no_grad():  # SpeechBrain's EncoderClassifier.classify_batch, step by step, on each utterance alone
        expected = []
        for i, n in enumerate((12000, 9600)):
            one = torch.ones(1)
            feats = InputNormalization(norm_type="sentence", std_norm=False)(Fbank(n_mels=24)(wav[i : i + 1, :n]), one)
            expected.append(head(ecapa(feats, one)).squeeze(1))
        expected = torch.cat(expected)
        got = loaded.cosine({"wavs": wav, "wav_lens": lens, "labels": torch.zeros(2, dtype=torch.long)})
    assert torch.allclose(got, expected, atol=1e-6)


def test_load_rejects_broken_directories(adapter, tmp_path):
    with pytest.raises(FileNotFoundError, match="no hyperparams.yaml"):
        SpeakerAdapter.load(tmp_path, device="cpu")
    out = adapter.save(tmp_path / "m")
    (out / "label_encoder.ckpt").write_text("'a' => 0\n'b' => 5\n================\n'starting_index' => 0\n")
    with pytest.raises(ValueError, match="indices"):
        SpeakerAdapter.load(out, device="cpu")
    (out / "label_encoder.ckpt").unlink()
    with pytest.raises(FileNotFoundError, match="label_encoder"):
        SpeakerAdapter.load(out, device="cpu")
    big = SpeakerAdapter.build(SPEAKERS, preset="tiny", device="cpu", lin_neurons=8).save(tmp_path / "big")
    (big / "hyperparams.yaml").write_text((out / "hyperparams.yaml").read_text())
    with pytest.raises(ValueError, match="does not fit"):
        SpeakerAdapter.load(big, device="cpu")


def test_config_validation():
    with pytest.raises(ValueError, match="preset"):
        SpeakerAdapter.build(3, preset="huge")
    with pytest.raises(ValueError, match="divisible"):
        SpeakerConfig(3, channels=[8, 10, 10, 10, 30], res2net_scale=4)
    with pytest.raises(ValueError, match="margin"):
        SpeakerConfig(3, margin=1.5)
    assert set(PRESETS) >= {"tiny", "small", "base", "large"}


def test_erase_and_restore_on_conv_kernels(adapter):
    model = SpeakerAdapter.build(SPEAKERS, preset="tiny", device="cpu", seed=4).model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    names = [
        "embedding_model.blocks.0.conv.conv.weight",
        "embedding_model.blocks.2.tdnn1.conv.conv.weight",
        "embedding_model.mfa.conv.conv.weight",
    ]
    params = dict(model.named_parameters())
    gen = torch.Generator().manual_seed(0)
    forget = {n: torch.randn(params[n].shape, generator=gen) for n in names}
    report = erase(model, forget, rank=2, localize=False, groups=adapter.groups())
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert sorted(changed) == sorted(names)
    for n in names:  # the update is rank <= 2 in the out x in*k view
        delta = (params[n].detach() - before[n]).reshape(params[n].shape[0], -1)
        assert torch.linalg.matrix_rank(delta.double(), atol=1e-5) <= 2
    restore(model, report)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_short_training_lowers_the_loss_and_beats_chance(speaker_manifests):
    rows, speakers = training_rows(speaker_manifests)
    kwargs = dict(
        speakers=speakers, preset="tiny", crop_seconds=1.0, batch_size=8, lr=1e-2, device="cpu", progress=False, seed=0
    )
    adapter, result = train_speaker_classifier(rows, epochs=15, **kwargs)
    assert result.steps == 30
    assert sum(result.losses[-5:]) / 5 < 0.7 * sum(result.losses[:5]) / 5
    assert accuracy(adapter, rows, desc=None) > 2.0 / len(speakers)
    again, _ = train_speaker_classifier(rows, steps=2, **kwargs)
    twice, _ = train_speaker_classifier(rows, steps=2, **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(again.model.state_dict().values(), twice.model.state_dict().values()))


def test_training_never_makes_a_batch_of_one():
    gen = torch.Generator().manual_seed(0)
    rows = [{"ID": f"u{k}", "spk_id": "ab"[k % 2], "wav": torch.randn(4000, generator=gen)} for k in range(3)]
    adapter, result = train_speaker_classifier(
        rows, preset="tiny", crop_seconds=None, batch_size=2, epochs=1, device="cpu", progress=False
    )
    assert adapter.speakers == ["a", "b"] and result.steps == 2  # 3 rows + 1 repeated: two batches of two
    with pytest.raises(ValueError, match="not in the label space"):
        train_speaker_classifier(rows, speakers=["a"], preset="tiny", steps=1, device="cpu", progress=False)


def test_scope_limits_the_layers_erasure_sees(adapter):
    twin = adapter.clone()
    every = [lw.name for lw in twin.layers()]
    twin.scope = "head"
    assert [lw.name for lw in twin.layers()] == ["classifier.weight"] and twin.clone().scope == "head"
    twin.scope = "embedding"
    assert [lw.name for lw in twin.layers()] == [n for n in every if n != "classifier.weight"]
    assert adapter.scope == "all" and len(list(adapter.layers())) == len(every)
    with pytest.raises(ValueError, match="scope"):
        twin.scope = "classifier"


def test_head_scope_reuses_embeddings_only_while_the_embedding_model_is_unchanged(adapter):
    examples = _examples((8000, 2400, 12000, 2400), ("id00002", "id00001", "id00003", "id00002"))
    batch = adapter.collate(examples)
    plain = adapter.clone()  # scope all: no cache
    twin = adapter.clone()
    twin.scope = "head"
    cache = twin.embedding_cache
    assert plain.embedding_cache is None and cache is not None
    with torch.no_grad():
        first, emb0 = twin.cosine(batch), plain.embeddings(batch)
        assert cache.misses == 4 and cache.hits == 0
        again = twin.cosine(adapter.collate(examples[::-1])).flip(0)  # another batch of the same utterances
        assert cache.hits == 4 and torch.allclose(again, first, atol=1e-6)
        assert torch.allclose(first, plain.cosine(batch), atol=1e-6)
        # a head edit: embeddings served from the cache, scores those of the edited model computed afresh
        twin.model.classifier.weight.mul_(-1.0)
        plain.model.classifier.weight.mul_(-1.0)
        assert torch.allclose(twin.cosine(batch), plain.cosine(batch), atol=1e-6) and cache.misses == 4
        # an embedding edit (even one in place, of one weight): never a stale embedding
        conv = next(m for m in twin.model.embedding_model.modules() if isinstance(m, nn.Conv1d))
        conv.weight.add_(0.05)
        next(m for m in plain.model.embedding_model.modules() if isinstance(m, nn.Conv1d)).weight.add_(0.05)
        edited = twin.embeddings(batch)
        assert cache.misses == 8 and torch.allclose(edited, plain.embeddings(batch), atol=1e-6)
        assert (edited - emb0).abs().max() > 1e-3  # the edit did move the embeddings
    # under autograd the embedding model is run (a gradient may be wanted through it)
    twin.embeddings(batch).sum().backward()
    assert conv.weight.grad is not None and cache.misses == 8
    # ... unless only the head wants one (a head-scope gradient extraction): the same head gradient, cached
    for m in (twin.model, plain.model):
        for name, p in m.named_parameters():
            p.grad = None
            p.requires_grad_(name.startswith("classifier."))
    hits = cache.hits
    twin.loss(batch).backward()
    plain.loss(batch).backward()
    assert cache.hits == hits + 4 and cache.misses == 8
    assert torch.allclose(twin.model.classifier.weight.grad, plain.model.classifier.weight.grad, atol=1e-6)
    for p in twin.model.parameters():
        p.requires_grad_(True)
    twin.scope = "all"
    assert twin.embedding_cache is None
