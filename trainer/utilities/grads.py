"""``lightning.pytorch.utilities.grads`` under the rename: `grad_norm`."""

from __future__ import annotations

import torch
from torch import nn


def grad_norm(module: nn.Module, norm_type: float | int | str, group_separator: str = "/") -> dict[str, torch.Tensor]:
    """Each parameter's gradient norm, ``grad_<p>_norm<sep><name>``, and their total, ``grad_<p>_norm_total`` (the norm
    of all gradients as one vector); typically ``self.log_dict(grad_norm(self, 2))`` in ``on_before_optimizer_step``.

    Raises:
        ValueError: `norm_type` is not positive (``"inf"`` is the infinity norm).
    """
    norm_type = float(norm_type)
    if norm_type <= 0:
        raise ValueError(f"`norm_type` must be a positive number or 'inf' (infinity norm). Got {norm_type}")
    norms = {f"grad_{norm_type}_norm{group_separator}{name}": p.grad.data.norm(norm_type)
             for name, p in module.named_parameters() if p.grad is not None}
    if norms:
        norms[f"grad_{norm_type}_norm_total"] = torch.tensor(list(norms.values())).norm(norm_type)
    return norms


__all__ = ["grad_norm"]
