"""Check a Whisper converted from CTranslate2 against CTranslate2 itself running the original file, on real clips.

Both models get the same log-mel features (the converted folder's ``WhisperFeatureExtractor``), so what is compared
is the weights and the network, not the feature code. Measured per clip: the encoder's output (max absolute
difference against the largest reference value) and the greedy transcript (prompt ``<|startoftranscript|>
<|notimestamps|>``, the generation config's token suppression on the Hugging Face side and the CTranslate2 config's
on the other). The conversion agrees when every encoder difference lies within float16 rounding (half a float16
step at the largest output: the shipped weights are float16, so no closer agreement is owed) and at least 95 % of
the transcripts are equal. A transcript that names the clip's digit (FSDD: ``{digit}_{speaker}_{take}.wav``)
counts as correct, a figure about Whisper itself rather than the conversion.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from mmunlearn.data.audio import DEFAULT_SR, read_audio
from mmunlearn.report import machine_facts

#: Half a float16 step relative to the value: 2**-11 (float16 keeps 10 fraction bits).
FP16_HALF_STEP = 2.0**-11
TRANSCRIPT_GOAL = 0.95
PROMPT = ("<|startoftranscript|>", "<|notimestamps|>")
DIGIT_WORDS = {
    0: ("zero", "oh", "o"),
    1: ("one",),
    2: ("two", "to", "too"),
    3: ("three",),
    4: ("four", "for"),
    5: ("five",),
    6: ("six",),
    7: ("seven",),
    8: ("eight",),
    9: ("nine",),
}


def fsdd_clips(root: str | os.PathLike, n: int) -> list[Path]:
    """``n`` FSDD recordings spread evenly over the sorted file list (every digit and speaker when ``n`` >= 60)."""
    files = sorted(Path(root, "recordings").glob("*.wav"))
    if n < 1 or n > len(files):
        raise ValueError(f"asked for {n} clips, {Path(root, 'recordings')} holds {len(files)}")
    # sorted names are digit-major, then speaker: 100 of FSDD's 3,000 give 10 per digit over all 6 speakers
    return [files[(i * len(files)) // n] for i in range(n)]


def names_digit(text: str, digit: int) -> bool:
    """Whether a transcript says ``digit`` (as a numeral or an English word)."""
    words = re.findall(r"[a-z]+|\d+", text.lower())
    return str(digit) in words or any(w in words for w in DIGIT_WORDS[digit])


def _digit_of(clip: Path) -> int | None:
    head = clip.name.split("_", 1)[0]
    return int(head) if head.isdigit() and len(head) == 1 else None


def _batch_outputs(hf, processor, ct2, wavs: list[np.ndarray], max_new_tokens: int):
    """Encoder outputs and token ids of both models for one batch of waveforms."""
    import ctranslate2  # deferred: optional, only this check needs it

    features = processor.feature_extractor(wavs, sampling_rate=DEFAULT_SR, return_tensors="np").input_features
    features = np.ascontiguousarray(features, dtype=np.float32)
    with torch.no_grad():
        encoded = hf.model.encoder(torch.from_numpy(features))  # encoded once: generate starts from it
        hf_ids = hf.generate(encoder_outputs=encoded, max_new_tokens=max_new_tokens).tolist()
    hf_encoded = encoded.last_hidden_state.numpy()
    ct2_encoded = ct2.encode(ctranslate2.StorageView.from_array(features), to_cpu=True)
    results = ct2.generate(
        ct2_encoded, [list(PROMPT)] * len(wavs), beam_size=1, max_length=len(PROMPT) + max_new_tokens
    )  # CTranslate2 counts the prompt
    return hf_encoded, np.asarray(ct2_encoded), hf_ids, [r.sequences_ids[0] for r in results]


def compare_with_ctranslate2(
    hf_dir: str | os.PathLike,
    ct2_dir: str | os.PathLike,
    clips: Sequence[Path],
    *,
    batch: int = 10,
    max_new_tokens: int = 48,
    threads: int = 1,
) -> dict:
    """Encoder and transcript agreement of the folder ``hf_dir`` with CTranslate2 on ``ct2_dir``, over ``clips``."""
    import ctranslate2  # deferred: optional, only this check needs it
    import transformers  # deferred: heavy
    from transformers import WhisperForConditionalGeneration, WhisperProcessor  # deferred: heavy

    if not clips or batch < 1 or max_new_tokens < 1:
        raise ValueError("need at least one clip, batch >= 1 and max_new_tokens >= 1")
    torch.set_num_threads(threads)
    processor = WhisperProcessor.from_pretrained(str(hf_dir))
    hf = WhisperForConditionalGeneration.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    ct2 = ctranslate2.models.Whisper(str(ct2_dir), device="cpu", compute_type="float32", intra_threads=threads)
    start, per_clip = time.perf_counter(), []
    for i in range(0, len(clips), batch):
        chunk = list(clips[i : i + batch])
        hf_enc, ct2_enc, hf_ids, ct2_ids = _batch_outputs(
            hf, processor, ct2, [read_audio(c) for c in chunk], max_new_tokens
        )
        for j, clip in enumerate(chunk):
            hf_text = processor.tokenizer.decode(hf_ids[j], skip_special_tokens=True).strip()
            ct2_text = processor.tokenizer.decode(ct2_ids[j], skip_special_tokens=True).strip()
            digit = _digit_of(clip)
            per_clip.append(
                {
                    "clip": clip.name,
                    "encoder_max_abs_diff": float(np.abs(hf_enc[j] - ct2_enc[j]).max()),
                    "encoder_max_abs": float(np.abs(ct2_enc[j]).max()),
                    "hf": hf_text,
                    "ct2": ct2_text,
                    "equal": hf_text == ct2_text,
                    "hf_digit": None if digit is None else names_digit(hf_text, digit),
                    "ct2_digit": None if digit is None else names_digit(ct2_text, digit),
                }
            )
    result = summarise(per_clip, seconds=time.perf_counter() - start, threads=threads, max_new_tokens=max_new_tokens)
    result["context"]["versions"] = {"ctranslate2": ctranslate2.__version__, "transformers": transformers.__version__}
    return result


def summarise(per_clip: list[dict], *, seconds: float, threads: int, max_new_tokens: int) -> dict:
    """The run's JSON: one summary row (the record's table), the checks, and every clip's figures as context."""
    diffs = np.array([c["encoder_max_abs_diff"] for c in per_clip])
    scales = np.array([c["encoder_max_abs"] for c in per_clip])
    ratio = float((diffs / scales).max())
    equal = sum(c["equal"] for c in per_clip) / len(per_clip)
    scored = [c for c in per_clip if c["hf_digit"] is not None]
    row = {
        "clips": len(per_clip),
        "encoder_max_abs_diff": float(diffs.max()),
        "encoder_diff_over_max_abs": ratio,
        "fp16_half_step": FP16_HALF_STEP,
        "transcripts_equal": equal,
        "hf_digit_correct": sum(c["hf_digit"] for c in scored) / len(scored) if scored else None,
        "ct2_digit_correct": sum(c["ct2_digit"] for c in scored) / len(scored) if scored else None,
        "passed": bool(ratio <= FP16_HALF_STEP and equal >= TRANSCRIPT_GOAL),
    }
    checks = [
        {
            "name": "encoder outputs within float16 rounding (max |diff| <= 2^-11 x max |output|, every clip)",
            "passed": bool(ratio <= FP16_HALF_STEP),
            "measured": f"{ratio:.2e} of max |output|",
        },
        {
            "name": f"greedy transcripts equal on >= {TRANSCRIPT_GOAL:.0%} of clips",
            "passed": equal >= TRANSCRIPT_GOAL,
            "measured": f"{sum(c['equal'] for c in per_clip)}/{len(per_clip)}",
        },
    ]
    columns = [
        ["clips", "clips"],
        ["encoder max abs diff", "encoder_max_abs_diff"],
        ["diff / max abs output", "encoder_diff_over_max_abs"],
        ["float16 half step", "fp16_half_step"],
        ["transcripts equal", "transcripts_equal"],
        ["digit named (converted)", "hf_digit_correct"],
        ["digit named (CTranslate2)", "ct2_digit_correct"],
        ["passed", "passed"],
    ]
    return {
        "rows": [row],
        "columns": columns,
        "checks": checks,
        "machine": machine_facts(),
        "context": {
            "seconds": round(seconds, 1),
            "threads": threads,
            "max_new_tokens": max_new_tokens,
            "prompt": list(PROMPT),
            "clips": per_clip,
        },
    }
