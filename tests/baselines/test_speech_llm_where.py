"""The training baselines keep to a speech LLM's ``where`` tower, as erasure does: with where=audio the language model
comes out bit for bit as it went in, with where=text the audio tower does."""

from __future__ import annotations

import pytest
import torch

from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter
from mmunlearn.adapters.speech_llm.families import tower_block, tower_of
from mmunlearn.baselines.base import BaselineConfig
from mmunlearn.baselines.runner import unlearn
from mmunlearn.data.utterances import split_rows
from mmunlearn.speech.spoken_qa import spoken_qa
from tests.speech_corpus import llm_dir, one_thread, speaker_manifests  # noqa: F401  (fixtures)


@pytest.mark.parametrize("where", ["audio", "text"])
def test_a_baseline_trains_the_chosen_tower_only(llm_dir, speaker_manifests, where):
    adapter = SpeechLLMAdapter.load(llm_dir, device="cpu", where=where)
    before = {n: p.detach().clone() for n, p in adapter.model.named_parameters()}
    forget = spoken_qa(split_rows(speaker_manifests, "spk_forget_train")[:4], ("speaker",))
    retain = spoken_qa(split_rows(speaker_manifests, "spk_retain_train")[:4], ("speaker",))
    unlearn(adapter, "grad_diff", forget, retain, BaselineConfig(epochs=1, batch_size=2, lr=1e-2), progress=False)
    changed = {n for n, p in adapter.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    towers = {tower_of(tower_block(n)) for n in changed if tower_block(n) is not None}
    assert changed and towers == {where}
    assert all(tower_block(n) is not None for n in changed)  # nothing outside the two towers either


def test_both_leaves_every_parameter_to_the_method(llm_dir):
    assert SpeechLLMAdapter.load(llm_dir, device="cpu", where="both").trainable_parameters() is None
    audio = SpeechLLMAdapter.load(llm_dir, device="cpu", where="audio").trainable_parameters()
    assert audio and all(p.requires_grad for p in audio)
