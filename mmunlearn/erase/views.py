"""Matrix views of model parameters: Linear weights, Conv1d kernels, fused MoE expert tensors.

Erasure works on 2-D matrices. A Conv1d kernel (out x in x k) is seen as out x (in*k); a fused
expert tensor (E x a x b) as E separate a x b matrices, labelled ``name[e]``. Views share storage
with the parameter, so editing a view edits the model.

>>> import torch
>>> conv = torch.nn.Conv1d(4, 6, kernel_size=3)
>>> [(label, tuple(v.shape)) for label, v in matrices("w", conv.weight.data, "conv")]
[('w', (6, 12))]
>>> [(label, tuple(v.shape)) for label, v in matrices("e", torch.zeros(2, 3, 5), "experts")]
[('e[0]', (3, 5)), ('e[1]', (3, 5))]
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import nn

from mmunlearn.taskvec.lowrank import LowRank

KINDS = ("linear", "conv", "experts")


def kind_of(name: str, tensor: torch.Tensor, module: nn.Module | None = None) -> str:
    """How a parameter is seen as matrices: ``linear`` (2-D), ``conv`` or ``experts`` (3-D).

    With the owning module known, a 3-D weight of a ``Conv1d`` is a kernel and any other 3-D
    tensor is a fused expert stack. Without it (a bare state dict), names that mention experts
    are expert stacks and other 3-D tensors are Conv1d kernels.
    """
    if tensor.dim() == 2:
        return "linear"
    if tensor.dim() == 3:
        if module is not None:
            return "conv" if isinstance(module, nn.Conv1d) else "experts"
        return "experts" if "expert" in name.lower() else "conv"
    raise ValueError(
        f"parameter {name!r} has shape {tuple(tensor.shape)}: only 2-D weights, "
        "Conv1d kernels and fused 3-D expert tensors can be erased"
    )


def matrices(name: str, tensor: torch.Tensor, kind: str) -> list[tuple[str, torch.Tensor]]:
    """(label, 2-D view) pairs of a parameter; views share storage with ``tensor``."""
    if kind == "linear":
        return [(name, tensor)]
    if kind == "conv":
        return [(name, tensor.view(tensor.shape[0], -1))]
    if kind == "experts":
        return [(f"{name}[{e}]", tensor[e]) for e in range(tensor.shape[0])]
    raise ValueError(f"unknown parameter kind {kind!r}; expected one of {KINDS}")


def task_matrices_for(name: str, task: torch.Tensor, param: torch.Tensor, kind: str) -> list[tuple[str, torch.Tensor]]:
    """Split a task tensor the way its parameter is split; the shapes must agree. A factored task
    matrix stays factored on a Linear weight and is materialised for a reshaped (conv, experts) one."""
    if isinstance(task, LowRank) and kind != "linear":
        task = task.dense()
    if kind == "conv" and task.dim() == 2 and task.shape == (param.shape[0], param[0].numel()):
        return [(name, task)]
    if task.shape != param.shape:
        raise ValueError(
            f"task matrix for {name!r} has shape {tuple(task.shape)} but the model's "
            f"parameter has shape {tuple(param.shape)}"
        )
    return matrices(name, task, kind)


class ParamTable:
    """Name -> (tensor, kind) for an ``nn.Module`` or a plain state dict of tensors."""

    def __init__(self, model: nn.Module | Mapping[str, torch.Tensor]):
        self._params: dict[str, tuple[torch.Tensor, str]] = {}
        if isinstance(model, nn.Module):
            modules = dict(model.named_modules())
            for pname, p in model.named_parameters(remove_duplicate=False):
                owner = modules.get(pname.rsplit(".", 1)[0]) if "." in pname else model
                if p.dim() in (2, 3):
                    self._params[pname] = (p.data, kind_of(pname, p, owner))
        elif isinstance(model, Mapping):
            for pname, t in model.items():
                if isinstance(t, torch.Tensor) and t.dim() in (2, 3):
                    self._params[pname] = (t, kind_of(pname, t))
        else:
            raise TypeError(f"model must be a torch.nn.Module or a mapping of tensors, got {type(model).__name__}")

    def __contains__(self, name: str) -> bool:
        return name in self._params

    def get(self, name: str) -> tuple[torch.Tensor, str]:
        if name not in self._params:
            near = [n for n in self._params if n.split(".")[-2:] == name.split(".")[-2:]][:3]
            hint = f"; similar names: {near}" if near else ""
            raise KeyError(f"the model has no erasable parameter named {name!r}{hint}")
        return self._params[name]

    def views(self, name: str) -> Iterator[tuple[str, torch.Tensor]]:
        tensor, kind = self.get(name)
        yield from matrices(name, tensor, kind)
