"""The direct-training control for sharing across architectures (issue #45, item 1): one set of
weights per parameter name, trained directly on N architectures of one family at once, each
architecture reading the leading corner of each tensor that its own shapes hold.

That is the sharing the low-rank decoder builds in: a role's block is ``W[:rows] M W[:cols]^T``,
so one architecture's block is the leading corner of a wider one's whenever their queries agree,
and ``family_share.py`` found the queries of one name in two architectures predict weights with a
cosine of 0.8 (block 0 and block 1 of one architecture: 1.0). ``family_archs.py`` found that a
hypernetwork on N architectures of ``vision_transformer`` fits them about as one architecture
fits on 1,500 / N steps. This control asks whether weights shared that way can serve N
architectures at all, without a hypernetwork in between:

- the shared weights fit the N about as one architecture fits alone: sharing by corners works,
  and the hypernetwork is what fails to share;
- they degrade with N as the hypernetwork does: the corners are the limit, and a hypernetwork that
  shares must condition on more than the role.

Each run trains, for ``--steps`` AdamW steps (cosine schedule, as ``train-ghn``), the mean loss of
``--meta-batch`` architectures drawn per step from the first N of ``family_archs.py``'s seeded
shuffle, each on its own batch of 32 digits at the zoo's 32 px. The tensors start from the
architectures' own inits, the largest's where they overlap. Probed as ``family_archs.py`` probes a
hypernetwork: training CE over the last 100 steps, and each architecture's model with the shared
corners (parameters no corner covers keep its own init) scored alone at step 0 on held-out digits,
beside its own init: the shuffle's first 4 (trained by every N from 4 up) and its last 8 (no run
trains them). Also per weight, its RMS over the most a prediction of its shape can take.

Across families: the same corners on another family's last ``--unseen`` architectures (``--probe-with
FAMILY``, its own seeded shuffle) and on the first architecture of each held-out family of the
zoo's eval split (``--held-out``), each with the share of its parameters that a shared tensor
covers: whether what one tensor per role shares, trained directly, crosses to another family, the
most a hypernetwork that shares by role could carry there. ``--whole-split`` trains on every
family of the train split at once (one seeded shuffle of all of them, its last ``--unseen`` probed
and never trained): the control for the zoo-vision hypernetwork's own pool, which from one family
no run can give (its leaf tensors take each dimension's largest size in any family, 988M values:
``--device cuda``; with ``--own-kernels``, the convolution kernels left at each architecture's own
init, 150M values, which 2 cores and 24 GB train).

The hypernetwork's other bounds, one at a time: ``--tie-blocks``, one tensor per name for every
block (the zoo recipe predicts one architecture's blocks alike: ``family_share.py``); ``--rank R``,
each weight as rank-R factors (LoGAH-tiny's blocks have rank 32 at most); ``--rank R --one-map``,
each weight as LoGAH's decoder makes a block, one map for its rows and its columns; ``--capped``,
each weight at the RMS the decoder gives it (``INIT_GAIN g / sqrt(fan-in)``, a learned g in (0, 2)).
``--share-by-leaf`` goes past ``--tie-blocks``: one tensor per leaf role, as the zoo-vision
recipe's role factors are keyed, which is what another family can read. ``--share-by-family`` keys
each leaf role's tensor by the architecture's zoo family as well: with ``--whole-split``, whether
the whole split's families fit when none shares a tensor with another (the control for sharing
across families; the held-out families then read nothing but their own init).

Inside a family the control held to all four bounds transfers better than the hypernetwork it
bounds (docs/experiments.md, "What crosses to another family"). The ways it still trains
differently are options that take each away: ``--own-rest``, every tensor that is not a
Linear's or a convolution's weight (1-D parameters, position embeddings, class tokens) stays each
architecture's own init, untrained, where the control otherwise trains it shared and free
(``--own-rest 1-d`` or ``--own-rest tables``: only the 1-D parameters, or only the tables);
``--recipe-lrs maps gains``, those parts at the lr the zoo-vision recipe gives their counterparts
in the hypernetwork (``parameter_groups``: a role map, an r-in Linear's rows, at ``lr * min(1,
lr_fan_in / R)``, the gains as the gain head at ``GAIN_LR * lr``), where the control trains every
part at ``lr`` (a block's ``M`` and the free tensors are at ``lr`` in both, as the role
factors). ``--product-middle`` makes each block's ``M`` a product ``F_A F_B^T`` of two r x r
factors, as the decoder's role factors make it, where the control otherwise trains ``M`` itself.
``--bounded-tables`` holds the tables (position embeddings, class tokens) to ``--rank``
and ``--capped`` as well, a table's rows by its width at the RMS of its width's fan-in, as the
decoder decodes them, where the control otherwise trains them free. ``--device cuda`` trains on a
GPU (the whole split's control needs about 16 GB).

Which part of the hypernetwork's prediction the gap is in: ``--swap-with RUN`` scores, beside the
control, the hypernetwork of the checkpoint RUN (trained on the same N) with one part of its
prediction swapped for the control's, on each probed architecture: the weights, or the rest.
Per probed architecture the output also gives how far the control's 1-D parameters (and with
``--swap-with``, the hypernetwork's) lie from the architecture's own init: the 1-D path each took.
``--tempered`` scores both also at their best logit temperature (``zoo_pools.tempered``): whether
a gap in loss at equal accuracy is one of scale. ``--train-seed S`` draws the tensors, the
architectures and the batches from seed S (0 otherwise): the control's spread over seeds.

    .venv/bin/python experiments/shared_weights.py --counts 1 2 4 8 16 32    # about 5 min a count on 2 cores
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.func import functional_call

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from family_archs import PARTS, PROBED_TRAINED, is_scale, mean_of, shuffled_ids  # noqa: E402
from zoo_pools import KINDS, first_of_each, scored, tempered  # noqa: E402

from graphkit.errors import GraphkitError  # noqa: E402
from graphkit.families import build_model  # noqa: E402
from graphkit.fileio import save_figure  # noqa: E402
from graphkit.ghn import load_checkpoint  # noqa: E402
from graphkit.ghn.encoding import role_of, siblings  # noqa: E402
from graphkit.ghn.model import weight_rms  # noqa: E402
from graphkit.ghn.pool import ArchPool, functional_model, graph_for  # noqa: E402
from graphkit.ghn.predict import predicted_params  # noqa: E402
from graphkit.ghn.training import GAIN_LR  # noqa: E402
from graphkit.training.data import load_source, output_loss  # noqa: E402

BATCH = 32
SIZING = 100  # steps after which a run with a time budget is cut to the steps that fit it
FAMILY_CE = "training CE by family, last 300 steps"


CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)
CONTEXT_KEYS = ("family", "module", "siblings")  # the sharings that key a leaf role by its context (:func:`contexts`)


def family_of(pool: ArchPool, index: int) -> str:
    """Architecture ``index``'s zoo family."""
    return pool.records[index].config["zoo_family"]


def contexts(model: torch.nn.Module, config: dict, sharing: str) -> dict[str, str]:
    """What :func:`key` keys each parameter of ``model`` (built from ``config``) by beside its leaf
    role, by ``sharing``: ``family``, the zoo family; ``module``, the class of the module that
    holds the parameter's layer (its nearest ancestor that is no container: ``mlp.Mlp`` for
    ``blocks.3.mlp.fc1.weight``, ``patch_embed.PatchEmbed`` for ``patch_embed.proj.weight``, the
    model's own class for ``head.weight``), which families built from timm's shared layers have
    in common; ``siblings``, what the traced graph's parameter names alone tell of that module:
    the parameters of the layer's parent and of its children, block indices as ``*``
    (``{proj.bias, proj.weight, qkv.bias, qkv.weight}`` for ``blocks.3.attn.qkv.weight``);
    otherwise nothing."""
    if sharing not in CONTEXT_KEYS:
        return {}
    names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    if sharing == "family":
        return dict.fromkeys(names, config["zoo_family"])
    if sharing == "siblings":
        return siblings(names)
    modules = dict(model.named_modules(remove_duplicate=False))

    def holder(name: str) -> str:
        path = name.split(".")[:-2]  # the parameter's layer's parent
        while path and isinstance(modules[".".join(path)], CONTAINERS):
            path.pop()
        kind = type(modules[".".join(path)])
        return f"{kind.__module__.rsplit('.', 1)[-1]}.{kind.__name__}"  # tnt.Block is not vision_transformer.Block

    return {name: holder(name) for name in names}


def context_of(pool: ArchPool, index: int, sharing: str) -> dict[str, str]:
    """:func:`contexts` of the pool's architecture ``index``."""
    return contexts(pool.model(index), pool.records[index].config, sharing)


def corner(tensor: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The leading corner of ``tensor`` of ``shape`` (a view)."""
    return tensor[tuple(slice(0, n) for n in shape)]


def key(name: str, sharing: str, dims: int, context: str = "") -> str:
    """The shared tensor that parameter ``name`` (of ``dims`` dimensions, in ``context``:
    :func:`contexts`') reads, by ``sharing``:
    ``name``, its own name; ``block``, the same for every block (``blocks.3.attn.qkv.weight``
    reads ``blocks.*.attn.qkv.weight``); ``leaf``, the same for every parameter of its
    ``role_of(name, "leaf")`` and dimensions (``qkv.weight`` 2-D), as the zoo-vision recipe's role
    factors share across blocks and families (a 4-D ``patch_embed.proj.weight`` is no corner of a
    2-D ``attn.proj.weight``); one of :data:`CONTEXT_KEYS`, the leaf's tensor of its context, as
    a prediction keyed by the role and what surrounds it could give it (``deit: qkv.weight (2-D)``,
    ``vision_transformer.Attention: qkv.weight (2-D)``)."""
    if sharing == "leaf" or sharing in CONTEXT_KEYS:
        leaf = f"{role_of(name, 'leaf')} ({dims}-D)"
        return leaf if sharing == "leaf" else f"{context}: {leaf}"
    return re.sub(r"^blocks\.\d+\.", "blocks.*.", name) if sharing == "block" else name


def shared_init(pool: ArchPool, indices: list[int], sharing: str = "name") -> dict[str, torch.Tensor]:
    """Per :func:`key` of the parameters of the architectures ``indices``, one tensor of the
    largest size each dimension takes among them, holding their own inits: smallest first, so the
    largest's wins where they overlap (and the last block's where blocks share one). The shapes are
    read on meta, and one architecture's init is held at a time."""
    params = {index: dict(pool.model(index).named_parameters(remove_duplicate=False)) for index in indices}
    shapes: dict[str, list[torch.Size]] = {}
    context = {index: context_of(pool, index, sharing) for index in indices}
    for index, named in params.items():
        for name, value in named.items():
            shapes.setdefault(key(name, sharing, value.dim(), context[index].get(name, "")), []).append(value.shape)
    shared = {}
    for name, seen in shapes.items():
        if len({len(s) for s in seen}) > 1:
            raise SystemExit(f"{name}: ranks differ between the architectures ({seen}); no corner serves them all")
        shared[name] = torch.zeros([max(s[d] for s in seen) for d in range(len(seen[0]))])
    for index in sorted(indices, key=lambda i: sum(v.numel() for v in params[i].values())):
        for name, value in pool.initialised(index).items():
            corner(shared[key(name, sharing, value.dim(), context[index].get(name, ""))], value.shape).copy_(value)
    return shared


def corners_for(
    shared: dict[str, torch.Tensor],
    params: dict[str, torch.Tensor],
    sharing: str = "name",
    views: dict[tuple[str, torch.Size], torch.Tensor] | None = None,
    context: dict[str, str] | None = None,
) -> dict[str, torch.Tensor]:
    """An architecture's parameters (``params``, its own, by name) as the shared tensors' corners
    where a shared tensor of that :func:`key` and rank holds its shape, else its own. With
    ``views`` (a training step's), every parameter of one key and shape reads one view, kept there,
    and a corner of a trained leaf tensor is a leaf of its own, whose gradient :func:`add_corners`
    adds into the shared tensor's: autograd through the corner would write a gradient of the whole
    shared tensor for every view (the whole split's leaf tensors hold 150M values, and a step's
    blocks read each several times: 2 s of a step's backward on 2 cores). ``context``: the
    architecture's :func:`contexts`."""
    context = context or {}

    def view(name: str, value: torch.Tensor) -> torch.Tensor:
        at = (key(name, sharing, value.dim(), context.get(name, "")), value.shape)
        base = shared[at[0]]
        if views is None:
            return corner(base, value.shape)
        if at not in views:
            leaf = base.is_leaf and base.requires_grad
            views[at] = corner(base.detach(), value.shape).requires_grad_() if leaf else corner(base, value.shape)
        return views[at]

    def fits(name: str, value: torch.Tensor) -> bool:
        other = shared.get(key(name, sharing, value.dim(), context.get(name, "")))
        return (
            other is not None and other.dim() == value.dim() and all(a <= b for a, b in zip(value.shape, other.shape))
        )

    return {name: view(name, v) if fits(name, v) else v for name, v in params.items()}


def add_corners(shared: dict[str, torch.Tensor], views: dict[tuple[str, torch.Size], torch.Tensor]) -> None:
    """Add the gradient of each leaf corner of :func:`corners_for`'s ``views`` into its shared
    tensor's gradient, at that corner."""
    for (name, shape), view in views.items():
        if view.is_leaf and view.grad is not None:
            corner(shared[name].grad, shape).add_(view.grad)


def covered(
    shared: dict[str, torch.Tensor],
    params: dict[str, torch.Tensor],
    sharing: str = "name",
    context: dict[str, str] | None = None,
) -> float:
    """The share of an architecture's parameter values (``params``, its own) that
    :func:`corners_for` takes from the shared tensors."""
    taken, total = corners_for(shared, params, sharing, context=context), sum(v.numel() for v in params.values())
    return sum(v.numel() for name, v in params.items() if taken[name] is not v) / total


def over_cap(shared: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per shared weight (a Linear's or convolution's: 2-D and larger, named ``...weight``), its
    RMS over the largest a hypernetwork's prediction of that shape can take (``weight_rms`` at
    gain 2: twice INIT_GAIN / sqrt(fan-in)): above 1, no prediction reaches it."""
    return {
        name: round(value.square().mean().sqrt().item() / float(weight_rms(2.0, math.sqrt(value[0].numel()))), 2)
        for name, value in shared.items()
        if is_weight(name, value)
    }


def distance_1d(values: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> dict[str, float]:
    """How far ``values`` (one architecture's parameters, by name) lie from its own init ``params``
    in its 1-D parameters: the RMS of the difference over its biases, and over the rest (norm
    gains, layer scales). How far a path moved them, where a control and a hypernetwork both start
    at the init constants."""
    parts: dict[str, list[torch.Tensor]] = {"biases": [], "scales": []}
    for name, own in params.items():
        if own.dim() == 1 and name in values:  # a name the prediction leaves out is the own init
            parts["scales" if is_scale(name, own) else "biases"].append((values[name].cpu() - own).flatten())
    return {part: round(torch.cat(diffs).square().mean().sqrt().item(), 4) for part, diffs in parts.items() if diffs}


def is_weight(name: str, value: torch.Tensor) -> bool:
    """Whether a shared tensor is a Linear's or a convolution's weight (the ones a rank can bound)."""
    return value.dim() >= 2 and name.split(" ")[0].endswith("weight")  # a leaf key ends in its dimensions


def is_bounded(name: str, value: torch.Tensor, tables: bool) -> bool:
    """Whether the decoder's rank and RMS bound the shared tensor ``name``: a weight, or with
    ``tables`` also a table (a position embedding, a class token: the tensors of two or more
    dimensions that are no weight), which the hypernetwork decodes as it decodes a weight."""
    return is_weight(name, value) or (tables and value.dim() >= 2)


def as_matrix(name: str, value: torch.Tensor) -> torch.Tensor:
    """The 2-D view a rank bounds: a weight's rows by the rest (its fan-in), a table's rows (its
    leading dimensions) by its width, as :attr:`~graphkit.ghn.encoding.Target.matrix_shape` shapes
    a position table."""
    return value.flatten(1) if is_weight(name, value) else value.reshape(-1, value.shape[-1])


OWN_REST = {"all": "the rest its own init", "1-d": "1-D at own init", "tables": "tables at own init"}


def untrained(name: str, value: torch.Tensor, own_rest: str, kernels: bool = False) -> bool:
    """Whether the shared tensor ``name`` stays out of training under ``--own-rest own_rest``
    and, with ``kernels``, ``--own-kernels`` (each architecture then reads its own init there)."""
    if is_weight(name, value):
        return kernels and value.dim() == 4
    return bool(own_rest) and (own_rest == "all" or (value.dim() == 1) == (own_rest == "1-d"))


def own_init(config: dict) -> dict[str, torch.Tensor]:
    """An architecture's own init by parameter name, as ``zoo_pools.scored`` scores it: drawn on
    the CPU from seed 0 (the global generator's state kept). What training leaves untrained is
    this init, so that the probe reads the values the shared tensors were trained beside."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return {name: v.detach() for name, v in build_model(config, "cpu").named_parameters(remove_duplicate=False)}


def own_params(
    pool: ArchPool, index: int, shared: dict[str, torch.Tensor], sharing: str, context: dict[str, str]
) -> dict[str, torch.Tensor]:
    """Architecture ``index``'s parameters by name as :func:`corners_for` reads them during
    training: its :func:`own_init` where no shared tensor serves it (what stays untrained), else
    only the parameter's shape (on meta). One architecture's init is drawn at a time, and only its
    untrained parts are kept: the whole split's inits at once would not fit in memory. ``context``:
    the architecture's :func:`contexts`."""
    params = dict(pool.model(index).named_parameters(remove_duplicate=False))
    taken = corners_for(shared, params, sharing, context=context)
    if all(taken[name] is not value for name, value in params.items()):
        return params
    init = own_init(pool.records[index].config)
    return {name: init[name] if taken[name] is value else value for name, value in params.items()}


def swapped(
    predicted: dict[str, torch.Tensor],
    shared: dict[str, torch.Tensor],
    params: dict[str, torch.Tensor],
    bounds: Bounds,
    part: str,
) -> dict[str, torch.Tensor]:
    """A hypernetwork's prediction (``predicted``, by name) with ``part`` of it, the ``weights``
    (:func:`is_weight`) or the ``rest``, taken from the shared tensors' corners (``params``: the
    architecture's own, for its shapes)."""
    direct = corners_for(shared, params, bounds.sharing)

    def taken(name: str, value: torch.Tensor) -> bool:
        other = shared.get(key(name, bounds.sharing, value.dim()))
        if other is None or direct[name] is params[name]:
            return False
        return is_weight(key(name, bounds.sharing, value.dim()), other) == (part == "weights")

    return {name: direct[name] if taken(name, v) else predicted[name] for name, v in params.items()}


def low_rank(
    shared: dict[str, torch.Tensor], rank: int, one_map: bool = False, tables: bool = False, product: bool = False
) -> dict[str, tuple[torch.Tensor, ...]]:
    """Per weight of ``shared`` (with ``tables``, per table too) whose sides both exceed ``rank``
    (as :func:`as_matrix` views it), two factors ``(U, V)`` with ``U V^T`` its best rank-``rank`` approximation (its
    SVD's, the singular values split evenly): the bound the hypernetwork's rank puts on a predicted
    block. With ``one_map``, as LoGAH's decoder builds a block instead: ``(P, M)`` with the block
    ``P[:rows] M P[:cols]^T``, one map ``P`` for its rows and its columns (the decoder's r -> K
    map; a role map per role), ``P`` drawn as the decoder draws its maps and ``M`` so that the
    block starts at its init's RMS. With ``product`` too, ``(P, F_A, F_B)`` with ``M = F_A F_B^T``,
    two r x r factors of equal RMS, as the decoder's role factors make ``M``."""
    out = {}
    for name, value in shared.items():
        if not (is_bounded(name, value, tables) and min(as_matrix(name, value).shape) > rank):
            continue
        matrix = as_matrix(name, value)
        if one_map:
            rms = matrix.square().mean().sqrt()
            bound = 1 / math.sqrt(rank)  # the decoder's maps' init (nn.Linear's), so that Adam moves both alike
            # an entry of P M P^T has variance rank^2 var(P)^2 var(M), var(P) = bound^2 / 3
            first = torch.empty(max(matrix.shape), rank, device=matrix.device).uniform_(-bound, bound)
            if product:  # an entry of F_A F_B^T has variance rank var(F)^2
                side = (3 * rms / math.sqrt(rank)).sqrt()
                out[name] = (first, *(torch.randn(rank, rank, device=matrix.device) * side for _ in range(2)))
            else:
                out[name] = (first, torch.randn(rank, rank, device=matrix.device) * 3 * rms)
        else:
            u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
            root = s[:rank].sqrt()
            out[name] = (u[:, :rank] * root, vh[:rank].t() * root)
    return out


def block(factors: tuple[torch.Tensor, ...], like: torch.Tensor, name: str, one_map: bool) -> torch.Tensor:
    """The tensor of ``like``'s shape (the shared tensor ``name``) that :func:`low_rank`'s
    ``factors`` make."""
    rows, cols = as_matrix(name, like).shape
    shape = like.shape
    first, second, *third = factors
    middle = second @ third[0].t() if third else second
    matrix = first[:rows] @ middle @ first[:cols].t() if one_map else first @ second.t()
    return matrix.view(shape)


@dataclass(frozen=True)
class Bounds:
    """The hypernetwork's bounds that the shared weights are held to, each its own option."""

    sharing: str = "name"  # which parameters read one tensor (:func:`key`)
    rank: int | None = None  # each weight as rank-``rank`` factors (:func:`low_rank`)
    one_map: bool = False  # with ``rank``: one map for a block's rows and columns, as LoGAH's decoder
    capped: bool = False  # each weight at the decoder's RMS, INIT_GAIN g / sqrt(fan-in), g in (0, 2) learned
    # what is not a weight stays each architecture's own init: all of it, or only its 1-D parameters or its
    # tables (position embeddings, tokens); "": none
    own_rest: str = ""
    tables: bool = False  # the tables held to the weights' bounds (rank, one map, RMS), as the decoder decodes them
    product: bool = False  # with one_map: M = F_A F_B^T, as the decoder's role factors make it
    recipe_lrs: tuple[str, ...] = ()  # parts (maps, gains) at their counterpart's lr in the hypernetwork
    kernels: bool = False  # the 4-D weights (convolution kernels) stay each architecture's own init

    def label(self) -> str:
        """How the table and the plot name these bounds."""
        parts = {
            "name": [],
            "block": ["blocks tied"],
            "leaf": ["one tensor per leaf"],
            "family": ["one tensor per leaf and family"],
            "module": ["one tensor per leaf and holding module's class"],
            "siblings": ["one tensor per leaf and holding module's parameter names"],
        }[self.sharing]
        parts += [f"rank {self.rank}" + (", one map" if self.one_map else "")] if self.rank else []
        parts += ["RMS as decoded"] if self.capped else []
        parts += [OWN_REST[self.own_rest]] if self.own_rest else []
        parts += ["kernels at own init"] if self.kernels else []
        parts += ["tables bounded too"] if self.tables else []
        parts += ["M a product of two factors"] if self.product else []
        parts += [f"the recipe's lr for {' and '.join(self.recipe_lrs)}"] if self.recipe_lrs else []
        return ", ".join(parts) or "untied"


def train_shared(
    pool: ArchPool,
    indices: list[int],
    source,
    steps: int,
    meta_batch: int,
    lr: float,
    bounds: Bounds,
    device: torch.device = torch.device("cpu"),
    seed: int = 0,
    budget: float | None = None,
) -> tuple[dict[str, torch.Tensor], list[float], list[tuple[str, float]]]:
    """The shared tensors of ``indices`` trained on ``device`` for ``steps`` steps under
    ``bounds`` from ``seed`` (their random draw, the architectures and batches drawn), the
    training CE per step, and each draw's family and CE in order (the tensors returned on the
    CPU). With a ``budget`` of seconds, the steps are cut at step :data:`SIZING` to those its pace
    since step ``SIZING / 2`` fits in it (the cosine schedule then anneals over them), and training
    stops at the budget whatever the pace: a lent GPU's call has a hard limit, and a run cut there
    gives nothing."""
    torch.manual_seed(seed)
    shared = {name: value.to(device) for name, value in shared_init(pool, indices, bounds.sharing).items()}
    factored = (
        {} if bounds.rank is None else low_rank(shared, bounds.rank, bounds.one_map, bounds.tables, bounds.product)
    )
    shared = {
        name: value for name, value in shared.items() if not untrained(name, value, bounds.own_rest, bounds.kernels)
    }
    free = {name: value.requires_grad_(True) for name, value in shared.items() if name not in factored}
    # the decoder's gain: 2 sigmoid(s / 2), 1 at s = 0, one per weight as the gain head gives one per parameter
    gains = {
        name: torch.zeros((), device=device, requires_grad=True)
        for name, v in shared.items()
        if bounds.capped and is_bounded(name, v, bounds.tables)
    }
    maps = [pair[0].requires_grad_(True) for pair in factored.values()]
    middles = [factor.requires_grad_(True) for pair in factored.values() for factor in pair[1:]]
    if "maps" in bounds.recipe_lrs:  # as parameter_groups: a map is an r-in Linear's rows (one map's P, or both)
        maps, middles = (maps, middles) if bounds.one_map else (maps + middles, [])
    slow = "maps" in bounds.recipe_lrs and bounds.rank is not None
    groups = [
        {"params": [*free.values(), *middles], "lr": lr},
        {"params": maps, "lr": lr * min(1.0, KINDS["vision"][1]["lr_fan_in"] / bounds.rank) if slow else lr},
        {"params": list(gains.values()), "lr": lr * GAIN_LR if "gains" in bounds.recipe_lrs else lr},
    ]
    trained = [p for group in groups for p in group["params"]]

    def current() -> dict[str, torch.Tensor]:
        weights = {**free, **{name: block(pair, shared[name], name, bounds.one_map) for name, pair in factored.items()}}
        for name, s in gains.items():
            w = weights[name]
            rms = weight_rms(2 * torch.sigmoid(s / 2), math.sqrt(as_matrix(name, w).shape[1]))
            weights[name] = w * rms / w.square().mean().sqrt().clamp_min(1e-12)
        return weights

    # fused: one kernel per tensor, where the default on a CPU is several (0.6 s a step on the whole split)
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, weight_decay=0.01, fused=True)
    for value in trained:  # zeroed in place each step: add_corners adds into the free tensors' gradients
        value.grad = torch.zeros_like(value)
    total = [steps]  # the steps the schedule anneals over, cut once to the budget
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * min(1.0, s / total[0])))
    )
    generator = torch.Generator().manual_seed(seed)
    context = {index: context_of(pool, index, bounds.sharing) for index in indices}
    own = {index: own_params(pool, index, shared, bounds.sharing, context[index]) for index in indices}
    own = {index: {name: v if v.is_meta else v.to(device) for name, v in ps.items()} for index, ps in own.items()}
    curve: list[float] = []
    draws: list[tuple[str, float]] = []
    start = time.monotonic()
    half = 0.0  # when step SIZING / 2 began: the pace is read over the second half, past the first steps' costs
    while len(curve) < total[0]:
        elapsed = time.monotonic() - start
        half = elapsed if len(curve) == SIZING // 2 else half
        if budget is not None and len(curve) == SIZING:
            pace = (elapsed - half) / (SIZING - SIZING // 2)
            total[0] = min(steps, SIZING + int((budget - elapsed) / max(pace, 1e-9)))
            print(f"{pace:.3f} s a step: {total[0]} steps fit in {budget:g} s", flush=True)
        if budget is not None and elapsed > budget:
            print(f"stopped at the budget, step {len(curve)} of {total[0]}", flush=True)
            break
        drawn = [indices[i] for i in torch.randint(len(indices), (meta_batch,), generator=generator).tolist()]
        weights, losses, views = current(), [], {}
        for index in drawn:
            inputs, labels = source.batch(pool.records[index].config, BATCH, generator)
            # tied names (CoaT's shared convolutions) read equal values: corners of one key, or one init
            parameters = corners_for(weights, own[index], bounds.sharing, views, context[index])
            output = functional_call(pool.model(index).train(), parameters, (inputs.to(device),), tie_weights=False)
            losses.append(output_loss(source.task, output, labels.to(device))[0])
        each = torch.stack(losses)
        loss = each.mean()
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        add_corners(free, views)
        torch.nn.utils.clip_grad_norm_(trained, 5.0)
        optimizer.step()
        schedule.step()
        curve.append(loss.item())
        draws += [(family_of(pool, index), ce) for index, ce in zip(drawn, each.tolist())]
    with torch.no_grad():
        return {name: value.detach().cpu() for name, value in current().items()}, curve, draws


def by_family(draws: list[tuple[str, float]]) -> dict[str, list[float]]:
    """Per family of ``draws`` (:func:`train_shared`'s), its mean training CE and its number of
    draws, worst first: which families a shared model fits, and which it leaves at chance."""
    losses: dict[str, list[float]] = {}
    for family, ce in draws:
        losses.setdefault(family, []).append(ce)
    means = {family: [round(statistics.mean(ces), 3), len(ces)] for family, ces in losses.items()}
    return dict(sorted(means.items(), key=lambda item: -item[1][0]))


def hypernetwork_ce(family: str, n: int, steps: int) -> float | None:
    """The training CE over the last 100 steps of ``family_archs.py``'s run on the same N
    architectures (the zoo-vision recipe, LoGAH-tiny), or None where it has not been trained."""
    log = ROOT / "runs" / f"{KINDS['vision'][0].name}-{family}-{n}-{steps}" / "metrics.jsonl"
    if not log.exists():
        return None
    return statistics.mean(json.loads(line)["ce"] for line in log.read_text().splitlines()[-10:])


def plot_curves(results: dict[str, dict], png: Path) -> None:
    """Each run of each of ``results`` (``--out`` JSONs by their file's name) by its training CE
    per step (means over 100 steps), its count and its file's name, beside chance, as ``png``: a
    run of the whole split is one count, a point in :func:`plot`."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure, axis = plt.subplots(figsize=(7, 4))
    for name, result in results.items():
        for n, run in result["runs"].items():
            curve = run["curve"]
            starts = range(0, len(curve), 100)
            means = [statistics.mean(curve[i : i + 100]) for i in starts]
            axis.plot([i + 100 for i in starts], means, marker=".", label=f"{name}: {n} architectures")
    axis.axhline(math.log(10), color="grey", linestyle="--", label="chance (ln 10)")
    axis.set(
        xlabel="step",
        ylabel="training CE (mean over 100 steps)",
        title="one tensor per role, trained directly on N architectures",
    )
    axis.legend(fontsize=7)
    save_figure(figure, png, "training-figure", dpi=120, bbox_inches="tight")


def plot_families(results: dict[str, dict], png: Path) -> None:
    """Each run of each of ``results`` (``--out`` JSONs by their file's name) by its training CE
    per family over its last 300 steps (:func:`by_family`), the families in the first run's order,
    beside chance, as ``png``: which families each way of sharing fits."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    runs = {f"{name}: {n}": run for name, result in results.items() for n, run in result["runs"].items()}
    runs = {label: run[FAMILY_CE] for label, run in runs.items() if FAMILY_CE in run}
    if not runs:
        raise SystemExit(f"--by-family: no run of {', '.join(results)} logged its families (an older --out JSON)")
    families = list(reversed(next(iter(runs.values()))))  # best first
    figure, axis = plt.subplots(figsize=(7, 0.2 * len(families) + 1.5))
    for label, ces in runs.items():
        axis.plot([ces.get(f, [math.nan])[0] for f in families], range(len(families)), "o", label=label)
    axis.axvline(math.log(10), color="grey", linestyle="--", label="chance (ln 10)")
    axis.set_yticks(range(len(families)), families, fontsize=7)
    top = max(ce for ces in runs.values() for ce, _ in ces.values())
    axis.set(xlabel="training CE, last 300 steps", xlim=(0, max(4.0, top + 0.3)))
    axis.set_title("each family's fit, trained directly")
    axis.legend(fontsize=7)
    save_figure(figure, png, "training-figure", dpi=120, bbox_inches="tight")


def plot(results: dict, family: str, steps: int, png: Path) -> None:
    """Training CE (the last 100 steps) against the number of architectures: the shared weights
    of ``results`` beside the hypernetwork on the same architectures, as ``png``."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    counts = sorted(int(n) for n in results["runs"])
    figure, axis = plt.subplots(figsize=(6, 4))
    axis.plot(
        counts,
        [results["runs"][str(n)]["training CE, last 100 steps"] for n in counts],
        "o-",
        label=f"shared weights, trained directly ({results['label']})",
    )
    hyper = [(n, ce) for n in counts if (ce := hypernetwork_ce(family, n, steps)) is not None]
    if hyper:
        axis.plot(*zip(*hyper), "s-", label="LoGAH-tiny, the zoo-vision recipe (family_archs.py)")
    axis.axhline(math.log(10), color="grey", linestyle="--", label="chance (ln 10)")
    axis.set_xscale("log", base=2)
    axis.set(
        xlabel=f"architectures of {family}",
        ylabel=f"training CE, last 100 of {steps} steps",
        title="one weight per name, trained directly, against a hypernetwork",
    )
    axis.legend(fontsize=7)
    save_figure(figure, png, "training-figure", dpi=120, bbox_inches="tight")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="vision_transformer")
    parser.add_argument(
        "--whole-split",
        action="store_true",
        help="every family of the train split instead of --family (one seeded shuffle; about 16 GB with "
        "--share-by-leaf: --device cuda)",
    )
    parser.add_argument("--counts", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--meta-batch", type=int, default=4, help="architectures per step (train-ghn's)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0, help="the shuffle's seed (family_archs.py's)")
    parser.add_argument(
        "--train-seed", type=int, default=0, help="the training seed: the tensors' draw, architectures, batches"
    )
    parser.add_argument("--unseen", type=int, default=8, help="the family's last architectures, probed, never trained")
    parser.add_argument(
        "--tie-blocks",
        dest="sharing",
        action="store_const",
        const="block",
        default="name",
        help="one tensor per name for all blocks, as the hypernetwork predicts them",
    )
    parser.add_argument(
        "--share-by-leaf",
        dest="sharing",
        action="store_const",
        const="leaf",
        help="one tensor per leaf role (qkv.weight, fc1.weight) for all blocks and families, as the zoo recipe's roles",
    )
    parser.add_argument(
        "--share-by-family",
        dest="sharing",
        action="store_const",
        const="family",
        help="one tensor per leaf role and zoo family: what the leaf's roles fit when each family keys its own "
        "(with --whole-split, the control for sharing across families)",
    )
    parser.add_argument(
        "--share-by-module",
        dest="sharing",
        action="store_const",
        const="module",
        help="one tensor per leaf role and the class of the module holding its layer (Attention, PatchEmbed): "
        "a context that families built from timm's shared layers have in common",
    )
    parser.add_argument(
        "--share-by-siblings",
        dest="sharing",
        action="store_const",
        const="siblings",
        help="one tensor per leaf role and the parameter names of the module holding its layer (as a traced "
        "graph holds them): the module's signature without its class",
    )
    parser.add_argument(
        "--rank", type=int, default=None, help="each weight as rank-R factors, as the hypernetwork's blocks are"
    )
    parser.add_argument(
        "--one-map", action="store_true", help="with --rank: each block P[:rows] M P[:cols]^T, as LoGAH's decoder"
    )
    parser.add_argument(
        "--capped", action="store_true", help="each weight at the RMS the decoder gives it (a learned gain in (0, 2))"
    )
    parser.add_argument(
        "--own-rest",
        nargs="?",
        const="all",
        default="",
        choices=list(OWN_REST),
        help="what is not a weight stays each architecture's own init: all of it (1-D parameters, position "
        "embeddings, tokens; the default), or only its 1-D parameters or tables",
    )
    parser.add_argument(
        "--own-kernels",
        action="store_true",
        help="the 4-D weights (convolution kernels) stay each architecture's own init: the whole split's leaf "
        "tensors without them fit in 24 GB (150M values, against 988M)",
    )
    parser.add_argument(
        "--product-middle",
        action="store_true",
        help="with --one-map: each block's M = F_A F_B^T, two r x r factors, as the decoder's role factors make it",
    )
    parser.add_argument(
        "--bounded-tables",
        action="store_true",
        help="with --rank or --capped: the tables (position embeddings, tokens) held to the weights' bounds too, "
        "as the decoder decodes them",
    )
    parser.add_argument(
        "--recipe-lrs",
        nargs="+",
        choices=["maps", "gains"],
        default=[],
        help="with --rank: these parts at their counterpart's lr in the hypernetwork (maps: lr * lr_fan_in / R)",
    )
    parser.add_argument(
        "--swap-with",
        type=Path,
        default=None,
        metavar="RUN",
        help="also score RUN's predictions (a checkpoint) with their weights, then the rest, from the control",
    )
    parser.add_argument("--device", default="cpu", help="train on this torch device (cuda for the whole split)")
    parser.add_argument(
        "--no-cudnn",
        action="store_true",
        help="PyTorch's own convolutions, not cuDNN's (cuDNN 9 on a lent H200 had no engine for one of the zoo's)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="each run's training time at most: its steps cut at step 100 to what fits, stopped at it regardless",
    )
    parser.add_argument(
        "--probe-with",
        default=None,
        metavar="FAMILY",
        help="also probe FAMILY's last --unseen architectures (its own shuffle's; never trained)",
    )
    parser.add_argument(
        "--held-out", action="store_true", help="also probe the first architecture of each held-out family"
    )
    parser.add_argument(
        "--tempered",
        action="store_true",
        help="also score each probed model (the control's, and with --swap-with the hypernetwork's) at its best "
        "logit temperature: whether a gap in loss is one of scale",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the figures and curves as this JSON")
    parser.add_argument("--plot", type=Path, default=None, help="draw training CE against N as this PNG")
    parser.add_argument(
        "--from-json",
        type=Path,
        nargs="+",
        default=None,
        help="plot runs' --out JSONs instead of training (several with --curves)",
    )
    parser.add_argument(
        "--curves",
        action="store_true",
        help="with --from-json: each run's training curve (means over 100 steps), not training CE against N",
    )
    parser.add_argument(
        "--by-family",
        action="store_true",
        help="with --from-json: each run's training CE per family over its last 300 steps, not against N",
    )
    args = parser.parse_args()
    if min(args.counts) < 1 or args.steps < 100 or (args.rank is not None and args.rank < 1):
        parser.error("--counts and --rank: each at least 1; --steps: at least 100")
    if args.budget is not None and not (math.isfinite(args.budget) and args.budget > 0):
        parser.error(f"--budget: a number of seconds above 0, not {args.budget}")
    if args.rank is None and (args.one_map or args.recipe_lrs):
        parser.error("--one-map and --recipe-lrs need --rank (the maps' width)")
    if args.product_middle and not args.one_map:
        parser.error("--product-middle factors the one map's M: give --one-map")
    if args.bounded_tables and args.rank is None and not args.capped:
        parser.error("--bounded-tables holds the tables to --rank or --capped: give one")
    if args.bounded_tables and args.own_rest in ("all", "tables"):
        parser.error(f"--bounded-tables bounds the tables, which --own-rest {args.own_rest} does not train")
    if args.whole_split and args.probe_with is not None:
        parser.error("--probe-with probes a family no run trains; --whole-split trains every family")
    if args.swap_with is not None and args.sharing in CONTEXT_KEYS:
        parser.error("--swap-with swaps in the control's tensors by leaf, not by a context")
    if args.swap_with is not None and (args.own_rest or args.own_kernels):
        parser.error("--swap-with takes every tensor from the control: --own-rest and --own-kernels train fewer")
    torch.backends.cudnn.enabled = not args.no_cudnn
    try:
        device = torch.device(args.device)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        parser.error(f"--device {args.device}: {str(error).splitlines()[0]}")
    try:
        ghn = None if args.swap_with is None else load_checkpoint(args.swap_with)
    except GraphkitError as error:
        parser.error(f"--swap-with: {error}")
    bounds = Bounds(
        args.sharing,
        args.rank,
        args.one_map,
        args.capped,
        args.own_rest,
        args.bounded_tables,
        args.product_middle,
        tuple(args.recipe_lrs),
        args.own_kernels,
    )
    label = bounds.label() + (f", training seed {args.train_seed}" if args.train_seed else "")
    scope = "the whole split" if args.whole_split else args.family  # what the plot names the architectures by
    if args.from_json is not None:
        if args.plot is None:
            parser.error("--from-json needs --plot")
        results = {path.stem: json.loads(path.read_text()) for path in args.from_json}
        if args.curves and args.by_family:
            parser.error("--from-json: --curves or --by-family, not both")
        if args.curves:
            plot_curves(results, args.plot)
        elif args.by_family:
            plot_families(results, args.plot)
        elif len(results) > 1:
            parser.error("--from-json: one JSON, or several with --curves or --by-family")
        else:
            plot(*results.values(), scope, args.steps, args.plot)
        return
    zoo, recipe = KINDS["vision"]
    source = load_source(recipe["data"])
    pool = ArchPool(zoo, "train", device)
    position = {record.id: i for i, record in enumerate(pool.records)}
    ids = shuffled_ids(zoo, None if args.whole_split else args.family, args.seed)
    order = [position[i] for i in ids]
    probed = [(f"trained: {ids[k]}", order[k]) for k in range(PROBED_TRAINED)]
    probed += [(f"unseen: {ids[k]}", order[k]) for k in range(len(ids) - args.unseen, len(ids))]
    records = [(what, pool.records[i]) for what, i in probed]
    parts = PARTS[:2]
    if args.probe_with is not None:
        other = shuffled_ids(zoo, args.probe_with, args.seed)
        parts = (*parts, f"{args.probe_with} unseen")
        records += [(f"{parts[-1]}: {i}", pool.records[position[i]]) for i in other[len(other) - args.unseen :]]
    if args.held_out:
        parts = (*parts, PARTS[2])
        records += [(f"{PARTS[2]}: {f}", r) for f, r in first_of_each(ArchPool(zoo, "eval").records).items()]
    own = {what: scored(record, source, BATCH) for what, record in records}
    header = ["architectures", "training CE, last 100 steps", "@0: 4 trained", "8 unseen", *parts[2:]]
    table = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    table.append("| own init | - | " + " | ".join(mean_of(own, part) for part in parts) + " |")
    results: dict = {"label": label, "own init @0": own, "runs": {}}
    for n in sorted(set(min(n, len(ids) - args.unseen) for n in args.counts)):
        shared, curve, draws = train_shared(
            pool, order[:n], source, args.steps, args.meta_batch, args.lr, bounds, device, args.train_seed, args.budget
        )
        ce = statistics.mean(curve[-100:])
        cut = "" if len(curve) == args.steps else f", {len(curve)} steps"  # a run the budget cut
        at0, cover, moved, temper = {}, {}, {}, {}
        swaps: dict[str, dict[str, list[float]]] = {"weights": {}, "rest": {}}
        for what, record in records:
            params = own_init(record.config)
            context = contexts(functional_model(record.config, "cpu"), record.config, args.sharing)
            cover[what] = round(covered(shared, params, args.sharing, context), 3)
            corners = corners_for(shared, params, args.sharing, context=context)
            at0[what] = scored(record, source, BATCH, corners)
            moved[what] = {"control": distance_1d(corners, params)}
            if args.tempered:
                temper[what] = {"control": tempered(record, source, BATCH, corners)}
            if ghn is not None:
                predicted = predicted_params(ghn, graph_for(record, ghn.config))
                moved[what][args.swap_with.name] = distance_1d(predicted, params)
                if args.tempered:
                    temper[what][args.swap_with.name] = tempered(record, source, BATCH, predicted)
                for part, by_arch in swaps.items():
                    by_arch[what] = scored(record, source, BATCH, swapped(predicted, shared, params, bounds, part))
        figures = {"steps": len(curve), "training CE, last 100 steps": round(ce, 3), "@0": at0, "covered": cover}
        figures[FAMILY_CE] = by_family(draws[-300 * args.meta_batch :])
        figures["1-D parameters' RMS distance from the own init"] = moved
        if args.tempered:
            figures["loss; at the best temperature; the same, logits centred"] = temper
        if ghn is not None:
            figures["@0, the hypernetwork's with the control's"] = swaps
        figures["RMS over the cap"] = over_cap(shared)
        results["runs"][str(n)] = {**figures, "curve": curve, "draws": draws}
        print(json.dumps({"architectures": n, **figures}), flush=True)
        table.append(
            f"| {n}, shared weights, {label}{cut} | {ce:.2f} | "
            + " | ".join(mean_of(at0, part) for part in parts)
            + " |"
        )
        for swap, scores in swaps.items() if ghn is not None else ():
            table.append(
                f"| {args.swap_with.name}: its {swap} from the control | - | "
                + " | ".join(mean_of(scores, part) for part in parts)
                + " |"
            )
    print("\n".join(table), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(results))
    if args.plot is not None:
        plot(results, scope, args.steps, args.plot)


if __name__ == "__main__":
    main()
