"""Quantisation attack: round-trip the weights through 8-bit and 4-bit formats and re-measure forgetting.

Zhang et al., ICLR 2025 ("Catastrophic failure of LLM unlearning via quantization") show that 4-bit weight
quantisation of a GradAscent/NPO-unlearned model brings back much of the forgotten knowledge: the unlearning
update is small next to the quantisation step, so rounding snaps the weights back towards the target's.

Library: ``gguf`` (ggml-org's Python package for llama.cpp's format, already a dependency of mmunlearn for the
SmolLM2 preset). Its ``gguf.quants`` quantises and de-quantises on the CPU in numpy, with the very block
formats people run quantised models in (llama.cpp, Ollama): ``Q8_0`` (8-bit, blocks of 32 weights with one
scale) and ``Q4_0`` (4-bit round-to-nearest, blocks of 32 with one scale: the RTN setting of Zhang et al.).
Chosen over torchao (its CPU int4 path needs packed layouts and kernels tied to the torch build), optimum-quanto
(last release March 2025, compiles extensions at run time) and bitsandbytes (CUDA-first; its CPU backend is
partial): none of those is installed, and gguf runs everywhere torch does with nothing new to install.

Weight-only, as in the paper: every weight the model family's adapter exposes (``adapter.layers()``: the
decoder blocks' linear layers of an LLM; the convolutions, linear layers and class matrix of a speaker
classifier) is quantised row by row; embeddings, norms and biases stay as they are. A row whose length is not
a multiple of the 32-weight block is padded with zeros for the round trip (zeros change no block's scale);
llama.cpp would keep such a tensor unquantised, so this is the stricter reading.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: Bits -> GGUF quantisation type name.
FORMATS: dict[int, str] = {8: "Q8_0", 4: "Q4_0"}


def _qtype(bits: int):
    from gguf import GGMLQuantizationType

    if bits not in FORMATS:
        raise ValueError(f"bits must be one of {sorted(FORMATS)}, got {bits}")
    return getattr(GGMLQuantizationType, FORMATS[bits])


@torch.no_grad()
def round_trip(weight: torch.Tensor, bits: int) -> torch.Tensor:
    """``weight`` (2-D or more: rows = first dimension) quantised to ``bits`` and back, same shape and dtype."""
    from gguf import GGML_QUANT_SIZES, quants

    if weight.dim() < 2:
        raise ValueError(f"round_trip quantises matrices and kernels (2-D or more), got shape {tuple(weight.shape)}")
    qtype = _qtype(bits)
    block = GGML_QUANT_SIZES[qtype][0]
    rows = weight.detach().to("cpu", torch.float32).reshape(weight.shape[0], -1).numpy()
    width = rows.shape[1]
    padded = -(-width // block) * block
    if padded != width:
        rows = np.pad(rows, ((0, 0), (0, padded - width)))
    back = quants.dequantize(quants.quantize(np.ascontiguousarray(rows), qtype), qtype)[:, :width]
    return torch.from_numpy(np.ascontiguousarray(back)).reshape(weight.shape).to(weight.device, weight.dtype)


def quantised(adapter: Any, bits: int) -> Any:
    """A copy of ``adapter`` whose ``layers()`` weights went through the ``bits`` round trip."""
    twin = adapter.clone()
    for lw in twin.layers():
        lw.weight.data.copy_(round_trip(lw.weight.data, bits))
    return twin
