"""Library models that compute what a graphkit family's model computes, under other parameter
names: transformers' ``ViTForImageClassification`` is timm's VisionTransformer with its query,
key and value projections apart (timm fuses them into one ``qkv``) and its own names.

Why: a hypernetwork reads a model's graph, and one trained on timm's ViTs never saw three
projections where it learned one. transformers' ViT, predicted as itself by the bundled ViT
hypernetwork, scored 3.76 on held-out digits at step 0 (6 x 256 at 8 px, inside the space it
trained on), where timm's ViT of that shape scores 0.80 and either's own init 2.39. Predicted as
its timm equivalent, each of its parameters is the equivalent's, renamed, and q, k and v are
the fused projection's three row blocks (:func:`graphkit.ghn.grow.twin_of` makes the equivalent
the model's twin, :class:`~graphkit.ghn.grow.GrownDecoding` reads it through :data:`Renaming`).

A model can also compute a plainer model of its own family once its parameters are converted
from that model's: timm's ViT with layer scale computes the plain ViT with every gain at 1, and
one whose position table covers the patches only (DeiT-III) computes it with the table's class
row added to the class token (:func:`plain_form`, the family's ``plain`` options). The bundled
ViT hypernetwork trained on neither; predicted as itself, a 6 x 384 ViT at 8 px whose table covers
the patches only scored 4.32 on held-out digits at step 0, predicted as its plain form 0.82
(own init 2.45).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from graphkit.families.registry import ConfigError, build_model, config_from_graph, get_family, traced_family
from graphkit.graph import ArchGraph
from graphkit.validation import is_count

#: for each of a model's parameters, the equivalent's parameter and which of its equal row blocks
#: it is, (index, blocks): (0, 1) for the whole, (1, 3) for k in a fused q, k, v. In blocks, not
#: rows, so that it reads a narrower twin of the equivalent as well (graphkit.ghn.grow)
Renaming = dict[str, tuple[str, tuple[int, int]]]


#: transformers' image classifiers that are timm's ViT under other names, and their model types:
#: ViT-MSN is ViT pretrained another way (masked siamese networks), the same classifier
VIT_CLASSIFIERS = {"ViTForImageClassification": "vit", "ViTMSNForImageClassification": "vit_msn"}


def vit_equivalent(model: nn.Module) -> tuple[dict[str, Any], Renaming] | None:
    """The graphkit ``vit`` config of the timm ViT that transformers' ``model`` computes the same
    function as, and the renaming of its parameters into that ViT's; None for any other model,
    or one whose parameters do not line up one to one at the equivalent's shapes (another
    activation, a pooler, a transformers version that names or orders its layers otherwise).

    The layers are matched by position and, inside a layer, the linear maps and the norms in the
    order transformers defines them: q, k, v, the output projection, the MLP's two; the norm before
    attention, the one after. The shapes are checked against the equivalent built on meta. Its
    norms' epsilon is timm's (1e-6 against transformers' 1e-12): the same function to float
    precision for any stream not near zero."""
    config: Any = getattr(model, "config", None)
    if VIT_CLASSIFIERS.get(type(model).__name__) != getattr(config, "model_type", None):
        return None
    fields = [
        "hidden_size",
        "num_attention_heads",
        "num_hidden_layers",
        "intermediate_size",
        "image_size",
        "patch_size",
        "num_channels",
        "num_labels",
    ]
    if getattr(config, "hidden_act", None) != "gelu" or not all(is_count(getattr(config, f, None)) for f in fields):
        return None
    vit = {
        "family": "vit",
        "num_layers": config.num_hidden_layers,
        "hidden": config.hidden_size,
        "heads": config.num_attention_heads,
        "mlp": config.intermediate_size,
        "image_size": config.image_size,
        "patch_size": config.patch_size,
        "in_chans": config.num_channels,
        "num_classes": config.num_labels,
        "global_pool": "token",
        **({} if getattr(config, "qkv_bias", True) else {"qkv_bias": False}),
    }
    renaming = _vit_renaming(model, config.num_hidden_layers)
    if renaming is None:
        return None
    shapes = {name: tuple(p.shape) for name, p in build_model(vit, "meta").named_parameters()}
    for name, param in model.named_parameters():
        source, block = renaming.get(name, ("", (0, 1)))
        expected = shapes.get(source)
        if expected is not None:
            expected = block_shape(expected, block)
        if expected != tuple(param.shape):
            return None
    return vit, renaming


def _vit_renaming(model: nn.Module, depth: int) -> Renaming | None:
    """transformers' ViT's parameters by timm's names (see :func:`vit_equivalent`), or None when
    its modules do not line up."""
    stacks = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == depth]
    if len(stacks) != 1:
        return None
    prefix, layers = stacks[0]
    whole = (0, 1)
    linears = (
        ("attn.qkv", (0, 3)),
        ("attn.qkv", (1, 3)),
        ("attn.qkv", (2, 3)),
        ("attn.proj", whole),
        ("mlp.fc1", whole),
        ("mlp.fc2", whole),
    )
    renaming: Renaming = {}
    for i, layer in enumerate(layers):
        found = [(n, m) for n, m in layer.named_modules() if isinstance(m, (nn.Linear, nn.LayerNorm))]
        maps = [n for n, m in found if isinstance(m, nn.Linear)]
        norms = [n for n, m in found if isinstance(m, nn.LayerNorm)]
        if len(maps) != len(linears) or len(norms) != 2:
            return None
        for name, (timm_name, block) in zip(maps, linears):
            for what in ("weight", "bias"):
                renaming[f"{prefix}.{i}.{name}.{what}"] = (f"blocks.{i}.{timm_name}.{what}", block)
        for name, timm_name in zip(norms, ("norm1", "norm2")):
            for what in ("weight", "bias"):
                renaming[f"{prefix}.{i}.{name}.{what}"] = (f"blocks.{i}.{timm_name}.{what}", whole)
    outside = {
        "cls_token": "cls_token",
        "position_embeddings": "pos_embed",
        "patch_embeddings.projection.weight": "patch_embed.proj.weight",
        "patch_embeddings.projection.bias": "patch_embed.proj.bias",
        "layernorm.weight": "norm.weight",
        "layernorm.bias": "norm.bias",
        "classifier.weight": "head.weight",
        "classifier.bias": "head.bias",
    }
    for name, _ in model.named_parameters():
        if name.startswith(prefix + "."):
            continue
        ending = next((e for e in outside if name == e or name.endswith("." + e)), None)
        if ending is None:
            return None
        renaming[name] = (outside[ending], whole)
    return renaming


class PlainForm(NamedTuple):
    """A model as the plainer model of its family that it computes with its parameters
    converted from that model's (:func:`plain_form`): the plain model's ``config``; the
    ``options`` left out, in the order :meth:`convert` applies them; ``ops``, the op kinds of the
    model's graph without the nodes made of parameters the plain model lacks; and ``parts``, how
    predict names what differs."""

    config: dict[str, Any]
    options: tuple[str, ...]
    ops: frozenset[str]
    parts: tuple[str, ...]

    def convert(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The model's parameters, by name, from the plain model's ``params`` (at any width:
        a narrow twin's give its narrow twin's)."""
        family = get_family(self.config["family"])
        for key in self.options:
            params = family.plain[key][1](params)
        return params


def plain_form(graph: ArchGraph) -> PlainForm | None:
    """The plainer model of ``graph``'s family that ``graph``'s model computes, its parameters
    converted from that model's by the family's ``plain`` options: a timm ViT with layer scale
    computes the plain ViT with every gain at 1, one whose position table covers the patches
    only computes it with the table's class row added to the class token. None for a graph no
    family reads, whose config read back does not build the model's own parameters at their
    shapes, or that has no such option.

    Why: a hypernetwork that never trained on a variant (the bundled ViT one saw neither) predicts
    it as untrained noise or refuses its op (layer scale's ``scale``), and the checkpoint trained
    across families predicts near chance; the plain model's prediction, converted, is the one the
    family's checkpoint was measured on (:func:`graphkit.ghn.grow.twin_of`)."""
    family = traced_family(graph)
    if family is None or not family.plain:
        return None
    try:
        config = config_from_graph(graph)
    except ConfigError:
        return None
    options = tuple(key for key in family.plain if key in config)
    if not options:
        return None
    own = {name: tuple(shape) for node in graph.nodes for name, shape in node.params.items()}
    if {name: tuple(p.shape) for name, p in build_model(config, "meta").named_parameters()} != own:
        return None
    plain = {key: value for key, value in config.items() if key not in options}
    lacked = own.keys() - {name for name, _ in build_model(plain, "meta").named_parameters()}
    ops = frozenset(node.op for node in graph.nodes if not node.params or not set(node.params) <= lacked)
    return PlainForm(plain, options, ops, tuple(family.plain[key][0] for key in options))


def block_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    """The shape of one of ``block[1]`` equal row blocks of a parameter of ``shape``."""
    return (shape[0] // block[1], *shape[1:])


@torch.no_grad()
def renamed(params: dict[str, torch.Tensor], renaming: Renaming) -> dict[str, torch.Tensor]:
    """An equivalent's ``params`` under the model's names (views: a row block of a fused projection)."""
    return {name: params[source].chunk(blocks)[index] for name, (source, (index, blocks)) in renaming.items()}


__all__ = ["PlainForm", "Renaming", "block_shape", "plain_form", "renamed", "vit_equivalent"]
