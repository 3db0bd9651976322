"""GPT-2 language models: Hugging Face ``GPT2LMHeadModel`` (LoGAH's GPTs-1K keeps the LM head
untied from the token embedding, so ``tied`` defaults to False)."""

from __future__ import annotations

from typing import Any

from torch import nn

from graphkit.families import Family, hf_init, register_family


def build(config: dict[str, Any], init: bool = True) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    with hf_init(init):
        return GPT2LMHeadModel(GPT2Config(
            n_layer=config["num_layers"],
            n_embd=config["hidden"],
            n_head=config["heads"],
            n_inner=config["mlp"],
            vocab_size=config["vocab_size"],
            n_positions=config["context"],
            tie_word_embeddings=config["tied"],
        ))


FAMILY = register_family(Family(
    name="gpt2",
    build=build,
    blocks="transformer.h",
    required=("num_layers", "hidden", "heads"),
    defaults={"vocab_size": 50257, "context": 1024, "tied": False},
))
