"""QR-Erase core: subspace recovery (CPQR, SVD), retain discrimination, layer energy, apply/undo."""

from mmunlearn.erase.apply import PATCH_NAME, REPORT_NAME, erase, merge_erases, restore
from mmunlearn.erase.energy import group_of, layer_energy, select_layers
from mmunlearn.erase.patch import UndoPatch
from mmunlearn.erase.report import EraseReport
from mmunlearn.erase.subspace.basis import METHODS, Basis, column_basis
from mmunlearn.erase.subspace.discriminate import discriminate, discriminate_factors

__all__ = [
    "METHODS",
    "PATCH_NAME",
    "REPORT_NAME",
    "Basis",
    "EraseReport",
    "UndoPatch",
    "column_basis",
    "discriminate",
    "discriminate_factors",
    "erase",
    "group_of",
    "layer_energy",
    "merge_erases",
    "restore",
    "select_layers",
]
