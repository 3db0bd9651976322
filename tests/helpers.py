"""What tests share besides fixtures: model builders (every model built from a config on the meta
device: no hub access, no weights allocated), hand-written models that use the vocabulary's rarer
ops, and assertions. Imported as ``from helpers import ...``; conftest.py keeps the fixtures."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from torch import nn

#: the devices a test that must hold on every device runs on: cpu, and cuda where there is a GPU
ON_EVERY_DEVICE = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here")),
]

ROOT = Path(__file__).resolve().parent.parent


MODEL_FILES = Path(__file__).resolve().parent / "model_files"


GOLDEN = Path(__file__).resolve().parent / "golden_fingerprints.json"


def assert_golden_fingerprint(key: str, graph) -> None:
    """``graph``'s fingerprint is the one pinned in tests/golden_fingerprints.json for ``key``: a
    tracer change that alters the graph of a model of each pinned kind fails here. After
    checking the new graph is right, repin with ``GRAPHKIT_PIN_FINGERPRINTS=1 pytest``."""
    pinned = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("GRAPHKIT_PIN_FINGERPRINTS") == "1":
        pinned[key] = graph.fingerprint()
        GOLDEN.write_text(json.dumps(dict(sorted(pinned.items())), indent=2) + "\n")
    assert graph.fingerprint() == pinned.get(key), f"{key}: the graph changed (see {GOLDEN.name})"


def assert_decodes_from_its_cache(model, tokens: torch.Tensor, prefix: int = 5) -> object:
    """A language model decoding token by token from its cache gives the logits of one pass over
    the whole sequence, and ``generate`` picks the same tokens with its cache as without it.
    Returns the cache after the last step."""
    with torch.no_grad():
        whole = model(tokens, use_cache=False).logits
        first = model(tokens[:, :prefix], use_cache=True)
        cache, steps = first.past_key_values, [first.logits]
        for t in range(prefix, tokens.shape[1]):
            out = model(tokens[:, t : t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits)
        cached = model.generate(tokens[:, :prefix], max_new_tokens=6, do_sample=False)
        uncached = model.generate(tokens[:, :prefix], max_new_tokens=6, do_sample=False, use_cache=False)
    assert (torch.cat(steps, dim=1) - whole).abs().max() < 1e-4
    assert torch.equal(cached, uncached)
    return cache


def meta(build):
    """Call ``build`` with the meta device as default."""
    with torch.device("meta"):
        return build()


def timm_vit(name: str, **kwargs) -> nn.Module:
    import timm

    return meta(lambda: timm.create_model(name, pretrained=False, **kwargs))


def gpt2(layers=3, dim=64, heads=4, tied=False, headless=False, **kwargs) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

    config = GPT2Config(n_layer=layers, n_embd=dim, n_head=heads, tie_word_embeddings=tied, **kwargs)
    return meta(lambda: (GPT2Model if headless else GPT2LMHeadModel)(config))


def llama(layers=3, dim=64, heads=8, kv_heads=2, **kwargs) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=layers,
        hidden_size=dim,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=2 * dim,
        vocab_size=128,
        **kwargs,
    )
    return meta(lambda: LlamaForCausalLM(config))


def mistral(layers=3, dim=64, heads=4, kv_heads=2, window=16) -> nn.Module:
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        num_hidden_layers=layers,
        hidden_size=dim,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=2 * dim,
        vocab_size=128,
        sliding_window=window,
    )
    return meta(lambda: MistralForCausalLM(config))


# --- hand-written models that use the rarer ops of the vocabulary ---------------------------


class ALiBi(nn.Module):
    """ALiBi bias table (Press et al.): -slope_h * distance, added to attention scores."""

    def __init__(self, heads: int):
        super().__init__()
        slopes = torch.tensor([2 ** (-8 * (h + 1) / heads) for h in range(heads)])
        self.register_buffer("slopes", slopes, persistent=False)

    def forward(self, length: int) -> torch.Tensor:
        pos = torch.arange(length, device=self.slopes.device)
        distance = (pos[None, :] - pos[:, None]).clamp(max=0).float()
        return self.slopes[:, None, None] * distance[None]


class EagerAttention(nn.Module):
    """nanoGPT-style attention with an explicit softmax, a causal mask and ALiBi bias."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, bias):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads) + bias
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        y = scores.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MoE(nn.Module):
    """Top-2 mixture of experts with dense dispatch (exportable: no data-dependent shapes)."""

    def __init__(self, dim: int, experts: int = 4, k: int = 2):
        super().__init__()
        self.k = k
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))

    def forward(self, x):
        probs = self.router(x).softmax(dim=-1)
        top, idx = probs.topk(self.k, dim=-1)
        gates = torch.zeros_like(probs).scatter(-1, idx, top)
        return sum(gates[..., e : e + 1] * expert(x) for e, expert in enumerate(self.experts))


class ExoticLM(nn.Module):
    """ALiBi eager attention, an MoE MLP, a mean-pooled side branch, soft-capped logits and one
    op outside the vocabulary (cumsum)."""

    def __init__(self, vocab=64, dim=32, heads=4, cap=30.0):
        super().__init__()
        self.cap = cap
        self.embed = nn.Embedding(vocab, dim)
        self.alibi = ALiBi(heads)
        self.attn = EagerAttention(dim, heads)
        self.norm = nn.LayerNorm(dim)
        self.moe = MoE(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        x = x + self.attn(x, self.alibi(ids.shape[1]))
        x = x + self.moe(self.norm(x))
        x = x + x.mean(dim=1, keepdim=True)
        x = torch.cumsum(x, dim=1)
        return self.cap * torch.tanh(self.head(x) / self.cap)


def one_line_error(result) -> str:
    """The one ``error:`` line a failed CLI run (exit code 1) printed on stderr."""
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]
