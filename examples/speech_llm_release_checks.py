"""What a speech-LLM forgetting run hands over, checked with plain tools: every method's output folder loaded by plain
transformers and asked "Who is speaking?" through its own processor (T3's folder: its frozen base checked instead,
since it answers through its tilt head), the edited parameters named by tower and block
(output against the original, tensor by tensor, bit by bit), and the undo patch restoring the original bit for bit
(byte digests: -0.0 and 0.0 differ here, as they do in a checkpoint's file).

Read top to bottom; one line per method; the rows go to ``mmunlearn report record``:

    python examples/speech_llm_release_checks.py --run runs/whisper_smollm2_forget/speaker \
        --original runs/whisper_smollm2_all/model --manifests runs/fsdd/subset60 --out runs/whisper_smollm2_checks.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

import soundfile as sf
import torch
from safetensors.torch import load_file
from transformers import AutoProcessor, Qwen2AudioForConditionalGeneration

import mmunlearn  # noqa: F401  (first: torchaudio's stand-in before anything imports SpeechBrain)
from mmunlearn.adapters.speech_llm.families import tower_block
from mmunlearn.api.restore import restore_folder
from mmunlearn.data.utterances import split_rows
from mmunlearn.erase.patch import bits_differ, digest
from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.report import git_commit, machine_facts


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a save_pretrained folder's safetensors files."""
    out: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(path)))
    if not out:
        raise FileNotFoundError(f"{folder}: no safetensors weights")
    return out


def edited_blocks(original: dict[str, torch.Tensor], edited: dict[str, torch.Tensor]) -> dict[str, int]:
    """Layer group (``audio.layers.3``, ``audio.proj``, ``text.layers.0``, ...) -> parameters that differ."""
    if set(original) != set(edited):
        raise ValueError(f"the output's tensors differ from the original's: {sorted(set(original) ^ set(edited))[:5]}")
    blocks: dict[str, int] = {}
    for name, value in original.items():
        if value.shape != edited[name].shape or bool(bits_differ(value, edited[name]).any()):
            block = tower_block(name) or "other"
            blocks[block] = blocks.get(block, 0) + 1
    return dict(sorted(blocks.items()))


def plain_answers(folder: Path, wavs: list[str], question: str = "Who is speaking?") -> list[str]:
    """The folder's greedy answer on each clip through transformers alone: its processor, chat template and generate
    (the folder loaded once)."""
    processor = AutoProcessor.from_pretrained(str(folder))
    model = Qwen2AudioForConditionalGeneration.from_pretrained(str(folder)).eval()
    answers = []
    for wav in wavs:
        audio, rate = sf.read(wav, dtype="float32")
        messages = [{"role": "user", "content": [{"type": "audio", "audio": wav}, {"type": "text", "text": question}]}]
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = processor(text=text, audio=[audio], sampling_rate=rate, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
        new_tokens = out[0, inputs["input_ids"].shape[1] :]
        answers.append(processor.tokenizer.decode(new_tokens, skip_special_tokens=True).strip())
    return answers


def check(method_dir: Path, original: dict[str, torch.Tensor], clips: dict[str, dict]) -> dict:
    """One method's row (see the module notes)."""
    folder = method_dir / "model"
    start = time.perf_counter()
    tilted = not any(folder.glob("*.safetensors")) and (folder / "base").is_dir()  # T3: base + tilt head
    weights = folder / "base" if tilted else folder
    row: dict = {"method": method_dir.name, "edited_blocks": edited_blocks(original, tensors(weights))}
    row["towers_touched"] = ",".join(sorted({b.split(".")[0] for b in row["edited_blocks"]})) or "none"
    row["parameters_edited"] = sum(row["edited_blocks"].values())
    answers = [None] * len(clips) if tilted else plain_answers(folder, [c["wav"] for c in clips.values()])
    for (role, clip), answer in zip(clips.items(), answers):  # a tilted model answers through mmunlearn's decoding
        row[f"{role}_speaker"], row[f"{role}_answer"] = clip["spk_id"], answer
    if tilted:  # nothing to undo: the base is the original, checked bit for bit above
        row["restored_bit_for_bit"] = None
        row["seconds"] = round(time.perf_counter() - start, 1)
        return row
    with tempfile.TemporaryDirectory() as tmp:
        restored = restore_folder(folder, Path(tmp) / "restored", progress=False)
        back = tensors(restored)
        row["restored_bit_for_bit"] = set(back) == set(original) and all(
            digest(v) == digest(back[k]) and v.dtype == back[k].dtype and v.shape == back[k].shape
            for k, v in original.items()
        )
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True, help="a speech-LLM run's level folder (<out>/speaker)")
    ap.add_argument("--original", type=Path, required=True, help="the model that run unlearned from")
    ap.add_argument("--manifests", type=Path, required=True, help="the run's manifests (held-out clips asked)")
    ap.add_argument("--out", type=Path, required=True, help="the JSON to write (rows for mmunlearn report record)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    clips = {
        "forgotten": split_rows(args.manifests, "spk_forget_test")[0],
        "kept": split_rows(args.manifests, "spk_retain_test")[0],
    }
    original = tensors(args.original)
    methods = sorted(p for p in args.run.iterdir() if (p / "model").is_dir())
    if not methods:
        raise SystemExit(f"{args.run}: no <method>/model folders")
    answers = dict(zip(clips, plain_answers(args.original, [c["wav"] for c in clips.values()])))
    rows = [
        {
            "method": "original",
            "edited_blocks": {},
            "towers_touched": "none",
            "parameters_edited": 0,
            **{f"{r}_{k}": v for r, c in clips.items() for k, v in (("speaker", c["spk_id"]), ("answer", answers[r]))},
            "restored_bit_for_bit": None,
            "seconds": None,
        }
    ]
    for i, method_dir in enumerate(methods, 1):
        rows.append(check(method_dir, original, clips))
        print(
            f"[{i}/{len(methods)}] {method_dir.name}: {rows[-1]['towers_touched']} "
            f"({rows[-1]['parameters_edited']} tensors), restored bit for bit: {rows[-1]['restored_bit_for_bit']}",
            flush=True,
        )
    result = {
        "command": "python examples/speech_llm_release_checks.py "
        + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        "commit": git_commit(),
        "machine": machine_facts(),
        "rows": rows,
        "context": {"run": str(args.run), "original": str(args.original), "manifests": str(args.manifests)},
    }
    write_text_atomic(args.out, json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
