"""Every example in a docstring of the package runs and gives what it shows (doctest over all modules)."""

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in (ROOT / "mmunlearn").rglob("*.py")
    if ">>>" in p.read_text()
)


def test_the_modules_with_examples_are_found():
    assert "mmunlearn.train.answer_only" in MODULES and len(MODULES) >= 5


@pytest.mark.parametrize("name", MODULES)
def test_doctest(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_the_examples_are_many():
    attempted = sum(doctest.testmod(importlib.import_module(n)).attempted for n in MODULES)
    assert attempted >= 40  # 22 in erase/ and metrics/ alone when the suite first ran them
