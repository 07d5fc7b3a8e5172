"""Hyperparameters of one training run (:class:`TrainConfig`), validated, hashable and JSON-friendly."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("onecycle", "constant", "linear", "cosine")
PRECISIONS = ("no", "bf16", "fp16", "auto")


@dataclass(frozen=True)
class TrainConfig:
    """What :func:`mmunlearn.train.train` needs to know besides the model and the data.

    Exactly one of ``epochs`` (passes over the data) and ``steps`` (optimizer steps) is set.
    ``batch_size`` is per process and per micro-batch; the effective batch is
    ``batch_size * grad_accum * processes``. ``warmup`` is the fraction of optimizer steps spent
    warming up (None: 0.3 for ``onecycle``, whose peak it places, else 0). Weight decay applies to
    parameters of two or more dimensions only (not to norms and biases).
    """

    epochs: int | None = None
    steps: int | None = None
    batch_size: int = 16
    lr: float = 1e-3
    optimizer: str = "adamw"
    schedule: str = "constant"
    warmup: float | None = None
    weight_decay: float = 0.0
    grad_accum: int = 1
    max_grad_norm: float | None = 1.0
    mixed_precision: str = "no"
    seed: int = 0
    shuffle: bool = True
    betas: tuple[float, float] = (0.9, 0.999)

    def __post_init__(self) -> None:
        if (self.epochs is None) == (self.steps is None):
            raise ValueError(f"give exactly one of epochs and steps (got epochs={self.epochs}, steps={self.steps})")
        for name in ("epochs", "steps", "batch_size", "grad_accum"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.warmup is not None and not 0.0 <= self.warmup < 1.0:
            raise ValueError(f"warmup is a fraction of the steps in [0, 1), got {self.warmup!r}")
        if self.schedule == "onecycle" and self.warmup == 0.0:
            raise ValueError("the onecycle schedule needs warmup > 0 (the fraction of steps before its peak)")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be positive or None, got {self.max_grad_norm!r}")
        if self.mixed_precision not in PRECISIONS:
            raise ValueError(f"mixed_precision must be one of {PRECISIONS}, got {self.mixed_precision!r}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))

    @property
    def warmup_fraction(self) -> float:
        """``warmup`` with the schedule's default filled in."""
        if self.warmup is not None:
            return self.warmup
        return 0.3 if self.schedule == "onecycle" else 0.0

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with some fields changed (unknown names raise ``TypeError``). Setting ``steps`` clears
        ``epochs`` and vice versa, so a preset's epochs can be overridden by a step count."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"unknown training option(s): {', '.join(sorted(unknown))}")
        if "steps" in changes and changes["steps"] is not None and "epochs" not in changes:
            changes["epochs"] = None
        if "epochs" in changes and changes["epochs"] is not None and "steps" not in changes:
            changes["steps"] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["betas"] = list(self.betas)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        data = dict(data)
        if "betas" in data:
            data["betas"] = tuple(data["betas"])
        return cls(**data)


@functools.lru_cache(maxsize=1)
def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU computes bf16 natively (the ``avx512_bf16`` or ``amx_bf16`` flag of /proc/cpuinfo; False
    where there is no such file). Without it PyTorch emulates bf16 on the CPU: on an AVX2-only CPU a SmolLM2-135M
    training step under bf16 autocast ran at 0.11x float32's speed, scoring at 0.20x (docs/benchmarks.md, record
    bench_precision_smollm2_avx2_table)."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def native_bf16(device_type: str) -> bool:
    """Whether bf16 is fast on ``device_type``: a CUDA device that supports it, or a CPU with native bf16."""
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return cpu_has_native_bf16()


def resolve_mixed_precision(mode: str, device_type: str) -> str:
    """``auto`` -> bf16 where it is native (:func:`native_bf16`: a CUDA device that supports it, a CPU with
    AVX512_BF16 or AMX), else ``no``; fp16 needs CUDA; an explicit bf16 on a CPU without native bf16 is kept and
    warned about (it is emulated, many times slower)."""
    if mode not in PRECISIONS:
        raise ValueError(f"mixed_precision must be one of {PRECISIONS}, got {mode!r}")
    if mode == "auto":
        return "bf16" if native_bf16(device_type) else "no"
    if mode == "bf16" and device_type == "cpu" and not cpu_has_native_bf16():
        warnings.warn(
            "mixed_precision='bf16' on a CPU without native bf16 (no avx512_bf16/amx_bf16 flag): PyTorch "
            "emulates it, many times slower than float32; 'auto' picks float32 here",
            stacklevel=2,
        )
    if mode == "fp16" and device_type != "cuda":
        raise ValueError(f"mixed_precision='fp16' needs a CUDA device (training on {device_type}); use 'bf16' or 'no'")
    if mode == "bf16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("mixed_precision='bf16' is not supported by this GPU; use 'fp16' or 'no'")
    return mode
