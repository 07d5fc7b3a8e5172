"""Adapter for HF causal LMs (Llama, Qwen2, GPT-2, ...): QA formatting, scoring, generation, I/O.

Question/answer pairs are formatted with the tokenizer's chat template when it has one, else
``Question: ...\\nAnswer: ...``, or in the ``prompt_format`` given (:mod:`mmunlearn.adapters.text.prompt_format`:
``chat``,
``plain``, ``raw`` or a format string); prompt and answer are tokenised separately and concatenated, so the labels
cover exactly the answer tokens (plus EOS).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from jinja2 import TemplateError
from torch import nn
from tqdm.auto import tqdm

from mmunlearn.adapters.base import IGNORE, LayerWeight, TokenScoring, resolve_device, resolve_dtype
from mmunlearn.adapters.hf_checks import check_hf_folder, check_loaded, loading
from mmunlearn.adapters.text import prompt_format as formats
from mmunlearn.adapters.text.chat_template import install as install_bounds
from mmunlearn.adapters.text.chat_template import template_error
from mmunlearn.files.checkpoint import atomic_dir
from mmunlearn.kinds import Kind, register_kind
from mmunlearn.naming import group_of
from mmunlearn.train.answer_only import answer_logits, autocast_context, supports_answer_only

PLAIN_TEMPLATE = formats.TEMPLATES["plain"]
PRECISIONS = ("no", "bf16")


def check_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISIONS` (a ``ValueError`` naming them otherwise)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def _qa(example: Any) -> tuple[str, str | None]:
    """(question, answer) of a dict-like or attribute-style example."""
    if isinstance(example, Mapping):
        q, a = example.get("question"), example.get("answer")
    else:
        q, a = getattr(example, "question", None), getattr(example, "answer", None)
    if not isinstance(q, str):
        raise ValueError(f"example has no 'question' string: {example!r:.120}")
    return q, a


class TextLLMAdapter(TokenScoring):
    """Wraps a causal LM and its tokenizer with the adapter interface
    (:class:`mmunlearn.adapters.base.ModalityAdapter`)."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        *,
        max_length: int = 512,
        use_chat_template: bool | None = None,
        precision: str = "no",
        prompt_format: str | None = None,
    ):
        self.model = model
        self.precision = check_precision(precision)
        #: bf16 autocast of every teacher-forced forward (scoring, losses) when ``precision`` is bf16
        self.autocast_dtype = torch.bfloat16 if precision == "bf16" else None
        self._generation_model: nn.Module | None = None
        self.tokenizer = tokenizer
        self.max_length = max_length
        has_template = bool(getattr(tokenizer, "chat_template", None))
        self.use_chat_template = has_template if use_chat_template is None else use_chat_template
        if self.use_chat_template and not has_template:
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        self.prompt_format: str | None = None  # None: the chat template when used, else the plain Question/Answer form
        if prompt_format is not None:
            self.set_prompt_format(prompt_format)
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        if self.pad_id is None:
            raise ValueError("tokenizer has neither a pad nor an EOS token")

    # ------------------------------------------------------------------ loading and saving
    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, *, device: str = "auto", dtype: str | torch.dtype = "auto", **kwargs
    ) -> TextLLMAdapter:
        """Load a model directory (or hub id) with ``AutoModelForCausalLM`` and its tokenizer; ``precision``
        (a keyword passed on to the adapter): ``no`` (float32 scoring) or ``bf16`` (autocast scoring and
        bf16 weights for generation, :meth:`bf16_generation`)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(path, Path) or os.path.sep in str(path) or os.path.exists(str(path)):
            if not Path(path).is_dir():
                raise FileNotFoundError(f"model directory not found: {path}")
            check_hf_folder(path)  # links, safetensors only, config.json sizes and kernels: before transformers
        dev = resolve_device(device)
        with loading(path):
            model = (
                AutoModelForCausalLM.from_pretrained(
                    str(path), dtype=resolve_dtype(dtype, dev), use_safetensors=True, trust_remote_code=False
                )
                .to(dev)
                .eval()
            )
        check_loaded(model, path)
        with loading(path):  # a tokenizer.json nested 100,000 deep is one error naming the folder
            tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)  # never asks or runs code
        return cls(model, tokenizer, **kwargs)

    load = from_pretrained

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """``save_pretrained`` of model and tokenizer into ``path`` (atomically)."""
        with atomic_dir(path, overwrite=overwrite) as tmp:
            self.model.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
        return Path(path)

    def with_model(self, model: nn.Module) -> TextLLMAdapter:
        """The same tokenizer and formatting around another model (e.g. T3's tilted wrapper)."""
        return TextLLMAdapter(
            model,
            self.tokenizer,
            max_length=self.max_length,
            use_chat_template=self.use_chat_template,
            precision=self.precision,
            prompt_format=None if self.use_chat_template else self.prompt_format,
        )

    def clone(self) -> TextLLMAdapter:
        """An independent copy of the model; the tokenizer is shared."""
        import copy

        return self.with_model(copy.deepcopy(self.model))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ layers
    def layers(self, include_embeddings: bool = False, include_lm_head: bool = False) -> Iterator[LayerWeight]:
        """Every 2-D Linear (and GPT-2 Conv1D) weight in the decoder blocks, grouped by block.

        Embeddings and the LM head are excluded unless asked for; norms (1-D) never appear.
        """
        seen: set[int] = set()
        for mname, module in self.model.named_modules():
            w = getattr(module, "weight", None)
            if not isinstance(w, nn.Parameter) or w.dim() != 2 or id(w) in seen:
                continue
            name = f"{mname}.weight"
            is_embedding = isinstance(module, nn.Embedding)
            is_head = module is self.model.get_output_embeddings()
            in_block = group_of(name) != name.rsplit(".", 1)[0]
            if (
                (is_embedding and include_embeddings)
                or (is_head and include_lm_head)
                or (in_block and not is_embedding)
            ):
                seen.add(id(w))
                yield LayerWeight(name, group_of(name), w)

    # ------------------------------------------------------------------ formatting
    def set_prompt_format(self, fmt: str) -> None:
        """Format rows in ``fmt`` from now on (:mod:`mmunlearn.adapters.text.prompt_format`); ``chat`` needs the
        tokenizer's
        chat template."""
        fmt = formats.check(fmt)
        if fmt == "chat" and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                "prompt_format 'chat' needs a tokenizer with a chat template; this one has none "
                f"(use one of {', '.join(f for f in formats.NAMED if f != 'chat')} or a format string)"
            )
        self.use_chat_template = fmt == "chat"
        self.prompt_format = None if fmt == "chat" else fmt

    @property
    def format_name(self) -> str:
        """The prompt format rows are written in: ``chat``, ``plain``, ``raw`` or the format string."""
        return "chat" if self.use_chat_template else self.prompt_format or "plain"

    def _templates(self) -> tuple[str, str]:
        return formats.split(self.prompt_format or "plain")

    def prompt_text(self, question: str) -> str:
        if self.use_chat_template:
            install_bounds()  # the tokenizer's template is someone else's code: rendered within bounds
            try:
                return self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
                )
            except (TemplateError, OverflowError) as exc:  # OverflowError: Jinja's "range too big"
                raise template_error(exc, getattr(self.tokenizer, "name_or_path", "the tokenizer")) from None
        return self._templates()[0].format(question=question)

    def encode(self, question: str, answer: str | None = None) -> tuple[list[int], list[int]]:
        """Token ids of prompt (+ answer + EOS) and labels (-100 on the prompt). An empty ``question`` with an answer is
        prompt-less text: its tokens as they are, each scored but the first."""
        tok = self.tokenizer
        if question == "" and answer is not None:  # prompt-less text (a passage): no template, every token after
            ids = tok(answer, add_special_tokens=True)["input_ids"]  # the first scored (a BOS, if any, is the first)
            ids = (ids + ([self.eos_id] if self.eos_id is not None else []))[: self.max_length]
            if len(ids) < 2:
                raise ValueError(f"a prompt-less text needs at least two tokens to score: {answer[:80]!r}")
            return ids, [IGNORE] + ids[1:]
        prompt = tok(self.prompt_text(question), add_special_tokens=not self.use_chat_template)["input_ids"]
        if answer is None:
            return prompt, [IGNORE] * len(prompt)
        text = answer if self.use_chat_template else self._templates()[1].format(answer=answer)
        ans = tok(text, add_special_tokens=False)["input_ids"] + ([self.eos_id] if self.eos_id is not None else [])
        ids = (prompt + ans)[: self.max_length]
        labels = ([IGNORE] * len(prompt) + ans)[: self.max_length]
        if all(label == IGNORE for label in labels):
            raise ValueError(f"prompt alone fills max_length={self.max_length}: {question[:80]!r}")
        return ids, labels

    def collate(self, examples: Sequence[Any], answers: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        """Right-padded batch of QA examples (dicts or objects with question/answer).

        ``answers`` overrides the examples' answers (to score paraphrased or perturbed ones).
        """
        if not examples:
            raise ValueError("cannot collate an empty list of examples")
        rows = []
        for i, ex in enumerate(examples):
            q, a = _qa(ex)
            a = answers[i] if answers is not None else a
            if not isinstance(a, str):
                raise ValueError(f"example {i} has no answer to score")
            rows.append(self.encode(q, a))
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (ids, lab) in enumerate(rows):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            labels[i, : len(lab)] = torch.tensor(lab)
            mask[i, : len(ids)] = 1
        return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}

    def _to(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) for k, v in batch.items()}

    # ------------------------------------------------------------------ scoring
    # Every scoring method takes an optional ``model``: a training loop passes its (possibly
    # distributed-wrapped) module so gradients flow through the wrapper.
    def logits(
        self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Next-token logits aligned with their targets: (B x T-1 x V, targets B x T-1)."""
        b = self._to(batch)
        with autocast_context(self.device, self.autocast_dtype):
            out = (model or self.model)(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
        return out.logits[:, :-1].float(), b["labels"][:, 1:]

    def answer_logits(
        self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits at the answer positions only (N x V float, N targets, N row indices); the LM head runs
        on those positions alone for a plain HF model (:mod:`mmunlearn.train.answer_only`)."""
        b = self._to(batch)
        with autocast_context(self.device, self.autocast_dtype):
            logits, targets, rows = answer_logits(model or self.model, b["input_ids"], b["attention_mask"], b["labels"])
        return logits.float(), targets, rows

    def hidden_states(self, batch: Mapping[str, torch.Tensor], layer: int | str = "final") -> torch.Tensor:
        """Hidden states B x T x d; ``final`` = the last (normed) state, an int indexes HF's tuple."""
        b = self._to(batch)
        out = self.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], output_hidden_states=True)
        states = out.hidden_states
        if layer == "final":
            return states[-1]
        if not isinstance(layer, int) or not -len(states) <= layer < len(states):
            raise ValueError(f"layer must be 'final' or an int in [-{len(states)}, {len(states) - 1}], got {layer!r}")
        return states[layer]

    # ------------------------------------------------------------------ generation
    def prompt_batch(self, questions: Sequence[str]) -> dict[str, torch.Tensor]:
        """Left-padded prompts for generation."""
        rows = [self.encode(q)[0] for q in questions]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = torch.tensor(r)
            mask[i, width - len(r) :] = 1
        return {"input_ids": ids, "attention_mask": mask}

    @contextmanager
    def bf16_generation(self) -> Iterator[None]:
        """Within the block, :meth:`generate` decodes with a bf16 copy of the model when ``precision`` is
        bf16 and the model is a plain HF causal LM (made once on entry: the weights must not change inside
        the block); otherwise nothing changes. Greedy answers of a memorised SmolLM2 agree with float32 on
        >= 90 % (``mmunlearn bench precision``)."""
        if self.precision != "bf16" or not supports_answer_only(self.model) or self._generation_model is not None:
            yield
            return
        import copy

        self._generation_model = copy.deepcopy(self.model).to(torch.bfloat16).eval()
        try:
            yield
        finally:
            self._generation_model = None

    @torch.no_grad()
    def generate(
        self,
        questions: Sequence[str],
        max_new_tokens: int = 64,
        batch_size: int = 16,
        desc: str | None = None,
        **gen_kwargs,
    ) -> list[str]:
        """Batched greedy answers (only the new text, special tokens removed)."""
        texts: list[str] = []
        kwargs = {"do_sample": False, **gen_kwargs}
        for i in tqdm(range(0, len(questions), batch_size), desc=desc, disable=desc is None, leave=False):
            b = self._to(self.prompt_batch(questions[i : i + batch_size]))
            out = (self._generation_model or self.model).generate(
                **b, max_new_tokens=max_new_tokens, pad_token_id=self.pad_id, eos_token_id=self.eos_id, **kwargs
            )
            new = out[:, b["input_ids"].shape[1] :]
            texts.extend(t.strip() for t in self.tokenizer.batch_decode(new, skip_special_tokens=True))
        return texts


def _load_kind(
    folder: str | os.PathLike, *, device: str = "auto", prompt_format: str | None = None, **_: Any
) -> TextLLMAdapter:
    return TextLLMAdapter.from_pretrained(folder, device=device, prompt_format=prompt_format)


KIND = register_kind(
    Kind(
        "text",
        detect=lambda folder: (folder / "config.json").is_file(),
        load=_load_kind,
        adapter=TextLLMAdapter,
        sizes=("micro", "mini", "model_dir"),
        default_size="model_dir",
        description="Hugging Face causal LM in save_pretrained layout (config.json)",
        request_extract="gradient",
        priority=90,
    )
)
