"""A small ViT with real weights (for `graphkit convert`): 6 heads, patch 4 on 32x32 images."""

import torch

from graphkit.families import build_model as build_family

torch.manual_seed(0)
model = build_family({"family": "vit", "num_layers": 4, "hidden": 192, "heads": 6, "patch_size": 4}, device="cpu")
