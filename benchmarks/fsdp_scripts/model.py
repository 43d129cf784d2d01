"""The model both FSDP benchmark scripts train: residual MLP blocks, each its own FSDP unit."""

import torch
from torch import nn

WIDTH, BLOCKS = 256, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(Block() for _ in range(BLOCKS)), nn.Linear(WIDTH, 10))
