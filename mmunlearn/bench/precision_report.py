"""What ``mmunlearn bench precision`` reports: its rows, checks and result, rendered as table cells and Markdown."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

#: the project's tokens/s must reach this share of the plain loop's (issue 22)
GOAL_RATIO = 0.9


@dataclass
class PrecisionRow:
    """One stage at one precision: both implementations' timings on the same tokens and the accuracy."""

    stage: str
    precision: str
    tokens: int  # tokens one call processes (see the docstring of mmunlearn.bench.precision)
    plain_runs: list[float]  # seconds of each timed call, warm-up excluded
    mmunlearn_runs: list[float]
    plain_seconds: float  # median of plain_runs
    mmunlearn_seconds: float
    plain_tokens_per_s: float
    mmunlearn_tokens_per_s: float
    ratio: float  # mmunlearn_tokens_per_s / plain_tokens_per_s
    plain_speedup: float = 1.0  # plain tokens/s against plain float32 of the same stage
    mmunlearn_speedup: float = 1.0
    accuracy: dict[str, Any] = field(default_factory=dict)
    agreement: str = ""  # the accuracy in words
    plain_cpu_runs: list[float] = field(default_factory=list)  # thread CPU seconds of each timed call
    mmunlearn_cpu_runs: list[float] = field(default_factory=list)
    flops: float | None = None  # model FLOPs of one call (mmunlearn.bench.precision_roofline)
    plain_roofline_share: float | None = None  # achieved FLOP/s (wall clock) over the matmul's at this precision
    mmunlearn_roofline_share: float | None = None
    plain_cpu_roofline_share: float | None = None  # the same on thread CPU seconds (stage and matmul alike)
    mmunlearn_cpu_roofline_share: float | None = None

    @property
    def goal_met(self) -> bool:
        return self.ratio >= GOAL_RATIO

    @property
    def cpu_ratio(self) -> float | None:
        """mmunlearn/plain on thread CPU seconds (less sensitive than wall time to a busy machine)."""
        if not self.plain_cpu_runs or not self.mmunlearn_cpu_runs:
            return None
        return statistics.median(self.plain_cpu_runs) / statistics.median(self.mmunlearn_cpu_runs)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "goal_met": self.goal_met, "cpu_ratio": self.cpu_ratio}


@dataclass
class Variant:
    """One implementation of the ablation, timed in the same rounds as "before" (the project's code without its
    speed-ups) and the plain loop on the same tokens."""

    stage: str
    precision: str
    name: str
    tokens: int
    runs: list[float]
    cpu_runs: list[float]
    before_runs: list[float]
    before_cpu_runs: list[float]
    plain_runs: list[float]
    plain_cpu_runs: list[float]

    def _ratio(self, other: list[float], mine: list[float]) -> float:
        return statistics.median(other) / statistics.median(mine)

    def to_dict(self) -> dict[str, Any]:
        med = statistics.median
        return {
            **asdict(self),
            "tokens_per_s": self.tokens / med(self.runs),
            "cpu_tokens_per_s": self.tokens / med(self.cpu_runs),
            "speedup_vs_before": self._ratio(self.before_runs, self.runs),
            "cpu_speedup_vs_before": self._ratio(self.before_cpu_runs, self.cpu_runs),
            "vs_plain": self._ratio(self.plain_runs, self.runs),
            "cpu_vs_plain": self._ratio(self.plain_cpu_runs, self.cpu_runs),
        }


@dataclass
class Check:
    """A bound the run is held to, and whether it held."""

    name: str
    passed: bool
    measured: str
    #: goal (tokens/s ratio), accuracy (bf16 against float32), memorised (a bound meant for a memorised
    #: model), same (the two implementations compute the same thing)
    kind: str = "accuracy"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PrecisionResult:
    model: str
    parameters: int
    data: str
    split: str
    batch: int  # QA rows per batch
    batch_tokens: int  # real tokens of the training / scoring batch
    answer_tokens: int  # of which labelled (answer) tokens
    new_tokens: int
    repeats: int
    threads: int
    rows: list[PrecisionRow] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    weights_changed: bool | None = None  # after the train stage (None: not run)
    bf16_copy_seconds: float | None = None  # entering bf16_generation (one bf16 copy), outside the timings
    variants: list[Variant] = field(default_factory=list)  # the ablation (--ablation)
    roofline: list[dict[str, Any]] = field(default_factory=list)  # matmul measurements, before and after the stages

    @property
    def goal_met(self) -> bool:
        return all(r.goal_met for r in self.rows)

    def row(self, stage: str, precision: str) -> PrecisionRow:
        for r in self.rows:
            if r.stage == stage and r.precision == precision:
                return r
        raise KeyError(f"no row for stage {stage!r} at precision {precision!r}")

    def to_dict(self) -> dict[str, Any]:
        plain = {k: v for k, v in asdict(self).items() if k not in ("rows", "checks", "variants")}
        return {
            **plain,
            "goal_ratio": GOAL_RATIO,
            "goal_met": self.goal_met,
            "rows": [r.to_dict() for r in self.rows],
            "checks": [c.to_dict() for c in self.checks],
            "variants": [v.to_dict() for v in self.variants],
        }


# ---------------------------------------------------------------------------------------------- report
COLUMNS = (
    "stage",
    "precision",
    "plain tok/s",
    "mmunlearn tok/s",
    "mmunlearn/plain",
    "mmunlearn/plain (CPU time)",
    "share of matmul roofline (plain / mmunlearn)",
    "share of matmul roofline, CPU time (plain / mmunlearn)",
    "speed-up vs float32 (plain / mmunlearn)",
    "accuracy",
)
#: the ablation table's columns
VARIANT_COLUMNS = (
    "stage",
    "precision",
    "implementation",
    "tok/s",
    "tok/CPU-s",
    "vs before",
    "vs before (CPU time)",
    "vs plain (CPU time)",
)


def _share(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def table_rows(res: PrecisionResult) -> list[tuple[str, ...]]:
    """The printed table's cells, one tuple per row (:data:`COLUMNS`); tokens are real (unpadded) tokens."""
    return [
        (
            r.stage,
            r.precision,
            f"{r.plain_tokens_per_s:.1f}",
            f"{r.mmunlearn_tokens_per_s:.1f}",
            f"{r.ratio:.2f}x",
            "n/a" if r.cpu_ratio is None else f"{r.cpu_ratio:.2f}x",
            f"{_share(r.plain_roofline_share)} / {_share(r.mmunlearn_roofline_share)}",
            f"{_share(r.plain_cpu_roofline_share)} / {_share(r.mmunlearn_cpu_roofline_share)}",
            f"{r.plain_speedup:.2f}x / {r.mmunlearn_speedup:.2f}x",
            r.agreement,
        )
        for r in res.rows
    ]


def variant_rows(res: PrecisionResult) -> list[tuple[str, ...]]:
    """The ablation table's cells (:data:`VARIANT_COLUMNS`)."""
    out = []
    for v in res.variants:
        d = v.to_dict()
        out.append(
            (
                v.stage,
                v.precision,
                v.name,
                f"{d['tokens_per_s']:.1f}",
                f"{d['cpu_tokens_per_s']:.1f}",
                f"{d['speedup_vs_before']:.2f}x",
                f"{d['cpu_speedup_vs_before']:.2f}x",
                f"{d['cpu_vs_plain']:.2f}x",
            )
        )
    return out


def roofline_line(res: PrecisionResult) -> str:
    """The matmul measurements in words."""
    parts = [
        f"{m['precision']} n={m['n']} {m['flops_per_s'] / 1e9:.1f} GFLOP/s ({m['cpu_flops_per_s'] / 1e9:.1f} per CPU-s)"
        for m in res.roofline
    ]
    return "matmul roofline (same thread; before and after the stages): " + "; ".join(parts)


def goal_lines(res: PrecisionResult) -> list[str]:
    """One line per row: "goal met" or "GOAL MISSED by ..." against :data:`GOAL_RATIO`."""
    return [
        f"{r.stage} {r.precision}: mmunlearn/plain {r.ratio:.2f}x: "
        + ("goal met" if r.goal_met else f"GOAL MISSED by {GOAL_RATIO - r.ratio:.2f}")
        + f" (>= {GOAL_RATIO}x)"
        for r in res.rows
    ]


def facts_line(res: PrecisionResult) -> str:
    m = res.machine
    return (
        f"{res.threads} torch thread(s); {m.get('cores')} cores ({m.get('cpu')}); torch {m.get('torch')}; "
        f"avx512_bf16 {m.get('avx512_bf16')}; load average (1 min) {m.get('load_1min_before')} before, "
        f"{m.get('load_1min_after')} after"
    )


def markdown(res: PrecisionResult) -> str:
    """The table, the goal lines, the checks and the machine facts as Markdown."""
    lines = _md(COLUMNS, table_rows(res), {2, 3, 4, 5, 6, 7, 8})
    lines += ["", "Tokens are the batch's real tokens (padding excluded)."]
    if res.variants:
        lines += ["", *_md(VARIANT_COLUMNS, variant_rows(res), set(range(3, 8)))]
    if res.roofline:
        lines += ["", roofline_line(res)]
    lines += ["", *[f"- {line}" for line in goal_lines(res)], ""]
    lines += [f"- {'PASS' if c.passed else 'MISS'} {c.name}: {c.measured}" for c in res.checks if c.kind != "goal"]
    lines += ["", facts_line(res)]
    return "\n".join(lines)


def _md(columns: tuple[str, ...], rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    out = [
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---:" if i in right else "---" for i in range(len(columns))) + "|",
    ]
    return out + ["| " + " | ".join(cells) + " |" for cells in rows]
