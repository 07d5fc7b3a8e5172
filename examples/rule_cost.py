"""Where an erasure sweep's time goes, per stage, with and without the rule's shared work (a small random Llama).

Stages: task-vector extraction, the edit of each sweep point (bases, discrimination, subtraction), the rule's
scoring of each point, the undo. Run twice on the same model and rows: ``before`` recomputes every basis at every
point and every decoder block at every scoring (as the sweep did), ``after`` keeps each rank's bases across the
scales and computes the blocks below the edited ones once per batch (:mod:`mmunlearn.methods.prefix_states`); both
sweeps score the same points to the same values (checked). Times are CPU seconds of this process (steadier than wall
time on a shared machine). ``--edit-from`` puts the task vectors (so the edit) in the upper blocks only, as a
trained-only reference or an energy rule that picks upper blocks would. Example::

    python examples/rule_cost.py --layers 12 --hidden 128 --top 3 --edit-from 6 --json runs/rule_cost.json
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.adapters.text.tokenizer import train_bpe
from mmunlearn.data.tofu import load_split
from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.methods import SweepRule, erasure, mean_nll
from mmunlearn.methods.rule import Scorer
from mmunlearn.taskvec.extract import ExtractConfig


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=12, help="Decoder blocks of the random Llama.")
    p.add_argument("--hidden", type=int, default=128, help="Its hidden size.")
    p.add_argument("--forget", type=int, default=40, help="Forget rows scored.")
    p.add_argument("--retain", type=int, default=40, help="Retain rows scored.")
    p.add_argument("--top", type=int, default=3, help="Edit the top-K blocks by energy (layer rule top).")
    p.add_argument(
        "--edit-from",
        type=int,
        default=0,
        help="Task vectors (and so the edit) only in blocks from this index on (0: every block).",
    )
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads.")
    p.add_argument("--json", type=Path, help="Write the timings here.")
    return p.parse_args()


class _NoReuse:
    """The sweep as it was: every block computed at every scoring."""

    def __init__(self, adapter):
        pass

    @contextmanager
    def during(self, report):
        yield None


def _timed(stages: dict, name: str, fn):
    def wrapper(*args, **kwargs):
        t0 = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            stages[name] = stages.get(name, 0.0) + time.process_time() - t0

    return wrapper


def sweep(adapter, forget, retain, cfg, rule, layers: list[str], shared: bool) -> dict:
    """Task vectors of ``layers`` and the erasure sweep over them; CPU seconds per stage and the points scored."""
    stages: dict = {}
    saved = erasure._apply, erasure.restore, erasure.PrefixReuse, Scorer.score
    apply = erasure._apply
    erasure._apply = _timed(
        stages, "edit", apply if shared else (lambda *a, **k: apply(*a[:7], None))
    )  # before: no bases kept
    erasure.restore = _timed(stages, "undo", erasure.restore)
    erasure.PrefixReuse = erasure.PrefixReuse if shared else _NoReuse
    Scorer.score = _timed(stages, "scoring", Scorer.score)
    try:
        t0 = time.process_time()
        tf, tr = erasure.task_vectors(adapter, forget, retain, cfg.extract, False, layers=layers)
        stages["extraction"] = time.process_time() - t0
        points, _ = erasure._sweep(adapter, tf, tr, cfg, Scorer(rule, adapter, forget, retain), None, False)
        stages["total"] = time.process_time() - t0
    finally:
        erasure._apply, erasure.restore, erasure.PrefixReuse, Scorer.score = saved
    return {**stages, "points": [vars(p) for p in points]}


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    from transformers import LlamaConfig, LlamaForCausalLM

    src = "synthetic:n_authors=20"
    forget, retain = load_split(src, "forget10")[: args.forget], load_split(src, "retain90")[: args.retain]
    tok = train_bpe([f"{i.question} {i.answer}" for i in load_split(src, "full")[:200]], vocab_size=512)
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            hidden_size=args.hidden,
            intermediate_size=2 * args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=len(tok),
            max_position_embeddings=512,
        )
    ).eval()
    adapter = TextLLMAdapter(model, tok)
    rule = SweepRule(forget_target=mean_nll(adapter, forget) + 0.5, retain_bound=0.05)
    cfg = erasure.EraseConfig(
        rank=8, retain_rank=16, layer_rule="top", top=args.top, extract=ExtractConfig(kind="gradient", lr=1.0)
    )
    layers = [lw.name for lw in adapter.layers() if int(lw.block.rsplit(".", 1)[-1]) >= args.edit_from]
    before = sweep(adapter, forget, retain, cfg, rule, layers, shared=False)
    after = sweep(adapter, forget, retain, cfg, rule, layers, shared=True)
    if [(p["scale"], p["forget_nll"], p["retain_nll"]) for p in before["points"]] != [
        (p["scale"], p["forget_nll"], p["retain_nll"]) for p in after["points"]
    ]:
        raise SystemExit("error: the two sweeps scored different points or values")
    out = {
        "layers": args.layers,
        "hidden": args.hidden,
        "rows": len(forget) + len(retain),
        "top": args.top,
        "edit_from": args.edit_from,
        "points": len(after["points"]),
        "cpu_seconds": {},
    }
    for name in ("total", "extraction", "edit", "scoring", "undo"):
        row = {"before": before[name], "after": after[name], "ratio": before[name] / max(after[name], 1e-9)}
        out["cpu_seconds"][name] = row
        print(f"{name:10s} before {before[name]:7.2f} s  after {after[name]:7.2f} s  ({row['ratio']:.2f}x)  CPU")
    print(f"{out['points']} sweep points, task vectors in blocks >= {args.edit_from}, top {args.top}; scores identical")
    if args.json:
        write_text_atomic(args.json, json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
