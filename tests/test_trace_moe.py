"""Mixture of experts as one `moe` node: Mixtral, DeepSeek-V3 (shared experts, group-limited
routing, a dense first layer) and a hand-written top-k block, all built on meta from small configs."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_golden_fingerprint
from torch import nn
from typer.testing import CliRunner

from graphkit import ArchGraph, trace
from graphkit.cli import app
from graphkit.draw import build_scene, layout
from graphkit.ghn import CheckpointError, load_checkpoint
from graphkit.ghn.checkpoint import check_graph
from graphkit.ghn.config import LoGAHConfig
from graphkit.ghn.encoding import EncodingError, encode
from graphkit.ops import VOCABULARY_SIZES

transformers = pytest.importorskip("transformers")


def mixtral(layers: int = 3) -> nn.Module:
    config = transformers.MixtralConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    with torch.device("meta"):
        return transformers.MixtralForCausalLM(config)


def deepseek_v3(layers: int = 2) -> nn.Module:
    """A dense first layer, then MoE layers of 8 routed experts in 2 groups (group-limited
    routing: topk over groups, then over experts) and one shared expert."""
    config = transformers.DeepseekV3Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=layers,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=2,
        topk_group=1,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
    )
    with torch.device("meta"):
        return transformers.DeepseekV3ForCausalLM(config)


class Expert(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class TopKMoE(nn.Module):
    """Softmax over the top-k router logits, every expert run densely, weighted sum: no
    data-dependent control flow, so torch.export traces it."""

    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(dim, hidden) for _ in range(num_experts))
        self.top_k = top_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x)
        weights, chosen = logits.topk(self.top_k, dim=-1)
        gates = torch.zeros_like(logits).scatter(-1, chosen, weights.softmax(dim=-1))
        outputs = torch.stack([expert(x) for expert in self.experts], dim=-1)
        return (outputs * gates.unsqueeze(-2)).sum(dim=-1)


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.moe = TopKMoE(dim, hidden=48, num_experts=4, top_k=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.moe(self.norm(x))


class TinyMoELM(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 16, layers: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def moe_nodes(graph: ArchGraph) -> list:
    return [node for node in graph.nodes if node.op == "moe"]


def parents(graph: ArchGraph, name: str) -> list[str]:
    index = next(i for i, node in enumerate(graph.nodes) if node.name == name)
    return sorted(graph.nodes[s].name for s, d in graph.edges if d == index)


def assert_clean(graph: ArchGraph) -> None:
    """No op outside the vocabulary, no raw router pieces left beside the moe nodes."""
    ops = graph.op_counts()
    assert not [op for op in ops if op.startswith("other:")], ops
    assert "moe_router" not in ops and "softmax" not in ops and "sigmoid" not in ops


def test_mixtral_has_one_moe_node_per_layer_owning_router_and_experts():
    graph = trace(mixtral())  # trace validates: every parameter owned exactly once
    assert_clean(graph)
    moes = moe_nodes(graph)
    assert [n.name for n in moes] == [f"model.layers.{i}.mlp.moe" for i in range(3)]
    assert all(n.attrs == {"num_experts": 4, "top_k": 2, "intermediate_size": 64} for n in moes)
    assert sorted(moes[0].params) == [
        "model.layers.0.mlp.experts.down_proj",
        "model.layers.0.mlp.experts.gate_up_proj",
        "model.layers.0.mlp.gate.weight",
    ]
    assert moes[0].params["model.layers.0.mlp.experts.gate_up_proj"] == (4, 128, 32)
    # fed by the post-attention norm, feeding the residual add
    assert parents(graph, "model.layers.0.mlp.moe") == ["model.layers.0.post_attention_layernorm"]
    assert "model.layers.0.mlp.moe" in parents(graph, "model.layers.0.add_1")
    assert graph.summary().splitlines()[-1] == "moe: 3 x experts=4 top_k=2 intermediate_size=64"


@pytest.mark.slow
def test_mixtral_folded_and_retraced_graphs_are_identical():
    folded = trace(mixtral())
    assert_golden_fingerprint("mixtral", folded)
    assert folded.fingerprint() == trace(mixtral(), fold_repeats=False).fingerprint()
    assert folded.fingerprint() == trace(mixtral()).fingerprint()
    assert folded.fingerprint() != trace(mixtral(layers=2)).fingerprint()


@pytest.mark.slow
def test_deepseek_v3_keeps_the_dense_layer_and_the_shared_experts_apart():
    model = deepseek_v3()
    graph = trace(model)
    assert_clean(graph)
    (moe,) = moe_nodes(graph)
    # the expert topk ranks 8 experts, not the 4 of a group nor the 2 groups
    assert moe.name == "model.layers.1.mlp.moe"
    assert moe.attrs == {"num_experts": 8, "top_k": 2, "intermediate_size": 16}
    assert sorted(moe.params) == [
        "model.layers.1.mlp.experts.down_proj",
        "model.layers.1.mlp.experts.gate_up_proj",
        "model.layers.1.mlp.gate.weight",
    ]
    ops = {node.name: node.op for node in graph.nodes}
    assert ops["model.layers.0.mlp.down_proj"] == "linear"  # layer 0 is dense
    assert ops["model.layers.1.mlp.shared_experts.down_proj"] == "linear"
    # the shared expert runs beside the routed experts and is added to their output
    assert parents(graph, "model.layers.1.mlp.add") == [
        "model.layers.1.mlp.moe",
        "model.layers.1.mlp.shared_experts.down_proj",
    ]
    assert parents(graph, "model.layers.1.mlp.shared_experts.gate_proj") == parents(graph, "model.layers.1.mlp.moe")
    assert_golden_fingerprint("deepseek_v3", graph)
    assert graph.fingerprint() == trace(deepseek_v3(), fold_repeats=False).fingerprint()
    assert graph.fingerprint() == trace(deepseek_v3()).fingerprint()


def test_a_drawing_frames_the_repeated_moe_layers_only():
    """The folded run starts after the dense first layer; the rotary table's edge into it comes
    from far above and must neither stretch the frame over layer 0 nor leave the canvas."""
    scene = build_scene(trace(deepseek_v3(layers=3)))
    layout(scene)
    (frame,) = scene.frames
    assert (frame.label, frame.count) == ("model.layers.1–2", 2)
    x0, y0, x1, y1 = frame.bounds
    outside = [box for i, box in enumerate(scene.boxes) if i not in frame.members]
    assert not [box.node.name for box in outside if x0 <= box.x <= x1 and y0 <= box.y <= y1]
    assert any(scene.boxes[i].node.op == "moe" for i in frame.members)
    assert all(0 <= x <= scene.width for curve in scene.curves for x, _ in curve)


def test_qwen2_moe_keeps_its_gated_shared_expert_apart():
    config = transformers.Qwen2MoeConfig(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=48,
        num_experts=6,
        num_experts_per_tok=2,
    )
    with torch.device("meta"):
        graph = trace(transformers.Qwen2MoeForCausalLM(config))
    assert not [op for op in graph.op_counts() if op.startswith("other:")]
    (moe,) = moe_nodes(graph)
    assert moe.attrs == {"num_experts": 6, "top_k": 2, "intermediate_size": 16}
    # shared expert * sigmoid(shared_expert_gate(x)), added to the routed experts' output
    assert parents(graph, "model.layers.0.mlp.sigmoid") == ["model.layers.0.mlp.shared_expert_gate"]
    assert parents(graph, "model.layers.0.mlp.add") == ["model.layers.0.mlp.moe", "model.layers.0.mlp.mul"]


def test_a_hand_written_top_k_block_is_one_moe_node():
    graph = trace(TinyMoELM())
    assert_clean(graph)
    assert_golden_fingerprint("hand_written_top_k_moe", graph)
    moes = moe_nodes(graph)
    assert [n.name for n in moes] == [f"blocks.{i}.moe.moe" for i in range(3)]
    assert all(n.attrs == {"num_experts": 4, "top_k": 2, "intermediate_size": 48} for n in moes)
    expected = ["blocks.0.moe.router.weight"] + [
        f"blocks.0.moe.experts.{e}.{fc}.{p}" for e in range(4) for fc in ("fc1", "fc2") for p in ("bias", "weight")
    ]
    assert sorted(moes[0].params) == sorted(expected)
    # the residual around the block stays an add: the moe node stops where another value comes in
    assert parents(graph, "blocks.0.add") == ["blocks.0.moe.moe", "embed"]
    assert (
        graph.fingerprint() == trace(TinyMoELM(), fold_repeats=False).fingerprint() == trace(TinyMoELM()).fingerprint()
    )


def test_a_single_block_with_many_experts_is_not_folded_over_its_experts():
    """The expert ModuleList has identical children, but they are one node: folding them away
    would change the block's output shape and break the export."""
    graph = trace(TopKMoE(dim=8, hidden=16, num_experts=5, top_k=3), torch.zeros(2, 4, 8))
    (moe,) = moe_nodes(graph)
    assert moe.name == "moe" and moe.attrs == {"num_experts": 5, "top_k": 3, "intermediate_size": 16}
    assert [n.op for n in graph.nodes] == ["input", "moe", "output"]


class NormedTopKMoE(TopKMoE):
    """A block that holds its own pre-norm and residual."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim, hidden=16, num_experts=4, top_k=2)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + super().forward(self.norm(x))


def test_a_norm_and_a_residual_inside_the_block_stay_their_own_nodes():
    """The norm feeds the router and the experts alike: it is the tokens, not the routing."""
    graph = trace(NormedTopKMoE(8), torch.zeros(2, 4, 8))
    assert [(n.op, n.name) for n in graph.nodes] == [
        ("input", "input"),
        ("layer_norm", "norm"),
        ("moe", "moe"),
        ("add", "add"),
        ("output", "output"),
    ]
    assert parents(graph, "moe") == ["norm"] and parents(graph, "add") == ["input", "moe"]
    assert "norm.weight" not in graph.nodes[2].params


class PiecesMoE(nn.Module):
    """A top-k block that returns its experts' outputs and a masked sum of the top-k weights
    per expert, leaving the weighted sum to the block that calls it."""

    def __init__(self, dim: int = 16, num_experts: int = 4, top_k: int = 2) -> None:
        super().__init__()
        self.router, self.num_experts, self.top_k = nn.Linear(dim, num_experts, bias=False), num_experts, top_k
        self.experts = nn.ModuleList(Expert(dim, 32) for _ in range(num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights, chosen = self.router(x).topk(self.top_k, dim=-1)
        mask = torch.nn.functional.one_hot(chosen, self.num_experts).to(x.dtype)  # (..., k, experts)
        gates = (mask * weights.softmax(dim=-1).unsqueeze(-1)).sum(dim=-2)  # the masked sum
        return torch.stack([expert(x) for expert in self.experts], dim=-2), gates


class PiecesBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.moe = nn.LayerNorm(16), PiecesMoE()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs, gates = self.moe(self.norm(x))
        return x + (outputs * gates.unsqueeze(-1)).sum(dim=-2)


def test_a_block_that_leaves_the_weighted_sum_to_its_caller_is_still_one_moe_node():
    graph = trace(PiecesBlock(), torch.zeros(2, 5, 16))
    assert [n.op for n in graph.nodes] == ["input", "layer_norm", "moe", "add", "output"]
    assert parents(graph, "add") == ["input", "moe.moe"]


class TopKPool(nn.Module):
    """Keeps each token's 3 largest features: a topk with no experts around it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).softmax(dim=-1).topk(3, dim=-1).values.sum(dim=-1)


def test_a_topk_outside_an_moe_block_stays_a_router_op():
    graph = trace(TopKPool(), torch.zeros(2, 8))
    assert [n.op for n in graph.nodes] == ["input", "head", "softmax", "moe_router", "sum_pool", "output"]
    assert graph.nodes[3].attrs == {"k": 3}


@pytest.mark.slow
def test_the_bundled_hypernetworks_refuse_a_moe_node():
    """They never saw one: their prediction for it would be untrained noise."""
    refusal = r"^node 'blocks.0.moe.moe' has op 'moe', which this hypernetwork was not trained on"
    with pytest.raises(CheckpointError, match=refusal):
        check_graph(load_checkpoint("logah-tiny-gpts"), trace(TinyMoELM()))


def test_a_version_1_hypernetwork_cannot_read_a_moe_node():
    """moe joined the vocabulary in version 2: a LoGAH made with the 29 ops of version 1 has
    no id for it, whatever it was trained on."""
    with pytest.raises(EncodingError, match=r"^node 'blocks.0.moe.moe' has op 'moe', which is newer than the 29 ops"):
        encode(trace(TinyMoELM()), LoGAHConfig(num_ops=VOCABULARY_SIZES[1]))


def test_predict_on_a_mixtral_is_a_one_line_error(tmp_path):
    model_file = tmp_path / "mixtral.py"
    model_file.write_text(
        "import torch, transformers\n"
        "config = transformers.MixtralConfig(vocab_size=128, "
        "hidden_size=32, intermediate_size=64, num_hidden_layers=1,\n"
        "    num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)\n"
        "with torch.device('meta'):\n"
        "    model = transformers.MixtralForCausalLM(config)\n"
    )
    result = CliRunner().invoke(app, ["predict", str(model_file), "--ghn", "logah-tiny-gpts"])
    assert result.exit_code == 1
    message = result.stderr.strip()
    assert message.startswith("error: node ") and "which this hypernetwork was not trained on" in message
    assert "\n" not in message and "Traceback" not in result.output
