"""Mini zoos: every zoo architecture shrunk to a size that trains on a CPU, with every op kind and
parameter kind of the model as published.

A zoo model is shrunk through its own constructor or config, never by editing the built module:

- timm: the keyword arguments its model class receives. The model is built once at full size on
  meta while timm's ``build_model_with_cfg`` is watched, which gives the class and every
  argument the entry point passes it (with the class's own defaults for the rest); the rules
  below rewrite those arguments by name and value (``depth``/``depths`` at most 2 blocks a
  stage, widths divided by a power of two until the widest is at most 192, heads with them,
  ``img_size`` 32, ``num_classes`` 10, patches and windows halved so that a 32-pixel image
  still gives every stage more than one token; a model whose last stage still sees one token
  at 32 pixels, such as CoAtNet, MaxViT or LeViT, gets last plans at 64 and 128). Config
  dataclasses (MaxxViT's ``model_cfg``) are rewritten field by field the same way. The
  rewritten arguments are what a record stores: rebuilding applies them to the same
  ``build_model_with_cfg`` call, so every model, including one published without a classifier
  (EVA-02, AIMv2), gets 10 classes.
- transformers: the reference config's fields (``num_hidden_layers`` 2 to 4, ``hidden_size``
  128, 4 heads of 32, ``num_key_value_heads`` kept MHA, GQA or MQA, MoE sizes, MLA ranks),
  with a byte vocabulary: 256 tokens, the ids of the text source (:mod:`graphkit.training.data.text`
  needs no special token), and special-token ids moved onto byte values the text never holds
  (0, 1, 2, ...). Per-layer lists (``layer_types``) keep one layer of each kind, and the
  periods that place layers of another kind (``attn_layer_period``, ``full_attention_interval``,
  ``sliding_window_pattern``) shrink with the depth.

The rules are data (:data:`VISION_RULES`, :data:`DECODER_RULES`) plus a small table of
timm modules that need their own (:data:`TIMM_MODULE_RULES`). Each model gets a short ladder of plans,
from the smallest to the least shrunk; the first whose model builds, traces on meta, keeps
every op kind and parameter kind of the full model (:func:`kinds`) and passes the
trainability check (:func:`trainability`) is the model's mini variant. A model for which no
plan passes is reported with the last plan's reason.

The split holds out whole zoo families (timm's model module, transformers' ``model_type``;
"family" alone is a graphkit model family, :mod:`graphkit.families`):
:func:`held_out_zoo_families` picks up to :data:`HELD_OUT_SHARE` of them, deterministically from
a seed, among the zoo families whose op kinds the others all have.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from graphkit.errors import ShrinkError
from graphkit.families.libraries import (
    CONTEXT_FIELDS,
    EXPERT_MLP_FIELDS,
    HEAD_FIELDS,
    IMAGE_SIZE,
    KV_HEAD_FIELDS,
    MLP_FIELDS,
    NUM_CLASSES,
    WIDTH_FIELDS,
    watched_timm,
)
from graphkit.graph import ArchGraph
from graphkit.tracing.inputs import logits_of
from graphkit.validation import is_count

#: the sides of the last plans' images, for models whose deepest stage pools 32 pixels to one token
#: (IMAGE_SIZE, the side of the images a vision mini model takes, and NUM_CLASSES are its builder's)
LARGE_IMAGE_SIZES = (64, 128)
#: the widest a vision mini model's stages may be
VISION_MAX_WIDTH = 192
#: byte ids 0..255: the text source's tokens (graphkit.training.data.text), no special token needed
BYTE_VOCAB = 256
#: the decoders' width and head size (so 4 heads), and the positions they keep
DECODER_WIDTH = 128
DECODER_HEAD_DIM = 32
DECODER_CONTEXT = 256
#: this share of the zoo families is held out whole, or less where too few leave their ops to others
HELD_OUT_SHARE = 0.15
#: the batch of the trainability check: the smallest that batch norm trains on
CHECK_BATCH = 2
CHECK_TOKENS = 8


# ---------------------------------------------------------------------------------------------
# kinds: what a shrunk model must keep


def kinds(graph: ArchGraph) -> tuple[set[str], set[tuple[str, str]]]:
    """The op kinds of ``graph`` and its parameter kinds: (op, the parameter's own name, as
    ``weight``, ``bias``, ``gamma`` or ``rel_pos_h``), which say what a hypernetwork must
    predict whatever the depth or width."""
    ops = set(graph.op_counts())
    params = {(node.op, name.rsplit(".", 1)[-1]) for node in graph.nodes for name in node.params}
    return ops, params


def missing_kinds(full: ArchGraph, small: ArchGraph) -> str | None:
    """None when ``small`` keeps every op kind and parameter kind of ``full``; else what it lost."""
    (full_ops, full_params), (ops, params) = kinds(full), kinds(small)
    lost_ops = sorted(full_ops - ops)
    lost_params = sorted(f"{op}.{name}" for op, name in full_params - params)
    if not (lost_ops or lost_params):
        return None
    return "loses " + "; ".join(
        part
        for part in (
            f"op kinds {', '.join(lost_ops)}" if lost_ops else "",
            f"parameter kinds {', '.join(lost_params)}" if lost_params else "",
        )
        if part
    )


# ---------------------------------------------------------------------------------------------
# rules: a value rewritten by its name


@dataclasses.dataclass(frozen=True)
class Plan:
    """One way to shrink: blocks per stage (vision) or layers (decoders), how many times the
    widths are halved (vision) or the decoder's width, whether patches and windows shrink, and
    the side of the images (vision)."""

    depth: int
    halvings: int = 0
    width: int = DECODER_WIDTH
    small_patches: bool = True
    image_size: int = IMAGE_SIZE

    def describe(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))


def _ints(value: Any, rule: Callable[[int], int]) -> Any:
    """``rule`` applied to every integer of a value, nested tuples and lists included (None,
    floats and strings stay)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return rule(value)
    if isinstance(value, (tuple, list)):
        return [_ints(v, rule) for v in value]
    return value


def _depth(plan: Plan, value: Any, _: Mapping[str, Any]) -> Any:
    return _ints(value, lambda n: min(n, plan.depth))


def _width(plan: Plan, value: Any, _: Mapping[str, Any]) -> Any:
    """A width divided by 2**halvings, kept a multiple of 8 where it was one."""
    scale = 2**plan.halvings

    def shrink(n: int) -> int:
        if n % (8 * scale) == 0 or n < 8 * scale:
            return max(1, n // scale)
        return max(8, round(n / scale / 8) * 8)

    return _ints(value, shrink)


def _heads(plan: Plan, value: Any, _: Mapping[str, Any]) -> Any:
    return _ints(value, lambda n: max(1, n // 2**plan.halvings))


def _halved(plan: Plan, value: Any, _: Mapping[str, Any]) -> Any:
    """A patch at most half as big, a power of two so that it divides the 32-pixel image."""
    return _ints(value, lambda n: 2 ** int(math.log2(max(1, n // 2)))) if plan.small_patches else value


def _window(plan: Plan, value: Any, _: Mapping[str, Any]) -> Any:
    return _ints(value, lambda n: min(n, 4)) if plan.small_patches else value


def _pooling(plan: Plan, value: Any, _: Mapping[str, Any]) -> Any:
    """A token-pooling kernel of 2, so that patch x kernel divides the 32-pixel image."""
    return _ints(value, lambda n: min(n, 2)) if plan.small_patches else value


def _last_block(plan: Plan, value: Any, fields: Mapping[str, Any]) -> Any:
    """Indices of the blocks of another kind (SAM's global attention): the last block."""
    return [plan.depth - 1] if isinstance(value, (tuple, list)) and value else value


def _below_depth(plan: Plan, value: Any, _: Mapping[str, Any]) -> Any:
    """A count of leading blocks of one kind (ConViT's ``local_up_to_layer``): fewer than the
    blocks, so the other kind stays."""
    return _ints(value, lambda n: max(1, min(n, plan.depth - 1)))


Rule = Callable[[Plan, Any, Mapping[str, Any]], Any]

#: timm constructor arguments by name, and how each shrinks
VISION_RULES: dict[str, Rule] = {
    **dict.fromkeys(
        ("depth", "depths", "layers", "stages", "serial_depths", "depth_list", "num_vit", "cls_attn_layers", "d"),
        _depth,
    ),
    **dict.fromkeys(
        (
            "embed_dim",
            "embed_dims",
            "dims",
            "dim",
            "widths",
            "width_list",
            "base_dims",
            "stem_width",
            "stem_chs",
            "init_channels",
            "head_widths",
            "head_hidden_size",
            "intermediate_size",
            "inner_dim",
            "neck_chans",
            "partial_dim",
            "c",
        ),
        _width,
    ),
    **dict.fromkeys(("num_heads", "heads", "num_heads_outer", "num_heads_inner", "num_kv_heads"), _heads),
    **dict.fromkeys(("patch_size", "patch_stride"), _halved),
    **dict.fromkeys(("window_size", "window_sizes", "window_spec"), _window),
    "pooling_kernel_size": _pooling,
    **dict.fromkeys(("global_attn_indexes", "global_att_blocks"), _last_block),
    "local_up_to_layer": _below_depth,
}
#: the arguments whose widest value sets the halvings
WIDTH_KEYS = tuple(k for k, rule in VISION_RULES.items() if rule is _width and k not in ("head_widths", "c"))

#: the per-stage depth lists: a single width beside one of them is the first stage's, doubled each stage
STAGE_KEYS = ("depths", "stages")

#: timm modules whose models' own arguments mean something the generic names do not say
TIMM_MODULE_RULES: dict[str, dict[str, Rule]] = {
    # ConViT's embed_dim is per head (the model is embed_dim x num_heads wide): only heads shrink
    "convit": {"embed_dim": lambda plan, value, fields: value},
    # iFormer's attention comes in groups of three blocks at the end of a stage: one group each
    "iformer": {
        "attn_groups": lambda plan, value, fields: _ints(value, lambda n: min(n, 1)),
        "depths": lambda plan, value, fields: _ints(value, lambda n: min(n, max(plan.depth, 3))),
    },
}
#: how wide a timm module's model is, where its arguments do not say it by the generic names
TIMM_MODULE_WIDEST: dict[str, Callable[[Mapping[str, Any]], int]] = {
    "convit": lambda arguments: arguments["embed_dim"] * arguments["num_heads"],
}


# ---------------------------------------------------------------------------------------------
# timm


def _fields(value: Any) -> dict[str, Any] | None:
    """The fields of a config dataclass or a dict, else None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return dict(value) if isinstance(value, Mapping) else None


def _each_fields(value: Any) -> list[dict[str, Any]] | None:
    """The fields of each element of a non-empty tuple or list of config dataclasses or dicts
    (a model's per-stage configs), else None."""
    if not isinstance(value, (tuple, list)) or not value:
        return None
    each = [_fields(v) for v in value]
    return [f for f in each if f is not None] if all(f is not None for f in each) else None


def _widest(fields: Mapping[str, Any], rules: Mapping[str, Rule]) -> int:
    """The largest width among ``fields`` (nested configs included)."""
    widest = 0
    for key, value in fields.items():
        nested = _fields(value)
        if nested is not None:
            widest = max(widest, _widest(nested, rules))
        elif (parts := _each_fields(value)) is not None:
            widest = max(widest, *(_widest(part, rules) for part in parts))
        elif rules.get(key) is _width and key in (*WIDTH_KEYS, "c"):
            widths = _flat_ints(value)
            stages = next((len(fields[k]) for k in STAGE_KEYS if isinstance(fields.get(k), (tuple, list))), 1)
            if key == "embed_dim" and isinstance(value, int) and not isinstance(value, bool) and stages > 1:
                widths = [value * 2 ** (stages - 1)]  # one width for many stages: it doubles each (Swin)
            widest = max(widest, max(widths, default=0))
    return widest


def _flat_ints(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (tuple, list)):
        return [n for v in value for n in _flat_ints(v)]
    return []


def _rewrite(fields: Mapping[str, Any], plan: Plan, rules: Mapping[str, Rule]) -> dict[str, Any]:
    """The overrides ``plan`` makes of ``fields``: each value whose name has a rule, rewritten,
    nested configs (a dataclass, or a tuple of them) rewritten field by field; JSON only."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        nested = _fields(value)
        if nested is not None:
            inner = _rewrite(nested, plan, rules)
            if inner:
                out[key] = inner
        elif (parts := _each_fields(value)) is not None:
            items = [_rewrite(part, plan, rules) for part in parts]
            if any(items):
                out[key] = items
        elif key in rules:
            new = rules[key](plan, value, fields)
            if _jsonable(new) and new != _plain(value):
                out[key] = new
    return out


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, (tuple, list)) else value


def _jsonable(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_jsonable(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def timm_arguments(name: str) -> tuple[nn.Module, dict[str, Any]]:
    """The full model ``name``, built on meta, and every argument its class got: the entry
    point's, over the class's own defaults."""
    import timm  # noqa: PLC0415

    with warnings.catch_warnings(), torch.device("meta"), watched_timm(name) as seen:
        warnings.simplefilter("ignore")
        model = timm.create_model(name, pretrained=False).eval()
    if not seen:
        raise ShrinkError(f"timm builds {name!r} without build_model_with_cfg: no constructor arguments to shrink")
    model_cls, kwargs = next(((c, k) for c, k in reversed(seen) if c is type(model)), seen[-1])
    defaults = {
        key: p.default
        for key, p in inspect.signature(model_cls).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    return model, {**defaults, **kwargs}


def vision_plans(module: str, arguments: Mapping[str, Any]) -> list[tuple[Plan, dict[str, Any]]]:
    """The ladder of (plan, overrides) for a model of the timm module ``module`` built with
    ``arguments``, smallest first; the same overrides twice are tried once."""
    rules = {**VISION_RULES, **TIMM_MODULE_RULES.get(module, {})}
    widest = TIMM_MODULE_WIDEST[module](arguments) if module in TIMM_MODULE_WIDEST else _widest(arguments, rules)
    halvings = max(0, math.ceil(math.log2(widest / VISION_MAX_WIDTH))) if widest > VISION_MAX_WIDTH else 0
    fewer = range(halvings, max(-1, halvings - 3), -1)  # widths a model's own ratios accept (heads of 32)
    ladder = [Plan(2, h, small_patches=small) for h in fewer for small in (True, False)]
    ladder += [Plan(4, halvings), Plan(2, 0)]
    ladder += [Plan(2, h, image_size=side) for side in LARGE_IMAGE_SIZES for h in fewer]
    plans, seen = [], []
    for plan in ladder:
        overrides = _rewrite(arguments, plan, rules)
        if plan.image_size != IMAGE_SIZE:
            overrides["img_size"] = plan.image_size
        if overrides not in seen:
            seen.append(overrides)
            plans.append((plan, overrides))
    return plans


# ---------------------------------------------------------------------------------------------
# transformers


def _decoder_width(plan: Plan, value: Any, _: Mapping[str, Any]) -> Any:
    return plan.width if isinstance(value, int) and not isinstance(value, bool) else value


def _decoder_heads(plan: Plan, value: Any, _: Mapping[str, Any]) -> Any:
    return min(value, plan.width // DECODER_HEAD_DIM) if isinstance(value, int) and value else value


def _kv_heads(plan: Plan, value: Any, fields: Mapping[str, Any]) -> Any:
    """MHA stays MHA, MQA stays MQA, GQA gets two groups."""
    heads = next((fields[k] for k in ("num_attention_heads", "n_head", "num_heads") if fields.get(k)), None)
    if not isinstance(value, int) or not value or not heads:
        return value
    new_heads = min(heads, plan.width // DECODER_HEAD_DIM)
    if value == heads:
        return new_heads
    return 1 if value == 1 else min(value, max(1, new_heads // 2))


def _head_dim(plan: Plan, value: Any, fields: Mapping[str, Any]) -> Any:
    """A head of 32, or MLA's rotary part where the head size is it (DeepSeek-V3's head_dim)."""
    if not isinstance(value, int) or not value:
        return value
    return min(value, 16) if value == fields.get("qk_rope_head_dim") else min(value, DECODER_HEAD_DIM)


def _ffn(plan: Plan, value: Any, _: Mapping[str, Any]) -> Any:
    return 2 * plan.width if isinstance(value, int) and value else value


def _expert_ffn(plan: Plan, value: Any, _: Mapping[str, Any]) -> Any:
    return plan.width // 2 if isinstance(value, int) and value else value


def _cap(limit: int) -> Rule:
    def rule(plan: Plan, value: Any, _: Mapping[str, Any]) -> Any:
        return min(value, limit) if isinstance(value, int) and not isinstance(value, bool) and value else value

    return rule


def _mla_head(plan: Plan, value: Any, fields: Mapping[str, Any]) -> Any:
    """MLA's query-key head: its no-rotary part and its rotary part, each shrunk."""
    nope, rope = fields.get("qk_nope_head_dim"), fields.get("qk_rope_head_dim")
    if not isinstance(nope, int) or not isinstance(rope, int):
        return value
    return min(nope, 16) + min(rope, 16)


def _period(plan: Plan, value: Any, _: Mapping[str, Any]) -> Any:
    """Every n-th layer is of another kind: n at most the depth, so one of them stays."""
    return min(value, plan.depth) if isinstance(value, int) and not isinstance(value, bool) and value > 1 else value


def _offset(plan: Plan, value: Any, _: Mapping[str, Any]) -> Any:
    return min(value, plan.depth - 1) if isinstance(value, int) and not isinstance(value, bool) else value


#: the config fields that count the layers
DEPTH_FIELDS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
#: transformers config fields by name, and how each shrinks (layer lists: :func:`_per_layer`)
DECODER_RULES: dict[str, Rule] = {
    **dict.fromkeys(DEPTH_FIELDS, _depth),
    **dict.fromkeys(WIDTH_FIELDS, _decoder_width),
    **dict.fromkeys(HEAD_FIELDS, _decoder_heads),
    **dict.fromkeys(KV_HEAD_FIELDS, _kv_heads),
    **dict.fromkeys(("head_dim", "v_head_dim", "kv_channels", "swa_head_dim"), _head_dim),
    **dict.fromkeys(MLP_FIELDS, _ffn),
    **dict.fromkeys(EXPERT_MLP_FIELDS, _expert_ffn),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), _cap(4)),
    **dict.fromkeys(
        ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "top_k", "n_group", "num_expert_group"),
        _cap(2),
    ),
    **dict.fromkeys(
        ("n_shared_experts", "topk_group", "first_k_dense_replace", "num_shared_experts", "moe_num_shared_experts"),
        _cap(1),
    ),
    **dict.fromkeys(("q_lora_rank", "kv_lora_rank"), _cap(32)),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim", "rotary_dim"), _cap(16)),
    "qk_head_dim": _mla_head,
    **dict.fromkeys(("linear_head_dim",), _head_dim),
    **dict.fromkeys(("linear_num_heads",), _decoder_heads),
    **dict.fromkeys(CONTEXT_FIELDS, _cap(DECODER_CONTEXT)),
    **dict.fromkeys(("sliding_window", "attention_window"), _cap(16)),
    **dict.fromkeys(
        (
            "attn_layer_period",
            "expert_layer_period",
            "full_attention_interval",
            "sliding_window_pattern",
            "interleave_moe_layer_step",
            "decoder_sparse_step",
            "no_rope_layer_interval",
            "moe_layer_freq",
            "moe_layer_interval",
        ),
        _period,
    ),
    **dict.fromkeys(("attn_layer_offset", "expert_layer_offset", "moe_layer_end_index"), _offset),
}


def _ssm_heads(plan: Plan, value: Any, fields: Mapping[str, Any]) -> Any:
    """Mamba-2's heads fill the expanded width: expand x width / head_dim."""
    head_dim = _head_dim(plan, fields.get("head_dim"), fields)
    if not isinstance(value, int) or not isinstance(head_dim, int) or not isinstance(fields.get("expand"), int):
        return value
    return max(1, fields["expand"] * plan.width // head_dim)


#: model types whose fields mean something the generic names do not say
DECODER_MODEL_TYPE_RULES: dict[str, dict[str, Rule]] = {
    "mamba2": {"num_heads": _ssm_heads},  # the SSM's heads, not attention's
}


def _special_ids(reference: Mapping[str, Any]) -> dict[str, Any]:
    """The special-token fields moved onto the byte vocabulary: ids of 256 and above become the
    lowest byte values no other special token holds (control bytes UTF-8 text does not use)."""
    fields = {k: v for k, v in reference.items() if k.endswith("_token_id") and v is not None}
    ids = sorted({i for v in fields.values() for i in _flat_ints(v)})
    free = iter(i for i in range(BYTE_VOCAB) if i not in ids)
    moved = {i: next(free) for i in ids if i >= BYTE_VOCAB}
    return {k: _ints(v, lambda i: moved.get(i, i)) for k, v in fields.items() if moved and _flat_ints(v)}


def _per_layer(reference: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    """The per-layer lists (a list as long as the depth: ``layer_types``) cut to the first layer
    of each kind they hold, then the first others up to ``plan.depth`` layers; the depth field
    follows."""
    depth = next((reference[k] for k in DEPTH_FIELDS if isinstance(reference.get(k), int)), None)
    if not depth or depth < 2:
        return {}
    lists = {k: v for k, v in reference.items() if isinstance(v, list) and len(v) == depth}
    if not lists:
        return {}
    firsts: set[int] = set()
    for values in lists.values():
        seen: dict[str, int] = {}
        for i, v in enumerate(values):
            seen.setdefault(repr(v), i)
        firsts |= set(seen.values())
    others = [i for i in range(depth) if i not in firsts]
    chosen = sorted(firsts | set(others[: max(0, plan.depth - len(firsts))]))
    out: dict[str, Any] = {k: [v[i] for i in chosen] for k, v in lists.items()}
    out.update({k: len(chosen) for k in DEPTH_FIELDS if isinstance(reference.get(k), int)})
    return out


def decoder_plans(reference: Mapping[str, Any], model_type: str = "") -> list[tuple[Plan, dict[str, Any]]]:
    """The ladder of (plan, config overrides) for a transformers reference config (as a dict) of
    the model type ``model_type``, smallest first."""
    rules = {**DECODER_RULES, **DECODER_MODEL_TYPE_RULES.get(model_type, {})}
    ladder = [Plan(2), Plan(3), Plan(4), Plan(2, width=2 * DECODER_WIDTH), Plan(4, width=2 * DECODER_WIDTH)]
    plans, seen = [], []
    for plan in ladder:
        overrides = {k: new for k, v in reference.items() if k in rules and (new := rules[k](plan, v, reference)) != v}
        overrides.update(_per_layer(reference, plan))
        # the vocabulary, and any other count of it (the unpadded one a head slices its logits to)
        overrides.update({k: BYTE_VOCAB for k, v in reference.items() if k.endswith("vocab_size") and is_count(v)})
        overrides.update(_special_ids(reference))
        if overrides not in seen:
            seen.append(overrides)
            plans.append((plan, overrides))
    return plans


# ---------------------------------------------------------------------------------------------
# trainability


def trainability(model: nn.Module, task: str) -> str | None:
    """None when ``model`` (on the CPU, in training mode) runs forward and backward on a tiny
    batch with a finite loss and the output a data source scores: (B, 10) logits for images,
    (B, T, vocab) for text; else why not, in one line."""
    generator = torch.Generator().manual_seed(0)
    model.train()
    try:
        if task == "image":
            channels, *side = getattr(model, "pretrained_cfg", {}).get("input_size", (3, IMAGE_SIZE, IMAGE_SIZE))
            inputs = torch.randn(CHECK_BATCH, channels, *side, generator=generator)
            targets = torch.randint(NUM_CLASSES, (CHECK_BATCH,), generator=generator)
            output = model(inputs)
            expected: tuple[int, ...] = (CHECK_BATCH, NUM_CLASSES)
        else:
            vocab = cast(Any, model).config.vocab_size  # a transformers model: its config
            tokens = torch.randint(BYTE_VOCAB, (CHECK_BATCH, CHECK_TOKENS + 1), generator=generator)
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            output = model(input_ids=inputs, use_cache=False)
            expected = (CHECK_BATCH, CHECK_TOKENS, vocab)
        logits = logits_of(output)
        if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != expected:
            shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            return f"returns {shape}, not the {expected} a {task} model's loss needs"
        loss = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())
        if not torch.isfinite(loss):
            return f"the loss is {loss.item()} on a batch of {CHECK_BATCH}"
        loss.backward()
    except Exception as e:  # a library's own failure to train its model is a report line
        return f"forward and backward fail: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
    grads = ((n, p.grad) for n, p in model.named_parameters() if p.grad is not None)
    bad = next((n for n, grad in grads if not torch.isfinite(grad).all()), None)
    return f"the gradient of {bad} is not finite" if bad else None


# ---------------------------------------------------------------------------------------------
# the split


def held_out_zoo_families(
    zoo_families: Sequence[str],
    seed: int = 0,
    architectures: Iterable[tuple[Iterable[str], Iterable[str]]] | None = None,
) -> list[str]:
    """The zoo families (timm modules, transformers model types) a mini zoo holds out whole: up
    to ceil(HELD_OUT_SHARE x their number), taken in the order of sha256(seed:zoo family), so the
    same zoo families and seed give the same split. At least one is left to train on: a single
    zoo family is not split.

    With ``architectures`` (each: the zoo families that share it, its op kinds), a zoo family is
    passed over when holding it out would leave an op kind of a held-out one to no architecture
    left in training (an architecture that a held-out zoo family shares is held out with it), and
    fewer are held out when too few others remain. Why: a hypernetwork refuses an op it never
    trained on, so such a zoo family could not be evaluated as held out, and its op (MaxViT's tanh, VOLO's
    fold, Apertus's xielu) would be refused on every model that has it, the full-size ones
    users bring included."""
    distinct = sorted(set(zoo_families))
    count = min(math.ceil(HELD_OUT_SHARE * len(distinct)), len(distinct) - 1) if distinct else 0
    ranked = sorted(distinct, key=lambda f: hashlib.sha256(f"{seed}:{f}".encode()).hexdigest())
    if architectures is None:
        return sorted(ranked[:count])
    shared = [(frozenset(owners), frozenset(ops)) for owners, ops in architectures]
    kinds = {f: frozenset().union(*(ops for owners, ops in shared if f in owners)) for f in distinct}
    held: list[str] = []
    for candidate in ranked:
        if len(held) == count:
            break
        out = {*held, candidate}
        trained = frozenset().union(*(ops for owners, ops in shared if not owners & out))
        if all(kinds[f] <= trained for f in out):
            held.append(candidate)
    return sorted(held)


# ---------------------------------------------------------------------------------------------
# one model


def reference_config(model_type: str) -> dict[str, Any]:
    """transformers' reference config of ``model_type`` as a dict (its class's defaults)."""
    from transformers import AutoConfig  # noqa: PLC0415
    from transformers.utils import logging as hf_logging  # noqa: PLC0415

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoConfig.for_model(model_type).to_dict()
    finally:
        hf_logging.set_verbosity(verbosity)


def data_keys(overrides: Mapping[str, Any], reference: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a data source shapes its batches by (graphkit.training.data): the image side, channels
    and classes of a timm model, or, for a decoder of the ``reference`` config, the vocabulary
    and context."""
    if reference is None:
        return {
            "image_size": int(overrides.get("img_size", IMAGE_SIZE)),
            "in_chans": int(overrides.get("in_chans", 3)),
            "num_classes": NUM_CLASSES,
        }
    context = next(
        (v for k in CONTEXT_FIELDS if isinstance(v := overrides.get(k, reference.get(k)), int)),
        DECODER_CONTEXT,
    )
    return {"vocab_size": BYTE_VOCAB, "context": context}


__all__ = [
    "IMAGE_SIZE",
    "LARGE_IMAGE_SIZES",
    "NUM_CLASSES",
    "BYTE_VOCAB",
    "HELD_OUT_SHARE",
    "Plan",
    "ShrinkError",
    "VISION_RULES",
    "DECODER_RULES",
    "TIMM_MODULE_RULES",
    "DECODER_MODEL_TYPE_RULES",
    "kinds",
    "missing_kinds",
    "reference_config",
    "data_keys",
    "timm_arguments",
    "vision_plans",
    "decoder_plans",
    "trainability",
    "held_out_zoo_families",
]
