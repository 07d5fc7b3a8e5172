"""mmunlearn: machine unlearning for text LLMs, speech LLMs and speaker classifiers."""

from mmunlearn import _compat

_compat.patch_torchaudio()  # before anything imports torchaudio, speechbrain or HF audio code

from mmunlearn._version import __version__  # noqa: E402
from mmunlearn.erase import (  # noqa: E402
    Basis,
    EraseReport,
    column_basis,
    discriminate,
    erase,
    layer_energy,
    restore,
    select_layers,
)

__all__ = [
    "Basis",
    "unlearn",
    "load",
    "EraseReport",
    "__version__",
    "column_basis",
    "discriminate",
    "erase",
    "layer_energy",
    "restore",
    "select_layers",
]


def __getattr__(name: str):
    """``mmunlearn.unlearn``: the voice-pipeline entry point (:func:`mmunlearn.api.unlearn.unlearn`), and
    ``mmunlearn.load``: the unlearned model of an output folder (:func:`mmunlearn.api.load.load`), imported on
    first use so that ``import mmunlearn`` stays light."""
    if name == "unlearn":
        from mmunlearn.api.unlearn import unlearn  # deferred: keeps `import mmunlearn` light (the package face)

        return unlearn
    if name == "load":
        from mmunlearn.api.load import load  # deferred: keeps `import mmunlearn` light (the package face)

        return load
    raise AttributeError(f"module 'mmunlearn' has no attribute {name!r}")
