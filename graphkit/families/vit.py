"""ViT image classifiers: timm's VisionTransformer (class token, learned positions, pre-norm),
and the variants of it that timm registers under other names, as far as their parameters show
them (:data:`OPTIONS`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from graphkit.attention.builtin import TIMM_ATTENTION
from graphkit.families.registry import ConfigError, Family, register_family
from graphkit.graph import ArchGraph

#: timm VisionTransformer options that its parameters show, with timm's defaults. A config carries
#: one only where a model differs (:func:`from_graph` reads them off a traced timm model: CLIP's
#: pre-norm, DINOv2's layer scale, register tokens, a pooled model's final norm), so that the
#: configs of graphkit's own recipes, and the dataset records written from them, stay as they were.
#: Why they matter: a model's twin inside a hypernetwork's training space
#: (:func:`graphkit.ghn.grow.twin_of`) is built from its config and must have its parameters;
#: before these were read, 142 of timm's 163 VisionTransformer models had none and were decoded
#: directly at their resolution, where the bundled ViT hypernetwork's prediction is worse than the
#: model's own init.
OPTIONS: dict[str, Any] = {
    "class_token": True,  # default: a class token when pooling by it
    "reg_tokens": 1,  # register tokens (none by default; the value here is the type: a count)
    "no_embed_class": False,  # the position table covers the patches only, not the prefix tokens
    "qkv_bias": True,
    "qk_norm": False,
    "scale_attn_norm": False,  # a norm before the attention's output projection (BEiT-3)
    "scale_mlp_norm": False,  # a norm inside the MLP (BEiT-3)
    "init_values": 1e-5,  # layer scale (none by default), its gains' initial value
    "pre_norm": False,  # a norm on the stream before the blocks, and no patch-embedding bias (CLIP)
    "final_norm": True,
    "fc_norm": False,  # default: a norm after pooling when pooling by the mean, else one before
}


def _with_layer_scale(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A plain ViT's parameters with the layer-scale gains of each block, all 1, added."""
    gains = {
        name.replace(f".{norm}.weight", f".{scale}.gamma"): torch.ones_like(value)
        for name, value in params.items()
        for norm, scale in (("norm1", "ls1"), ("norm2", "ls2"))
        if name.startswith("blocks.") and name.endswith(f".{norm}.weight")
    }
    return {**params, **gains}


def _without_prefix_positions(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ViT's parameters with its position table's prefix rows (class and register tokens)
    added to those tokens, so that the table covers the patches only (``no_embed_class``): the
    tokens enter the blocks with the same values."""
    table, prefix = params["pos_embed"], 0
    moved: dict[str, torch.Tensor] = {}
    for name in ("cls_token", "reg_token"):  # timm's order in front of the patches
        if name in params:
            count = params[name].shape[1]
            moved[name] = params[name] + table[:, prefix : prefix + count]
            prefix += count
    return {**params, **moved, "pos_embed": table[:, prefix:]}


#: options a model computes the plain ViT with, its parameters converted from the plain ViT's:
#: layer scale (DeiT-III, DINOv2) with every gain at 1, and a position table that covers the
#: patches only (DeiT-III) with the prefix tokens' rows added to those tokens. The bundled ViT
#: hypernetwork trained on neither and predicts such a model as its plain twin
#: (:func:`graphkit.families.equivalents.plain_form`); decoded directly, a 6 x 384 ViT at 8 px
#: whose table covers the patches only scored 4.32 on held-out digits at step 0, as its plain
#: twin 0.82 (own init 2.45)
PLAIN: dict[str, tuple[str, Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]]] = {
    "no_embed_class": (
        "with its prefix tokens' positions in the position table (added to the tokens)",
        _without_prefix_positions,
    ),
    "init_values": ("without layer scale (its gains set to 1)", _with_layer_scale),
}


def build(config: dict[str, Any], init: bool = True) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    options = {key: config[key] for key in OPTIONS if key in config}
    options.setdefault("class_token", config["global_pool"] == "token")
    return VisionTransformer(
        img_size=config["image_size"],
        patch_size=config["patch_size"],
        in_chans=config["in_chans"],
        num_classes=config["num_classes"],
        global_pool=config["global_pool"],
        embed_dim=config["hidden"],
        depth=config["num_layers"],
        num_heads=config["heads"],
        mlp_ratio=config["mlp"] / config["hidden"],
        weight_init="" if init else "skip",
        **options,
    )


def _check(config: dict[str, Any]) -> None:

    if config["image_size"] % config["patch_size"]:
        raise ConfigError(
            f"vit config: image_size {config['image_size']} is not divisible by patch_size {config['patch_size']}"
        )
    if config["global_pool"] not in ("token", "avg"):
        raise ConfigError(f"vit config: global_pool must be 'token' or 'avg', got {config['global_pool']!r}")
    if config["global_pool"] == "token" and not config.get("class_token", True):
        raise ConfigError("vit config: global_pool 'token' needs class_token true")


def from_graph(graph: ArchGraph) -> dict[str, Any]:
    """Read a timm ViT's config back from its graph: parameter shapes, attention attrs and the
    input's shape; :data:`OPTIONS` only where the model differs from timm's defaults."""
    shapes = {name: shape for node in graph.nodes for name, shape in node.params.items()}
    hidden, in_chans, patch, _ = shapes["patch_embed.proj.weight"]
    attention = [n.attrs for n in graph.nodes if n.op == "attention"]
    variant = attention[0].get("variant")
    pooled = any(n.op == "mean_pool" for n in graph.nodes)
    class_token = "cls_token" in shapes
    reg_tokens = shapes["reg_token"][1] if "reg_token" in shapes else 0
    prefix = int(class_token) + reg_tokens
    rows = shapes["pos_embed"][1]
    inputs = graph.meta.get("input_shapes") or []
    image = inputs[0][-1] if inputs and len(inputs[0]) == 4 else None
    # the position table covers the patches alone when its rows are the image's token grid
    no_embed_class = prefix > 0 and image is not None and rows == (image // patch) ** 2
    grid = math.isqrt(rows - (0 if no_embed_class else prefix))
    mlp = shapes["blocks.0.mlp.fc1.weight"][0]
    if shapes["blocks.0.mlp.fc2.weight"][1] != mlp:  # a packed gated MLP (DINOv2-giant's SwiGLU)
        raise ConfigError(f"vit config: an MLP whose fc1 ({mlp}) is not fc2's input is not timm's Mlp")
    fc_norm = "fc_norm.weight" in shapes
    found = {
        "class_token": class_token,
        "reg_tokens": reg_tokens,
        "no_embed_class": no_embed_class,
        "qkv_bias": "blocks.0.attn.qkv.bias" in shapes,
        "qk_norm": "blocks.0.attn.q_norm.weight" in shapes,
        "scale_attn_norm": "blocks.0.attn.norm.weight" in shapes,
        "scale_mlp_norm": "blocks.0.mlp.norm.weight" in shapes,
        "pre_norm": "norm_pre.weight" in shapes,
        "final_norm": fc_norm or "norm.weight" in shapes,
        "fc_norm": fc_norm,
    }
    defaults = {**OPTIONS, "class_token": not pooled, "reg_tokens": 0, "fc_norm": pooled and found["final_norm"]}
    options = {key: value for key, value in found.items() if value != defaults[key]}
    if "blocks.0.ls1.gamma" in shapes:  # its constructor's value where the traced model held one
        options["init_values"] = (graph.meta.get("init") or {}).get("blocks.ls1.gamma", OPTIONS["init_values"])
    return {
        "family": "vit",
        "num_layers": len(attention),
        "hidden": hidden,
        "heads": attention[0]["heads"],
        "attention": variant,
        "kv_heads": attention[0]["kv_heads"] if variant else None,
        "mlp": mlp,
        "image_size": grid * patch,
        "patch_size": patch,
        "in_chans": in_chans,
        "num_classes": shapes["head.weight"][0],
        "global_pool": "avg" if pooled else "token",
        **options,
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
        options=OPTIONS,
        plain=PLAIN,
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
