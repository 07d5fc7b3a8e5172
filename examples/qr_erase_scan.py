"""Why QR-Erase does or does not forget on a TOFU target: protocol x rank x retain rank x layer rule x subtraction.

Read top to bottom. On the training partitions only (the sweep rule's data, never the evaluation):

1. load the target, its base (the model it was fine-tuned from), optionally a retain model (the base fine-tuned on
   the retain rows alone), the forget rows and a spread of retain rows; the rule's forget target is the base's
   forget NLL (``--forget-target retain``: the retain model's), its retain bound ``--bound``;
2. task matrices by protocol (each saved under ``<json stem>.taskvec/`` and reused on a rerun):
   ``update``: T_f = target - base, T_r = retain model - base (without ``--retain-model``: the base fine-tuned on
   the retain rows); ``layerwise``: UNLEARN's, each block of the base fine-tuned alone on each partition;
   ``finetune`` / ``gradient`` / ``lora``: the toolkit's extractions from the base (``NAME@target``: from the target);
3. every point of protocol x rank x retain rank x layer rule (``mean`` = energy >= 1/|L|, ``all``, ``topK``) x
   subtraction (``own``: W - T~ at the task matrix's own size, one edit; ``swept``: QR-Erase's sweep of the edit's
   size, its choice) is scored with the rule's two measures and written to the JSON as it finishes; a rerun skips
   the points already there;
4. the per-block scan: one block edited alone (``--block-protocol``, own size): forget vs retain NLL rise per block,
   written to the JSON and drawn in ``<json stem>.blocks.png``;
5. the ``--best`` points within the bound edited again: their forget ROUGE-L (greedy answers) and probability,
   beside the target's and the retain model's.

Example (the SmolLM2 models ``tofu compare --config tofu/smollm2`` built; paths from the build cache)::

    python examples/qr_erase_scan.py --target TARGET_DIR --base BASE_DIR --retain-model RETAIN_DIR \\
        --data ../shared/data/tofu --authors 10 --json runs/qr_scan/smollm2.json
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import torch

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.data.tofu import load_split, split_info
from mmunlearn.erase import restore
from mmunlearn.erase.energy import group_of
from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.methods.erasure import EraseConfig, _apply, _sweep, relative_unit
from mmunlearn.methods.rule import Scorer, SweepRule
from mmunlearn.taskvec import load_task_matrices, save_task_matrices
from mmunlearn.taskvec.extract import ExtractConfig, extract_task_matrices, update_task_matrices

PROTOCOLS = ("update", "layerwise", "finetune", "gradient", "lora")
#: The options a resumed scan must share with the JSON's (what every point's figures depend on).
SETUP = (
    "target",
    "base",
    "retain_model",
    "data",
    "authors",
    "forget_split",
    "retain_items",
    "bound",
    "forget_target",
    "precision",
    "steps",
    "layerwise_steps",
    "lr",
    "batch_size",
    "block_rank",
    "block_retain_rank",
)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, type=Path, help="Target model folder.")
    p.add_argument(
        "--base",
        type=Path,
        help="The folder the target was fine-tuned from (default: the one its train_log.json names).",
    )
    p.add_argument(
        "--retain-model",
        type=Path,
        help="The base fine-tuned on the retain rows alone (update: T_r = it "
        "- base; also the forget target with --forget-target retain).",
    )
    p.add_argument("--data", default="synthetic", help="TOFU folder or 'synthetic[:...]'.")
    p.add_argument("--authors", type=int, default=None, help="Keep N authors (as the recipes' --authors).")
    p.add_argument("--forget-split", default="forget10", help="Forget split.")
    p.add_argument("--retain-items", type=int, default=40, help="Retain rows the rule scores (spread evenly).")
    p.add_argument("--bound", type=float, default=0.1, help="Retain NLL rise allowed (nats).")
    p.add_argument(
        "--forget-target",
        default="base",
        choices=("base", "retain"),
        help="The forget NLL aimed at: the base model's or the retain model's.",
    )
    p.add_argument("--precision", default="bf16", choices=("no", "bf16"), help="Scoring precision.")
    p.add_argument(
        "--protocols",
        default="update,layerwise,finetune,gradient",
        help=f"Comma-separated, of {', '.join(PROTOCOLS)}; NAME@target extracts from the target.",
    )
    p.add_argument("--ranks", default="8,32,128", help="Forget ranks (comma-separated).")
    p.add_argument("--retain-ranks", default="0,128", help="Retain ranks (0: no retain projection).")
    p.add_argument("--layer-rules", default="mean,all,top3", help="Layer rules: mean, all, topK (K blocks by energy).")
    p.add_argument("--subtractions", default="own,swept", help="own (task matrix's own size) and/or swept.")
    p.add_argument("--steps", type=int, default=20, help="Fine-tuning steps of finetune / lora extraction.")
    p.add_argument("--layerwise-steps", type=int, default=5, help="Fine-tuning steps per block (layerwise).")
    p.add_argument("--lr", type=float, default=1e-4, help="Extraction learning rate (gradient: step size).")
    p.add_argument("--batch-size", type=int, default=8, help="Extraction batch size.")
    p.add_argument("--block-protocol", default=None, help="Protocol of the per-block scan (default: the first).")
    p.add_argument("--block-rank", type=int, default=32, help="Per-block scan: forget rank.")
    p.add_argument("--block-retain-rank", type=int, default=128, help="Per-block scan: retain rank.")
    p.add_argument(
        "--best",
        type=int,
        default=3,
        help="Points (best within the bound) whose forget ROUGE-L and "
        "probability are measured (greedy answers; 0: none).",
    )
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads.")
    p.add_argument("--json", type=Path, required=True, help="Where the results go (resumed when it exists).")
    return p.parse_args(argv)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def layer_rule(text: str) -> tuple[str, int | None]:
    """``mean`` / ``all`` / ``topK`` -> (rule, top)."""
    m = re.fullmatch(r"top(\d+)", text)
    if m:
        return "top", int(m.group(1))
    if text not in ("mean", "all"):
        raise SystemExit(f"error: --layer-rules: mean, all or topK, got {text!r}")
    return text, None


def task_matrices(name: str, args, models: dict, forget, retain_all, cache: Path):
    """(T_f, T_r, seconds) of a protocol, read from ``cache`` when a run already made them."""
    stem = name.replace("@", "-at-")
    files = cache / f"{stem}.forget.safetensors", cache / f"{stem}.retain.safetensors"
    if all(f.is_file() for f in files):
        tf, tr = (load_task_matrices(f) for f in files)
        return tf, tr, float(tf.meta.get("scan_seconds", 0.0))
    kind, _, where = name.partition("@")
    if kind not in PROTOCOLS or where not in ("", "target"):
        raise SystemExit(f"error: --protocols: {name!r} is not one of {', '.join(PROTOCOLS)} (optionally @target)")
    source = models["target"] if where else models["base"]
    t0 = time.perf_counter()
    if kind == "update":
        tf = update_task_matrices(models["target"], models["base"])
        if models.get("retain") is not None:
            tr = update_task_matrices(models["retain"], models["base"], what="retain model")
        else:
            tr = extract_task_matrices(
                models["base"],
                retain_all,
                ExtractConfig(kind="finetune", steps=args.steps, lr=args.lr, batch_size=args.batch_size),
                progress=False,
            )
    else:
        steps = args.layerwise_steps if kind == "layerwise" else args.steps
        cfg = ExtractConfig(kind=kind, steps=steps, lr=args.lr, batch_size=args.batch_size)
        tf = extract_task_matrices(source, forget, cfg, progress=False)
        tr = extract_task_matrices(source, retain_all, cfg, progress=False)
    seconds = time.perf_counter() - t0
    cache.mkdir(parents=True, exist_ok=True)
    save_task_matrices(files[0], dict(tf), {**tf.meta, "scan_seconds": seconds})
    save_task_matrices(files[1], dict(tr), dict(tr.meta))
    return tf, tr, seconds


def measure(target, scorer: Scorer, rep, **extra) -> dict:
    """The rule's measures of the edited model (then undone): what every point records."""
    f, r = scorer.score(target)
    restore(target.model, rep)
    return {
        "forget_nll": f,
        "retain_nll": r,
        "forget_rise": f - scorer.base_forget,
        "retain_rise": r - scorer.base_retain,
        "met": scorer.reached(f) and not scorer.over(r),
        "selected_layers": rep.selected,
        **extra,
    }


def point(target, tf, tr, cfg: EraseConfig, subtraction: str, scorer: Scorer) -> dict:
    """One configuration: the own-size edit, or the sweep's choice (its measures and how many edits it scored)."""
    t0, scored = time.perf_counter(), scorer.seconds
    if subtraction == "own":
        rep = _apply(target.model, tf, tr, cfg, cfg.rank, 1.0, None)
        row = measure(target, scorer, rep, scale=1.0, relative=relative_unit(target.model, tf), points=1)
    else:
        points, chosen = _sweep(target, tf, tr, cfg, scorer, None, progress=False)
        rep = _apply(target.model, tf, tr, cfg, chosen.rank, chosen.scale, None)
        row = measure(target, scorer, rep, scale=chosen.scale, relative=chosen.relative, points=len(points))
    row["seconds"], row["scoring_seconds"] = time.perf_counter() - t0, scorer.seconds - scored
    return row


def block_scan(target, tf, tr, args, scorer: Scorer, results: dict, save) -> None:
    """Each block edited alone at its task matrix's own size: where the forget task lives."""
    done = {b["block"] for b in results["blocks"]}
    blocks = sorted({group_of(n) for n in tf}, key=lambda g: [int(x) if x.isdigit() else x for x in g.split(".")])
    total = sum(float(t.float().norm()) for t in tf.values())
    for g in blocks:
        if g in done:
            continue
        sub_f = {n: t for n, t in tf.items() if group_of(n) == g}
        sub_r = {n: tr[n] for n in sub_f}
        cfg = EraseConfig(rank=args.block_rank, retain_rank=args.block_retain_rank, localize=False)
        rep = _apply(target.model, sub_f, sub_r, cfg, cfg.rank, 1.0, None)
        row = measure(target, scorer, rep, block=g, energy=sum(float(t.float().norm()) for t in sub_f.values()) / total)
        results["blocks"].append(row)
        print(
            f"block {g}: energy {row['energy']:.3f}, forget {row['forget_rise']:+.3f}, retain {row['retain_rise']:+.3f}"
        )
        save()


def forget_outputs(adapter, forget) -> dict:
    """What the model still says of the forget rows: greedy ROUGE-L recall of their answers and the mean per-token
    probability of each answer (exp of its length-normalised NLL, averaged over rows)."""
    from mmunlearn.eval.scoring import generate_answers
    from mmunlearn.metrics.rouge import rouge_l_recall

    gold = [row.answer for row in forget]
    said = generate_answers(adapter, [row.question for row in forget], max_new_tokens="auto", gold=gold)
    return {
        "forget_rouge_l": float(rouge_l_recall(said, gold).mean()),
        "forget_prob": float(torch.exp(-adapter.answer_nll(forget)).mean()),
    }


def best_points(target, args, models, forget, retain_all, cache: Path, results: dict, save) -> None:
    """The ``--best`` points within the retain bound (those that meet the rule first, then by forget rise), edited
    again: their forget ROUGE-L and probability, beside the target's and the retain model's."""
    if "reference_outputs" not in results:
        results["reference_outputs"] = {"target": forget_outputs(target, forget)}
        if models.get("retain") is not None:
            results["reference_outputs"]["retain_model"] = forget_outputs(models["retain"], forget)
        save()
    within = [p for p in results["points"] if p["retain_rise"] <= args.bound]
    for p in sorted(within, key=lambda p: (p["met"], p["forget_rise"]), reverse=True)[: args.best]:
        if "forget_rouge_l" in p:
            continue
        tf, tr, _ = task_matrices(p["protocol"], args, models, forget, retain_all, cache)
        rule_name, top = layer_rule(p["layer_rule"])
        cfg = EraseConfig(
            rank=p["rank"], retain_rank=p["retain_rank"], layer_rule=rule_name, top=top, localize=rule_name != "all"
        )
        rep = _apply(target.model, tf, tr, cfg, cfg.rank, p["scale"], None)
        try:
            p.update(forget_outputs(target, forget))
        finally:
            restore(target.model, rep)
        print(f"best {p['key']}: forget ROUGE-L {p['forget_rouge_l']:.3f}, probability {p['forget_prob']:.3f}")
        save()


def plot_blocks(blocks: list[dict], path: Path, bound: float, title: str) -> None:
    from mmunlearn.report.figures import figure

    with figure(path, figsize=(max(6, 0.3 * len(blocks)), 4)) as (_fig, ax):
        x = range(len(blocks))
        ax.bar([i - 0.2 for i in x], [b["forget_rise"] for b in blocks], width=0.4, label="forget NLL rise")
        ax.bar([i + 0.2 for i in x], [b["retain_rise"] for b in blocks], width=0.4, label="retain NLL rise")
        ax.axhline(bound, color="grey", linestyle="--", linewidth=0.8, label=f"retain bound {bound:g}")
        ax.set_xticks(list(x), [b["block"].rsplit(".", 1)[-1] for b in blocks], fontsize=7)
        ax.set_xlabel("block edited alone (own size)")
        ax.set_ylabel("NLL rise (nats)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)


def load_models(args) -> dict:
    log = json.loads((args.target / "train_log.json").read_text()) if (args.target / "train_log.json").is_file() else {}
    base_dir = args.base or (Path(log["base"]) if log.get("base") else None)
    if base_dir is None:
        raise SystemExit("error: the target names no base model; pass --base")
    load = lambda d: TextLLMAdapter.from_pretrained(d, device="cpu", precision=args.precision)  # noqa: E731
    return {
        "target": load(args.target),
        "base": load(base_dir),
        "base_dir": base_dir,
        "retain": load(args.retain_model) if args.retain_model else None,
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    setup = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k in SETUP}
    results = json.loads(args.json.read_text()) if args.json.is_file() else {"points": [], "blocks": [], "setup": setup}
    changed = sorted(k for k in SETUP if results.get("setup", {}).get(k) != setup[k])
    if changed:
        raise SystemExit(
            f"error: {args.json} was scanned with other {', '.join(changed)}: its points would not "
            "compare; give another --json"
        )
    models = load_models(args)
    target = models["target"]
    pct = split_info(args.forget_split).forget_pct
    forget = load_split(args.data, args.forget_split, authors=args.authors, forget_pct=pct)
    retain_all = load_split(args.data, f"retain{100 - pct:02d}", authors=args.authors, forget_pct=pct)
    retain = retain_all[:: max(1, len(retain_all) // args.retain_items)][: args.retain_items]
    aim = models["retain"] if args.forget_target == "retain" else models["base"]
    if aim is None:
        raise SystemExit("error: --forget-target retain needs --retain-model")
    rule = SweepRule(forget_target=float(aim.answer_nll(forget).mean()), retain_bound=args.bound)
    scorer = Scorer(rule, target, forget, retain)
    results.update(
        {
            "target": str(args.target),
            "base": str(models["base_dir"]),
            "retain_model": str(args.retain_model),
            "forget_items": len(forget),
            "retain_items": len(retain),
            "forget_target": rule.forget_target,
            "bound": args.bound,
            "base_forget_nll": scorer.base_forget,
            "base_retain_nll": scorer.base_retain,
            "scoring_seconds_per_point": scorer.seconds,
        }
    )
    save = lambda: write_text_atomic(args.json, json.dumps(results, indent=2))  # noqa: E731
    print(
        f"forget NLL: target {scorer.base_forget:.3f}, aim {rule.forget_target:.3f}; "
        f"retain NLL {scorer.base_retain:.3f}"
    )
    cache = args.json.with_suffix(".taskvec")
    protocols = [x.strip() for x in args.protocols.split(",") if x.strip()]
    done = {p["key"] for p in results["points"]}
    for name in protocols:
        tf, tr, seconds = task_matrices(name, args, models, forget, retain_all, cache)
        for rank in _ints(args.ranks):
            for retain_rank in _ints(args.retain_ranks):
                for rule_text in args.layer_rules.split(","):
                    rule_name, top = layer_rule(rule_text.strip())
                    cfg = EraseConfig(
                        rank=rank, retain_rank=retain_rank, layer_rule=rule_name, top=top, localize=rule_name != "all"
                    )
                    for sub in [s.strip() for s in args.subtractions.split(",") if s.strip()]:
                        key = f"{name}|{rank}|{retain_rank}|{rule_text.strip()}|{sub}"
                        if key in done:
                            continue
                        row = {
                            "key": key,
                            "protocol": name,
                            "rank": rank,
                            "retain_rank": retain_rank,
                            "layer_rule": rule_text.strip(),
                            "subtraction": sub,
                            "extract_seconds": seconds,
                            **point(target, tf, tr, cfg, sub, scorer),
                        }
                        results["points"].append(row)
                        save()
                        print(
                            " ".join(
                                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                for k, v in row.items()
                                if k != "selected_layers"
                            )
                        )
    tf, tr, _ = task_matrices(args.block_protocol or protocols[0], args, models, forget, retain_all, cache)
    results["block_protocol"] = args.block_protocol or protocols[0]
    block_scan(target, tf, tr, args, scorer, results, save)
    plot_blocks(
        results["blocks"],
        args.json.with_suffix(".blocks.png"),
        args.bound,
        f"one block edited alone: {results['block_protocol']}, rank {args.block_rank}, "
        f"retain rank {args.block_retain_rank}",
    )
    if args.best > 0:
        best_points(target, args, models, forget, retain_all, cache, results, save)
    within = [p for p in results["points"] if p["retain_rise"] <= args.bound]
    results["best"] = max(within, key=lambda p: (p["met"], p["forget_rise"]))["key"] if within else None
    save()
    print(f"best within the bound: {results['best']}")
    return results


if __name__ == "__main__":
    main()
