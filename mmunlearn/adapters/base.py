"""The adapter interface every model family implements, and device/dtype resolution."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from mmunlearn.progress import StageBar


class LayerWeight(NamedTuple):
    """One 2-D (or Conv1d / fused-expert) weight an adapter exposes for task matrices and erasure."""

    name: str  # parameter name in model.named_parameters()
    block: str  # layer group it belongs to (energy and selection are per group)
    weight: torch.nn.Parameter


@runtime_checkable
class ModalityAdapter(Protocol):
    """What task-vector extraction, erasure, T3 and the metrics need from a model family."""

    model: torch.nn.Module

    def layers(self) -> Iterator[LayerWeight]:
        """Every weight the methods may touch, with its layer group."""

    def collate(self, examples: Sequence[Any]) -> dict[str, torch.Tensor]:
        """Turn examples into a padded batch with ``labels`` (-100 outside the target tokens)."""

    # Scoring methods take an optional ``model`` (a training loop's possibly wrapped module).
    def loss(self, batch: dict[str, torch.Tensor], model: torch.nn.Module | None = None) -> torch.Tensor:
        """Mean NLL of the targets (differentiable)."""

    def logprobs(
        self, batch: dict[str, torch.Tensor], model: torch.nn.Module | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced per-token log-probs of the targets (B x T) and their mask."""

    def sequence_logprob(
        self, batch: dict[str, torch.Tensor], model: torch.nn.Module | None = None, average: bool = False
    ) -> torch.Tensor:
        """log p(y | x) per example (B,), summed over target tokens (or their mean); for NPO/SimNPO."""

    def target_distributions(
        self, batch: dict[str, torch.Tensor], model: torch.nn.Module | None = None
    ) -> torch.Tensor:
        """Log-probabilities over the output space at every target position (N x V); for KL terms."""

    def hidden_states(self, batch: dict[str, torch.Tensor], layer: int | str = "final") -> torch.Tensor:
        """Hidden states (B x T x d) at a layer; ``final`` is the last normed state."""

    def save(self, path: str | os.PathLike) -> None:
        """Write the model (and its tokenizer/processor) in ``save_pretrained`` layout."""

    def clone(self) -> Any:
        """An adapter of the same kind around a deep copy of the model (the methods edit copies, never the input)."""

    def with_model(self, model: torch.nn.Module) -> Any:
        """An adapter of the same kind and settings around ``model`` (T3 wraps the base this way)."""

    def groups(self) -> dict[str, str] | None:
        """Parameter name -> layer group (the unit of QR-Erase's per-layer energy rule); None: by block prefix."""

    def trainable_parameters(self) -> list[torch.nn.Parameter] | None:
        """The parameters a training method may change (a speech LLM's chosen tower); None: every parameter."""

    def answer_nll(
        self, examples: Sequence[Any], answers: Sequence[str] | None = None, batch_size: int = 16
    ) -> torch.Tensor:
        """Length-normalised NLL of each example's target (float, CPU, one value per example): what the sweep rule
        and ``mean_nll`` measure (:class:`AdapterDefaults` gives it from :meth:`collate` and
        :meth:`sequence_logprob`)."""

    def bf16_generation(self) -> Any:
        """A context manager within which generation may use a faster bf16 copy (default: nothing changes)."""


@runtime_checkable
class TokenAdapter(ModalityAdapter, Protocol):
    """A causal LM (text or speech): scores only its answer tokens (``mmunlearn.eval.scoring`` reads these)."""

    tokenizer: Any  # the text tokenizer: decodes the scored targets, counts gold-answer tokens
    # the id appended after every answer (scored; TOFU's per-token statistics drop it), None when none is appended
    # (:class:`TokenScoring`: None)
    eos_id: int | None
    # ``no`` or ``bf16`` (answer-only bf16 scoring and generation), recorded by the TOFU evaluation
    # (:class:`TokenScoring`: ``no``)
    precision: str

    def answer_logits(
        self, batch: dict[str, torch.Tensor], model: torch.nn.Module | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits at the scored positions only: (N x V logits, N targets, N row indices)."""

    def decoder_layers(self, model: torch.nn.Module | None = None) -> torch.nn.ModuleList:
        """The language model's decoder blocks of ``model`` (default: the adapter's), in order (RMU steers one)."""


@runtime_checkable
class ClassifierAdapter(ModalityAdapter, Protocol):
    """A speaker (utterance) classifier: what ``mmunlearn.eval.speaker``, the speaker rule and the audits call."""

    speakers: Sequence[str]  # class index -> speaker ID
    index: dict[str, int]  # speaker ID -> class index
    sample_rate: int
    # weight and bias names of the layer whose outputs are the embeddings, or None (QR-Erase's centroid step)
    embedding_output: tuple[str, str | None] | None
    # the parameter name of the class-weight matrix (one row per speaker): the ``head`` scope, QR-Erase's head rows
    head_weight: str
    # which weights erasure extracts from and edits: ``all``, ``head`` or ``embedding`` (speaker/batches.py: SCOPES)
    scope: str

    def logits_and_embeddings(
        self, batch: dict[str, torch.Tensor], model: torch.nn.Module | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Class logits (B x C) and utterance embeddings (B x d) of a batch."""

    def embeddings(self, batch: dict[str, torch.Tensor], model: torch.nn.Module | None = None) -> torch.Tensor:
        """Utterance embeddings (B x d)."""

    def nll(self, batch: dict[str, torch.Tensor], model: torch.nn.Module | None = None) -> torch.Tensor:
        """Per-utterance NLL of the labelled speaker (B,)."""

    def predict(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Predicted class indices (B,)."""


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` picks CUDA when present, else CPU; ``cpu``, ``cuda``, ``cuda:N``, ``mps``, ... are checked
    to exist here, so a typo or a missing accelerator is a readable ValueError, not a torch error later."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"unknown device {str(device)!r}; use auto, cpu, cuda, cuda:N or mps") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} requested but CUDA is not available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {str(device)!r} requested but only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
    if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ValueError(f"device {str(device)!r} requested but MPS is not available")
    return dev


def resolve_dtype(dtype: str | torch.dtype = "auto", device: torch.device | None = None) -> torch.dtype:
    """``auto``: bfloat16 on a GPU that supports it, else float32; or a name like ``float16``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device is not None and device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    named = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "float16": torch.float16,
        "fp16": torch.float16,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float64": torch.float64,
    }
    if dtype not in named:
        raise ValueError(f"unknown dtype {dtype!r}; choose auto or one of {sorted(named)}")
    return named[dtype]


IGNORE = -100  # label of the tokens that are not scored (prompt, padding)


class AdapterDefaults:
    """The optional parts of :class:`ModalityAdapter` with plain defaults; an adapter overrides what it does better."""

    @torch.no_grad()
    def answer_nll(
        self, examples: Sequence[Any], answers: Sequence[str] | None = None, batch_size: int = 16
    ) -> torch.Tensor:
        """Length-normalised NLL per example from :meth:`collate` and ``sequence_logprob(average=True)``."""
        if answers is not None:
            raise ValueError(f"{type(self).__name__} scores its examples' own targets: answers= is for language models")
        out = [
            -self.sequence_logprob(self.collate(examples[i : i + batch_size]), average=True).double().cpu()
            for i in range(0, len(examples), batch_size)
        ]
        return torch.cat(out) if out else torch.empty(0, dtype=torch.float64)

    @contextmanager
    def bf16_generation(self) -> Iterator[None]:
        """Nothing changes within the block (an adapter with a faster generation copy overrides this)."""
        yield

    def groups(self) -> dict[str, str] | None:
        """None: erasure groups parameters by their block prefix (:func:`mmunlearn.naming.group_of`)."""
        return None

    def trainable_parameters(self) -> list[torch.nn.Parameter] | None:
        """None: a training method may change every parameter of the model."""
        return None


class TokenScoring(AdapterDefaults):
    """Answer-token scores shared by the causal-LM adapters (text and speech LLM): each defines
    ``logits(batch, model) -> (B x T-1 x V logits, B x T-1 targets)``; these follow from it. An adapter
    that can project only the scored positions (:mod:`mmunlearn.train.answer_only`) overrides
    :meth:`answer_logits`, and every score below uses that."""

    eos_id: int | None = None  # no EOS appended after the answers (an adapter that appends one sets its id)
    precision: str = "no"  # full precision (an adapter with a bf16 mode sets it)

    def answer_logits(self, batch, model=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits at the scored positions only: (N x V float logits, N targets, N row indices)."""
        logits, targets = self.logits(batch, model)
        mask = targets != IGNORE
        return logits[mask].float(), targets[mask], mask.nonzero(as_tuple=True)[0]

    def decoder_layers(self, model=None) -> torch.nn.ModuleList:
        """The decoder blocks of a transformers causal LM (``get_decoder().layers``: Llama, Qwen2, Qwen2.5-Omni's
        thinker, ...); a ValueError naming the model class when it has none."""
        model = self.model if model is None else model
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        layers = getattr(decoder, "layers", None)
        if not isinstance(layers, torch.nn.ModuleList):
            raise ValueError(f"{type(model).__name__} has no decoder with .layers")
        return layers

    def loss(self, batch, model=None) -> torch.Tensor:
        """Mean NLL over all answer tokens of the batch."""
        logits, targets, _ = self.answer_logits(batch, model)
        return F.cross_entropy(logits.float(), targets)

    def logprobs(self, batch, model=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced log p(y_t | x, y_<t) of every answer token (B x T-1; 0 off the mask) and the mask."""
        logits, targets, _ = self.answer_logits(batch, model)
        mask = batch["labels"][:, 1:].to(targets.device) != IGNORE
        tok = torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        lp = torch.zeros(mask.shape, dtype=tok.dtype, device=tok.device)
        lp[mask] = tok
        return lp, mask

    def sequence_logprob(self, batch, model=None, average: bool = False) -> torch.Tensor:
        """log p(y | x) per example (B,): the sum over answer tokens, or their mean if ``average``."""
        lp, mask = self.logprobs(batch, model)
        total = lp.sum(1)
        return total / mask.sum(1).clamp(min=1) if average else total

    def target_distributions(self, batch, model=None) -> torch.Tensor:
        """Log-probabilities over the vocabulary at every answer position (N x V), for KL terms."""
        logits, _, _ = self.answer_logits(batch, model)
        return torch.log_softmax(logits.float(), -1)

    @torch.no_grad()
    def answer_nll(
        self,
        examples: Sequence[Any],
        answers: Sequence[str] | None = None,
        batch_size: int = 16,
        desc: str | None = None,
    ) -> torch.Tensor:
        """Mean answer-token NLL per example (length-normalised), float64 on the CPU; ``answers`` replace the
        examples' own (``collate(examples, answers)``)."""
        out = []
        for i in StageBar(range(0, len(examples), batch_size), desc=desc, disable=desc is None, leave=False):
            sub = answers[i : i + batch_size] if answers is not None else None
            lp, mask = self.logprobs(self.collate(examples[i : i + batch_size], sub))
            out.append((-(lp.double().sum(1)) / mask.sum(1).clamp(min=1)).cpu())
        return torch.cat(out) if out else torch.empty(0, dtype=torch.float64)


class HiddenStateTap:
    """Forward hook on a module that keeps its last output hidden states (a model's ``last_hidden_state``,
    or a decoder layer's output tensor, first of a tuple)."""

    def __init__(self, module: torch.nn.Module):
        self.states: torch.Tensor | None = None
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, _module, _inputs, output) -> None:
        states = getattr(output, "last_hidden_state", None)
        if states is None:
            states = output[0] if isinstance(output, (tuple, list)) else output
        self.states = states

    def remove(self) -> None:
        self._handle.remove()
