"""Resumable training state in safetensors and JSON only: no pickle in a checkpoint, so resuming runs no code.

accelerate's ``save_state`` pickles the optimizer, the random states and every registered object, and its
``load_state`` unpickles them (``torch.load(weights_only=False)``): whoever can write a checkpoint folder
(a shared model cache's ``.resume/``) could run code in the next build. The training loop saves its state
itself instead:

* ``model.safetensors``: the (unwrapped) model's state, tied tensors once (safetensors' ``save_model``);
* ``optimizer.safetensors`` + ``optimizer.json``: the optimizer's tensors and the rest of its state dict;
* ``trainer.json``: the schedule's state, the gradient scaler's, the loop's progress and accelerate's step;
* ``rng-<rank>.safetensors`` + ``rng-<rank>.json``: every process's random states (torch, CUDA, Python, NumPy).

:func:`load_state` reads those files only, and refuses a folder holding anything else (an old accelerate
checkpoint, a planted ``custom_checkpoint_0.pkl``): the error names the file and says to delete the folder.
FSDP and DeepSpeed shard their state in formats of their own (pickles): under them no checkpoint is saved
or read (:func:`supported` is False).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from mmunlearn.errors import UnsafePathError
from mmunlearn.files.paths import check_private

MODEL = "model.safetensors"
OPTIM, OPTIM_META = "optimizer.safetensors", "optimizer.json"
TRAINER = "trainer.json"
#: files a checkpoint folder may hold besides the random states (``rng-<rank>.*``) and the loop's run info
FIXED = frozenset({MODEL, OPTIM, OPTIM_META, TRAINER})
MAX_JSON = 64 << 20


def supported(acc: Any) -> bool:
    """Whether the loop saves its own state under ``acc`` (not under FSDP, DeepSpeed or Megatron-LM)."""
    from accelerate.utils import DistributedType

    return acc.distributed_type not in {DistributedType.FSDP, DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM}


def _json(path: Path, value: Any) -> None:
    try:
        text = json.dumps(value)
    except TypeError as exc:
        raise TypeError(f"training state for {path} is not JSON ({exc}): it cannot be checkpointed") from exc
    path.write_text(text)


def _read_json(path: Path) -> Any:
    if path.is_symlink() or not path.is_file():
        raise UnsafePathError(f"{path} is missing or not a regular file: the checkpoint is incomplete")
    if path.stat().st_size > MAX_JSON:
        raise ValueError(f"{path} is larger than {MAX_JSON} bytes: not a checkpoint this loop wrote")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}): delete the checkpoint folder to start afresh") from None


def _rng_names(rank: int) -> tuple[str, str]:
    return f"rng-{rank}.safetensors", f"rng-{rank}.json"


def save_state(
    acc: Any,
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    progress: Mapping[str, Any],
    folder: str | os.PathLike,
) -> None:
    """Write the state of this process into the existing ``folder`` (the model, optimizer and schedule from the
    main process; each process its random states). Every process calls it."""
    folder = Path(folder)
    rng_file, rng_meta = _rng_names(acc.process_index)
    np_state = np.random.get_state()
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng.update({f"cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    save_file(rng, str(folder / rng_file))
    py_version, py_state, py_gauss = random.getstate()
    _json(
        folder / rng_meta,
        {
            "python": [py_version, list(py_state), py_gauss],
            "numpy": [np_state[0], np_state[1].tolist(), *map(_plain, np_state[2:])],
        },
    )
    if not acc.is_main_process:
        return
    save_model(acc.unwrap_model(model), str(folder / MODEL), metadata={"format": "pt"})
    sd = optimizer.state_dict()
    tensors, state = {}, {}
    for idx, entries in sd["state"].items():
        state[str(idx)] = {}
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{key}"] = value.detach().cpu().contiguous()
                state[str(idx)][key] = {"tensor": f"{idx}.{key}"}
            else:
                state[str(idx)][key] = {"value": value}
    save_file(tensors, str(folder / OPTIM))
    _json(folder / OPTIM_META, {"state": state, "param_groups": sd["param_groups"]})
    _json(
        folder / TRAINER,
        {
            "scheduler": scheduler.state_dict(),
            "progress": dict(progress),
            "step": acc.step,
            "scaler": acc.scaler.state_dict() if acc.scaler is not None else None,
        },
    )


def seal(folder: str | os.PathLike) -> None:
    """Make ``folder`` and its files unwritable by group and others (whatever the umask was), as
    :func:`check_folder` wants them."""
    for path in [Path(folder), *Path(folder).iterdir()]:
        if not path.is_symlink():
            os.chmod(path, path.stat().st_mode & ~0o022)


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def check_folder(folder: str | os.PathLike, extra: frozenset[str] = frozenset()) -> None:
    """Refuse a checkpoint folder holding a file this module does not write (a pickle above all), a link or a
    folder: only safetensors and JSON are read from it; the folder, its parent and its files must be this user's and
    writable by no one else (:func:`mmunlearn.files.paths.check_private`)."""
    folder = Path(folder)
    check_private(folder.parent, folder, *folder.iterdir())  # no one else could have written it
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        name = entry.name
        ours = name in FIXED or name in extra or (name.startswith("rng-") and name.endswith((".safetensors", ".json")))
        if not ours or entry.is_symlink() or not entry.is_file(follow_symlinks=False):
            pickled = name.endswith((".pkl", ".bin", ".pt", ".pth", ".ckpt"))
            what = "a pickle" if pickled else "not a file this loop writes"
            raise UnsafePathError(
                f"{folder / name} is {what}: resume state is read from safetensors and JSON only "
                f"(an older mmunlearn or someone else wrote this folder); delete {folder} to start "
                "afresh"
            )


def load_state(
    acc: Any,
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    folder: str | os.PathLike,
    extra: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Read what :func:`save_state` wrote into the running objects (every process); returns the loop's progress.
    ``extra``: other names the folder may hold (the loop's run info)."""
    folder = Path(folder)
    check_folder(folder, extra)
    load_model(acc.unwrap_model(model), str(folder / MODEL), strict=True)
    meta = _read_json(folder / OPTIM_META)
    tensors = load_file(str(folder / OPTIM))
    try:
        state = {
            int(idx): {k: tensors[v["tensor"]] if "tensor" in v else v["value"] for k, v in entries.items()}
            for idx, entries in meta["state"].items()
        }
        optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
        trainer = _read_json(folder / TRAINER)
        scheduler.load_state_dict(trainer["scheduler"])
        if acc.scaler is not None and trainer.get("scaler") is not None:
            acc.scaler.load_state_dict(trainer["scaler"])
        acc.step = int(trainer["step"])
        progress = dict(trainer["progress"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(
            f"{folder} is not a checkpoint this training loop can resume from ({exc!r}); delete it to start afresh"
        ) from None
    rng_file, rng_meta = _rng_names(acc.process_index)
    if (folder / rng_file).is_file():
        rng, py = load_file(str(folder / rng_file)), _read_json(folder / rng_meta)
        torch.set_rng_state(rng["torch"])
        cuda = [rng[k] for k in sorted((k for k in rng if k.startswith("cuda.")), key=lambda k: int(k[5:]))]
        if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        version, state, gauss = py["python"]
        random.setstate((version, tuple(state), gauss))
        kind, keys, *rest = py["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    return progress


__all__ = ["FIXED", "check_folder", "load_state", "save_state", "seal", "supported"]
