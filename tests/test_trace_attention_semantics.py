"""An attention node's attributes say what the module computes, not how it is spelled: heads
from the shapes that meet in the score product, whatever their rank; ``causal`` and ``window``
from the values of the mask, wherever it is applied; a softmax in any form. Each module here is
hand-written the way a user might write it, and is traced against a reference spelling."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphkit
from graphkit import TraceError
from graphkit.tracing import masks

T, DIM = 8, 32  # tokens and width of every model here


def attention_attrs(graph) -> dict:
    (attrs,) = [node.attrs for node in graph.nodes if node.op == "attention"]
    return attrs


def summary(attrs: dict) -> tuple:
    return tuple(attrs[k] for k in ("heads", "kv_heads", "head_dim", "causal", "window"))


def traced(model: nn.Module, tokens: int = T):
    graph = graphkit.trace(model, (torch.randn(2, tokens, DIM),))
    assert not [node.op for node in graph.nodes if node.op.startswith("other:")]
    return graph


class Projections(nn.Module):
    """q, k, v and output projections for ``heads`` query heads sharing ``kv_heads`` K/V heads;
    ``forward`` returns the output projection of what ``attend(q, k, v)`` gives, the inputs in
    (batch, tokens, heads * head_dim)."""

    def __init__(self, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.h, self.kv, self.d = heads, kv_heads, DIM // heads
        self.q, self.o = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        self.k, self.v = nn.Linear(DIM, kv_heads * self.d), nn.Linear(DIM, kv_heads * self.d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return self.o(self.attend(self.q(x), self.k(x), self.v(x)).reshape(b, t, DIM))

    def heads_first(self, z: torch.Tensor, heads: int) -> torch.Tensor:
        return z.unflatten(-1, (heads, self.d)).transpose(1, 2)


# --- heads: the shapes that meet in the score product ------------------------------------------


class GroupedHeads(Projections):
    """8 query heads in 2 groups sharing K/V, written in the spellings the red-team found."""

    def __init__(self, spelling: str, kv_heads: int = 2) -> None:
        super().__init__(8, kv_heads)
        self.spelling = spelling

    def attend(self, q, k, v):
        b, t, _ = q.shape
        g, r, d = self.kv, self.h // self.kv, self.d
        if self.spelling == "sdpa enable_gqa":
            y = F.scaled_dot_product_attention(
                self.heads_first(q, self.h), self.heads_first(k, g), self.heads_first(v, g), enable_gqa=True
            )
            return y.transpose(1, 2)
        if self.spelling == "repeat_interleave":  # K/V copied to every query head of their group
            k, v = (self.heads_first(z, g).repeat_interleave(r, dim=1) for z in (k, v))
            return F.scaled_dot_product_attention(self.heads_first(q, self.h), k, v).transpose(1, 2)
        if self.spelling == "5-D matmul":  # queries (b, g, r, t, d) against K/V (b, g, 1, t, d)
            q = q.view(b, t, g, r, d).permute(0, 2, 3, 1, 4)
            k, v = (z.view(b, t, g, 1, d).permute(0, 2, 3, 1, 4) for z in (k, v))
            p = (q @ k.transpose(-1, -2) / math.sqrt(d)).softmax(-1)
            return (p @ v).permute(0, 3, 1, 2, 4)
        if self.spelling == "grouped einsum":  # Gemma's letters: K/V groups, G queries per group
            q, k, v = q.view(b, t, g, r, d), k.view(b, t, g, d), v.view(b, t, g, d)
            p = torch.einsum("BTKGH,BSKH->BKGTS", q / math.sqrt(d), k).softmax(-1)
            return torch.einsum("BKGTS,BSKH->BTKGH", p, v)
        if self.spelling == "einsum without a K/V head letter":  # one K/V head: MQA
            p = torch.einsum("bhqd,bkd->bhqk", self.heads_first(q, self.h) / math.sqrt(d), k).softmax(-1)
            return torch.einsum("bhqk,bkd->bqhd", p, v)
        raise AssertionError(self.spelling)


@pytest.mark.parametrize(
    "spelling,kv_heads",
    [("repeat_interleave", 2), ("5-D matmul", 2), ("grouped einsum", 2), ("einsum without a K/V head letter", 1)],
)
def test_grouped_heads_are_counted_whatever_the_rank_or_the_letters(spelling, kv_heads):
    graph = traced(GroupedHeads(spelling, kv_heads))
    assert summary(attention_attrs(graph)) == (8, kv_heads, 4, False, None)
    assert graph.fingerprint() == traced(GroupedHeads("sdpa enable_gqa", kv_heads)).fingerprint()


class FoldedHeads(Projections):
    """Heads folded into the batch for ``bmm``, the module naming their count as nothing the
    tracer knows (``n_splits``), or single-head SDPA on 3-D tensors."""

    def __init__(self, heads: int) -> None:
        super().__init__(heads, heads)
        self.n_splits = heads

    def attend(self, q, k, v):
        b, t, _ = q.shape
        if self.n_splits == 1:
            return F.scaled_dot_product_attention(q, k, v)
        q, k, v = (self.heads_first(z, self.n_splits).reshape(b * self.n_splits, t, self.d) for z in (q, k, v))
        p = torch.bmm(q, k.transpose(1, 2) / math.sqrt(self.d)).softmax(-1)
        return torch.bmm(p, v).view(b, self.n_splits, t, self.d).transpose(1, 2)


@pytest.mark.parametrize("heads", [4, 1])
def test_heads_folded_into_the_batch_are_read_from_the_shapes_before_the_fold(heads):
    assert summary(attention_attrs(traced(FoldedHeads(heads)))) == (heads, heads, DIM // heads, False, None)


# --- causal and window: the values of the mask, wherever it is applied --------------------------

MASKINGS = [
    "masked_fill before softmax",
    "added before softmax",
    "where before softmax",
    "multiplied after softmax",
    "masked_fill after softmax",
    "where after softmax",
]


class Masked(Projections):
    """Attention whose queries see ``keep(t)``, applied as ``masking`` says: to the scores before
    the softmax, or to the probabilities after it (which are then renormalised)."""

    def __init__(self, masking: str, window: int | None = None, alibi: float = 0.0, **attributes) -> None:
        super().__init__(4, 4)
        self.masking, self.band, self.alibi = masking, window, alibi
        for name, value in attributes.items():  # attributes the tracer must not take at their word
            setattr(self, name, value)

    def keep(self, t: int, device) -> torch.Tensor:
        i = torch.arange(t, device=device)
        keep = i[None, :] <= i[:, None]
        return keep if self.band is None else keep & (i[None, :] > i[:, None] - self.band)

    def attend(self, q, k, v):
        q, k, v = (self.heads_first(z, self.h) for z in (q, k, v))
        keep = self.keep(q.shape[-2], q.device)
        if self.masking == "sdpa is_causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        if self.alibi:  # a bias that grows with the distance to the key
            i = torch.arange(q.shape[-2], device=q.device)
            s = s - self.alibi * (i[:, None] - i[None, :]).clamp(min=0)
        if self.masking == "masked_fill before softmax":
            s = s.masked_fill(~keep, float("-inf"))
        elif self.masking == "added before softmax":
            s = s + torch.zeros(keep.shape, device=s.device).masked_fill(~keep, -1e9)
        elif self.masking == "where before softmax":
            s = torch.where(keep, s, torch.finfo(s.dtype).min)
        p = s.softmax(-1)
        if self.masking.endswith("after softmax"):
            if self.masking.startswith("multiplied"):
                p = p * keep.to(p.dtype)
            elif self.masking.startswith("masked_fill"):
                p = p.masked_fill(~keep, 0.0)
            else:
                p = torch.where(keep, p, 0.0)
            p = p / p.sum(-1, keepdim=True)
        return (p @ v).transpose(1, 2)


@pytest.mark.parametrize("masking", MASKINGS)
def test_a_causal_mask_is_read_wherever_it_is_applied(masking):
    graph = traced(Masked(masking))
    assert summary(attention_attrs(graph)) == (4, 4, 8, True, None)
    assert graph.fingerprint() == traced(Masked("sdpa is_causal")).fingerprint()


@pytest.mark.parametrize("masking", ["masked_fill before softmax", "multiplied after softmax"])
def test_a_sliding_window_is_read_off_the_mask(masking):
    """A 3-token window built from ``arange`` comparisons, with no attribute naming it."""
    assert attention_attrs(traced(Masked(masking, window=3)))["window"] == 3


def test_a_window_is_read_only_where_every_head_has_it(monkeypatch):
    """The maps of the batch and heads are read as what some map shows and what every map does:
    a window is the band every head keeps; a head with a wider one makes the attention causal,
    with no window; a later key any head sees makes it bidirectional. A long context goes
    through a few maps at a time, with the same result."""
    keys = torch.arange(T)
    band = (keys[None, :] <= keys[:, None]) & (keys[None, :] > keys[:, None] - 3)
    wider = (keys[None, :] <= keys[:, None]) & (keys[None, :] > keys[:, None] - 5)
    logits = torch.where(band, 0.0, -torch.inf).expand(2, 4, T, T).clone()
    assert masks.read_pattern(masks.visibility(logits), T, T) == masks.Pattern(causal=True, window=3)
    monkeypatch.setattr(masks, "CHUNK_NUMEL", T * T)  # one map at a time
    assert masks.read_pattern(masks.visibility(logits), T, T) == masks.Pattern(causal=True, window=3)
    logits[1, 2] = torch.where(wider, 0.0, -torch.inf)  # one head of one sequence sees 5 keys
    assert masks.read_pattern(masks.visibility(logits), T, T) == masks.Pattern(causal=True, window=None)
    logits[0, 3, 0, T - 1] = 0.0  # one query of one head sees the last key
    assert masks.read_pattern(masks.visibility(logits), T, T) == masks.Pattern(causal=False, window=None)
    mask = band.expand(2, 4, T, T).clone()  # a boolean mask says the same
    assert masks.read_pattern(masks.Visibility.of_mask(mask), T, T) == masks.Pattern(causal=True, window=3)
    mask[1, 2] = wider
    assert masks.read_pattern(masks.Visibility.of_mask(mask), T, T) == masks.Pattern(causal=True, window=None)


def test_a_window_needs_masked_keys_not_faded_ones():
    """Keys 30 below the best are hidden (weight under e^-20) but not masked (100 below): the
    band they leave is no window; a row whose every key is masked shows none and stays sharp."""
    keys = torch.arange(T)
    band = (keys[None, :] <= keys[:, None]) & (keys[None, :] > keys[:, None] - 3)
    faded = torch.where(band, 0.0, -30.0).masked_fill(keys[None, :] > keys[:, None], -torch.inf)
    seen = masks.visibility(faded)
    assert torch.equal(seen.some, band) and not seen.sharp
    assert masks.read_pattern(seen, T, T) == masks.Pattern(causal=True, window=None)
    empty = torch.full((T, T), -torch.inf)
    assert not masks.visibility(empty).some.any() and masks.visibility(empty).sharp


class GatedSoftmaxes(Projections):
    """ConViT's gated positional attention: a learned gate mixes the softmax of the scores with a
    softmax of learned positional logits, then renormalises."""

    def __init__(self) -> None:
        super().__init__(4, 4)
        self.positional = nn.Parameter(torch.zeros(1, 4, T, T))
        self.gate = nn.Parameter(torch.ones(4, 1, 1))

    def attend(self, q, k, v):
        q, k, v = (self.heads_first(z, self.h) for z in (q, k, v))
        gate = torch.sigmoid(self.gate)
        p = (1 - gate) * (q @ k.transpose(-1, -2)).softmax(-1) + gate * self.positional.softmax(-1)
        return (p / p.sum(-1, keepdim=True) @ v).transpose(1, 2)


def test_a_learned_gate_after_the_softmax_hides_no_key():
    assert summary(attention_attrs(traced(GatedSoftmaxes()))) == (4, 4, 8, False, None)


def test_a_bias_that_fades_far_keys_is_no_window():
    """ALiBi-like bias over 32 tokens: keys more than 20 back weigh less than e^-20 of the best,
    but nothing masks them."""
    attrs = attention_attrs(traced(Masked("masked_fill before softmax", alibi=1.0), tokens=32))
    assert (attrs["causal"], attrs["window"]) == (True, None)


def test_an_attribute_named_like_a_window_does_not_make_one():
    """``window_size = 4`` on a full causal attention over 8 tokens: the mask shows no window."""
    attrs = attention_attrs(traced(Masked("masked_fill before softmax", window_size=4)))
    assert (attrs["causal"], attrs["window"]) == (True, None)
    attrs = attention_attrs(traced(Masked("sdpa is_causal", sliding_window=4)))
    assert (attrs["causal"], attrs["window"]) == (True, None)


def test_a_window_longer_than_the_inputs_is_the_one_the_module_names():
    """8 tokens cannot show a 16-token window: the module's ``sliding_window`` stands, as the
    config's does for transformers' models; the values show nothing against it."""
    assert attention_attrs(traced(Masked("masked_fill before softmax", sliding_window=16)))["window"] == 16
    attrs = attention_attrs(traced(Masked("masked_fill before softmax", window=3, sliding_window=16)))
    assert attrs["window"] == 3  # the values show a window: they decide


class CausalFromTwoTokens(Masked):
    """transformers' SDPA path: ``is_causal`` only where there is more than one query."""

    def attend(self, q, k, v):
        q, k, v = (self.heads_first(z, self.h) for z in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[-2] > 1).transpose(1, 2)


@pytest.mark.parametrize("model", [Masked("masked_fill before softmax"), CausalFromTwoTokens("")])
def test_one_token_cannot_show_causality_and_is_refused(model):
    name = type(model).__name__
    with pytest.raises(TraceError, match=rf"attention in module '{name}' is causal: .*single key.*at least 2 tokens"):
        traced(model, tokens=1)
    assert attention_attrs(traced(model, tokens=2))["causal"] is True


# --- a softmax in any form ---------------------------------------------------------------------


class Softmaxes(Projections):
    def __init__(self, form: str) -> None:
        super().__init__(4, 4)
        self.form = form

    def attend(self, q, k, v):
        q, k, v = (self.heads_first(z, self.h) for z in (q, k, v))
        s = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        if self.form == "softmax":
            p = s.softmax(-1)
        elif self.form == "softmax then nan_to_num":  # a row with every key masked gives zeros, not NaN
            p = s.softmax(-1).nan_to_num(0.0)
        elif self.form == "exp over its sum":
            e = (s - s.amax(-1, keepdim=True)).exp()
            p = e / e.sum(-1, keepdim=True)
        elif self.form == "exp times the reciprocal of its sum":
            e = s.exp()
            p = e * e.sum(-1, keepdim=True).reciprocal()
        elif self.form == "exp, not normalised":
            p = s.exp()
        return (p @ v).transpose(1, 2)


@pytest.mark.parametrize("form", ["softmax then nan_to_num", "exp over its sum", "exp times the reciprocal of its sum"])
def test_a_softmax_in_any_form_makes_an_attention(form):
    graph = traced(Softmaxes(form))
    assert graph.fingerprint() == traced(Softmaxes("softmax")).fingerprint()


def test_exponentials_not_normalised_are_no_softmax():
    graph = graphkit.trace(Softmaxes("exp, not normalised"), (torch.randn(2, T, DIM),))
    assert "attention" not in graph.op_counts() and graph.op_counts()["matmul"] == 2


# --- transposes ----------------------------------------------------------------------------------


class Transposes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.T.mT.swapaxes(0, 1).swapdims(0, 1).moveaxis(0, 1))


def test_transposes_in_every_spelling_move_data():
    graph = graphkit.trace(Transposes(), (torch.randn(6, 6),))
    assert [node.op for node in graph.nodes] == ["input", "head", "output"]
