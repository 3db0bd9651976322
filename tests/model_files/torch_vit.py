"""A hand-written ViT of torch's own layers, of none of graphkit's families: a convolution for
its patches, a class token and a position table of its own; tests copy it with another
``IMAGE`` and ``PATCH``, or with ``FIXED = True`` for a forward that refuses any other image size."""

import torch
from torch import nn

IMAGE, PATCH, WIDTH, DEPTH, HEADS = 32, 4, 64, 2, 2
FIXED = False


class ViT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.patch = nn.Conv2d(3, WIDTH, PATCH, stride=PATCH)
        self.cls = nn.Parameter(torch.zeros(1, 1, WIDTH))
        self.pos = nn.Parameter(torch.randn(1, (IMAGE // PATCH) ** 2 + 1, WIDTH) * 0.02)
        block = dict(dim_feedforward=4 * WIDTH, dropout=0.0, batch_first=True, norm_first=True, activation="gelu")
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(WIDTH, HEADS, **block) for _ in range(DEPTH))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if FIXED and images.shape[-1] != IMAGE:
            raise ValueError(f"images must be {IMAGE} px")
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


model = ViT()


def example_inputs() -> torch.Tensor:
    return torch.zeros(2, 3, IMAGE, IMAGE)
