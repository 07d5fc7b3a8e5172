#!/usr/bin/env bash
# Issue 22 item 3: the same mini models evaluated with the reference settings (200 new tokens, every
# real-authors / world-facts item) and the lean ones (auto length, 40 utility items); float32 both.
# The reference run adds NPO (an optimisation method); the lean one T3 only, which both share (run them one
# after the other, or at once on two cores); then the side-by-side JSON for the docs table.
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
common=(--preset mini --data ../shared/data/tofu --authors 40 --forget-split forget10 --threads 1 --device cpu)
.venv/bin/mmunlearn tofu compare "${common[@]}" --methods npo,t3 --max-new-tokens 200 --out runs/mini_reference
.venv/bin/mmunlearn tofu compare "${common[@]}" --methods t3 --max-new-tokens auto --utility-items 40 --out runs/mini_lean
.venv/bin/python examples/lean_vs_reference.py runs/mini_reference runs/mini_lean --json runs/lean_vs_reference.json
