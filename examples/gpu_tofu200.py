"""One prepared GPU run: full TOFU (200 authors) forget10 on SmolLM2-135M-Instruct, the main methods, in a time budget.

Builds the target (``full``) and retain (``retain90``) models with the preset's own fine-tuning
(:func:`mmunlearn.presets.build.build_models`), evaluates both (:func:`mmunlearn.eval.evaluate_tofu`, lean: ``auto``
generation length, 40 real-authors / world-facts items), then runs each method through the recipes' runner
(:func:`recipes.runner.run_method`: the harness swept by the rule -- forget NLL up to the pretrained model's, retain
NLL rise at most 0.1 on 60 retain rows -- and the same evaluation). What differs from ``tofu compare`` is only
what a GPU changes: scoring and generation batches (64 / 256 rows instead of 16), no resumable training states
(a 135M-parameter state every 5 steps would cost more than a lost run), and a wall-clock budget: a method whose
estimated time (the longest method stage so far, or ``--first-estimate``) would pass it is skipped and listed.

After every stage ``REPORT/result.json`` (rows, columns, stages, skipped methods, machine) is rewritten, so a run
stopped from outside still leaves what it finished; ``mmunlearn report record REPORT/result.json`` records it::

    PYTHONPATH=. python examples/gpu_tofu200.py --data .tofu200/data --out /tmp/tofu200 --report $OUT \\
        --budget 480 --device cuda
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from mmunlearn.adapters.text_llm import TextLLMAdapter
from mmunlearn.atomic import write_text_atomic
from mmunlearn.data.tofu import load_split, split_info
from mmunlearn.eval import evaluate_tofu
from mmunlearn.eval.tofu import check_max_new_tokens
from mmunlearn.methods import names
from mmunlearn.presets.build import build_models
from mmunlearn.presets.models import get_preset
from mmunlearn.report import machine_facts
from recipes.runner import run_method
from recipes.tofu_pipeline import TofuSetup
from recipes.tofu_report import COLUMNS
from recipes.tofu_settings import default_precision, memorisation, memorisation_warning, sweep_rule

#: The methods of issue 36's GPU table, cheapest first (a budget cut then drops the dearest).
METHODS = ("t3", "qr-erase", "qr-erase-rows", "grad_diff", "npo")
#: The columns of the record, those of the 10-author CPU table (docs/results/tofu_smollm2.json).
RECORD_COLUMNS = [["method", "method"], ["forget quality", "forget_quality"], ["model utility", "model_utility"],
                  ["forget ROUGE-L", "forget_Q_A_ROUGE"], ["forget prob", "forget_Q_A_Prob"],
                  ["retain prob", "retain_Q_A_Prob"], ["forget NLL rise", "forget_nll_rise"],
                  ["retain NLL rise", "retain_nll_rise"], ["params changed", "changed_fraction"],
                  ["extract s", "extract_seconds"], ["sweep s", "sweep_seconds"], ["edit/train s", "edit_seconds"],
                  ["eval s", "eval_seconds"], ["rule met", "target_reached"]]


@dataclass(frozen=True)
class GpuRun:
    """The settings of one run (every one recorded in the result's context)."""

    data: str
    out: Path
    report: Path
    preset: str = "smollm2-135m"
    forget_split: str = "forget10"
    authors: int | None = None  # None: every author of the data (TOFU: 200)
    methods: tuple[str, ...] = METHODS
    device: str = "cuda"
    budget: float = 480.0  # seconds of wall time after which no method is started
    first_estimate: float = 60.0  # a method's time before any was measured
    score_batch: int = 64
    gen_batch: int = 256
    max_new_tokens: int | str = "auto"
    utility_items: int | None = 40
    rule_retain_items: int | None = 60
    retain_bound: float = 0.1
    seed: int = 0
    cache_dir: Path | None = None
    ft_max_steps: int | None = None  # tests: a few fine-tuning steps
    ft_batch_size: int | None = None  # fine-tuning micro-batch (None: the preset's)
    ft_lr: float | None = None  # fine-tuning learning rate (None: the preset's)
    pretrain_max_steps: int | None = None  # tests: a few pretraining steps of a built preset's base

    def __post_init__(self) -> None:
        for name in ("budget", "first_estimate", "score_batch", "gen_batch"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        for name in ("authors", "utility_items", "rule_retain_items", "ft_max_steps", "pretrain_max_steps",
                     "ft_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        unknown = [m for m in self.methods if m not in names("text")]
        if self.ft_lr is not None and not self.ft_lr > 0:
            raise ValueError(f"ft_lr must be positive, got {self.ft_lr!r}")
        if not self.methods or unknown:
            raise ValueError(f"methods: choose from {names('text')}, got {list(self.methods)}")
        check_max_new_tokens(self.max_new_tokens)
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"device must be cuda or cpu, got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device cuda: no CUDA device here (pass --device cpu for a CPU run)")


@dataclass
class GpuSetup(TofuSetup):
    """The TOFU setup with the GPU's batches: evaluation and the sweep's forget target on ``device``."""

    score_batch: int = 64
    gen_batch: int = 256
    device: str = "cuda"

    def evaluate(self, adapter: Any, folder: Path, method: str) -> list[dict]:
        logs = evaluate_tofu(adapter, self.data, self.forget_split, self.authors, retain_logs=self.retain_logs,
                             out_dir=folder, batch_size=self.score_batch, generation_batch_size=self.gen_batch,
                             max_new_tokens=self.max_new_tokens, model_name=method, metrics=self.metrics,
                             utility_items=self.utility_items)
        return [{"method": method, **table_values(logs)}]

    def forget_target(self) -> float:
        base = self.adapter(self.built.base, self.device)
        return float(base.answer_nll(self.forget, batch_size=self.score_batch).mean())


def table_values(logs: dict) -> dict:
    """The comparison table's values (:data:`recipes.tofu_report.COLUMNS`) found in TOFU logs."""
    return {key: logs[key].get("agg_value") if isinstance(logs[key], dict) else logs[key]
            for _, key in COLUMNS if key in logs}


class Progress:
    """Stage times, one printed line per stage, and ``report/result.json`` rewritten after each."""

    def __init__(self, run: GpuRun):
        self.run, self.start = run, time.perf_counter()
        self.stages: list[dict] = []
        self.rows: list[dict] = []
        self.skipped: list[dict] = []
        self.context: dict[str, Any] = {"settings": _jsonable(asdict(run))}
        self.machine = _machine(run.device)
        run.report.mkdir(parents=True, exist_ok=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def stage(self, name: str, seconds: float, **info: Any) -> None:
        self.stages.append({"stage": name, "seconds": round(seconds, 2), "elapsed": round(self.elapsed(), 1), **info})
        extra = "".join(f"; {k} {v}" for k, v in info.items())
        print(f"[stage {len(self.stages)}] {name}: {seconds:.1f} s; elapsed {self.elapsed():.0f} s{extra}", flush=True)
        self.write()

    def write(self, finished: bool = False) -> Path:
        if self.run.device == "cuda":
            self.machine["gpu_peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        result = {"columns": RECORD_COLUMNS, "rows": self.rows, "stages": self.stages, "skipped": self.skipped,
                  "finished": finished, "wall_seconds": round(self.elapsed(), 1), "context": self.context,
                  "machine": self.machine}
        path = self.run.report / "result.json"
        write_text_atomic(path, json.dumps(result, indent=2, default=str))
        return path


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _machine(device: str) -> dict[str, Any]:
    facts = machine_facts()
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                     cuda=torch.version.cuda)
    return facts


def _timed(fn, *args, **kwargs) -> tuple[Any, float]:
    t0 = time.perf_counter()
    value = fn(*args, **kwargs)
    return value, time.perf_counter() - t0


def prepare(run: GpuRun, progress: Progress) -> GpuSetup:
    """Base folder, target and retain models, their evaluations, the memorisation check: the setup."""
    _, seconds = _timed(get_preset, run.preset)  # a real checkpoint is converted here on first use
    progress.stage("base model folder", seconds)
    overrides = {k: v for k, v in (("max_steps", run.ft_max_steps), ("batch_size", run.ft_batch_size),
                                   ("lr", run.ft_lr)) if v is not None} or None
    pretrain = {"max_steps": run.pretrain_max_steps} if run.pretrain_max_steps else None
    built, seconds = _timed(build_models, run.preset, run.data, run.forget_split, run.authors, run.seed,
                            run.cache_dir, run.device, progress=False, overrides=overrides,
                            pretrain_overrides=pretrain, checkpoint_every=None)
    logs = built.logs
    progress.stage("target and retain models", seconds,
                   train_seconds={r: round(logs[r].get("seconds") or 0.0, 1) for r in ("target", "retain")},
                   steps={r: logs[r].get("steps") for r in ("target", "retain")})
    precision = default_precision(run.preset, run.device)
    retain_logs, target_logs = run.out / "retain_model" / "TOFU_EVAL.json", run.out / "target_model" / "TOFU_EVAL.json"
    common = dict(max_new_tokens=run.max_new_tokens, batch_size=run.score_batch, generation_batch_size=run.gen_batch,
                  utility_items=run.utility_items)
    for role, path, ref in (("retain", retain_logs, None), ("target", target_logs, retain_logs)):
        t0 = time.perf_counter()
        adapter = TextLLMAdapter.from_pretrained(getattr(built, role), device=run.device, precision=precision)
        evaluate_tofu(adapter, run.data, run.forget_split, run.authors, retain_logs=ref, out_dir=path.parent,
                      model_name=f"{role} model", **common)
        del adapter
        progress.stage(f"{role} model evaluation", time.perf_counter() - t0)
    tl, rl = json.loads(target_logs.read_text()), json.loads(retain_logs.read_text())
    check = memorisation(run.preset, _agg(tl.get("forget_Q_A_Prob")), _agg(tl.get("forget_Q_A_ROUGE")),
                         pretrained_prob=logs["target"].get("pretrained_forget_prob"),
                         retain_prob=_agg(rl.get("forget_Q_A_Prob")), forget_quality=_agg(tl.get("forget_quality")))
    warning = memorisation_warning(check)
    if warning:
        print(f"warning: {warning}", flush=True)
    pct = split_info(run.forget_split).forget_pct
    forget = load_split(run.data, run.forget_split, authors=run.authors, forget_pct=pct)
    retain = load_split(run.data, f"retain{100 - pct:02d}", authors=run.authors, forget_pct=pct)
    rule_retain = None
    if run.rule_retain_items is not None and run.rule_retain_items < len(retain):
        step = len(retain) / run.rule_retain_items
        rule_retain = [retain[int(i * step)] for i in range(run.rule_retain_items)]
    cache = run.cache_dir if run.cache_dir is not None else run.out / "cache"
    return GpuSetup(run.preset, run.data, run.forget_split, run.authors, run.max_new_tokens, built, retain_logs,
                    target_logs, cache, forget, retain, None, check, precision, run.utility_items, rule_retain,
                    score_batch=run.score_batch, gen_batch=run.gen_batch, device=run.device)


def _agg(entry: Any) -> float | None:
    value = entry.get("agg_value") if isinstance(entry, dict) else entry
    return float(value) if isinstance(value, (int, float)) else None


def run_all(run: GpuRun) -> dict[str, Any]:
    """The whole run (module docstring); returns the result ``report/result.json`` holds."""
    progress = Progress(run)
    setup = prepare(run, progress)
    progress.rows = [setup.reference_row("target"), setup.reference_row("retain")]
    t0 = time.perf_counter()
    target_nll = setup.forget_target()
    progress.context.update(setup.describe(), forget_target_nll=target_nll,
                            build_logs=_jsonable({r: {k: v for k, v in log.items() if not isinstance(v, (dict, list))}
                                                  for r, log in setup.built.logs.items()}))
    progress.stage("forget target (base model's forget NLL)", time.perf_counter() - t0, nll=round(target_nll, 4))
    times: list[float] = []
    for method in run.methods:
        estimate = max(times) if times else run.first_estimate
        if progress.elapsed() + estimate > run.budget:
            progress.skipped.append({"method": method, "why": f"budget: {progress.elapsed():.0f} s elapsed + "
                                     f"{estimate:.0f} s estimated > {run.budget:.0f} s"})
            print(f"skipped {method}: {progress.skipped[-1]['why']}", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            row, = run_method(method, setup, run.out / method, options={}, overrides={}, base="target",
                              rule=sweep_rule(target_nll, run.retain_bound), device=run.device, resume=False,
                              progress=False)
        except Exception as e:  # one method's failure must not cost the others their row: recorded, run on
            progress.skipped.append({"method": method, "why": f"failed: {type(e).__name__}: {e}"[:500]})
            traceback.print_exc()
            progress.stage(f"{method} (failed)", time.perf_counter() - t0)
            continue
        times.append(time.perf_counter() - t0)
        progress.rows.append(row)
        progress.stage(method, times[-1], fq=_short(row.get("forget_quality")), mu=_short(row.get("model_utility")),
                       rule_met=row.get("target_reached"))
    progress.write(finished=True)
    return json.loads((run.report / "result.json").read_text())


def _short(value: Any) -> Any:
    return float(f"{value:.4g}") if isinstance(value, float) else value


def parse_args(argv: list[str] | None = None) -> GpuRun:
    """The command line as a :class:`GpuRun`."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="TOFU folder of JSON splits, or 'synthetic[:...]'.")
    p.add_argument("--out", type=Path, required=True, help="Run folder (models, logs: large).")
    p.add_argument("--report", type=Path, required=True, help="Folder of result.json (small: what comes back).")
    p.add_argument("--preset", default="smollm2-135m",
                   help="Model preset the target and retain models are fine-tuned from.")
    p.add_argument("--authors", type=int, default=None, help="Use this many TOFU authors (default: all).")
    p.add_argument("--methods", default=",".join(METHODS), help="Methods, comma-separated, run in this order.")
    p.add_argument("--device", default="cuda", help="Torch device.")
    p.add_argument("--budget", type=float, default=480.0,
                   help="Seconds of wall time after which no further method is started.")
    p.add_argument("--first-estimate", type=float, default=60.0,
                   help="A method's expected seconds before any method was timed (for the budget).")
    p.add_argument("--score-batch", type=int, default=64, help="Batch size of teacher-forced scoring.")
    p.add_argument("--gen-batch", type=int, default=256, help="Batch size of generation (ROUGE-L).")
    p.add_argument("--max-new-tokens", default="auto",
                   help="Generation length: a number, or auto (per batch, its longest gold answer plus a margin).")
    p.add_argument("--utility-items", type=int, default=40, help="First N items of each model-utility split.")
    p.add_argument("--rule-retain-items", type=int, default=60,
                   help="Retain items the sweep rule scores (evenly spaced over the retain set).")
    p.add_argument("--cache-dir", type=Path, default=None, help="Model cache (default: OUT/cache).")
    p.add_argument("--ft-max-steps", type=int, default=None, help="Cap on fine-tuning steps (tests).")
    p.add_argument("--pretrain-max-steps", type=int, default=None,
                   help="Cap on a built preset's pretraining steps (tests).")
    p.add_argument("--ft-batch-size", type=int, default=None, help="Fine-tuning micro-batch (default: the preset's).")
    p.add_argument("--ft-lr", type=float, default=None, help="Fine-tuning learning rate (default: the preset's).")
    a = p.parse_args(argv)
    tokens = int(a.max_new_tokens) if a.max_new_tokens.isdigit() else a.max_new_tokens
    return GpuRun(data=a.data, out=a.out, report=a.report, preset=a.preset, authors=a.authors,
                  methods=tuple(m.strip() for m in a.methods.split(",") if m.strip()), device=a.device,
                  budget=a.budget, first_estimate=a.first_estimate, score_batch=a.score_batch, gen_batch=a.gen_batch,
                  max_new_tokens=tokens, utility_items=a.utility_items, rule_retain_items=a.rule_retain_items,
                  cache_dir=a.cache_dir, ft_max_steps=a.ft_max_steps, pretrain_max_steps=a.pretrain_max_steps,
                  ft_batch_size=a.ft_batch_size, ft_lr=a.ft_lr)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING)
    result = run_all(parse_args(argv))
    for row in result["rows"]:
        print(f"{row['method']:<14} FQ {row.get('forget_quality')!s:<24} MU {row.get('model_utility')!s:<24} "
              f"rule {row.get('target_reached')}", flush=True)
    print(f"skipped: {result['skipped'] or 'none'}; wall {result['wall_seconds']} s", flush=True)


if __name__ == "__main__":
    main()
