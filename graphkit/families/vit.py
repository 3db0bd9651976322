"""ViT image classifiers: timm's VisionTransformer (class token, learned positions, pre-norm)."""

from __future__ import annotations

from typing import Any

from torch import nn

from graphkit.attention.builtin import TIMM_ATTENTION
from graphkit.families.registry import ConfigError, Family, register_family
from graphkit.graph import ArchGraph


def build(config: dict[str, Any], init: bool = True) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        img_size=config["image_size"],
        patch_size=config["patch_size"],
        in_chans=config["in_chans"],
        num_classes=config["num_classes"],
        global_pool=config["global_pool"],
        class_token=config["global_pool"] == "token",
        embed_dim=config["hidden"],
        depth=config["num_layers"],
        num_heads=config["heads"],
        mlp_ratio=config["mlp"] / config["hidden"],
        weight_init="" if init else "skip",
    )


def _check(config: dict[str, Any]) -> None:

    if config["image_size"] % config["patch_size"]:
        raise ConfigError(
            f"vit config: image_size {config['image_size']} is not divisible by patch_size {config['patch_size']}"
        )
    if config["global_pool"] not in ("token", "avg"):
        raise ConfigError(f"vit config: global_pool must be 'token' or 'avg', got {config['global_pool']!r}")


def from_graph(graph: ArchGraph) -> dict[str, Any]:
    """Read a timm ViT's config back from its graph (parameter shapes and attention attrs)."""
    shapes = {name: shape for node in graph.nodes for name, shape in node.params.items()}
    hidden, in_chans, patch, _ = shapes["patch_embed.proj.weight"]
    attention = [n.attrs for n in graph.nodes if n.op == "attention"]
    variant = attention[0].get("variant")
    pooled = any(n.op == "mean_pool" for n in graph.nodes)
    tokens = shapes["pos_embed"][1] - (0 if pooled else 1)
    return {
        "family": "vit",
        "num_layers": len(attention),
        "hidden": hidden,
        "heads": attention[0]["heads"],
        "attention": variant,
        "kv_heads": attention[0]["kv_heads"] if variant else None,
        "mlp": shapes["blocks.0.mlp.fc1.weight"][0],
        "image_size": round(tokens**0.5) * patch,
        "patch_size": patch,
        "in_chans": in_chans,
        "num_classes": shapes["head.weight"][0],
        "global_pool": "avg" if pooled else "token",
    }


#: LoGAH's ViTs-1K: deeper means narrower, heads by width, patch 2 or 4, under 10M parameters
#: (CIFAR resolution): the original generator draws the patch size from {2, 4}
VITS_1K = {
    "name": "vits-1k",
    "family": "vit",
    "description": "LoGAH's ViTs-1K: ViT classifiers, deeper means narrower, patch 2 or 4, under 10M parameters",
    "bins": [
        {"layers": [6, 9], "hidden": [128, 256, 32]},
        {"layers": [4, 5], "hidden": [256, 384, 32]},
        {"layers": [3, 3], "hidden": [384, 512, 32]},
    ],
    "heads": [{"choices": [3, 6, 12], "hidden": [192, 288, 384, 480]}, {"choices": [4, 8]}],
    "max_params": 10_000_000,
    "fixed": {"image_size": 32, "num_classes": 10},
    "choices": {"patch_size": [2, 4]},
}

FAMILY = register_family(
    Family(
        name="vit",
        build=build,
        blocks="blocks",
        required=("num_layers", "hidden", "heads"),
        defaults={"image_size": 32, "patch_size": 2, "in_chans": 3, "num_classes": 10, "global_pool": "token"},
        check=_check,
        from_graph=from_graph,
        traced_as=("vit",),
        recipes=(
            VITS_1K,
            {
                # patch 2 only: the bundled hypernetwork trained on this space's train split; a wider space
                # would draw another eval split, one holding architectures the hypernetwork trained on
                **VITS_1K,
                "name": "vits-digits",
                "fixed": {"image_size": 8, "patch_size": 2, "num_classes": 10},
                "choices": {},
                "description": (
                    "ViTs-1K's space at the 8x8 resolution of scikit-learn's digits, where the bundled hypernetwork "
                    "trains"
                ),
            },
            {
                # the same space at patch 2 and 4, token grids 4 x 4 and 2 x 2: training across token grids
                # (issue #45 item 4; benchmarks/token_grids.py, docs/experiments.md "Training across token grids")
                **VITS_1K,
                "name": "vits-digits-grids24",
                "fixed": {"image_size": 8, "num_classes": 10},
                "description": "vits-digits' space at 8 px with patch 2 or 4: token grids 4 x 4 and 2 x 2",
            },
        ),
        data="digits",
        bundled_ghn="logah-tiny-vits",
        attention_adapter=TIMM_ATTENTION,
    )
)
