"""A ViT wider than the bundled ViT hypernetwork's training space (768 against at most 512), at
the digits' 8x8 resolution: `predict` grows it from its 512-wide twin."""
from graphkit.families import build_model

model = build_model({"family": "vit", "num_layers": 3, "hidden": 768, "heads": 12, "image_size": 8, "patch_size": 2})
