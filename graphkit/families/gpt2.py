"""GPT-2 language models: Hugging Face ``GPT2LMHeadModel``. ``tied`` (default False) shares the
LM head with the token embedding, as transformers builds GPT-2 by default; GPTs-1K draws both,
so that a hypernetwork trained on it predicts either (docs/experiments.md, "Tied embeddings")."""

from __future__ import annotations

from typing import Any

from torch import nn

from graphkit.attention.builtin import GPT2_ATTENTION
from graphkit.families.registry import Family, build_hf, register_family
from graphkit.graph import ArchGraph


def build(config: dict[str, Any], init: bool = True) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return build_hf(
        GPT2LMHeadModel,
        GPT2Config(
            n_layer=config["num_layers"],
            n_embd=config["hidden"],
            n_head=config["heads"],
            n_inner=config["mlp"],
            vocab_size=config["vocab_size"],
            n_positions=config["context"],
            tie_word_embeddings=config["tied"],
            bos_token_id=config["vocab_size"] - 1,  # GPT-2's end-of-text is its last token
            eos_token_id=config["vocab_size"] - 1,
        ),
        init,
    )


def from_graph(graph: ArchGraph) -> dict[str, Any]:
    """Read a GPT-2 config back from its graph (parameter shapes and attention attrs)."""
    shapes = {name: shape for node in graph.nodes for name, shape in node.params.items()}
    vocab, hidden = shapes["transformer.wte.weight"]
    attention = [n.attrs for n in graph.nodes if n.op == "attention"]
    variant = attention[0].get("variant")
    head = next(n for n in graph.nodes if n.name == "lm_head")
    return {
        "family": "gpt2",
        "num_layers": len(attention),
        "hidden": hidden,
        "heads": attention[0]["heads"],
        "attention": variant,
        "kv_heads": attention[0]["kv_heads"] if variant else None,
        "mlp": shapes["transformer.h.0.mlp.c_fc.weight"][1],
        "vocab_size": vocab,
        "context": shapes["transformer.wpe.weight"][0],
        "tied": bool(head.attrs.get("tied")),
    }


FAMILY = register_family(
    Family(
        name="gpt2",
        build=build,
        blocks="transformer.h",
        required=("num_layers", "hidden", "heads"),
        defaults={"vocab_size": 50257, "context": 1024, "tied": False},
        from_graph=from_graph,
        traced_as=("gpt2",),
        recipes=(
            {
                "name": "gpts-1k",
                "family": "gpt2",
                "description": (
                    "LoGAH's GPTs-1K: GPT-2 LMs, deeper means narrower, under 30M parameters, the head tied "
                    "to the token embedding (as transformers builds GPT-2) or not"
                ),
                "bins": [
                    {"layers": [6, 9], "hidden": [72, 176, 8]},
                    {"layers": [4, 5], "hidden": [128, 176, 8]},
                    {"layers": [3, 3], "hidden": [176, 256, 8]},
                ],
                "heads": [{"choices": "divisors"}],
                "max_params": 30_000_000,
                "fixed": {"vocab_size": 50257, "context": 1024},
                "choices": {"tied": [False, True]},
            },
        ),
        data="stdlib-text",
        bundled_ghn="logah-tiny-gpts",
        scaled_residuals=True,
        keep_init=True,
        attention_adapter=GPT2_ATTENTION,
    )
)
