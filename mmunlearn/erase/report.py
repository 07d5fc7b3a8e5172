"""The erase report: every layer with its energy, whether it was edited, ranks, norms, time.

Layers with an edit larger than :data:`LARGE_UPDATE` times the weights it changes are flagged
(``large_update_layers`` in the JSON, a warning under the table).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.report.figures import figure

# An edit with ||dW||_F / ||W||_F above this in any matrix of a layer is flagged: it changes the
# weights by more than half their size, which usually means a --scale far too large or task
# matrices that belong to another model. The edit is still made (and can be undone).
LARGE_UPDATE = 0.5


@dataclass
class MatrixRow:
    """One edited matrix."""

    name: str
    shape: tuple[int, int]
    rank_forget: int
    rank_retain: int
    captured: float  # forget energy fraction captured by the forget basis
    norm_removed: float  # ||scale * T~||_F
    rel_norm_removed: float  # norm_removed / ||W||_F
    seconds: float


@dataclass
class LayerRow:
    """One layer group (a transformer block or module group)."""

    layer: str
    energy: float
    selected: bool
    matrices: list[MatrixRow] = field(default_factory=list)

    @property
    def norm_removed(self) -> float:
        return sum(m.norm_removed**2 for m in self.matrices) ** 0.5

    @property
    def rank(self) -> int:
        return max((m.rank_forget for m in self.matrices), default=0)

    @property
    def seconds(self) -> float:
        return sum(m.seconds for m in self.matrices)


@dataclass
class EraseReport:
    """What ``erase`` did. ``to_json`` / ``table`` / ``plot_energy`` present it."""

    method: str
    settings: dict
    layers: list[LayerRow]
    seconds: float
    patch_path: str | None = None
    patch: object | None = None  # the UndoPatch, kept in memory
    undo: dict | None = None  # mmunlearn erase: where the undo folder is ({"folder": ..., "id": ...}, undo_store)

    @property
    def selected(self) -> list[str]:
        return [row.layer for row in self.layers if row.selected]

    @property
    def energies(self) -> dict[str, float]:
        return {row.layer: row.energy for row in self.layers}

    @property
    def large_update_layers(self) -> list[str]:
        """Layers with a matrix whose relative update ||dW|| / ||W|| exceeds :data:`LARGE_UPDATE`."""
        return [row.layer for row in self.layers if any(m.rel_norm_removed > LARGE_UPDATE for m in row.matrices)]

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "settings": self.settings,
            "seconds": self.seconds,
            "patch": self.patch_path,
            **({"undo": self.undo} if self.undo is not None else {}),
            "selected": self.selected,
            "large_update_layers": self.large_update_layers,
            "large_update_threshold": LARGE_UPDATE,
            "layers": [
                {
                    **{k: v for k, v in asdict(row).items() if k != "matrices"},
                    "rank": row.rank,
                    "norm_removed": row.norm_removed,
                    "seconds": row.seconds,
                    "matrices": [asdict(m) for m in row.matrices],
                }
                for row in self.layers
            ],
        }

    def to_json(self, path: str | os.PathLike) -> Path:
        """Write the report as JSON, atomically (a NaN value is written as ``NaN``, not refused)."""
        return write_text_atomic(path, json.dumps(self.to_dict(), indent=2))

    def table(self):
        """A rich Table with one row per layer."""
        from rich.table import Table

        t = Table(
            title=f"erase ({self.method}): {len(self.selected)}/{len(self.layers)} layers edited "
            f"in {self.seconds:.2f} s"
        )
        for col in ("layer", "energy", "edited", "rank", "norm removed", "time (s)"):
            t.add_column(col, justify="left" if col == "layer" else "right")
        for row in self.layers:
            t.add_row(
                row.layer,
                f"{row.energy:.4f}",
                "yes" if row.selected else "",
                str(row.rank) if row.selected else "",
                f"{row.norm_removed:.4g}" if row.selected else "",
                f"{row.seconds:.3f}" if row.selected else "",
            )
        if self.large_update_layers:
            t.caption = (
                f"warning: ||dW||/||W|| > {LARGE_UPDATE} in {', '.join(self.large_update_layers)}: "
                "an update larger than half the weights (check --scale and the task matrices)"
            )
            t.caption_style = "bold red"
        return t

    def plot_energy(self, path: str | os.PathLike) -> Path:
        """Bar plot of layer energies, edited layers highlighted, the 1/|L| line drawn."""
        names = [row.layer for row in self.layers]
        with figure(path, figsize=(max(6, 0.35 * len(names) + 2), 4)) as (_, ax):
            colors = ["tab:red" if row.selected else "tab:gray" for row in self.layers]
            ax.bar(range(len(names)), [row.energy for row in self.layers], color=colors)
            ax.axhline(1 / len(names), color="black", linestyle="--", linewidth=1, label="1/|L|")
            ax.set_xticks(range(len(names)), names, rotation=70, ha="right", fontsize=7)
            ax.set_ylabel("task energy  ||T_f^l|| / sum_j ||T_f^j||")
            ax.set_title("Layer energy of the forget task (red: edited)")
            ax.legend()
        return Path(path)
