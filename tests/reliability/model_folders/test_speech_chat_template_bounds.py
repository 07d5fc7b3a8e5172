"""Issue 33, low items: a speech LLM folder's chat template is rendered within the same bounds as a text LLM's: a
template that would write gigabytes is one error naming the tokenizer, within seconds."""

import time

import pytest

from mmunlearn.errors import USER_ERRORS, one_line
from tests.speech_corpus import llm_dir, one_thread, speaker_manifests  # noqa: F401  (fixtures)


def test_a_speech_llm_chat_template_bomb_is_one_error(llm_dir):
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter

    adapter = SpeechLLMAdapter.load(llm_dir, device="cpu")
    assert adapter._prompt_ids("Who is speaking?")  # the folder's own template renders (the control)
    adapter.chat_template = "{{ 'x' * 10000000000 }}"
    adapter._prompts.clear()
    start = time.perf_counter()
    with pytest.raises(USER_ERRORS) as err:
        adapter._prompt_ids("Who is speaking?")
    assert "chat template" in one_line(err.value) and time.perf_counter() - start < 20
