"""A ViT inside the bundled ViT hypernetwork's training space (vits-digits: 8x8 images, patch 2)."""
from graphkit.families import build_model

model = build_model({"family": "vit", "num_layers": 4, "hidden": 128, "heads": 4, "image_size": 8, "patch_size": 2})
