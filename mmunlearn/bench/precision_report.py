"""What ``mmunlearn bench precision`` reports: its rows, checks and result, rendered as table cells and Markdown."""

from __future__ import annotations

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

    @property
    def goal_met(self) -> bool:
        return self.ratio >= GOAL_RATIO

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "goal_met": self.goal_met}


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

    @property
    def goal_met(self) -> bool:
        return all(r.goal_met for r in self.rows)

    def row(self, stage: str, precision: str) -> PrecisionRow:
        for r in self.rows:
            if r.stage == stage and r.precision == precision:
                return r
        raise KeyError(f"no row for stage {stage!r} at precision {precision!r}")

    def to_dict(self) -> dict[str, Any]:
        plain = {k: v for k, v in asdict(self).items() if k not in ("rows", "checks")}
        return {**plain, "goal_ratio": GOAL_RATIO, "goal_met": self.goal_met,
                "rows": [r.to_dict() for r in self.rows], "checks": [c.to_dict() for c in self.checks]}


# ---------------------------------------------------------------------------------------------- report
COLUMNS = ("stage", "precision", "plain tok/s", "mmunlearn tok/s", "mmunlearn/plain",
           "speed-up vs float32 (plain / mmunlearn)", "accuracy")


def table_rows(res: PrecisionResult) -> list[tuple[str, ...]]:
    """The printed table's cells, one tuple per row (:data:`COLUMNS`)."""
    return [(r.stage, r.precision, f"{r.plain_tokens_per_s:.1f}", f"{r.mmunlearn_tokens_per_s:.1f}",
             f"{r.ratio:.2f}x", f"{r.plain_speedup:.2f}x / {r.mmunlearn_speedup:.2f}x", r.agreement)
            for r in res.rows]


def goal_lines(res: PrecisionResult) -> list[str]:
    """One line per row: "goal met" or "GOAL MISSED by ..." against :data:`GOAL_RATIO`."""
    return [f"{r.stage} {r.precision}: mmunlearn/plain {r.ratio:.2f}x: "
            + ("goal met" if r.goal_met else f"GOAL MISSED by {GOAL_RATIO - r.ratio:.2f}")
            + f" (>= {GOAL_RATIO}x)" for r in res.rows]


def facts_line(res: PrecisionResult) -> str:
    m = res.machine
    return (f"{res.threads} torch thread(s); {m.get('cores')} cores ({m.get('cpu')}); torch {m.get('torch')}; "
            f"avx512_bf16 {m.get('avx512_bf16')}; load average (1 min) {m.get('load_1min_before')} before, "
            f"{m.get('load_1min_after')} after")


def markdown(res: PrecisionResult) -> str:
    """The table, the goal lines, the checks and the machine facts as Markdown."""
    right = {2, 3, 4, 5}
    lines = ["| " + " | ".join(COLUMNS) + " |",
             "|" + "|".join("---:" if i in right else "---" for i in range(len(COLUMNS))) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(res)]
    lines += ["", *[f"- {line}" for line in goal_lines(res)], ""]
    lines += [f"- {'PASS' if c.passed else 'MISS'} {c.name}: {c.measured}" for c in res.checks if c.kind != "goal"]
    lines += ["", facts_line(res)]
    return "\n".join(lines)
