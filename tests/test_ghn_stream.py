"""The residual stream's writers (graphkit.ghn.stream): scaling them with the token and position
tables scales the stream and leaves the logits as they were, on transformers' own models."""

from __future__ import annotations

import pytest
import torch

import graphkit
from graphkit.ghn.encoding import scalable_head_norm, targets
from graphkit.ghn.stream import stream_writers, table_params, tied_params
from graphkit.graph import ArchGraph

# branches large enough to matter and norms without an epsilon, so that any writer left out shows
SIZES = dict(
    vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
    initializer_range=0.3, rms_norm_eps=1e-12,
)  # fmt: skip


def _model(kind: str, tied: bool = True) -> torch.nn.Module:
    import transformers as hf  # noqa: PLC0415

    torch.manual_seed(0)
    if kind == "llama":
        return hf.LlamaForCausalLM(hf.LlamaConfig(**SIZES, num_key_value_heads=1, tie_word_embeddings=tied))
    if kind == "gpt2":  # learned positions, biases everywhere, LayerNorm
        config = hf.GPT2Config(
            vocab_size=64, n_embd=16, n_layer=2, n_head=2, n_positions=32, tie_word_embeddings=tied,
            initializer_range=0.3, layer_norm_epsilon=1e-12,
        )  # fmt: skip
        return hf.GPT2LMHeadModel(config)
    if kind == "qwen2_moe":  # routed experts and a gated shared expert writing one branch
        config = hf.Qwen2MoeConfig(
            **SIZES, num_key_value_heads=1, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
            shared_expert_intermediate_size=32, tie_word_embeddings=tied,
        )  # fmt: skip
        return hf.Qwen2MoeForCausalLM(config)
    if kind == "mamba":  # a recurrent mixer, one node, written by its out_proj
        config = hf.MambaConfig(
            vocab_size=64, hidden_size=16, state_size=4, num_hidden_layers=2, tie_word_embeddings=tied,
            initializer_range=0.3, layer_norm_epsilon=1e-12,
        )  # fmt: skip
        return hf.MambaForCausalLM(config)
    if kind == "olmo2":  # post-norm: the blocks read the stream without a norm
        return hf.Olmo2ForCausalLM(hf.Olmo2Config(**SIZES, num_key_value_heads=1, tie_word_embeddings=tied))
    raise AssertionError(kind)


def _logits(model: torch.nn.Module, scaled: set[str], c: float, graph: ArchGraph) -> torch.Tensor:
    """The logits of ``model`` with ``scaled`` times ``c`` and, where the head reads the token
    table, its final norm times 1 / ``c``."""
    params = dict(model.named_parameters())
    tied = tied_params(graph)
    norm = scalable_head_norm(graph)
    undo = set(norm.params) if tied & scaled and norm is not None else set()
    saved = {name: params[name].detach().clone() for name in scaled | undo}
    try:
        with torch.no_grad():
            for name in scaled:
                params[name].mul_(c)
            for name in undo:
                params[name].div_(c)
            x = torch.arange(24).remainder(64).view(2, 12)
            return model(x).logits.float()
    finally:
        with torch.no_grad():
            for name, value in saved.items():
                params[name].copy_(value)


@pytest.mark.parametrize("kind", ["llama", "gpt2", "qwen2_moe", "mamba"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_scaling_the_stream_writers_scales_the_stream_and_nothing_else(kind, tied):
    model = _model(kind, tied).eval()
    graph = graphkit.trace(model)
    writers = stream_writers(graph)
    assert writers is not None and table_params(graph) <= writers
    reference = _logits(model, set(), 1.0, graph)
    # a larger stream, so that the norms' epsilon stays out of the comparison
    torch.testing.assert_close(_logits(model, set(writers), 8.0, graph), reference, rtol=1e-4, atol=1e-4)
    # the test can fail: any one writer left out (but a bias at 0) changes what the model computes
    params = dict(model.named_parameters())
    for left_out in sorted(name for name in writers - table_params(graph) if params[name].any()):
        changed = _logits(model, set(writers) - {left_out}, 8.0, graph)
        assert (changed - reference).abs().max() > 1e-3, left_out


def test_a_block_that_reads_the_stream_without_a_norm_refuses_the_rewrite():
    model = _model("olmo2").eval()
    assert stream_writers(graphkit.trace(model)) is None  # its MLP reads x / c through SiLU


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_the_table_gain_is_written_as_smaller_writers_where_the_stream_allows(tied):
    graph = graphkit.trace(_model("llama", tied))
    writers = stream_writers(graph)
    assert writers is not None
    factors = {t.name: t.factor for t in targets(graph, anchors=True, table_gain=4.0) if t.factor != 1.0}
    # the tables at the weights' RMS, every writer a quarter, no factor left on the head's norm
    assert factors == {name: 0.25 for name in writers - table_params(graph)}
    assert {name.rsplit(".", 2)[-2] for name in factors} == {"o_proj", "down_proj"}
    # where the stream does not allow it, the tables carry the gain (and a tied head's norm its inverse)
    olmo = graphkit.trace(_model("olmo2", tied))
    factors = {t.name: t.factor for t in targets(olmo, anchors=True, table_gain=4.0) if t.factor != 1.0}
    assert factors == {"model.embed_tokens.weight": 4.0} | ({"model.norm.weight": 0.25} if tied else {})
