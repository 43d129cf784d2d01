"""The standard tracker scenario: the config and values every integration test logs and reads back."""

from __future__ import annotations

from typing import Any

CONFIG: dict[str, Any] = {
    "lr": 0.01,
    "batch_size": 32,
    "optimizer": {"name": "adamw", "weight_decay": 0.1},
    "tag": "baseline",
}
FLAT_CONFIG = {"lr": 0.01, "batch_size": 32, "optimizer/name": "adamw", "optimizer/weight_decay": 0.1, "tag": "baseline"}
STEPS = (0, 5, 10)


def expected_loss(step: int) -> float:
    return 1.0 / (step + 2)


def expected_acc(step: int) -> float:
    return 0.5 + step / 100


def step_values(step: int) -> dict[str, Any]:
    """What the scenario logs at ``step``: a 0-dim tensor, a float and a nested dict."""
    import torch

    return {"loss": torch.tensor(expected_loss(step)), "val": {"acc": expected_acc(step)}}
