"""Multi-head latent attention (MLA, DeepSeek-V2) by conversion: ``to_mla(model, kv_rank)``.

In MLA every head's keys and values are read from one shared latent per token,
``c = x W_down`` (``kv_rank`` numbers), ``K = c W_k_up`` and ``V = c W_v_up``, so a KV cache
holds ``kv_rank`` numbers per token and layer instead of MHA's ``2 heads head_dim``.

Conversion factors a layer's stacked K/V projections ``[W_k; W_v]`` (2 heads head_dim x dim)
by a truncated SVD, ``U_R S_R V_R^T``: ``W_down = V_R^T`` and ``[W_k_up; W_v_up] = U_R S_R``,
the best rank-R approximation of the pair in the Frobenius norm (Eckart-Young), as TransMLA and
MHA2MLA start from. The stacked matrix has rank at most ``dim``, so at ``kv_rank = dim`` the
converted layer computes exactly what the original did. The K/V biases stay on the up
projections: they add the same vector to every token and do not pass through the latent. Q and
the output projection are copied.

Handled: timm ViTs, Hugging Face GPT-2 and LLaMA-style models (LLaMA, Mistral, GQA or not);
the language models' converted attention caches the latent, not K and V.

Two ways to run it, the same numbers (:func:`latent_attention` picks the cheaper per call):
*expanded*, K and V rebuilt from the latent and handed to SDPA, cheap when every cached token is
also a query (a prompt); *absorbed*, DeepSeek's inference form, the K up projection folded into
the query and the V up projection applied after attending over the latent itself, cheap when a
few new tokens read a long cache (decoding), since nothing is rebuilt per cached token.

LLaMA's keys are rotated per position (RoPE) after the projection, which a latent cannot carry
through the absorbed form. Two conversions, by ``rope_dims``:

- ``rope_dims=None`` (exact): the whole K goes through the latent, and the converted attention
  rebuilds K from the cached latent and rotates it at every cached position each step. At full
  rank it computes what the original did; decoding rebuilds the whole cache each step. Cached
  positions are taken to run up to the current token's (the ``position_ids`` the decoder layer
  passes), which a full or a sliding-window cache both keep.
- ``rope_dims=D`` (partial RoPE, as MHA2MLA, Ji et al., 2025): per K/V head, D of the head's
  dimensions (D/2 rotary frequency pairs) keep RoPE and are cached as they are, a decoupled
  rotary key as in DeepSeek-V2; the other dimensions lose their rotation, and those keys with the
  values go through the latent, so decoding runs absorbed. The pairs kept are those with the
  largest product of query and key norms on calibration data (MHA2MLA's 2-norm rule, its best),
  or without calibration the highest frequencies. Removing RoPE from the rest changes the model:
  it needs up-training to recover (MHA2MLA uses 0.6-1% of the pre-training data); BENCHMARKS.md
  measures how much. The cache per token is ``kv_rank + kv_heads D`` numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from graphkit.attention.adapter import AttentionAdapter, LibraryModule, adapter_for
from graphkit.attention.convert import (
    GPT2AttentionCall,
    GPT2GroupedAttention,
    ViTGroupedAttention,
    capture_calibration,
    conversion_metadata,
)
from graphkit.attention.core import GroupedQueryAttention
from graphkit.errors import MLAError
from graphkit.validation import is_count


class LatentKV(nn.Module):
    """The part of MLA every converted attention shares: the down projection to the latent and
    the K and V up projections. ``attention_variant`` and ``attention_attrs`` are what the
    tracer records on the attention node."""

    attention_variant = "mla"
    k_rope: nn.Linear  # the rotary keys' projection, where LlamaLatentAttention keeps rope_dims out of the latent

    def __init__(self, dim: int, width: int, kv_rank: int, bias: bool, v_width: int | None = None) -> None:
        super().__init__()
        self.kv_rank = kv_rank
        self.rope_dims = 0  # rotary dimensions per K/V head kept out of the latent (set by LlamaLatentAttention)
        self.down = nn.Linear(dim, kv_rank, bias=False)
        self.k_up = nn.Linear(kv_rank, width, bias=bias)
        self.v_up = nn.Linear(kv_rank, width if v_width is None else v_width, bias=bias)

    @property
    def attention_attrs(self) -> dict[str, Any]:
        return {"kv_rank": self.kv_rank, **({"rope_dims": self.rope_dims} if self.rope_dims else {})}

    def extra_repr(self) -> str:
        return f"kv_rank={self.kv_rank}" + (f", rope_dims={self.rope_dims}" if self.rope_dims else "")

    @classmethod
    def factor(
        cls, w_k: torch.Tensor, w_v: torch.Tensor, b_k: torch.Tensor | None, b_v: torch.Tensor | None, kv_rank: int
    ) -> LatentKV:
        """The rank-``kv_rank`` latent of K and V projections ``w_k``, ``w_v`` (out, in), by the
        truncated SVD of their stack (see the module docstring)."""
        width, dim = w_k.shape
        new = cls(dim, width, kv_rank, bias=b_k is not None, v_width=w_v.shape[0]).to(w_k.device, w_k.dtype)
        u, s, vh = torch.linalg.svd(torch.cat([w_k, w_v]).double(), full_matrices=False)
        up = (u[:, :kv_rank] * s[:kv_rank]).to(w_k.dtype)
        with torch.no_grad():
            new.down.weight.copy_(vh[:kv_rank].to(w_k.dtype))
            new.k_up.weight.copy_(up[:width])
            new.v_up.weight.copy_(up[width:])
            if b_k is not None and b_v is not None:  # both or neither: the module has biases or not
                new.k_up.bias.copy_(b_k)
                new.v_up.bias.copy_(b_v)
        return new


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(batch, positions, heads * d) -> (batch, heads, positions, d)."""
    b, n, width = x.shape
    return x.view(b, n, heads, width // heads).transpose(1, 2)


def _causal_mask(queries: int, keys: int, device: torch.device) -> torch.Tensor:
    """Which keys each of the last ``queries`` positions may read, (queries, keys), True where
    allowed: the queries are the last of the ``keys`` positions."""
    offset = keys - queries
    return torch.arange(keys, device=device) <= torch.arange(queries, device=device).unsqueeze(1) + offset


def latent_attention(
    q: torch.Tensor,
    c: torch.Tensor,
    latent: LatentKV,
    *,
    kv_heads: int,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    q_rope: torch.Tensor | None = None,
    k_rope: torch.Tensor | None = None,
    form: str | None = None,
) -> torch.Tensor:
    """Attention of queries ``q`` (batch, heads, queries, d) over keys and values read from the
    latent ``c`` (batch, keys, kv_rank) through ``latent``'s up projections, ``kv_heads`` K/V
    heads; returns (batch, heads, queries, d_v). With decoupled RoPE, ``q_rope`` (batch, heads,
    queries, D) and ``k_rope`` (batch, kv_heads, keys, D), rotated, add their products to the
    scores. ``mask`` is an attention mask SDPA takes (boolean, True where allowed, or additive);
    without one, several queries are causal, aligned to the last keys.

    Runs ``form``, ``"expanded"`` or ``"absorbed"`` (module docstring), by default whichever
    takes fewer multiply-adds for these shapes; both compute the same thing. The absorbed form
    leaves out the K up projection's bias: it adds the same amount to every key's score for a
    query, which softmax ignores."""
    b, heads, n, d_k = q.shape
    keys, rank = c.shape[1], c.shape[2]
    d_rope = 0 if q_rope is None else q_rope.shape[-1]
    d_v = latent.v_up.out_features // kv_heads
    expanded = keys * rank * kv_heads * (d_k + d_v) + heads * n * keys * (d_rope + d_k + d_v)
    absorbed = heads * n * (d_k * rank + keys * (2 * rank + d_rope) + rank * d_v)
    if form not in (None, "expanded", "absorbed"):
        raise MLAError(f"form {form!r}: accepted: expanded, absorbed (default: the cheaper)")
    form = form or ("absorbed" if absorbed < expanded else "expanded")
    causal = mask is None and n > 1
    if causal and (form == "absorbed" or keys != n):  # SDPA's is_causal aligns the queries to the first keys
        mask, causal = _causal_mask(n, keys, q.device), False
    if form == "expanded":
        k, v = _heads(latent.k_up(c), kv_heads), _heads(latent.v_up(c), kv_heads)
        if q_rope is not None and k_rope is not None:  # both or neither: decoupled RoPE or not
            q, k = torch.cat([q_rope, q], dim=-1), torch.cat([k_rope, k], dim=-1)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=kv_heads != heads
        )
    group = heads // kv_heads
    q_latent = q.reshape(b, kv_heads, group * n, d_k) @ latent.k_up.weight.view(kv_heads, d_k, rank)
    scores = (q_latent.view(b, heads * n, rank) @ c.transpose(1, 2)).view(b, kv_heads, group * n, keys)
    if q_rope is not None and k_rope is not None:
        scores = scores + q_rope.reshape(b, kv_heads, group * n, d_rope) @ k_rope.transpose(-1, -2)
    scores = scores.view(b, heads, n, keys) * ((d_k + d_rope) ** -0.5 if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = scores.softmax(-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(c.dtype)  # half: in fp32
    read = (weights.view(b, heads * n, keys) @ c).view(b, kv_heads, group * n, rank)
    out = read @ latent.v_up.weight.view(kv_heads, d_v, rank).transpose(1, 2)
    if latent.v_up.bias is not None:  # the weights sum to one: the bias passes through unchanged
        out = out + latent.v_up.bias.view(kv_heads, 1, d_v)
    return out.view(b, heads, n, d_v)


class ViTLatentAttention(nn.Module):
    """timm ViT attention as MLA: ``q``, the shared :class:`LatentKV`, SDPA and ``proj``."""

    def __init__(self, dim: int, heads: int, kv_rank: int, *, qkv_bias: bool = True, proj_bias: bool = True) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = LatentKV(dim, dim, kv_rank, qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        c = self.kv.down(x)
        q, k, v = (_heads(t, self.heads) for t in (self.q(x), self.kv.k_up(c), self.kv.v_up(c)))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        return self.proj(y.transpose(1, 2).flatten(2))

    @classmethod
    def from_timm(cls, attn: LibraryModule, kv_rank: int) -> ViTLatentAttention:
        """Convert a timm ``Attention``: Q and ``proj`` copied, K/V factored through the latent."""
        dim = attn.qkv.in_features
        has_bias = attn.qkv.bias is not None
        new = cls(dim, attn.num_heads, kv_rank, qkv_bias=has_bias, proj_bias=attn.proj.bias is not None)
        new = new.to(attn.qkv.weight.device, attn.qkv.weight.dtype)
        w_q, w_k, w_v = attn.qkv.weight.detach().chunk(3)
        b_q, b_k, b_v = attn.qkv.bias.detach().chunk(3) if has_bias else (None, None, None)
        new.kv = LatentKV.factor(w_k, w_v, b_k, b_v, kv_rank)
        with torch.no_grad():
            new.q.weight.copy_(w_q)
            if b_q is not None:
                new.q.bias.copy_(b_q)
            new.proj.load_state_dict(attn.proj.state_dict())
        return new


class GPT2LatentAttention(GPT2AttentionCall):
    """Hugging Face GPT-2 attention as MLA; same call and return as ``GPT2Attention``. Its KV
    cache holds the latent, ``kv_rank`` numbers per token (stored in the cache's key slot, with
    an empty value), and K and V are rebuilt from it every step."""

    def __init__(self, dim: int, heads: int, kv_rank: int, *, layer_idx: int | None = None, resid_pdrop: float = 0.0):
        super().__init__()
        self.heads, self.layer_idx = heads, layer_idx
        self.is_causal = True  # as GPT2Attention: the tracer and HF masks read it
        self.q = nn.Linear(dim, dim)
        self.kv = LatentKV(dim, dim, kv_rank, bias=True)
        self.c_proj = nn.Linear(dim, dim)
        self.resid_dropout = nn.Dropout(resid_pdrop)

    def attend(self, hidden_states: torch.Tensor, cache: Any, attention_mask: torch.Tensor | None) -> torch.Tensor:
        b, n, _ = hidden_states.shape
        c = self.kv.down(hidden_states)
        if cache is not None:
            cached, _ = cache.update(c.unsqueeze(1), c.new_zeros(b, 1, n, 0), self.layer_idx)
            c = cached.squeeze(1)
        if attention_mask is not None:
            attention_mask = attention_mask[:, :, :, : c.shape[1]]
        q = _heads(self.q(hidden_states), self.heads)
        y = latent_attention(q, c, self.kv, kv_heads=self.heads, mask=attention_mask)
        return y.transpose(1, 2).flatten(2)

    @classmethod
    def from_hf(cls, attn: LibraryModule, kv_rank: int) -> GPT2LatentAttention:
        """Convert a ``GPT2Attention`` (``Conv1D`` weights stored (in, out)): Q and ``c_proj``
        copied, K/V factored through the latent."""
        dim = attn.embed_dim
        new = cls(dim, attn.num_heads, kv_rank, layer_idx=attn.layer_idx, resid_pdrop=attn.resid_dropout.p)
        new = new.to(attn.c_attn.weight.device, attn.c_attn.weight.dtype)
        w_q, w_k, w_v = attn.c_attn.weight.detach().t().chunk(3)
        b_q, b_k, b_v = attn.c_attn.bias.detach().chunk(3)
        new.kv = LatentKV.factor(w_k, w_v, b_k, b_v, kv_rank)
        with torch.no_grad():
            new.q.weight.copy_(w_q)
            new.q.bias.copy_(b_q)
            new.c_proj.weight.copy_(attn.c_proj.weight.t())
            new.c_proj.bias.copy_(attn.c_proj.bias)
        return new


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as LLaMA applies it: ``x cos + rotate_half(x) sin``; x (batch, heads, positions, d),
    cos and sin broadcast to it. Dimension i turns with i + d/2, one frequency per pair."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def rope_pairs(
    q: torch.Tensor | None, k: torch.Tensor | None, kv_heads: int, rope_dims: int, head_dim: int
) -> torch.Tensor:
    """Which RoPE frequency pairs each K/V head keeps under partial RoPE, (kv_heads, rope_dims
    / 2) indices into the head's ``head_dim / 2`` pairs: MHA2MLA's 2-norm rule, the pairs with the
    largest mean query norm (summed over the query heads that read the K/V head) times mean key
    norm on calibration queries ``q`` (tokens, heads, head_dim) and keys ``k`` (tokens, kv_heads,
    head_dim), before RoPE or after alike (a rotation keeps each pair's length); without them, the
    highest frequencies (LLaMA's first pairs)."""
    keep = rope_dims // 2
    if q is None or k is None:
        return torch.arange(keep).expand(kv_heads, keep).clone()
    half = head_dim // 2

    def pair_norms(x: torch.Tensor) -> torch.Tensor:  # (tokens, heads, half): each pair's length
        return torch.sqrt(x[..., :half].float() ** 2 + x[..., half:].float() ** 2)

    q_norms = pair_norms(q).mean(0).view(kv_heads, -1, half).sum(1)
    k_norms = pair_norms(k).mean(0)
    return torch.topk(q_norms * k_norms, keep, dim=-1).indices.sort(dim=-1).values


class LlamaLatentAttention(nn.Module):
    """LLaMA-style attention as MLA, exact or with partial RoPE (see the module docstring); the
    module's call and return are ``LlamaAttention``'s.

    With partial RoPE, each head's dimensions are reordered at conversion, the kept rotary ones
    first (their pairs' two halves in the order :func:`_rotate` pairs them), in ``q_proj``'s rows
    and in the key's, so a query and a key still meet dimension for dimension; ``kv.k_rope``
    projects the rotary keys, which are cached beside the latent, and ``rope_index`` (K/V
    heads, rope_dims) says which of RoPE's angles each head's rotary dimensions take."""

    def __init__(
        self,
        attn: LibraryModule,
        kv_rank: int,
        rotary: LibraryModule,
        rope_dims: int | None = None,
        pairs: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.config, self.layer_idx, self.head_dim = attn.config, attn.layer_idx, attn.head_dim
        self.is_causal, self.scaling = True, attn.scaling
        self.heads = attn.q_proj.out_features // attn.head_dim
        self.kv_heads = attn.k_proj.out_features // attn.head_dim
        self.q_proj, self.o_proj = attn.q_proj, attn.o_proj
        w_k, b_k = attn.k_proj.weight.detach(), None if attn.k_proj.bias is None else attn.k_proj.bias.detach()
        w_v, b_v = attn.v_proj.weight.detach(), None if attn.v_proj.bias is None else attn.v_proj.bias.detach()
        self.rope_dims = rope_dims
        if rope_dims is None:
            self.kv = LatentKV.factor(w_k, w_v, b_k, b_v, kv_rank)
            self._rotary = [rotary]  # the model's own rotary embedding, shared, not a submodule of each layer
            return
        assert pairs is not None, "rope_dims comes with the pairs rope_pairs chose"
        half = self.head_dim // 2
        kept = torch.zeros(self.kv_heads, half, dtype=torch.bool)
        kept.scatter_(1, pairs, True)
        rotary_dims = torch.cat([pairs, pairs + half], dim=1)
        plain = torch.stack([torch.cat([row.nonzero()[:, 0], row.nonzero()[:, 0] + half]) for row in ~kept])
        self.register_buffer("rope_index", rotary_dims)
        order = torch.cat([rotary_dims, plain], dim=1)  # (kv_heads, head_dim): each K/V head's new order
        rows = (order + self.head_dim * torch.arange(self.kv_heads).unsqueeze(1)).to(w_k.device)
        rope_rows, plain_rows = rows[:, :rope_dims].flatten(), rows[:, rope_dims:].flatten()
        self.kv = LatentKV.factor(w_k[plain_rows], w_v, None if b_k is None else b_k[plain_rows], b_v, kv_rank)
        self.kv.rope_dims = rope_dims
        self.kv.k_rope = nn.Linear(w_k.shape[1], len(rope_rows), bias=b_k is not None).to(w_k.device, w_k.dtype)
        group = self.heads // self.kv_heads
        heads = torch.arange(self.heads, device=rows.device).unsqueeze(1)
        q_rows = (order.to(rows.device).repeat_interleave(group, dim=0) + self.head_dim * heads).flatten()
        with torch.no_grad():
            self.kv.k_rope.weight.copy_(w_k[rope_rows])
            if b_k is not None:
                self.kv.k_rope.bias.copy_(b_k[rope_rows])
            self.q_proj.weight.copy_(self.q_proj.weight[q_rows])
            if self.q_proj.bias is not None:
                self.q_proj.bias.copy_(self.q_proj.bias[q_rows])

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        cache = cache if cache is not None else past_key_values
        q = _heads(self.q_proj(hidden_states), self.heads)
        if self.rope_dims is None:
            y = self._exact(hidden_states, q, position_embeddings, attention_mask, cache, kwargs.get("position_ids"))
        else:
            y = self._partial(hidden_states, q, position_embeddings, attention_mask, cache)
        return self.o_proj(y.transpose(1, 2).flatten(2)), None

    def _exact(self, x, q, position_embeddings, mask, cache, position_ids) -> torch.Tensor:
        """Attention with the whole K in the latent, rebuilt and rotated at every cached position."""
        b, n, _ = x.shape
        cos, sin = position_embeddings
        q = _rotate(q, cos.unsqueeze(1), sin.unsqueeze(1))
        c = self.kv.down(x)
        if cache is not None:
            cached, _ = cache.update(c.unsqueeze(1), c.new_zeros(b, 1, n, 0), self.layer_idx)
            c = cached.squeeze(1)
        length = c.shape[1]
        if length != n:  # the cached keys run up to this step's last position (a sliding cache keeps the last few)
            last = position_ids[:, -1:] if position_ids is not None else length - 1
            positions = last - length + 1 + torch.arange(length, device=c.device)
            cos, sin = self._rotary[0](c, positions.expand(b, length))
        k = _rotate(_heads(self.kv.k_up(c), self.kv_heads), cos.unsqueeze(1), sin.unsqueeze(1))
        v = _heads(self.kv.v_up(c), self.kv_heads)
        if mask is not None:
            mask = mask[:, :, :, :length]
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None and n > 1,
            scale=self.scaling,
            enable_gqa=self.kv_heads != self.heads,
        )

    def _partial(self, x, q, position_embeddings, mask, cache) -> torch.Tensor:
        """Attention with decoupled rotary keys: this step's are rotated at their positions and
        cached beside the latent, packed into the cache's key slot (latent first)."""
        b, n, _ = x.shape
        d, rank = self.rope_dims, self.kv.kv_rank
        cos, sin = (t[:, :, self.rope_index].transpose(1, 2) for t in position_embeddings)  # (b, kv_heads, n, d)
        k_rope = _rotate(_heads(self.kv.k_rope(x), self.kv_heads), cos, sin)
        group = self.heads // self.kv_heads
        q_rope = _rotate(q[..., :d], cos.repeat_interleave(group, 1), sin.repeat_interleave(group, 1))
        c = self.kv.down(x)
        if cache is not None:
            packed = torch.cat([c, k_rope.transpose(1, 2).flatten(2)], dim=-1).unsqueeze(1)
            cached, _ = cache.update(packed, c.new_zeros(b, 1, n, 0), self.layer_idx)
            c, k_rope = cached[:, 0, :, :rank], _heads(cached[:, 0, :, rank:], self.kv_heads)
        if mask is not None:
            mask = mask[:, :, :, : c.shape[1]]
        return latent_attention(
            q[..., d:], c, self.kv, kv_heads=self.kv_heads, scale=self.scaling, mask=mask, q_rope=q_rope, k_rope=k_rope
        )


def _attention_modules(model: nn.Module) -> list[tuple[str, nn.Module, AttentionAdapter]]:
    """Every attention module of ``model`` ``to_mla`` would replace, with its adapter: an
    attention no adapter claims is an MLAError naming it."""
    found: list[tuple[str, nn.Module, AttentionAdapter]] = []
    for path, module in model.named_modules():
        name = type(module).__name__
        if any(path.startswith(p + ".") for p, _, _ in found) or isinstance(
            module, (LatentKV, ViTLatentAttention, GPT2LatentAttention, LlamaLatentAttention)
        ):
            continue
        adapter = adapter_for(module)
        if adapter is not None:
            found.append((path, module, adapter))
        elif "attention" in name.lower():
            raise MLAError(f"module '{path}' ({type(module).__module__}.{name}) is an attention to_mla cannot convert")
    if not found:
        raise MLAError(f"{type(model).__name__} has no attention module to_mla knows how to convert")
    return found


def kv_cache_bytes(model: nn.Module) -> int:
    """Bytes of KV cache per token, summed over the layers: K and V, heads x head_dim values
    each, per layer for MHA and GQA, ``kv_rank`` values (and the rotary keys) for MLA, graphkit's
    or DeepSeek's (``kv_lora_rank + qk_rope_head_dim``), at the model's parameter dtype."""
    size = next(model.parameters()).element_size()
    total = 0
    for module in model.modules():
        if isinstance(module, LatentKV):
            total += module.kv_rank + (module.k_rope.out_features if module.rope_dims else 0)
        elif isinstance(latent := getattr(module, "kv_a_proj_with_mqa", None), nn.Linear):  # DeepSeek's MLA:
            total += latent.out_features  # the latent and the rotary key all heads share
        elif isinstance(module, (ViTGroupedAttention, GPT2GroupedAttention)):
            total += 2 * module.core.kv_heads * module.head_dim
        elif (adapter := adapter_for(module)) is not None:  # unconverted, or converted in place (LLaMA's GQA)
            total += adapter.kv_values(module)
    return total * size


def _check(path: str, module: nn.Module, adapter: AttentionAdapter, kv_rank: Any, rope_dims: Any) -> None:
    """Refuse a rank or rotary width ``module`` cannot take, naming it: ``rope_dims`` for
    attention without RoPE, what its adapter's ``mla_rank`` refuses, a ``kv_rank`` above the most
    it can factor."""
    if rope_dims is not None and not adapter.rotary:
        raise MLAError(
            f"rope_dims {rope_dims!r} for module '{path}' ({type(module).__name__}): it has no RoPE; "
            "rope_dims applies to rotary (LLaMA-style) attention"
        )
    most = adapter.mla_rank(path, module, rope_dims)
    if not is_count(kv_rank, 1, most):
        raise MLAError(
            f"kv_rank {kv_rank!r} for module '{path}': must be an integer from 1 to {most}, "
            f"the most it can factor (at {most} the latent is exact)"
        )


def to_mla(
    model: nn.Module, kv_rank: int, *, rope_dims: int | None = None, calibration: Sequence[Any] = ()
) -> nn.Module:
    """Replace every attention module of ``model`` (in place) by MLA with a ``kv_rank``-number
    latent per token (see the module docstring); returns the model. ``rope_dims`` converts a
    LLaMA-style model with partial RoPE, keeping that many rotary dimensions per K/V head out of
    the latent, chosen on ``calibration`` (a sequence of the model's inputs, as
    :func:`~graphkit.attention.convert` takes them) when given. Every module is checked before
    any changes: a rank or rotary width it cannot take, or an attention ``to_mla`` cannot
    convert, is an MLAError naming it, and the model is left as it was."""
    plan = _attention_modules(model)
    for path, module, adapter in plan:
        _check(path, module, adapter, kv_rank, rope_dims)
    rotary = next((m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")), None)
    if rotary is None and any(adapter.rotary for _, _, adapter in plan):
        raise MLAError(f"{type(model).__name__}: no rotary embedding module found for its RoPE attention")
    seen = {}
    if rope_dims is not None and calibration:
        seen = capture_calibration(model, plan, calibration)
    for path, module, adapter in plan:
        new = adapter.to_mla(module, kv_rank, rope_dims, rotary, seen.get(path))
        new.train(module.training)
        parent, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent), name, new)
    return model


def mla_metadata(model: nn.Module) -> dict[str, str]:
    """What an MLA conversion is, for a safetensors file's metadata: the variant and the rank,
    read off the model's own latents."""
    latent = next((m for m in model.modules() if isinstance(m, LatentKV)), None)
    if latent is None:
        raise MLAError(f"{type(model).__name__} has no MLA attention to describe")
    metadata = {"graphkit_attention": "mla", "graphkit_kv_rank": str(latent.kv_rank)}
    if latent.rope_dims:
        metadata["graphkit_rope_dims"] = str(latent.rope_dims)
    return metadata


def attention_metadata(model: nn.Module) -> dict[str, str]:
    """What ``model``'s converted attention is, for a safetensors file's metadata: MLA's rank and
    rotary width (:func:`mla_metadata`), GQA's or a variant's K/V heads and groups
    (:func:`~graphkit.attention.convert.conversion_metadata`), nothing for attention graphkit did
    not convert."""
    if any(isinstance(m, LatentKV) for m in model.modules()):
        return mla_metadata(model)
    if any(isinstance(m, GroupedQueryAttention) for m in model.modules()):
        return conversion_metadata(model)
    return {}
