#!/usr/bin/env bash
# Issue 22 item 3: the same mini comparison evaluated with the reference settings (200 new tokens, every
# real-authors / world-facts item) and the lean ones (auto length, 40 utility items); float32 both.
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
common=(--preset mini --data ../shared/data/tofu --authors 40 --forget-split forget10 --threads 1 --device cpu
        --methods npo,t3)
.venv/bin/mmunlearn tofu compare "${common[@]}" --max-new-tokens 200 --out runs/mini_reference
.venv/bin/mmunlearn tofu compare "${common[@]}" --max-new-tokens auto --utility-items 40 --out runs/mini_lean
