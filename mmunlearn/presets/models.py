"""Model presets built from code (``micro`` for tests, ``mini`` for the CPU demo) or a local model directory.

A preset names an architecture (a Llama built from a config, never downloaded), the size of its
byte-level BPE and of its pretraining corpus, and the training hyperparameters of its two phases:
``pretrain`` (the ``base`` model, on the built-in corpus) and ``finetune`` (target and retain models,
on TOFU). A directory holding a real checkpoint (e.g. Llama-3.2-1B-Instruct) is the third kind:
it is fine-tuned as it is, with its own tokenizer and the TOFU reference settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mmunlearn.presets.gguf import smollm2_dir
from mmunlearn.train.config import TrainConfig


@dataclass(frozen=True)
class LlamaArch:
    """A Llama decoder sized by hand; ``vocab_size`` is that of the BPE trained for it."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab_size: int
    max_positions: int = 512
    tie_embeddings: bool = True
    rope_theta: float = 10000.0

    def build(self, tokenizer, seed: int = 0):
        """A freshly initialised ``LlamaForCausalLM`` (seeded) matching ``tokenizer``'s vocabulary and specials."""
        from transformers import LlamaConfig, LlamaForCausalLM

        if len(tokenizer) > self.vocab_size:
            raise ValueError(
                f"tokenizer has {len(tokenizer)} tokens but the architecture's vocab_size is {self.vocab_size}"
            )
        config = LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=self.max_positions,
            tie_word_embeddings=self.tie_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


@dataclass(frozen=True)
class Preset:
    """Everything needed to build base, target and retain models of one kind.

    For a built preset ``arch`` is set and ``model_dir`` None; for a model directory the reverse
    (and ``pretrain`` is None: the checkpoint is its own base).
    """

    name: str
    finetune: TrainConfig
    arch: LlamaArch | None = None
    pretrain: TrainConfig | None = None
    corpus_authors: int = 0  # fictitious authors in the pretraining corpus (20 QA each)
    max_length: int = 512  # tokens per QA example
    model_dir: Path | None = None
    replay_facts: bool = False  # mix the data's real-authors / world-facts QA into target and retain training

    @property
    def is_model_dir(self) -> bool:
        return self.model_dir is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly description (part of the cache key of the models built from it)."""
        return {
            "name": self.name,
            "arch": dataclasses.asdict(self.arch) if self.arch else None,
            "pretrain": self.pretrain.to_dict() if self.pretrain else None,
            "finetune": self.finetune.to_dict(),
            "corpus_authors": self.corpus_authors,
            "max_length": self.max_length,
            "replay_facts": self.replay_facts,
            "model_dir": _dir_fingerprint(self.model_dir) if self.model_dir else None,
        }


MICRO = Preset(
    name="micro",
    arch=LlamaArch(hidden=64, layers=2, heads=4, kv_heads=4, intermediate=256, vocab_size=1024, max_positions=384),
    pretrain=TrainConfig(epochs=4, batch_size=16, lr=4e-3, schedule="onecycle", weight_decay=0.01),
    finetune=TrainConfig(epochs=8, batch_size=16, lr=4e-3, schedule="onecycle", weight_decay=0.01),
    corpus_authors=10,
    max_length=384,
    replay_facts=True,
)

# Measured here: 5.2M parameters (hidden 256, 4 layers, 4 heads, FFN 1024, tied 4,096-token embeddings)
# memorise 40 TOFU authors to an answer loss of 0.02 in about 22 epochs (AdamW 2e-3 one-cycle, batch 16).
MINI = Preset(
    name="mini",
    arch=LlamaArch(hidden=256, layers=4, heads=4, kv_heads=4, intermediate=1024, vocab_size=4096),
    pretrain=TrainConfig(epochs=8, batch_size=16, lr=2e-3, schedule="onecycle", weight_decay=0.01),
    finetune=TrainConfig(epochs=22, batch_size=16, lr=2e-3, schedule="onecycle", weight_decay=0.01),
    corpus_authors=60,
    max_length=512,
    replay_facts=True,
)

PRESETS: dict[str, Preset] = {p.name: p for p in (MICRO, MINI)}

# TOFU's reference fine-tuning of a real checkpoint: AdamW lr 1e-5, 5 epochs, effective batch 32
# (8 x 4 accumulation per process), weight decay 0.01, one epoch (20%) of linear warmup then linear decay,
# bf16 autocast where the GPU has it.
MODEL_DIR_FINETUNE = TrainConfig(
    epochs=5,
    batch_size=8,
    grad_accum=4,
    lr=1e-5,
    schedule="linear",
    warmup=0.2,
    weight_decay=0.01,
    mixed_precision="auto",
)


def _dir_fingerprint(path: Path) -> dict[str, Any]:
    """Identity of a model directory without reading its weights: resolved path, and name, size and
    mtime of each file (hashing gigabytes of weights on every call would be too slow)."""
    files = sorted(p for p in path.iterdir() if p.is_file())
    listing = [(p.name, p.stat().st_size, int(p.stat().st_mtime)) for p in files]
    digest = hashlib.sha256(repr(listing).encode()).hexdigest()[:16]
    return {"path": str(path.resolve()), "files": digest}


#: Real pretrained checkpoints by name: name -> (folder maker, fine-tuning settings). The folder is made on
#: first use and cached (see mmunlearn/presets/gguf.py). SmolLM2's settings were chosen by measurement on
#: this project's 2-core CPU (10 TOFU authors, 200 QA): AdamW lr 3e-4, batch 16, 6 epochs (78 steps), bf16
#: autocast, loss and LM head on the answer tokens only. The forget author's answers reach ROUGE-L 0.86 /
#: 0.99 / 0.97 and answer probability 0.94 / 0.96 / 0.98 after epochs 4 / 5 / 6 (pretrained: 0.31 / 0.08);
#: (``mixed_precision="auto"``: bf16 autocast where it is native -- a CPU with AVX512_BF16/AMX or a GPU -- float32
#: elsewhere: emulated bf16 trained at 0.11x float32's speed on an AVX2-only CPU, record
#: bench_precision_smollm2_avx2_table; :func:`mmunlearn.train.config.cpu_has_native_bf16`.)
#: lr 1e-4 (the earlier preset) reached ROUGE-L 0.39 in 5 epochs, and TOFU's reference (1e-5 x 5 epochs x
#: batch 32) barely moves the answer NLL. `tofu finetune --epochs/--lr/...` override them; every recipe
#: checks memorisation (recipes/tofu/settings.py) and warns when it failed.
REAL_MODELS: dict[str, tuple[str, TrainConfig]] = {
    "smollm2-135m": (
        "smollm2",
        TrainConfig(
            epochs=6, batch_size=16, lr=3e-4, schedule="linear", warmup=0.1, weight_decay=0.01, mixed_precision="auto"
        ),
    ),
}
#: Scoring / generation precision of the recipes per real checkpoint (``--precision`` overrides): bf16
#: autocast scoring and bf16 generation weights measured 2-3x faster on this CPU (AVX512_BF16) with mean
#: answer NLL within 0.02 of float32 (``mmunlearn bench precision``); the built presets stay float32. Where bf16 is
#: not native (a CPU without AVX512_BF16/AMX) the recipes score in float32 instead (``recipes.tofu.settings``).
REAL_MODEL_PRECISION: dict[str, str] = {"smollm2-135m": "bf16"}


def real_model_dir(name: str) -> Path:
    """The folder of the real checkpoint ``name`` (converted and cached on first use)."""
    if name not in REAL_MODELS:
        raise ValueError(f"unknown real model {name!r}; choose one of {', '.join(REAL_MODELS)}")
    return {"smollm2": smollm2_dir}[REAL_MODELS[name][0]]()


def get_preset(name_or_dir: str | os.PathLike) -> Preset:
    """The preset called ``name_or_dir`` (micro, mini, or a real checkpoint such as ``smollm2-135m``), or a
    model-directory preset for a checkpoint folder."""
    key = os.fspath(name_or_dir)
    if isinstance(name_or_dir, str) and key in PRESETS:
        return PRESETS[key]
    if isinstance(name_or_dir, str) and key in REAL_MODELS:
        return Preset(name=key, finetune=REAL_MODELS[key][1], model_dir=real_model_dir(key).resolve())
    path = Path(key).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"{path} has no config.json: pass a model directory in save_pretrained "
                f"layout, or one of the presets {', '.join(PRESETS)}"
            )
        return Preset(name=f"dir-{path.resolve().name}", finetune=MODEL_DIR_FINETUNE, model_dir=path.resolve())
    raise ValueError(
        f"unknown preset {key!r}: choose one of {', '.join([*PRESETS, *REAL_MODELS])} or give a model directory"
    )


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
