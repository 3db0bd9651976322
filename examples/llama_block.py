"""A hand-written LLaMA-style decoder in plain PyTorch: RMSNorm, RoPE, grouped-query attention
(SDPA with enable_gqa, no repeated K/V), SwiGLU MLP, untied LM head."""

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        self.attn = Attention(dim, heads, kv_heads)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class TinyLlama(nn.Module):
    def __init__(self, vocab=1000, dim=128, layers=4, heads=8, kv_heads=2, hidden=344, context=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim // heads, 2).float() / (dim // heads)))
        angles = torch.outer(torch.arange(context).float(), inv_freq)
        self.register_buffer("cos", torch.cat((angles, angles), -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((angles, angles), -1).sin(), persistent=False)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.embed(ids)
        cos, sin = self.cos[:t], self.sin[:t]
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.lm_head(self.norm(x))


model = TinyLlama()


def example_inputs():
    return (torch.randint(0, 1000, (2, 16)),)
