"""bf16 is chosen only where it is native: ``auto`` (the real checkpoints' preset setting) picks float32 on a CPU
without AVX512_BF16/AMX, where emulated bf16 is many times slower, and an explicit bf16 there is kept with a warning."""

from __future__ import annotations

import warnings

import pytest

from mmunlearn.presets.models import REAL_MODELS
from mmunlearn.train import config as train_config
from recipes.tofu.settings import default_precision


@pytest.fixture(params=[True, False], ids=["native-bf16-cpu", "avx2-only-cpu"])
def cpu_bf16(request, monkeypatch) -> bool:
    monkeypatch.setattr(train_config, "cpu_has_native_bf16", lambda: request.param)
    return request.param


def test_auto_is_bf16_only_where_the_cpu_has_it(cpu_bf16):
    assert train_config.resolve_mixed_precision("auto", "cpu") == ("bf16" if cpu_bf16 else "no")
    assert REAL_MODELS["smollm2-135m"][1].mixed_precision == "auto"  # the real checkpoint's fine-tuning follows it
    assert default_precision("smollm2-135m", "cpu") == ("bf16" if cpu_bf16 else "no")  # and its scoring
    assert default_precision("micro", "cpu") == "no" and default_precision("mini", "auto") == "no"


def test_an_explicit_bf16_is_kept_and_warned_about_only_where_it_is_emulated(cpu_bf16):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert train_config.resolve_mixed_precision("bf16", "cpu") == "bf16"
        assert train_config.resolve_mixed_precision("no", "cpu") == "no"
    emulated = [w for w in caught if "without native bf16" in str(w.message)]
    assert len(emulated) == (0 if cpu_bf16 else 1)


def test_the_cpu_flags_are_read_from_cpuinfo(tmp_path, monkeypatch):
    flags = {
        "with": "flags\t\t: fpu sse avx2 avx512f avx512_bf16\n",
        "amx": "flags : fpu avx2 amx_bf16 amx_tile\n",
        "without": "flags\t\t: fpu sse avx avx2\n",
        "empty": "processor : 0\n",
    }
    seen = {}
    for name, text in flags.items():
        info = tmp_path / name
        info.write_text("processor : 0\n" + text)
        seen[name] = train_config.cpu_has_native_bf16.__wrapped__(info)
    assert seen == {"with": True, "amx": True, "without": False, "empty": False}
    assert train_config.cpu_has_native_bf16.__wrapped__(tmp_path / "missing") is False
