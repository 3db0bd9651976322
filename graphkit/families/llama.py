"""LLaMA-style decoders: RMSNorm, RoPE, SwiGLU MLP, grouped-query attention. Hugging Face
``LlamaForCausalLM``, or ``MistralForCausalLM`` when ``sliding_window`` is set (LLaMA has no
sliding-window attention)."""

from __future__ import annotations

from typing import Any

from torch import nn

from graphkit.attention.builtin import LLAMA_ATTENTION
from graphkit.families.registry import ConfigError, Family, build_hf, register_family
from graphkit.graph import ArchGraph


def build(config: dict[str, Any], init: bool = True) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    common = dict(
        num_hidden_layers=config["num_layers"],
        hidden_size=config["hidden"],
        num_attention_heads=config["heads"],
        num_key_value_heads=config["kv_heads"] or config["heads"],
        intermediate_size=config["mlp"],
        vocab_size=config["vocab_size"],
        max_position_embeddings=config["context"],
        rms_norm_eps=config["rms_eps"],
        tie_word_embeddings=config["tied"],
    )
    if config["sliding_window"]:
        return build_hf(MistralForCausalLM, MistralConfig(sliding_window=config["sliding_window"], **common), init)
    return build_hf(LlamaForCausalLM, LlamaConfig(**common), init)


def _check(config: dict[str, Any]) -> None:
    kv = config["kv_heads"] or config["heads"]
    if config["heads"] % kv:
        raise ConfigError(f"llama config: heads {config['heads']} is not divisible by kv_heads {kv}")
    if (config["hidden"] // config["heads"]) % 2:
        raise ConfigError(f"llama config: head size {config['hidden'] // config['heads']} must be even for RoPE")


def from_graph(graph: ArchGraph) -> dict[str, Any]:
    """Read a LLaMA / Mistral config back from its graph. The context length leaves no trace in
    the graph (RoPE has no parameters), so it keeps the default."""
    shapes = {name: shape for node in graph.nodes for name, shape in node.params.items()}
    vocab, hidden = shapes["model.embed_tokens.weight"]
    attention = [n.attrs for n in graph.nodes if n.op == "attention"]
    head = next(n for n in graph.nodes if n.name == "lm_head")
    norm = next(n for n in graph.nodes if n.op == "rms_norm")
    return {
        "family": "llama",
        "num_layers": len(attention),
        "hidden": hidden,
        "heads": attention[0]["heads"],
        "kv_heads": attention[0]["kv_heads"],
        "attention": attention[0].get("variant"),
        "mlp": shapes["model.layers.0.mlp.gate_proj.weight"][0],
        "vocab_size": vocab,
        "sliding_window": attention[0]["window"],
        "rms_eps": norm.attrs["eps"],
        "tied": bool(head.attrs.get("tied")),
    }


FAMILY = register_family(
    Family(
        name="llama",
        build=build,
        blocks="model.layers",
        required=("num_layers", "hidden", "heads"),
        defaults={"vocab_size": 32000, "context": 2048, "sliding_window": None, "rms_eps": 1e-6, "tied": False},
        check=_check,
        mlp_ratio=8 / 3,
        from_graph=from_graph,
        traced_as=("llama", "mistral"),
        grouped=True,
        recipes=(
            {
                "name": "llamas-1k",
                "family": "llama",
                "description": (
                    "LLaMA-style LMs (RMSNorm, RoPE, SwiGLU, GQA/MQA, optional sliding window, the head tied to "
                    "the token embedding or not), deeper means narrower"
                ),
                "bins": [
                    {"layers": [6, 9], "hidden": [128, 256, 32]},
                    {"layers": [4, 5], "hidden": [256, 384, 32]},
                    {"layers": [3, 3], "hidden": [384, 512, 32]},
                ],
                "heads": [{"choices": [4, 8], "min_head_dim": 16}],
                "kv_heads": "divisors",
                "sliding_window": [None, 256],
                "max_params": 50_000_000,
                "fixed": {"vocab_size": 32000, "context": 2048},
                "choices": {"tied": [False, True]},
            },
        ),
        data="stdlib-text",
        bundled_ghn="logah-tiny-llamas",
        # fine-tuned from half the prediction on its own init, a LLaMA beats its own init at 0, 100
        # and 300 steps on 7, 8 and 8 of 8 held-out architectures; from the prediction alone on 8, 7
        # and 2 (docs/experiments.md, "Where the head start goes")
        keep_init=True,
        shrink=0.5,
        attention_adapter=LLAMA_ATTENTION,
    )
)
