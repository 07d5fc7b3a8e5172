"""Byte-level BPE tokenizers trained on the data, for presets built from configs.

Byte-level BPE encodes every script (Arabic, Hindi, Japanese, Korean, ...) without unknown
tokens, so the same builder serves TOFU and cross-lingual TOFU.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIALS = ["<pad>", "<s>", "</s>"]


def train_bpe(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2):
    """Train a byte-level BPE on ``texts``; returns a ``PreTrainedTokenizerFast``.

    Special tokens: ``<pad>`` (id 0), ``<s>`` (BOS, id 1, prepended by the post-processor),
    ``</s>`` (EOS, id 2). ``vocab_size`` includes the 256 byte symbols and the specials.
    """
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIALS):
        raise ValueError(f"vocab_size must be at least {256 + len(SPECIALS)} for byte-level BPE, got {vocab_size}")
    texts = list(texts)
    if not texts:
        raise ValueError("cannot train a tokenizer on no text")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
