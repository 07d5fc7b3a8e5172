"""A frozen audio tower's outputs computed once per clip and reused: the Qwen2-Audio forward and training from them.

When the audio tower does not train (a pretrained Whisper encoder in front of a trained projector), every
pass over a clip gives the same tower outputs; :class:`TowerCache` keeps them on disk, keyed by the clip
(its file's bytes and sample span, or the waveform's bytes) and by the tower (a digest of its weights,
the window and the feature extractor's settings), so another tower, window or extractor never reads
them. :func:`cached_logits` is the model's forward with the tower replaced by the cache: the projector, the
placeholders filled in order, the language model, the LM head (at the scored positions only, when asked);
``tests/speech/test_tower_cache.py`` checks it against the full forward. :func:`train_from_cache` trains the
projector (and, optionally, the language model's last blocks) with the shared loop on it.

Only Qwen2-Audio-architecture models (``model.model.audio_tower`` / ``multi_modal_projector`` /
``language_model``) take this path.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from mmunlearn.adapters.text.adapter import IGNORE, _qa
from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.train import TrainConfig, TrainResult, train

FILE = "tower_outputs.safetensors"


def tower_digest(adapter: Any) -> str:
    """A digest of what a clip's tower outputs depend on: the tower's weights, its config, the feature extractor."""
    digest = hashlib.sha256()
    tower = adapter.model.model.audio_tower
    for name, tensor in sorted(tower.state_dict().items()):
        digest.update(name.encode() + b"\0" + tensor.detach().float().cpu().contiguous().numpy().tobytes())
    digest.update(json.dumps(tower.config.to_dict(), sort_keys=True, default=str).encode())
    digest.update(adapter.feature_extractor.to_json_string().encode())
    return digest.hexdigest()[:24]


@functools.lru_cache(maxsize=1 << 16)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """A file's content digest (memoised while its size and modification time stay the same)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:24]


def clip_key(example: Mapping[str, Any]) -> str:
    """The clip of an example: its file's bytes and sample span, or its waveform's bytes."""
    wav = example.get("wav")
    if isinstance(wav, (str, os.PathLike)):
        st = os.stat(wav)
        return f"{_file_digest(str(wav), st.st_size, st.st_mtime_ns)}:{example.get('start')}:{example.get('stop')}"
    if isinstance(wav, torch.Tensor):
        return hashlib.sha256(wav.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()[:24]
    raise ValueError(f"example {example.get('ID', '?')!r}: 'wav' must be a file path or a 1-D waveform tensor")


def tower_outputs(
    model: nn.Module, input_features: torch.Tensor, feature_attention_mask: torch.Tensor
) -> list[torch.Tensor]:
    """The audio tower's outputs of a batch, one (tokens x audio width) tensor per clip, as the Qwen2-Audio forward
    computes them: the padded positions masked in self-attention, one output per placeholder kept."""
    from transformers.masking_utils import create_bidirectional_mask  # deferred: transformers is heavy

    tower = model.model.audio_tower
    after_conv, outputs = tower._get_feat_extract_output_lengths(feature_attention_mask.sum(-1))
    positions = (input_features.shape[-1] - 2) // 2 + 1
    valid = (torch.arange(positions, device=after_conv.device)[None, :] < after_conv[:, None]).long()
    shape = torch.zeros(len(valid), positions, 1, dtype=tower.conv1.weight.dtype)
    mask = create_bidirectional_mask(config=tower.config, attention_mask=valid, inputs_embeds=shape)
    hidden = tower(input_features.to(tower.conv1.weight.dtype), attention_mask=mask).last_hidden_state
    return [hidden[i, :n] for i, n in enumerate(outputs.tolist())]


class TowerCache:
    """Tower outputs by clip key, for one tower digest, in ``root/<digest>/`` (loaded on creation)."""

    def __init__(self, root: str | os.PathLike, digest: str):
        self.folder = Path(root) / digest
        self.digest = digest
        path = self.folder / FILE
        self.outputs: dict[str, torch.Tensor] = load_file(str(path)) if path.is_file() else {}
        self._dirty = False

    def __contains__(self, key: str) -> bool:
        return key in self.outputs

    def __len__(self) -> int:
        return len(self.outputs)

    def save(self) -> None:
        """Write the outputs (atomically: a temporary file renamed into place)."""
        if not self._dirty:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / (FILE + ".tmp")
        save_file({k: v.contiguous() for k, v in self.outputs.items()}, str(tmp))
        os.replace(tmp, self.folder / FILE)
        write_text_atomic(self.folder / "cache.json", json.dumps({"digest": self.digest, "clips": len(self)}))
        self._dirty = False

    @torch.no_grad()
    def fill(
        self,
        adapter: Any,
        examples: Sequence[Mapping[str, Any]],
        *,
        batch_size: int = 16,
        save_every: int = 256,
        log=None,
    ) -> dict[str, torch.Tensor]:
        """The outputs of every example's clip (computed for the clips not cached yet, saved every ``save_every``)."""
        keys = [clip_key(ex) for ex in examples]
        todo = list({k: ex for k, ex in zip(keys, examples) if k not in self.outputs}.items())
        model = adapter.model
        was_training = model.training
        model.eval()
        try:
            for start in range(0, len(todo), batch_size):
                chunk = todo[start : start + batch_size]
                feats = [adapter.features(ex) for _, ex in chunk]
                x = torch.stack([f for f, _ in feats]).to(adapter.device)
                mask = torch.zeros(len(feats), x.shape[-1], dtype=torch.long)
                for i, (_, valid) in enumerate(feats):
                    mask[i, :valid] = 1
                for (key, _), out in zip(chunk, tower_outputs(model, x, mask.to(adapter.device))):
                    self.outputs[key] = out.float().cpu().clone()
                self._dirty = True
                if (start // batch_size + 1) % max(1, save_every // batch_size) == 0:
                    self.save()
                    if log is not None:
                        log(f"tower cache: {min(start + batch_size, len(todo))}/{len(todo)} new clips")
        finally:
            model.train(was_training)
        self.save()
        return {k: self.outputs[k] for k in keys}


def cached_collate(adapter: Any, cache: TowerCache):
    """A collate for :func:`cached_logits`: ids and labels as the adapter encodes them (one placeholder per tower
    output), right-padded, with ``audio`` (clips x tokens x width, zero-padded) and ``audio_lengths``."""

    def collate(examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        outs = [cache.outputs[clip_key(ex)] for ex in examples]
        rows = [adapter.encode(_qa(ex)[0], len(o), _qa(ex)[1]) for ex, o in zip(examples, outs)]
        width = max(len(ids) for ids, _ in rows)
        ids = torch.full((len(rows), width), adapter.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (r_ids, r_lab) in enumerate(rows):
            ids[i, : len(r_ids)], labels[i, : len(r_ids)], mask[i, : len(r_ids)] = (
                torch.tensor(r_ids),
                torch.tensor(r_lab),
                1,
            )
        audio = torch.zeros(len(outs), max(len(o) for o in outs), outs[0].shape[-1])
        for i, o in enumerate(outs):
            audio[i, : len(o)] = o
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "labels": labels,
            "audio": audio,
            "audio_lengths": torch.tensor([len(o) for o in outs]),
        }

    return collate


def cached_logits(
    model: nn.Module, batch: Mapping[str, torch.Tensor], *, scored_only: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, targets) of the next token from cached tower outputs: every position (B x T-1 x V, B x T-1), or
    with ``scored_only`` the labelled ones only (N x V, N), the LM head applied there alone."""
    inner = model.model
    dev = inner.multi_modal_projector.linear.weight.device
    ids, mask = batch["input_ids"].to(dev), batch["attention_mask"].to(dev)
    audio, lengths = batch["audio"].to(dev), batch["audio_lengths"].to(dev)
    embeds = inner.get_input_embeddings()(ids)
    projected = inner.multi_modal_projector(audio.to(embeds.dtype))
    projected = projected[torch.arange(audio.shape[1], device=dev)[None, :] < lengths[:, None]]
    slots = ids == model.config.audio_token_id
    if int(slots.sum()) != len(projected):
        raise ValueError(f"{int(slots.sum())} audio placeholders for {len(projected)} tower outputs")
    embeds = embeds.masked_scatter(slots.unsqueeze(-1), projected.to(embeds.dtype))
    hidden = inner.language_model(inputs_embeds=embeds, attention_mask=mask).last_hidden_state[:, :-1]
    targets = batch["labels"][:, 1:].to(dev)
    if scored_only:
        keep = targets != IGNORE
        return model.lm_head(hidden[keep]).float(), targets[keep]
    return model.lm_head(hidden).float(), targets


def cached_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Mean answer-token NLL from cached tower outputs."""
    logits, targets = cached_logits(model, batch, scored_only=True)
    return F.cross_entropy(logits, targets)


def trainable(model: nn.Module, last_blocks: int = 0) -> list[nn.Parameter]:
    """The projector's parameters, and those of the language model's last ``last_blocks`` decoder blocks."""
    params = list(model.model.multi_modal_projector.parameters())
    layers = model.model.language_model.layers
    if not 0 <= last_blocks <= len(layers):
        raise ValueError(f"last_blocks must be in [0, {len(layers)}], got {last_blocks}")
    for block in list(layers)[len(layers) - last_blocks :]:
        params += list(block.parameters())
    return params


def train_from_cache(
    adapter: Any,
    examples: Sequence[Mapping[str, Any]],
    cache: TowerCache,
    config: TrainConfig,
    *,
    last_blocks: int = 0,
    device: str = "cpu",
    progress: bool = False,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    on_step=None,
) -> TrainResult:
    """Train the projector (and the LM's last ``last_blocks`` blocks) on spoken-QA examples whose clips are in
    ``cache``; everything else keeps its values bit for bit. Resumable through the shared loop's checkpoints."""
    missing = sum(clip_key(ex) not in cache for ex in examples)
    if missing:
        raise ValueError(f"{missing} of {len(examples)} examples have no cached tower outputs: fill the cache first")
    result = train(
        adapter.model,
        cached_loss,
        list(examples),
        cached_collate(adapter, cache),
        config,
        params=trainable(adapter.model, last_blocks),
        device=device,
        progress=progress,
        desc="train projector",
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        resume=resume,
        on_step=on_step,
    )
    adapter.model.eval()
    return result
