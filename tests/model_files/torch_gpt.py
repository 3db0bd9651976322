"""A hand-written GPT of torch's own encoder layers, of none of graphkit's families, its token
table left at torch's N(0, 1); tests copy it with ``TIED = True`` for a head tied to that table."""

import torch
from torch import nn

TIED = False


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tok, self.pos = nn.Embedding(256, 64), nn.Embedding(32, 64)
        block = dict(dim_feedforward=128, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(64, 4, **block) for _ in range(2))
        self.head = nn.Linear(64, 256, bias=False)
        if TIED:
            self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1])
        for layer in self.blocks:
            x = layer(x, src_mask=mask, is_causal=True)
        return self.head(x)


model = GPT()
