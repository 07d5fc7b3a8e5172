"""Make torchaudio's pure-Python parts (and SpeechBrain) importable beside a CPU-only torch.

PyPI's torchaudio wheels ship a native extension linked against CUDA (``libc10_cuda.so``).
Next to a CPU build of torch, ``import torchaudio`` then fails inside
``torchaudio._extension``, which also breaks ``import speechbrain`` and transformers' audio
code. The transforms, the Kaldi-compatible fbank and resampling are plain PyTorch and do not
need that extension. When (and only when) the extension cannot be loaded, we register a small
stand-in for ``torchaudio._extension`` that reports the extension as unavailable, so the rest
of torchaudio imports normally. Audio I/O never goes through torchaudio in this project
(see :mod:`mmunlearn.data.audio`).

No library offers this: torchaudio itself treats a present-but-unloadable extension as fatal.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import types
from pathlib import Path

#: Set by :func:`patch_torchaudio`: why the native extension was skipped (``None`` if it loaded
#: or torchaudio is absent).
TORCHAUDIO_NATIVE_ERROR: str | None = None


def _native_extension_error(lib_dir: Path) -> str | None:
    """Return the loader's error for torchaudio's native extension, or ``None`` if it loads."""
    import torch  # noqa: F401  (the extension resolves libtorch symbols from the loaded torch)

    for path in sorted(lib_dir.glob("_torchaudio*.so")):
        try:
            ctypes.CDLL(str(path))
        except OSError as exc:
            return str(exc)
    return None


def _stub_extension() -> types.ModuleType:
    mod = types.ModuleType("torchaudio._extension")
    mod.__doc__ = "mmunlearn stand-in: torchaudio's native extension is unavailable here."

    def _unavailable(*_args, **_kwargs):
        raise RuntimeError(
            "torchaudio's native extension could not be loaded (CUDA-linked wheel beside a "
            f"CPU-only torch: {TORCHAUDIO_NATIVE_ERROR}). Only its pure-Python parts work."
        )

    def fail_if_no_align(func):
        return _unavailable

    mod._MMUNLEARN_STUB = True
    mod._IS_TORCHAUDIO_EXT_AVAILABLE = False
    mod._IS_ALIGN_AVAILABLE = False
    mod.fail_if_no_align = fail_if_no_align
    mod._check_cuda_version = lambda: None
    mod._load_lib = lambda _lib: False
    mod.__all__ = ["_check_cuda_version", "_IS_TORCHAUDIO_EXT_AVAILABLE"]
    return mod


def patch_torchaudio() -> bool:
    """Install the stand-in extension if torchaudio's native one cannot load.

    Returns ``True`` if the stand-in was installed. Safe to call repeatedly; does nothing when
    torchaudio is not installed, already imported, or loads natively (e.g. with a CUDA torch).
    """
    global TORCHAUDIO_NATIVE_ERROR
    if "torchaudio._extension" in sys.modules or "torchaudio" in sys.modules:
        return getattr(sys.modules.get("torchaudio._extension"), "_MMUNLEARN_STUB", False)
    spec = importlib.util.find_spec("torchaudio")
    if spec is None or not spec.submodule_search_locations:
        return False
    lib_dir = Path(next(iter(spec.submodule_search_locations))) / "lib"
    error = _native_extension_error(lib_dir)
    if error is None:
        return False
    TORCHAUDIO_NATIVE_ERROR = error
    sys.modules["torchaudio._extension"] = _stub_extension()
    return True
