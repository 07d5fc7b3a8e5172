"""Unlearning methods as plug-ins (one module each, one registry) and the harness that runs any of them.

``mmunlearn.methods.get(name)`` gives a :class:`~mmunlearn.methods.base.Method`; importing this package
registers the built-in ones: QR-Erase, QR-Erase-rows, SVD-UNLEARN (:mod:`.erasure`), the optimisation
methods (:mod:`.optimisation`), T3 (:mod:`.t3`) and RMU (:mod:`.rmu`).
"""

from mmunlearn.methods import erasure, optimisation, rmu, t3  # noqa: F401  (register)
from mmunlearn.methods.base import (
    MAKES,
    NEEDS,
    REGISTRY,
    Artefacts,
    Method,
    MethodResult,
    RunContext,
    artefact_files,
    get,
    load_unlearned,
    model_folder,
    names,
    needing,
    register,
)
from mmunlearn.methods.harness import Outcome, run_unlearning
from mmunlearn.methods.request import UnlearnRequest
from mmunlearn.methods.rule import SweepRule, mean_nll

__all__ = [
    "MAKES",
    "NEEDS",
    "REGISTRY",
    "Artefacts",
    "Method",
    "MethodResult",
    "Outcome",
    "RunContext",
    "SweepRule",
    "UnlearnRequest",
    "artefact_files",
    "get",
    "load_unlearned",
    "mean_nll",
    "model_folder",
    "names",
    "needing",
    "register",
    "run_unlearning",
]
