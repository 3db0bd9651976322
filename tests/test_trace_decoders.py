"""What transformers' decoders added to the tracer (vocabulary v4, the zoo-decoders dataset): each
rule on a small config of the model that needs it, or on a hand-written module, traced on meta,
with the graphs of the transformers models pinned (tests/golden_fingerprints.json)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from helpers import assert_golden_fingerprint, meta
from torch import nn

import graphkit
from graphkit.errors import NeedsValuesError

SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=128)


def decoder(model_type: str, **config):
    """transformers' causal LM of ``model_type`` at a small config, on meta."""
    from transformers import AutoConfig, AutoModelForCausalLM

    reference = AutoConfig.for_model(model_type, **config)
    return meta(lambda: AutoModelForCausalLM.from_config(reference))


def clean(model, **kwargs):
    graph = graphkit.trace(model, **kwargs)
    assert not [n.op for n in graph.nodes if n.op.startswith("other:")]
    return graph


def nodes(graph, op: str):
    return [n for n in graph.nodes if n.op == op]


@pytest.mark.slow
def test_a_sink_applied_after_the_product_with_v_is_the_attentions_parameter():
    """Granite's SWA layers scale the output by sigmoid(logsumexp(scores) - sink): GPT-OSS's extra
    softmax-denominator logit, applied after the product with V. One attention node owns it."""
    graph = clean(decoder("granite_swa", **SMALL, num_key_value_heads=2))
    attention = nodes(graph, "attention")
    assert len(attention) == 2 and all(n.attrs["sinks"] and n.attrs["causal"] for n in attention)
    assert all(list(n.params) == [f"{n.module}.sinks"] for n in attention)
    assert not nodes(graph, "sigmoid")
    assert_golden_fingerprint("granite_swa_small", graph)


@pytest.mark.slow
def test_xglm_clamps_its_scores_inside_the_attention():
    graph = clean(decoder("xglm", d_model=64, ffn_dim=128, num_layers=2, attention_heads=4, vocab_size=128))
    assert [n.attrs["causal"] for n in nodes(graph, "attention")] == [True, True]


@pytest.mark.slow
def test_rotation_before_a_query_key_norm_is_still_rope():
    """nanochat and Llama 4 rotate q and k, then normalise them: the norm ends the attention
    node, and the rotation (a negation, or a complex product) is read in the attention module."""
    graph = clean(decoder("nanochat", **SMALL))
    assert all(n.attrs["rope"] for n in nodes(graph, "attention"))
    llama4 = decoder(
        "llama4_text",
        **{**SMALL, "intermediate_size": 64},
        intermediate_size_mlp=128,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        interleave_moe_layer_step=1,
    )
    graph = clean(llama4)
    attention, moe = nodes(graph, "attention"), nodes(graph, "moe")
    assert len(attention) == 2 and [n.attrs["rope"] for n in attention] == [True, True]
    # Llama 4's router is an nn.Linear that also picks and gates: all of it is the moe node's
    assert len(moe) == 2 and all(f"{n.module}.router.weight" in n.params for n in moe)
    assert [(n.attrs["num_experts"], n.attrs["top_k"]) for n in moe] == [(4, 1), (4, 1)]
    assert_golden_fingerprint("llama4_text_small", graph)


@pytest.mark.slow
def test_experts_picked_by_maxes_are_one_moe_node():
    """PhiMoE's sparse mixer picks its two experts with two maxes instead of a topk."""
    graph = clean(decoder("phimoe", **SMALL, num_key_value_heads=2, num_local_experts=4))
    moe = nodes(graph, "moe")
    assert [(n.attrs["num_experts"], n.attrs["top_k"], n.attrs["intermediate_size"]) for n in moe] == [(4, 2, 128)] * 2
    assert_golden_fingerprint("phimoe_small", graph)


@pytest.mark.slow
def test_a_mixture_of_attention_heads_is_an_attention_around_its_experts():
    """JetMoE's attention projections are experts (MoA): the attention node stays an attention,
    its experts' projections and router are traced around it, and the graph has no cycle."""
    jetmoe = decoder(
        "jetmoe",
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=64,
        num_key_value_heads=4,
        kv_channels=16,
        num_local_experts=4,
        vocab_size=128,
    )
    graph = clean(jetmoe)
    attention = nodes(graph, "attention")
    assert len(attention) == 2 and all(n.module.endswith("self_attention") for n in attention)
    # each layer routes twice, over its attention's experts and over its MLP's (whose experts are
    # ParallelExperts, not an ``experts`` child: traced op by op too)
    assert [n.module for n in nodes(graph, "moe_router")][:2] == [
        "model.layers.0.self_attention.experts.router",
        "model.layers.0.mlp.router",
    ]
    assert_golden_fingerprint("jetmoe_small", graph)


@pytest.mark.slow
def test_xielu_and_l2_norms():
    """Apertus' xIELU is one node owning its learned slopes; an L2 norm module is an rms_norm."""
    graph = clean(decoder("apertus", **SMALL))
    activations = nodes(graph, "xielu")
    assert len(activations) == 2 and all(len(n.params) >= 2 for n in activations)


class _Arithmetic(nn.Module):
    """Ops spelled by their aliases or as powers, as decoders write them."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        a = torch.concatenate([h, -h.flip(-1)], dim=-1)  # concat; the negation and the flip move data
        b = torch.multiply(a, a.sqrt().reciprocal())  # mul of pow(0.5) and pow(-1)
        c = b.pow(2) + b.pow(3) + torch.rsqrt(b)  # square, pow(3), pow(-0.5)
        return c / c.std(dim=-1, keepdim=True)


def test_aliases_and_powers_are_vocabulary_ops():
    graph = clean(_Arithmetic(), example_inputs=torch.zeros(2, 8))
    ops = Counter(n.op for n in graph.nodes)
    assert (ops["concat"], ops["mul"], ops["square"], ops["pow"], ops["std"], ops["div"]) == (1, 1, 1, 4, 1, 1)
    assert sorted(n.attrs["exponent"] for n in nodes(graph, "pow")) == [-1.0, -0.5, 0.5, 3.0]
    assert "neg" not in ops and "flip" not in ops


class _NoGradIndexer(nn.Module):
    """A block that scores without gradients (DeepSeek-style indexers, HRM's inner loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            gate = self.score(x).sigmoid()
        return self.out(x * gate)


def test_a_no_grad_block_is_traced_inline():
    graph = clean(_NoGradIndexer(), example_inputs=torch.zeros(2, 8))
    assert [n.op for n in graph.nodes] == ["input", "linear", "sigmoid", "mul", "head", "output"]


class _CpuPositions(nn.Module):
    """Makes a tensor on the CPU in forward whatever device its weights are on (XLNet)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + torch.arange(8, dtype=x.dtype)


def test_a_forward_that_makes_cpu_tensors_needs_a_model_with_values():
    with pytest.raises(NeedsValuesError, match=r"_CpuPositions.forward raised"):
        graphkit.trace(meta(_CpuPositions), torch.zeros(2, 8, device="meta"))
    assert [n.op for n in clean(_CpuPositions(), example_inputs=torch.zeros(2, 8)).nodes] == [
        "input",
        "head",
        "output",
    ]


class _HashRouted(nn.Module):
    """An MoE block whose experts are picked by a fixed table, not by a topk (DeepSeek-V4's first
    layers route by token id)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(8, 4, bias=False)
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        self.register_buffer("table", torch.tensor([[0, 1], [2, 3], [1, 2]]))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The two experts of each token, and their weights."""
        scores = self.gate(x).softmax(-1)  # (tokens, experts)
        picked = self.table[torch.arange(x.shape[0], device=x.device) % 3]  # (tokens, 2)
        return scores.gather(-1, picked), picked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, picked = self.route(x)
        out = torch.zeros_like(x)
        for slot in range(2):
            for e, expert in enumerate(self.experts):
                out = out + (picked[:, slot] == e).unsqueeze(-1) * weights[:, slot : slot + 1] * expert(x)
        return out


class _HashLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = _HashRouted()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


def test_experts_picked_by_a_table_are_one_moe_node():
    graph = clean(_HashLM(), example_inputs=torch.zeros(6, 8))
    (moe,) = nodes(graph, "moe")
    assert (moe.attrs["num_experts"], moe.attrs["top_k"]) == (4, 2) and "mlp.gate.weight" in moe.params


class _TopkMoE(_HashRouted):
    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.gate(x).softmax(-1).topk(2, dim=-1)


class _Looped(nn.Module):
    """Runs its MoE block twice (Inkling's looped layers): two calls, two ``moe`` nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = _TopkMoE()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(2):
            x = x + self.mlp(x)
        return x


def test_a_block_run_twice_is_two_moe_nodes():
    graph = clean(_Looped(), example_inputs=torch.zeros(6, 8))
    moe = nodes(graph, "moe")
    assert len(moe) == 2 and [n.attrs["top_k"] for n in moe] == [2, 2]
    assert moe[1].attrs.get("tied") and [n.op for n in graph.nodes].count("add") == 2
