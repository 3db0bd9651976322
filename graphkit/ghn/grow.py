"""Models wider than the hypernetwork trained at their depth, or with a patch size it never
trained on: predict the same architecture at the widest width trained at that depth and a
trained patch size, then grow it to the model's width and resize its patch embedding without
changing what it computes.

Why: the decoder reads row ``i`` of a parameter from row ``i`` of its r -> K map. Rows past the
widest trained residual width (512 for the bundled ViT hypernetwork, 256 for GPT-2) were never
read *as residual-stream coordinates* in training, and predicting them directly breaks the
model at once. Measured on digits, 3-layer ViTs, predicted parameters alone: width 512 scores
0.53 accuracy; 576, whose first 512 x 512 blocks are the 512-wide prediction to a cosine of
1.000, scores 0.12; 768 scores 0.05 (random init: 0.10). The extra 64 coordinates alone turn a
good model into one that is confidently wrong.

The rule is Net2WiderNet (Chen et al., 2016; bert2BERT's function-preserving init) applied to
every parameter by its shape. The narrow twin has width ``T`` with the same head size, depth,
vocabulary and MLP ratio, so every one of its shapes is the model's with ``D`` read as ``T``.
``T`` is the widest width trained at the model's depth (or the nearest depth trained), rounded
down to whole heads: the datasets make deeper models narrower, and the hypernetwork predicts
well only near that envelope (:func:`graphkit.ghn.space.widest_at_depth`). An axis of the model's parameter of size
``k D`` (the stream: k = 1; fused q, k, v: k = 3; a 4x MLP: k = 4) takes index ``i`` from the
twin's ``(i // D) T + (i % D) % T``: whole heads and whole units are copied, never split. Any
other axis that differs (an MLP of another ratio, GQA's k and v) takes ``i % n``. A weight that
*reads* a grown axis (a linear or convolution's input) splits each of the twin's values among
its copies, so that the copies sum to the twin's value; a weight that writes one, a bias, a
norm, an embedding or a position table is copied. A norm that feeds only a tied output head is
split as a reader, because the head reads the copied embedding.

Each coordinate of the grown stream is then a copy of one of the twin's, and every linear map
computes what the twin's does. When ``D`` is a multiple of ``T`` (ViT-L: 1024 = 2 x 512; the
GPT-2 shapes from Medium up against 256) every coordinate has the same number of copies, layer
and RMS norms see the twin's statistics, and the grown model computes exactly what the twin
computes (tests/test_ghn_grow.py checks this to float precision). Otherwise (ViT-B: 768 =
1.5 x 512) some coordinates have one copy more than others, and the norms' statistics weight
them accordingly: close to the twin, not equal to it.

The split is random, not even (each copy's share is u / sum(u) over its copies, u uniform in
[0.5, 1.5), from a fixed seed): with even shares the copies of a unit or a stream coordinate
would receive the same gradient at every step and stay copies for good, so the wide model could
never use its width (Net2Net's symmetry problem, which it solves with noise; uneven shares
solve it and keep the function exact).

The twin's own width lies in the training space, but its depth need not: depth is left as it
is, because the decoder extrapolates in depth (12-layer ViTs predicted from 3- to 9-layer ones
score 0.29-0.69 on digits from the predicted parameters alone).

A patch size is resized the same way (FlexiViT, Beyer et al., 2023): the twin keeps the model's
token grid at the nearest patch size trained on that grid (a ViT at 16 px with patch 4: patch 2
at 8 px, the same 4 x 4 tokens), and its patch embedding is resized to the model's kernel by the pseudo-inverse
of the image resize (``timm.layers.resample_patch_embed``), so that a patch of an image
upscaled by the same factor gives the token the twin's patch gives. The bundled ViT
hypernetwork trained at patch 2 on 8-pixel digits; decoded directly at 16 px with patch 4 (the
same 4 x 4 tokens) its prediction scored 3.81 on held-out digits at step 0, resized 0.86, where
patch 2 at 8 px scores 0.85 (BENCHMARKS.md, "Resolutions and patch sizes").

A token grid finer than the trained ones has no exact resize, but the one timm uses to move a
ViT to a new resolution helps: the twin is predicted at the finest trained grid and a trained
patch size (ViT-B/16 at 224 px: patch 2 at 8 px, 4 x 4 tokens, for the bundled checkpoint), its patch
embedding resized as above and its position table's grid interpolated bicubically to the
model's (``timm.layers.resample_abs_pos_embed``), the class token's row kept. On held-out
digits at step 0, ViT-S at 32 px, patch 4 (8 x 8 tokens) scored 1.83 / 0.47 (loss / accuracy)
this way, 4.10 / 0.20 decoded directly, 2.35 / 0.16 from its own init; ViT-B/16 at 224 px
2.23 / 0.30, 3.55 / 0.11 and 2.43 / 0.09. The model no longer computes what the twin does:
each token sees a smaller part of the image than the twin's did. A grid between trained ones
is predicted the same way from the trained grid below it
(:func:`~graphkit.ghn.space.grid_to_predict`); a coarser grid than any keeps its own
(downsampled, the table fine-tuned worse: :func:`twin_of`).

The resized prediction ranks the classes better than the own init but is as confident as at the
trained grid, where it was right far more often: its logits' RMS stayed at 2.4-2.6 (the own
init's: 0.4-0.5) while its accuracy fell from 0.73 to 0.26-0.47. Its output layer is therefore
scaled by the ratio of the grids' sides (twin over model: 4/8 at 8 x 8 tokens, 4/14 at 224 px
with patch 16), a temperature that leaves the accuracy as it is (:func:`logit_scale`). On
held-out digits at step 0 that ratio lay at the loss's minimum over the factors 1, 1/2, 1/4
and 1/10, or within 0.04 of it, on each grid measured: 8 x 8 1.83 -> 1.63, 16 x 16 3.36 ->
2.12, ViT-S/16 at 224 px 3.10 -> 2.10 and ViT-B/16 2.23 -> 2.02, each below its own init's
2.35-2.48. After 100 steps: 0.86 / 0.70 at 8 x 8 and 0.73 / 0.79 at 16 x 16, against 0.88 / 0.77
and 0.68 / 0.79 unscaled (own init 2.28 / 0.16 and 2.31 / 0.11).

A resized kernel also wants its own learning rate when the model is fine-tuned
(:func:`lr_scale`). Resized from patch 2 to 16, each of its weights is about (2/16)^2 = 1/64 of
a trained one, and AdamW moves every weight by about lr a step whatever its size: at lr 3e-4
fine-tuning rewrote it within a few steps and erased the prediction's head start
(`vit_small_patch16_224` at 224 px: 2.10 / 0.27 at step 0, 2.32 / 0.09 after 100 steps, own
init 2.30 / 0.10). With the kernel's lr times 1/64 the prediction kept it: 0.96 / 0.68 after 100
steps, where the own init under the same optimiser stood at 2.38 / 0.06 (``experiments/patch_lr.py``).
``graphkit predict`` writes the factors into the file's metadata and ``graphkit finetune``
trains with them.

A grown weight wants one for the same reason: each weight that reads a grown width holds a
share of the twin's value (a quarter, grown 4 times), so at one lr the copies together move the
function as many times as far. Its factor is the widths' ratio, twin over model. A 12 x 768 ViT
on digits grown from its 256-wide twin: 0.99 at step 0, 1.02 after 100 steps at one lr, 0.65 with
the factor, 0.20 after 300 (own init 2.23 and 1.51; ``benchmarks/grown_starts.py``).

A model is grown when it is wider than the widest width trained at its depth, not only than the
widest of all (a 12 x 384 ViT-S: 1.00 at step 0 grown from 256, 1.44 decoded directly). A
transformers model no graphkit family reads (Qwen2, Gemma, transformers' own ViT and DeiT) gets
a twin of its own config class (:func:`library_twin`) when the model is at hand; timm's ViT
variants (CLIP's pre-norm, layer scale, register tokens) get one from the options their config
reads (:data:`graphkit.families.vit.OPTIONS`). A variant that computes the plain ViT once its
parameters are converted from the plain ViT's (layer scale with every gain at 1; a position table
for the patches only, the prefix tokens' rows added to those tokens: DeiT-III) is predicted as
that plain ViT, and the prediction converted (:attr:`Twin.plain`,
:func:`graphkit.families.equivalents.plain_form`): the bundled checkpoint never trained on either,
and refused layer scale's op. Inside the space (6 x 384 at 8 px, held-out digits at step 0), a ViT
whose table covers the patches only scored 4.32 decoded directly and 0.82 as its plain twin (own
init 2.45); DeiT-III-S at 224 px 2.01 / 0.30, where the checkpoint trained across families, which
predicted it before, gave 2.30 / 0.06 (own init 2.30 / 0.06). A hand-written model (nanoGPT, a
ViT of torch's layers), which no config describes, is its own twin: a copy of it on the meta
device at the twin's width, patch size and grid, traced from its own inputs (:func:`copied_twin`).

Growing fixes the shapes, not what the hypernetwork never saw. Two variants it never trained on
start worse than a plain ViT of their shape (held-out digits, step 0; BENCHMARKS.md,
"Resolutions and patch sizes"): a pre-norm on the stream (CLIP; a 12 x 256 ViT at the trained 8
px: 3.36 predicted, 0.99 without the pre-norm, own init 2.34): the norm brings every token's row
to one size, where the predicted stream's smallest row was a third of its mean (RMS 0.05 against
0.16), and the norm's gain set to that mean leaves it at 2.81; and
transformers' separate query, key and value projections (a 6 x 256 ViT at 8 px: 3.76, timm's
fused one 0.80)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Collection, Mapping
from fractions import Fraction
from typing import Any, NamedTuple

import torch
from torch import nn

from graphkit.compat import skip_weight_init
from graphkit.errors import GraphkitError, GrowError
from graphkit.families import ConfigError, build_model, config_from_graph
from graphkit.families.equivalents import PlainForm, Renaming, block_shape, renamed, vit_equivalent
from graphkit.families.libraries import EXPERT_MLP_FIELDS, HEAD_FIELDS, KV_HEAD_FIELDS, MLP_FIELDS, WIDTH_FIELDS
from graphkit.ghn.calibrate import output_layer
from graphkit.ghn.checkpoint import plain_for
from graphkit.ghn.encoding import Target, targets
from graphkit.ghn.model import put
from graphkit.ghn.pool import with_init_constants
from graphkit.ghn.space import extent, grid_to_predict, patches_at_grid, widest_at_depth
from graphkit.graph import ArchGraph
from graphkit.params import first_non_finite, replace_parameter, tied_names
from graphkit.tracing import trace
from graphkit.tracing.inputs import ExampleInputs, normalise_inputs
from graphkit.validation import is_count

#: ops whose weight's input axis reads a previous activation (its values are split among the copies)
READERS = ("linear", "head", "patch_embed", "conv")


def twin_config(config: Mapping[str, Any], width: int) -> dict[str, Any]:
    """``config`` (a resolved family config) at residual width ``width``: heads, GQA's kv heads
    and the MLP scaled by the same factor, the head size kept (kv heads that would scale below
    one become one, which every query head shares). GrowError when the heads do not scale to
    whole numbers."""
    hidden, heads = config["hidden"], config["heads"]
    ratio = width / hidden
    twin = {**config, "hidden": width, "heads": round(heads * ratio)}
    if twin["heads"] * hidden != heads * width:
        raise GrowError(f"{heads} heads of width {hidden} do not scale to whole heads at width {width}")
    if config.get("kv_heads"):
        kv = config["kv_heads"]
        if kv * width < hidden:  # fewer than one: one kv head that every query head shares, as the model's groups do
            twin["kv_heads"] = 1
        else:
            twin["kv_heads"] = round(kv * ratio)
            if twin["kv_heads"] * hidden != kv * width or twin["heads"] % twin["kv_heads"]:
                raise GrowError(f"{kv} kv heads do not scale to whole groups at width {width}")
    if config.get("mlp"):
        twin["mlp"] = max(1, round(config["mlp"] * ratio))
    return twin


def axis_map(size: int, twin_size: int, width: int, twin: int) -> torch.Tensor:
    """For each index of an axis of ``size`` in the wide model, the index of the twin's axis of
    ``twin_size`` it copies (see the module docstring)."""
    i = torch.arange(size)
    if size % width == 0 and twin_size % twin == 0 and size // width == twin_size // twin:
        return (i // width) * twin + (i % width) % twin
    return i % twin_size


def _input_axis(target: Target, graph: ArchGraph) -> int | None:
    node = graph.nodes[target.node]
    if target.kind != "weight" or node.op not in READERS:
        return None
    return 0 if node.attrs.get("transposed") and len(target.shape) == 2 else 1


def split_axis(target: Target, graph: ArchGraph, tied_norms: set[int]) -> int | None:
    """The axis along which :func:`grow` splits ``target``'s values among their copies: a
    reader's input axis, or the one axis of a norm that feeds only a tied output head; None for
    a parameter whose values are copied whole."""
    reads = _input_axis(target, graph)
    if reads is None and target.node in tied_norms and len(target.shape) == 1:
        return 0
    return reads


def _tied_head_norms(graph: ArchGraph) -> set[int]:
    """Norm nodes whose every consumer is an output head that reads a tied embedding."""
    consumers: dict[int, list[int]] = {}
    for src, dst in graph.edges:
        consumers.setdefault(src, []).append(dst)
    return {
        i
        for i, node in enumerate(graph.nodes)
        if node.op in ("layer_norm", "rms_norm")
        and consumers.get(i)
        and all(graph.nodes[c].op == "head" and graph.nodes[c].attrs.get("tied") for c in consumers[i])
    }


def resize_patches(value: torch.Tensor, kernel: tuple[int, ...]) -> torch.Tensor:
    """A patch embedding's weight ``value`` (out, in, h, w) resized to ``kernel`` (h', w') by
    FlexiViT's pseudo-inverse resize: on an image upscaled from h x w to h' x w' patches the
    resized weight gives the tokens the original gave (exactly when the kernel grows)."""
    from timm.layers import resample_patch_embed

    return resample_patch_embed(value.float(), list(kernel), interpolation="bilinear", antialias=False).to(value.dtype)


def resize_positions(value: torch.Tensor, tokens: int, grid: int) -> torch.Tensor:
    """A position table ``value`` (1, prefix + g x g, width) resized to ``tokens`` rows on a
    ``grid`` x ``grid`` token grid: the prefix rows (class and register tokens) kept, the grid's
    interpolated bicubically as timm resizes a ViT to a new resolution
    (``timm.layers.resample_abs_pos_embed``). GrowError when the rows are no prefix plus a
    square grid."""
    from timm.layers import resample_abs_pos_embed

    prefix = tokens - grid * grid
    old = math.isqrt(max(value.shape[1] - prefix, 0))
    if value.dim() != 3 or prefix < 0 or old * old != value.shape[1] - prefix or old == 0:
        raise GrowError(
            f"cannot resize a position table of shape {tuple(value.shape)} to {tokens} tokens on a {grid} x {grid} grid"
        )
    resized = resample_abs_pos_embed(
        value.float(), [grid, grid], [old, old], num_prefix_tokens=prefix, interpolation="bicubic", antialias=True
    )
    return resized.to(value.dtype)


def grow(
    target: Target, value: torch.Tensor, graph: ArchGraph, width: int, twin: int, tied_norms: set[int] | None = None
) -> torch.Tensor:
    """The twin's ``value`` of ``target`` grown to the target's shape in ``graph`` (width
    ``width``, twin width ``twin``): a patch embedding's kernel resized (:func:`resize_patches`),
    a position table's grid resized (:func:`resize_positions`), then copied along every axis
    that differs; along a read axis each value is split among its copies at random shares that
    sum to one, drawn from seed 0 (the same model, the same prediction)."""
    tied_norms = _tied_head_norms(graph) if tied_norms is None else tied_norms
    split = split_axis(target, graph, tied_norms)
    op = graph.nodes[target.node].op
    if op == "patch_embed" and len(target.shape) == 4 and value.shape[2:] != target.shape[2:]:
        value = resize_patches(value, target.shape[2:])
    if op == "pos_embedding" and len(target.shape) == 3 and value.shape[1] != target.shape[1]:
        value = resize_positions(value, target.shape[1], extent(graph)["grid"] or 0)
    generator = torch.Generator().manual_seed(0)
    for axis, (size, twin_size) in enumerate(zip(target.shape, value.shape)):
        if size == twin_size:
            continue
        index = axis_map(size, twin_size, width, twin).to(value.device)
        value = value.index_select(axis, index)
        if axis == split:
            share = 0.5 + torch.rand(value.shape, generator=generator)
            total = torch.zeros(value.shape[:axis] + (twin_size,) + value.shape[axis + 1 :], dtype=share.dtype)
            total.index_add_(axis, index.cpu(), share)
            value = value * (share / total.index_select(axis, index.cpu())).to(value.device, value.dtype)
    return value


class GrownDecoding:
    """A wide model's parameters, decoded as its narrow twin's and grown one parameter at a time
    into their destinations (the interface of :class:`~graphkit.ghn.model.LowRankDecoding`): the
    twin's values are checked for NaN and Inf before anything is written, and the wide model
    never exists twice in memory, only one grown parameter beside it. ``head_factor`` multiplies
    the output layer (:func:`logit_scale`); ``renaming`` reads the twin's values by the model's
    names (:attr:`Twin.renaming`); ``plain`` converts them into those of a twin with the model's
    options (:attr:`Twin.plain`)."""

    def __init__(
        self,
        graph: ArchGraph,
        twin_params: dict[str, torch.Tensor],
        width: int,
        twin: int,
        max_slots: int,
        head_factor: float = 1.0,
        renaming: Renaming | None = None,
        plain: PlainForm | None = None,
    ) -> None:
        if renaming is not None:
            twin_params = renamed(twin_params, renaming)
        self.graph, self.twin_params = graph, twin_params if plain is None else plain.convert(twin_params)
        self.width, self.twin, self.head_factor = width, twin, head_factor
        self.targets = targets(graph, max_slots)
        self._tied_norms = _tied_head_norms(graph)
        head = output_layer(graph) if head_factor != 1 else None
        self._head = {t.name for t in self.targets if head is not None and t.name.rpartition(".")[0] == head}

    def first_non_finite(self) -> str | None:
        """The first parameter holding a NaN or Inf, or None (growing copies values and
        multiplies them by shares in (0, 1), so the twin's values decide)."""

        return first_non_finite(self.twin_params)

    def grown(self, target: Target) -> torch.Tensor:
        """One parameter at the wide model's shape (the output layer's times ``head_factor``)."""
        value = grow(target, self.twin_params[target.name], self.graph, self.width, self.twin, self._tied_norms)
        return value * self.head_factor if target.name in self._head else value

    @torch.no_grad()
    def write_into(
        self, destinations: dict[str, torch.Tensor], onto: Collection[str] = frozenset()
    ) -> dict[str, torch.Tensor]:
        """Grow every parameter into ``destinations[name]`` (added to what those named in
        ``onto`` hold; a meta destination gets the grown tensor, at its dtype). Returns the
        tensors written, by name."""
        return {t.name: put(destinations[t.name], self.grown(t), t.name in onto) for t in self.targets}


def _narrower(config: dict[str, Any], space: Mapping[str, Any], depth: int) -> dict[str, Any] | None:
    """``config`` at the widest width trained at ``depth`` that holds whole heads and kv groups
    of its own size; None when none does."""
    head_dim = config["hidden"] // config["heads"]
    widest = widest_at_depth(space, depth)
    for twin in range(((widest or 0) // head_dim) * head_dim, 0, -head_dim):
        try:
            return twin_config(config, twin)
        except GrowError:
            continue
    return None


class Twin(NamedTuple):
    """A model's twin inside a hypernetwork's training space (:func:`twin_of`): its config and
    the twin itself, built on the meta device once, to be checked, traced and described; and,
    for a model of another library that computes what the twin's family computes (transformers'
    ViT), the ``renaming`` of the model's parameters into the twin's; for a variant that computes
    the plain model of its family the twin is (DeiT-III's layer scale with its gains at 1), the
    ``plain`` form that converts the twin's prediction into the variant's parameters
    (:mod:`graphkit.families.equivalents`); for a hand-written model, which no config describes,
    its ``graph``, traced already from the model's own inputs (:func:`copied_twin`), and a
    ``config`` of the fields it changed. The shapes of parameters the twin lacks are not in
    :meth:`shapes`."""

    config: dict[str, Any]
    model: nn.Module
    renaming: Renaming | None = None
    plain: PlainForm | None = None
    graph: ArchGraph | None = None

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The twin's parameter shapes by the model's names."""
        own = {name: tuple(p.shape) for name, p in self.model.named_parameters()}
        if self.renaming is None:
            return own
        return {name: block_shape(own[source], block) for name, (source, block) in self.renaming.items()}


def twin_of(ghn, graph: ArchGraph, model: nn.Module | None = None, example_inputs: ExampleInputs = None) -> Twin | None:
    """``graph``'s twin inside the space ``ghn`` trained on (its ``info["space"]``): at the
    widest width trained at its depth (or the nearest depth trained) when it is wider than that,
    at the finest trained token grid when its own is finer, and at the nearest patch size trained
    on that grid when its own was not. The twin is built from the config graphkit's
    family reads off the graph, when that config builds the model's own parameters at their
    shapes; a transformers model that no family reads, or whose family's twin lacks its
    parameters, from its own config class when its ``model`` is given (:func:`library_twin`).
    A model whose plain form ``ghn`` trained on every op of
    (:func:`~graphkit.ghn.checkpoint.plain_for`) is predicted as that plain model, at its own
    shapes too (:attr:`Twin.plain`). A hand-written model, which neither describes, is its own
    twin: ``model`` copied at the widest width trained at its depth that keeps its head size
    (:func:`whole_heads_width`) and at a trained patch size and grid, traced from
    ``example_inputs`` (None: guessed) resized (:func:`copied_twin`); at its own width, regridded,
    when the narrowed copy does not trace.

    None when neither applies, when the checkpoint records no space, when there is nothing to
    build a twin from, when the twin would lack or add parameters (the model has parts its
    family's config does not describe: a distilled DeiT's distillation token), or when a wide
    graph has no width up to the widest trained at its depth that holds whole heads and kv
    groups of its own size."""

    info = getattr(ghn, "info", None) or {}
    space = info.get("space")
    size = extent(graph)
    # wider than the envelope at its depth, not only than the widest of all: the datasets make deeper
    # models narrower, and a 12 x 512 LLaMA decoded directly scored 3.47 at step 0, grown from its
    # 256-wide twin 2.74 (a ViT of that shape on digits: 3.31 and 0.99)
    widest = widest_at_depth(space, size["depth"] or 0) if space else None
    wide = widest is not None and size["width"] is not None and size["width"] > widest
    # a grid finer than any trained, or between trained ones, is predicted at the finest trained grid
    # below it and its position table upsampled; a coarser one keeps its own (downsampled from 4 x 4 to
    # 2 x 2, the bundled ViT's prediction fine-tuned worse: 0.65 after 100 steps on digits against 0.32
    # at its own grid)
    patch, grid = size["patch"], size["grid"]
    grid = grid_to_predict(space, grid) if space else grid
    # the patch sizes trained on that grid: a dataset with patch 2 or 4 at 8 px never trained patch 4
    # on 4 x 4 tokens (decoded directly at 16 px: 2.73 on digits at step 0, its own init 2.37)
    patches = patches_at_grid(space, grid) if space else None
    patch = patch if patches is None or patch is None else min(max(patch, patches[0]), patches[1])
    regrid = (patch, grid) != (size["patch"], size["grid"])
    regrid_to = (patch, grid) if regrid else None
    # a model another library writes as a family's model computes (transformers' ViT) is predicted as
    # that model, at its own shapes too: the hypernetwork read the family's graphs, not the library's
    equivalent = vit_equivalent(model) if model is not None else None
    if equivalent is not None:
        config, renaming = equivalent
        twin = _family_twin(graph, size, space or {}, wide, regrid_to, config)
        return twin._replace(renaming=renaming) if twin is not None else None
    # a model that computes a plainer model of its family (layer scale's gains at 1, a position table
    # without the class token's row) is predicted as that model, whose prediction is converted
    plain = plain_for(info, graph)
    if plain is not None:
        twin = _family_twin(graph, size, space or {}, wide, regrid_to, plain.config)
        return twin._replace(plain=plain) if twin is not None else None
    if not (wide or regrid):
        return None
    family = _family_twin(graph, size, space or {}, wide, regrid_to)
    if family is not None and _same_parameters(family.model, graph):
        return family
    width = size["width"]
    if model is None or width is None:
        return None
    # a family read a config off the graph whose twin lacks the model's parameters, or none did
    widest_twin = widest if wide and widest is not None else width
    library = library_twin(model, width, widest_twin, regrid_to)
    if library is not None and _same_parameters(library.model, graph):
        return library
    # no config describes it (nanoGPT, a ViT of torch's layers): its own modules, copied at the twin's shapes;
    # at its own width, regridded, where it cannot be narrowed (a 12 x 384 ViT at 224 px: 2.12 at step 0
    # on held-out digits, decoded directly 5.46, own init 2.43)
    narrow = whole_heads_width(graph, widest_twin) if wide else None
    twin = copied_twin(model, graph, narrow, regrid_to, example_inputs) if narrow is not None else None
    if twin is None and regrid_to is not None:
        twin = copied_twin(model, graph, width, regrid_to, example_inputs)
    return twin


def _same_parameters(model: nn.Module, graph: ArchGraph) -> bool:
    """Whether ``model`` has the parameters of ``graph``'s model, by name."""
    return {name for name, _ in model.named_parameters()} == {name for node in graph.nodes for name in node.params}


def _family_twin(
    graph: ArchGraph,
    size: Mapping[str, Any],
    space: Mapping[str, Any],
    wide: bool,
    regrid: tuple[int | None, int | None] | None,
    config: dict[str, Any] | None = None,
) -> Twin | None:
    """The twin :func:`twin_of` describes, from ``config`` (an equivalent's, checked already)
    or the config graphkit's family reads off ``graph`` (of extent ``size``): narrowed when
    ``wide``, at ``regrid``'s (patch, grid) when given. None when no family reads it or no width
    holds whole heads."""
    if config is None:
        try:
            config = config_from_graph(graph)
        except ConfigError:
            return None
        # the config read back must describe the model itself, shape by shape, before a twin is made of it
        own = {name: tuple(p.shape) for name, p in build_model(config, "meta").named_parameters()}
        if own != {name: tuple(shape) for node in graph.nodes for name, shape in node.params.items()}:
            return None
    if wide:
        if config["hidden"] != size["width"]:
            return None
        narrowed = _narrower(config, space, size["depth"] or 0)
        if narrowed is None:
            return None
        config = narrowed
    if regrid is not None and config.get("patch_size") == size["patch"]:
        patch, grid = regrid
        assert patch is not None and grid is not None, "a patch size and a grid are read together"
        config = {**config, "patch_size": patch, "image_size": grid * patch}
    # a config read back describes the model's family, not every part a library adds to it (a
    # distilled DeiT's distillation token, a CLIP ViT's pre-norm): such a twin lacks parameters
    return Twin(config, build_model(config, "meta"))


def _scaled_fields(fields: Mapping[str, Any], width: int, twin: int) -> dict[str, int] | None:
    """The transformers config ``fields`` of a ``width``-wide decoder that change at width
    ``twin``: the stream's, the heads' and K/V heads' counts and the MLPs' widths, all by the same
    factor (K/V heads that would scale below one become one). None when a head count does not
    scale to a whole number or the heads do not split into whole K/V groups."""
    ratio = Fraction(twin, width)
    counts = {k: v for k, v in fields.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
    out = {k: twin for k in WIDTH_FIELDS if counts.get(k) == width}
    for key in HEAD_FIELDS:
        if key in counts:
            scaled = counts[key] * ratio
            if scaled.denominator != 1:
                return None
            out[key] = int(scaled)
    for key in KV_HEAD_FIELDS:
        if key in counts:
            scaled = counts[key] * ratio
            if scaled >= 1 and scaled.denominator != 1:
                return None
            out[key] = max(1, int(scaled))
    heads = next((out[k] for k in HEAD_FIELDS if k in out), None)
    kv = next((out[k] for k in KV_HEAD_FIELDS if k in out), None)
    if heads is None or (kv is not None and heads % kv):
        return None
    out.update({k: max(1, round(counts[k] * ratio)) for k in (*MLP_FIELDS, *EXPERT_MLP_FIELDS) if k in counts})
    return out


def library_twin(
    model: nn.Module, width: int, widest: int, regrid: tuple[int | None, int | None] | None = None
) -> Twin | None:
    """A transformers model's twin at the widest width up to ``widest`` at which its heads and
    K/V groups stay whole, with the head size kept: its own config with the stream, the heads,
    the K/V heads and the MLPs scaled by one factor (:func:`_scaled_fields`), and, given
    ``regrid``'s (patch, grid), an image model's ``patch_size`` and ``image_size`` set to that
    patch on that token grid; built on the meta device by its own class. Why its own class: a
    model of a type no graphkit family reads (Qwen2's biased projections, Qwen3's per-head norms,
    transformers' ViT with its own parameter names) still has a twin the hypernetwork can
    predict, as a 12 x 512 Mistral has one at width 128 (a head size of 64: two heads) and
    ``ViTForImageClassification`` at 224 px one at 8 px with patch 2. None when ``model`` has no
    transformers config, no field of it gives the width, no width holds whole heads, or a
    ``regrid`` model's config has no whole ``patch_size`` and ``image_size``."""
    config = getattr(model, "config", None)
    if config is None or not callable(getattr(config, "to_dict", None)):
        return None
    fields = config.to_dict()
    if not any(fields.get(k) == width for k in WIDTH_FIELDS):
        return None
    image: dict[str, int] = {}
    if regrid is not None:
        patch, grid = regrid
        if patch is None or grid is None or not all(is_count(fields.get(k)) for k in ("patch_size", "image_size")):
            return None
        image = {"patch_size": patch, "image_size": patch * grid}
    for twin in range(widest, 0, -1):
        overrides = _scaled_fields(fields, width, twin)
        if overrides is None:
            continue
        narrow = copy.deepcopy(config)
        for key, value in {**overrides, **image}.items():
            setattr(narrow, key, value)
        with torch.device("meta"), skip_weight_init():
            built = type(model)(narrow)
        tie = getattr(built, "tie_weights", None)
        if callable(tie):  # tied as the model is, which a build without its init skips
            tie()
        heads = next(v for k, v in overrides.items() if k in HEAD_FIELDS)
        return Twin({"hidden": twin, "heads": heads, **image}, built)
    return None


#: prefix tokens (a class token, registers) a hand-written position table may hold beside its grid's rows
MAX_PREFIX = 16
#: the ops whose parameters :func:`copied_twin` knows how to narrow, and for each the axes that keep
#: their size (a table's rows, a kernel's input channels and size, an output layer's classes); a
#: negative axis counts from the end, None: all but the last
FIXED_AXES: dict[str, tuple[int, ...] | None] = {
    "embedding": (0,),
    "pos_embedding": None,
    "patch_embed": (1, 2, 3),
    "class_token": None,
    "linear": (),
    "head": (0,),
    "layer_norm": (),
    "rms_norm": (),
}


def copied_twin(
    model: nn.Module,
    graph: ArchGraph,
    width: int,
    regrid: tuple[int | None, int | None] | None = None,
    example_inputs: ExampleInputs = None,
) -> Twin | None:
    """A hand-written model's twin at residual width ``width`` and, given ``regrid``, at its
    (patch, grid): a copy of ``model`` on the meta device (nothing allocated, the model left as
    it is) whose parameters and modules take the twin's shapes, traced from ``example_inputs``
    (None: guessed) with its images resized to patch x grid pixels.

    Why: no config describes a model of no family and no library (nanoGPT, a ViT of torch's
    layers), so there is nothing to build a twin from (:func:`twin_of`), and decoded directly at
    a width or a grid it never trained on the prediction starts worse than the model's own init
    (a hand-written 6 x 256 ViT at 32 px, patch 4: 3.20 on held-out digits at step 0, own init
    2.41); but the model's own modules, at the trained width, patch size and grid, are the twin,
    and :func:`grow`'s growing and resizes apply to it as to timm's ViTs (1.64 through it, as
    timm's ViT of that shape; BENCHMARKS.md, "Resolutions and patch sizes").

    Narrowed, every axis of a parameter scales by width / the model's width (whole heads: the
    head size is kept) except those :data:`FIXED_AXES` keeps and axes of size 1; the copy's
    modules follow their parameters (``nn.Linear``'s features, a norm's shape,
    ``nn.MultiheadAttention``'s width and heads), and a module's own integer attributes that
    equal a scaled size (nanoGPT's ``n_embd``) or, by a name holding "head", the head count
    (its ``n_head``), take the twin's. Regridded, the patch embedding must be an ``nn.Conv2d``
    whose stride is its kernel, unpadded and undilated, reading square images; each position
    table a (1, prefix + g x g, width) parameter with at most :data:`MAX_PREFIX` prefix rows.

    None when an op with parameters is not in :data:`FIXED_AXES`, when the heads do not scale to
    whole numbers, or when the copy does not trace to the model's graph with only those shapes
    and head counts changed: a forward that fixes its sizes (a check of the image size, a
    buffer of the model's width) has no twin."""
    own = extent(graph)["width"]
    heads = _head_counts(graph)
    if own is None or heads is None or (width != own and not heads):
        return None
    twin_shapes = _narrowed_shapes(graph, own, width)
    if twin_shapes is None:
        return None
    kernel, patch, grid = None, *(regrid or (None, None))
    if regrid is not None:
        kernel = _patch_kernel(model, graph)
        tables = _regridded_tables(graph, twin_shapes, grid) if kernel is not None and grid is not None else None
        if kernel is None or tables is None or patch is None or grid is None:
            return None
        twin_shapes.update(tables)
        twin_shapes[kernel] = (*twin_shapes[kernel][:2], patch, patch)
    twin = _meta_copy(model)
    if twin is None:
        return None
    shapes = {name: shape for node in graph.nodes for name, shape in node.params.items()}
    names = tied_names(twin)  # a tied head takes the narrowed table too
    for name, shape in twin_shapes.items():
        if shape != shapes[name]:
            replace_parameter(twin, name, torch.empty(shape, device="meta"), names)
    scaled = {n: n * width // own for name in shapes for n, m in zip(shapes[name], twin_shapes[name]) if n != m}
    twin_heads = {count: count * width // own for count in heads}
    for module in twin.modules():
        _follow_parameters(module, scaled, twin_heads)
    side = None
    if kernel is not None and patch is not None and grid is not None:
        conv = twin.get_submodule(kernel.rpartition(".")[0])
        assert isinstance(conv, nn.Conv2d), "checked on the model by _patch_kernel"
        conv.kernel_size = conv.stride = (patch, patch)
        side = patch * grid
    traced = _traced_copy(twin, graph, model, example_inputs, side)
    if traced is None or extent(traced)["width"] != width or _head_counts(traced) != set(twin_heads.values()):
        return None
    same = [node.op for node in traced.nodes] == [node.op for node in graph.nodes] and [
        node.params for node in traced.nodes
    ] == [{name: twin_shapes[name] for name in node.params} for node in graph.nodes]
    if not same or (regrid is not None and (extent(traced)["patch"], extent(traced)["grid"]) != regrid):
        return None
    if "init" in graph.meta:  # traced on meta, it records none: the model's, whose 1-D constants it shares by name
        traced.meta["init"] = graph.meta["init"]
    config: dict[str, Any] = {"hidden": width}
    if width != own:
        config["heads"] = next(n.attrs["heads"] for n in traced.nodes if n.op == "attention")
    if side is not None:
        config.update(patch_size=patch, image_size=side)
    return Twin(config, twin, graph=traced)


def _head_counts(graph: ArchGraph) -> set[int] | None:
    """The query and K/V head counts of ``graph``'s attention (empty without attention); None
    when its attention layers differ in them (one narrowing cannot keep every head size)."""
    pairs = {
        (n.attrs.get("heads"), n.attrs.get("kv_heads") or n.attrs.get("heads"))
        for n in graph.nodes
        if n.op == "attention"
    }
    counts = [count for pair in pairs for count in pair]
    if len(pairs) > 1 or not all(is_count(count) for count in counts):
        return None
    return {int(count) for count in counts if count is not None}


def _narrowed_shapes(graph: ArchGraph, own: int, width: int) -> dict[str, tuple[int, ...]] | None:
    """Each parameter's shape in ``graph``'s model narrowed from width ``own`` to ``width``: every
    axis scaled by their ratio but those :data:`FIXED_AXES` keeps and axes of size 1. None when an
    op with parameters is not in :data:`FIXED_AXES`, or an axis or a head count does not scale to a
    whole number."""
    if any(node.params and node.op not in FIXED_AXES for node in graph.nodes):
        return None
    if any(count * width % own for count in _head_counts(graph) or ()):
        return None
    shapes = {}
    for node in graph.nodes:
        fixed = FIXED_AXES[node.op] if node.params else ()
        for name, shape in node.params.items():
            rank = len(shape)
            keep = set(range(rank - 1)) if fixed is None else {axis % rank for axis in fixed if -rank <= axis < rank}
            scaled = [axis for axis, n in enumerate(shape) if axis not in keep and n > 1]
            if any(shape[axis] * width % own for axis in scaled):
                return None
            shapes[name] = tuple(n * width // own if axis in scaled else n for axis, n in enumerate(shape))
    return shapes


def _patch_kernel(model: nn.Module, graph: ArchGraph) -> str | None:
    """The name of the weight of ``graph``'s one patch embedding when it is an ``nn.Conv2d`` whose
    stride is its kernel, unpadded and undilated, reading square images (what a resize to another
    patch size and grid keeps exact); None otherwise."""
    embeds = [node for node in graph.nodes if node.op == "patch_embed" and node.attrs.get("kernel")]
    image = (graph.meta.get("input_shapes") or [[]])[0]
    if len(embeds) != 1 or len(image) != 4 or image[2] != image[3]:
        return None
    kernel = next((name for name, shape in embeds[0].params.items() if len(shape) == 4), None)
    conv = model.get_submodule(kernel.rpartition(".")[0]) if kernel is not None else None
    exact = (
        isinstance(conv, nn.Conv2d)
        and conv.kernel_size == conv.stride
        and conv.padding in ((0, 0), "valid")
        and conv.dilation == (1, 1)
    )
    return kernel if exact else None


def _regridded_tables(
    graph: ArchGraph, shapes: Mapping[str, tuple[int, ...]], grid: int
) -> dict[str, tuple[int, ...]] | None:
    """The shapes of ``graph``'s position tables (``shapes``: their narrowed ones) on a ``grid`` x
    ``grid`` token grid, their prefix rows kept; None when one is no (1, prefix + g x g, width)
    table with at most :data:`MAX_PREFIX` prefix rows."""
    own = extent(graph)["grid"]
    tables = [name for node in graph.nodes if node.op == "pos_embedding" for name in node.params]
    if own is None or any(len(shapes[name]) != 3 for name in tables):
        return None
    prefixes = {name: shapes[name][1] - own * own for name in tables}
    if not all(0 <= prefix <= MAX_PREFIX for prefix in prefixes.values()):
        return None
    return {name: (1, prefix + grid * grid, shapes[name][2]) for name, prefix in prefixes.items()}


def _traced_copy(
    twin: nn.Module, graph: ArchGraph, model: nn.Module, example_inputs: ExampleInputs, side: int | None
) -> ArchGraph | None:
    """``twin`` (a meta copy of ``model``, of ``graph``) traced from the model's inputs on the meta
    device, its images resized to ``side`` pixels when given; None when it does not trace."""
    image = (graph.meta.get("input_shapes") or [[]])[0]

    def resized(value: torch.Tensor) -> torch.Tensor:
        if side is not None and value.dim() == 4 and list(value.shape) == image:
            return torch.zeros(*image[:2], side, side, dtype=value.dtype, device="meta")
        return value.to("meta")

    try:
        args, kwargs = normalise_inputs(model, example_inputs)
        return trace(twin, (_tensors_mapped(args, resized), _tensors_mapped(kwargs, resized)))
    except GraphkitError:
        return None


def whole_heads_width(graph: ArchGraph, widest: int) -> int | None:
    """The widest width up to ``widest`` at which ``graph``'s attention keeps its head size with
    whole query and K/V heads (:func:`copied_twin`'s twin width for a model wider than that);
    None when it has no attention, or no one head count."""
    width, counts = extent(graph)["width"], _head_counts(graph)
    if width is None or not counts or width % max(counts):
        return None
    head_size = width // max(counts)  # the query heads: there are at least as many as K/V heads
    return next(
        (
            twin
            for twin in range(widest // head_size * head_size, 0, -head_size)
            if all(count * twin % width == 0 for count in counts)
        ),
        None,
    )


def _meta_copy(model: nn.Module) -> nn.Module | None:
    """``model`` copied with every parameter and buffer on the meta device, by identity (ties
    kept), so that nothing is allocated; None when it holds what cannot be copied (a lock)."""
    memo: dict[int, Any] = {id(p): nn.Parameter(p.to("meta"), p.requires_grad) for p in model.parameters()}
    memo.update({id(b): b.to("meta") for b in model.buffers()})
    try:
        return copy.deepcopy(model, memo)
    except (TypeError, copy.Error):
        return None


def _follow_parameters(module: nn.Module, scaled: Mapping[int, int], head_counts: Mapping[int, int]) -> None:
    """Make ``module``'s sizes those of its (narrowed) parameters: torch's layers by their own
    fields, a hand-written module's integer attributes by ``scaled`` (a size the model's
    parameters had -> the twin's) and, for a name holding "head", ``head_counts``."""
    weight = getattr(module, "weight", None)
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):  # without a gain too
        module.normalized_shape = tuple(scaled.get(n, n) for n in module.normalized_shape)
    elif isinstance(module, nn.MultiheadAttention):
        module.kdim, module.vdim = scaled.get(module.kdim, module.kdim), scaled.get(module.vdim, module.vdim)
        module.embed_dim = module.out_proj.weight.shape[0]
        module.num_heads = module.embed_dim // module.head_dim
    elif isinstance(module, nn.Linear) and isinstance(weight, torch.Tensor):
        module.out_features, module.in_features = weight.shape
    elif isinstance(module, nn.Embedding) and isinstance(weight, torch.Tensor):
        module.embedding_dim = weight.shape[1]
    elif isinstance(module, nn.Conv2d) and isinstance(weight, torch.Tensor):
        module.out_channels = weight.shape[0]
    if type(module).__module__.startswith("torch."):
        return
    for name, value in list(vars(module).items()):
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        if "head" in name.lower() and value in head_counts:
            setattr(module, name, head_counts[value])
        elif value in scaled:
            setattr(module, name, scaled[value])


def _tensors_mapped(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` with ``fn`` applied to every tensor in its nested tuples, lists and dicts."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        return {key: _tensors_mapped(value, fn) for key, value in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(_tensors_mapped(value, fn) for value in obj)
    return obj


#: how :func:`twin_phrase` names a twin that is another library's model (:attr:`Twin.renaming`)
EQUIVALENT = "the timm ViT it computes the same function as (q, k and v fused)"


def twin_phrase(graph: ArchGraph, twin: Twin) -> str:
    """How ``graph`` is predicted through its ``twin`` (:func:`twin_of`'s), for predict's
    output: "its 512-wide twin (8 heads), grown to its width without changing what it
    computes", "its twin with patch 2 at 8 px (the same 4 x 4 tokens), its patch embedding
    resized without changing what it computes", "its twin with patch 2 at 8 px (4 x 4 tokens),
    its patch embedding and position table resized to its 14 x 14 tokens, its output layer
    scaled by 4/14" (:func:`logit_scale`), or a width and one of those; each after
    :data:`EQUIVALENT` for another library's model, or after "its twin without layer scale (its
    gains set to 1)" for a variant predicted as its plain form (:attr:`Twin.plain`)."""
    size, config = extent(graph), twin.config
    parts = [EQUIVALENT] if twin.renaming is not None else []
    if twin.plain is not None:
        parts.append(f"its twin {' and '.join(twin.plain.parts)}")
    widened = config["hidden"] != size["width"]
    if widened:
        parts.append(f"its {config['hidden']}-wide twin ({config['heads']} heads), grown to its width")
    if config.get("patch_size") is None or (config["patch_size"], config["image_size"]) == (
        size["patch"],
        size["resolution"],
    ):
        return ", ".join(parts) + ("" if parts == [EQUIVALENT] else " without changing what it computes")
    grid, twin_grid = size["grid"], config["image_size"] // config["patch_size"]
    where = f"patch {config['patch_size']} at {config['image_size']} px"
    if twin_grid == grid:
        resized = "its patch embedding resized"
        what, after = f"{where} (the same {grid} x {grid} tokens)", " without changing what it computes"
    else:
        resized = (
            "its position table resized"
            if config["patch_size"] == size["patch"]
            else "its patch embedding and position table resized"
        )
        what = f"{where} ({twin_grid} x {twin_grid} tokens)"
        after = f" to its {grid} x {grid} tokens"
        if logit_scale(graph, twin) < 1:
            after += f", its output layer scaled by {twin_grid}/{grid}"
    parts.append(f"{resized} from the twin's {what}" if widened else f"its twin with {what}, {resized}")
    return ", ".join(parts) + after


def growth(ghn, graph: ArchGraph, twin: Twin | None = None) -> GrownDecoding | None:
    """``ghn``'s prediction of ``graph`` as its ``twin``'s (default: :func:`twin_of`'s, which a
    caller that has asked already passes on), grown and its patches resized; None when the
    graph has no twin."""

    twin = twin if twin is not None else twin_of(ghn, graph)
    if twin is None:
        return None
    twin_graph = twin.graph if twin.graph is not None else trace(twin.model)
    if "init" in graph.meta and twin.renaming is None:  # built on meta: its 1-D constants are the model's, by name
        twin_graph.meta["init"] = graph.meta["init"]
    elif ghn.config.init_anchors and twin.graph is None:  # another library's names: the twin's own init's constants
        twin_graph = with_init_constants(twin_graph, twin.config)
    with torch.no_grad():
        params = ghn.predict(twin_graph)
    width = extent(graph)["width"]
    assert width is not None, "a twin is made for a model with a width"
    head = logit_scale(graph, twin)
    hidden = twin.config["hidden"]
    return GrownDecoding(graph, params, width, hidden, ghn.config.max_slots, head, twin.renaming, twin.plain)


def logit_scale(graph: ArchGraph, twin: Twin) -> float:
    """The factor on the output layer of ``graph`` predicted through ``twin``: the ratio of the
    token grids' sides (twin over model) when the twin's grid is coarser, else 1 (see the
    module docstring: a temperature for a prediction whose position table was resized)."""
    config, grid = twin.config, extent(graph)["grid"]
    if config.get("patch_size") is None or grid is None:
        return 1.0
    return min(1.0, config["image_size"] // config["patch_size"] / grid)


def lr_scale(graph: ArchGraph, twin: Twin | None) -> dict[str, float]:
    """The learning-rate factor, by state-dict name, of each parameter of ``graph``'s model that
    a prediction through ``twin`` makes smaller than the twin's: a kernel resized to a larger one
    takes the ratio of the kernels' areas, twin's over the model's (patch 2 resized to 16: 1/64);
    a weight whose values :func:`grow` splits among copies takes the ratio of that axis's sizes
    (a 128-wide twin grown to 512: 1/4); both, their product. Empty without a twin, or when the
    twin's parameters have the model's shapes (see the module docstring for why such a parameter
    wants a smaller lr)."""
    if twin is None:
        return {}
    twin_shapes = twin.shapes()
    tied_norms = _tied_head_norms(graph)
    scales = {}
    for target in targets(graph):
        shape, before = target.shape, twin_shapes.get(target.name)
        if before is None or len(before) != len(shape):
            continue
        factor = 1.0
        if graph.nodes[target.node].op == "patch_embed" and len(shape) == 4:
            factor *= min(1.0, (before[2] * before[3]) / (shape[2] * shape[3]))
        axis = split_axis(target, graph, tied_norms)
        if axis is not None and before[axis] < shape[axis]:
            factor *= before[axis] / shape[axis]
        if factor < 1:
            scales[target.name] = factor
    return scales


__all__ = [
    "GrowError",
    "GrownDecoding",
    "Twin",
    "axis_map",
    "copied_twin",
    "grow",
    "growth",
    "library_twin",
    "logit_scale",
    "lr_scale",
    "resize_patches",
    "split_axis",
    "twin_config",
    "twin_of",
    "twin_phrase",
    "whole_heads_width",
]
