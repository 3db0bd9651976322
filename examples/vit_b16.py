"""ViT-B/16 from timm, built on the meta device: its graph is traced without allocating weights."""

import timm
import torch

with torch.device("meta"):
    model = timm.create_model("vit_base_patch16_224", pretrained=False)
