"""A TinyLlama-1.1B-shaped LLaMA (22 layers, width 2048, 32 heads sharing 4 key/value heads,
SwiGLU MLP of 5,632, 32,000 tokens) from Hugging Face transformers, built from its config on the
meta device."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build_model():
    config = LlamaConfig(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
        max_position_embeddings=2048,
    )
    with torch.device("meta"):
        return LlamaForCausalLM(config)
