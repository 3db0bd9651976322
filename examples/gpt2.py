"""GPT-2 small (124M) from Hugging Face transformers, built from its config on the meta device."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def build_model():
    with torch.device("meta"):
        return GPT2LMHeadModel(GPT2Config())
