"""The config of a LoGAH hypernetwork (:mod:`graphkit.ghn.model`) and the paper's variants.

It sits in its own file, as a Hugging Face ``configuration_*.py`` sits beside its model, because
the graph encoding (:mod:`graphkit.ghn.encoding`) reads its limits too and the model reads the
encoding: one module under both keeps the imports one-way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from graphkit.errors import VariantError
from graphkit.ops import OPS

DECODERS = ("low_rank", "ghn3")
#: how a parameter's name becomes its role (:func:`~graphkit.ghn.encoding.role_of`): ``name``, the
#: name without block indices (one family's own roles); ``leaf``, its last module name and the
#: parameter (``q_proj.weight``), which families that follow one naming convention share; ``layer``,
#: the same with a wrapper named for its type skipped (Moshi's ``q_proj.linear.weight`` is
#: ``q_proj.weight``; ``leaf`` stays as checkpoints trained with it read their roles); ``siblings``,
#: the leaf in its context: the parameter names of the module that holds its layer, which only
#: the whole graph's names tell (:func:`~graphkit.ghn.encoding.roles_of`)
ROLE_KEYS = ("name", "leaf", "layer", "siblings")


@dataclass(frozen=True)
class LoGAHConfig:
    """Sizes of a LoGAH model (defaults: LoGAH-tiny)."""

    hidden: int = 64  # d
    layers: int = 3
    heads: int = 8
    rank: int = 32  # r
    max_mask: int = 2048 * 16  # K
    max_degree: int = 64
    max_distance: int = 32
    depth_buckets: int = 0  # relative-depth embeddings (see encoding.relative_depth); 0: none
    tie_feature: bool = False  # the encoder reads which nodes share a tied token table (encoding.tied_nodes)
    max_chunks: int = 64  # rows or columns up to max_chunks * K
    roles: tuple[str, ...] = ()  # parameter roles with their own map (see the module docstring); (): none
    role_rows: int = 4096  # rows of the map each role has to itself
    role_key: str = "name"  # how a parameter's name becomes its role: one of ROLE_KEYS
    max_slots: int = 8  # parameters per node
    decoder: str = "low_rank"  # or "ghn3", the tiling baseline
    spatial: int = 16  # the ghn3 decoder's block is d x d x spatial x spatial
    num_ops: int = len(OPS)  # op ids it reads: the vocabulary's size when it was made (ids never change meaning)
    # 1-D parameters decoded around their model's init constants (encoding.targets); train-ghn's runs
    # since 2026-11-29 set it (TrainConfig.init_anchors); False for checkpoints from before, which lack it
    init_anchors: bool = False
    # token and position tables decoded at this many times the weights' RMS (with init anchors; a
    # tied table where the final norm undoes it: encoding.targets): a stream whose input is larger
    # beside what its blocks write; 1 for checkpoints from before 2026-11-29, which lack it
    table_gain: float = 1.0
    # a head that reads each 1-D parameter's query, and a level per role map, added to its activated
    # values (LowRankDecoder.level, role_levels), so that a 1-D output has a path of its own that Adam moves at its
    # own scale; zero at init, so it decodes as a LoGAH without it. False for checkpoints that lack it
    level_head: bool = False
    # per role map a learned pair of r x r factors added to what the MLP gives each of its weights'
    # queries (LowRankDecoder.role_factors), so that every weight of a role has a path that Adam
    # moves as directly trained weights move; zero at init, so it decodes as a LoGAH without it.
    # False for checkpoints that lack it
    role_factors: bool = False
    # per role map a learned vector added to the activated values of each of its 1-D parameters (their
    # first role_rows entries; LowRankDecoder.role_vectors), so that a role's norm gains and biases have
    # a free path shared by every architecture, as directly trained ones do; zero at init, so it decodes
    # as a LoGAH without it. False for checkpoints that lack it
    role_vectors: bool = False
    # per role map the mean encoder embedding of the nodes that held its parameters in training
    # (LoGAH.fit_role_prototypes), so that a parameter of a role the checkpoint never saw decodes
    # through the nearest trained role's map and factors (LoGAH.nearest_roles) rather than the
    # shared map, which no trained role reaches; train-ghn fits them when a run with role maps ends.
    # False for checkpoints that lack them
    role_prototypes: bool = False

    def __post_init__(self) -> None:
        if self.decoder not in DECODERS:
            raise VariantError(f"unknown decoder {self.decoder!r}; accepted: {', '.join(DECODERS)}")
        roles = tuple(self.roles)  # config.json gives a list; the config must stay hashable
        if not all(isinstance(role, str) and role for role in roles) or len(set(roles)) < len(roles):
            raise VariantError(
                f"roles must be distinct parameter names without block indices; got {self.roles!r}", "roles"
            )
        if self.role_key not in ROLE_KEYS:
            raise VariantError(f"unknown role key {self.role_key!r}; accepted: {', '.join(ROLE_KEYS)}", "role_key")
        if roles and self.decoder != "low_rank":
            raise VariantError(f"role maps need the low_rank decoder, not {self.decoder!r}", "roles")
        if self.level_head and self.decoder != "low_rank":
            raise VariantError(f"a level head needs the low_rank decoder, not {self.decoder!r}", "level_head")
        if self.role_factors and (self.decoder != "low_rank" or not roles):
            raise VariantError("role factors need the low_rank decoder and role maps", "role_factors")
        if self.role_vectors and (self.decoder != "low_rank" or not roles):
            raise VariantError("role vectors need the low_rank decoder and role maps", "role_vectors")
        if self.role_prototypes and (self.decoder != "low_rank" or not roles):
            raise VariantError("role prototypes need the low_rank decoder and role maps", "role_prototypes")
        gain = self.table_gain
        if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not math.isfinite(gain) or gain <= 0:
            raise VariantError(f"table gain must be a positive number; got {gain!r}", "table_gain")
        object.__setattr__(self, "table_gain", float(gain))
        object.__setattr__(self, "roles", roles)


#: the variants of the paper's Table 1 (d, layers, heads, r)
LOGAH_VARIANTS: dict[str, LoGAHConfig] = {
    "tiny": LoGAHConfig(hidden=64, layers=3, heads=8, rank=32),
    "small": LoGAHConfig(hidden=128, layers=5, heads=16, rank=90),
    "base": LoGAHConfig(hidden=256, layers=5, heads=16, rank=128),
    "large": LoGAHConfig(hidden=256, layers=12, heads=16, rank=256),
}
