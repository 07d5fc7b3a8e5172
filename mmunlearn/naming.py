"""Parameter-name conventions shared by the adapters and erasure: a parameter's default layer group (block prefix).

Adapters group their weights with it (``layers()``) and erasure falls back on it when an adapter's ``groups()`` is
None; it lives here, beside neither, so that ``adapters/`` never imports ``erase/`` (tests/codebase/test_layers.py).

>>> group_of("model.layers.3.mlp.up_proj.weight"), group_of("lm_head.weight"), group_of("bias")
('model.layers.3', 'lm_head', 'bias')
"""

from __future__ import annotations

import re

_BLOCK = re.compile(r"^(.*?\.\d+)(?:\.|$)")


def group_of(name: str) -> str:
    """Default layer group of a parameter name: its prefix through the first numeric part."""
    match = _BLOCK.match(name)
    if match:
        return match.group(1)
    return name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name


__all__ = ["group_of"]
