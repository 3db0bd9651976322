"""The attention core of GQA and its key-driven variants, as one module.

``GroupedQueryAttention(heads, kv_heads, variant)`` maps queries (batch, heads, L, d) and keys
and values (batch, kv_heads, S, d) to (batch, heads, L, d):

- ``gqa``: uniform groups, one SDPA call with ``enable_gqa=True`` (K/V are not repeated).
- ``kdgqa``: query heads allocated to groups in proportion to the current keys' norms
  (:mod:`graphkit.attention.allocation`), every forward, in training and inference.
- ``dgqa``: the allocation is recomputed every ``window`` training forwards from the evolution
  of the key norms, ``evolution="ema"`` (eq. 7, ``alpha``) or ``"difference"`` (eqs. 4-6). The
  allocation, the cached norms and the step counter are buffers: saved in the state dict, and
  frozen in eval mode, so a checkpoint reproduces its predictions exactly.
- ``pgqa``: uniform groups; in training (or with ``perturb_in_eval``) a Gaussian matrix matched
  to each group's output mean and standard deviation, with its diagonal zeroed, is subtracted
  from the output (eq. 9).

Each variant is an :class:`AttentionVariant` in :data:`ATTENTION_VARIANTS`, what
:func:`register_variant` adds to: the options it reads, the state it keeps, how it routes query
heads to K/V heads in a forward pass and what it does to the output. GQA is the variant with none
of them; the other three are registered below the module, and a new one is one more
registration (docs/extending.md).

Non-uniform groups gather K/V once by a head index built with ``repeat_interleave`` and make one
SDPA call: no Python loop over heads or groups.

Uniform groups (gqa, pgqa) reach SDPA by one of two paths, and which is faster depends on the
device and the kernel SDPA picks: ``enable_gqa`` (K/V shared by index inside the kernel) or
``repeat`` (K/V materialised per query head). On CPU ``enable_gqa`` measured 1.10x faster; on an
H200 (torch 2.11) ``repeat`` was 0.83x of ``enable_gqa``. So ``path="auto"`` (the default)
measures both once per device, dtype and shape on a GPU (:func:`fastest_gqa_path`, cached for
the process) and keeps ``enable_gqa`` on CPU and while tracing or compiling; ``path`` forces one.

Choices the paper leaves open: DGQA's ``window`` counts training forward passes of the module
(it cannot see optimizer steps; with gradient accumulation over m micro-batches use window * m);
the EMA cache starts at the first window's norms rather than at zero. PGQA's statistics are
taken over each group's whole output (batch, heads, positions, channels); the "diagonal" of a
head's L x d output is its entries (i, i); the noise is detached, so it perturbs the output
without adding a gradient path.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from graphkit.attention.allocation import allocate_queries, key_norms, query_groups


@dataclass(frozen=True)
class AttentionVariant:
    """How one variant of grouped-query attention departs from GQA, as
    :class:`GroupedQueryAttention` runs it; every hook is optional.

    ``options``: the keyword options of ``GroupedQueryAttention`` it reads (``convert`` refuses
    another variant's). ``setup(core)``: makes the state it keeps (DGQA's buffers), once, when
    the module is built. ``route(core, q, k)``: the K/V head each query head reads in this
    forward pass, a (heads,) index (None: contiguous groups of ``heads // kv_heads``).
    ``adjust(core, out)``: the attention's output changed (PGQA's perturbation). ``metadata(core)``:
    what a converted model's safetensors file records of it beyond the variant and the K/V heads."""

    name: str
    options: tuple[str, ...] = ()
    setup: Callable[[GroupedQueryAttention], None] | None = None
    route: Callable[[GroupedQueryAttention, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    adjust: Callable[[GroupedQueryAttention, torch.Tensor], torch.Tensor] | None = None
    metadata: Callable[[GroupedQueryAttention], dict[str, str]] | None = None


#: every variant by name (gqa, kdgqa, dgqa, pgqa and those registered since)
ATTENTION_VARIANTS: dict[str, AttentionVariant] = {}


def register_variant(variant: AttentionVariant) -> AttentionVariant:
    """Make ``variant`` an attention ``convert``, ``compile``, recipes and datasets accept by its
    name (replacing one of that name); returns it."""
    if not variant.name or variant.name in ("mha", "mla"):
        raise ValueError(f"attention variant name {variant.name!r}: mha and mla name other attentions")
    ATTENTION_VARIANTS[variant.name] = variant
    return variant


#: how uniform groups reach SDPA; "auto" measures them on a GPU (see the module docstring)
GQA_PATHS = ("auto", "enable_gqa", "repeat")
_FASTEST: dict[tuple, str] = {}
#: PGQA's off-diagonal masks by (length, d, dtype, device); see _off_diagonal
_MASKS: dict[tuple, torch.Tensor] = {}
#: KDGQA's compiled allocation ("index"), or "failed" once compiling did not work; see kdgqa_index
_COMPILED: dict[str, Any] = {}


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, path: str, **kwargs) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    if groups > 1 and path == "repeat":
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=k.shape[1] != q.shape[1], **kwargs)


def _measurable(q: torch.Tensor) -> bool:
    """Real GPU tensors outside tracing, compiling and CUDA-graph capture: timing them is real."""
    compiler = getattr(torch, "compiler", None)
    for flag in ("is_compiling", "is_exporting"):
        check = getattr(compiler, flag, None)
        if check is not None and check():
            return False
    return (
        q.device.type == "cuda"
        and not q.is_meta
        and type(q) is torch.Tensor
        and not torch.cuda.is_current_stream_capturing()
    )


def fastest_gqa_path(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    repeats: int = 5,
) -> str:
    """The faster of ``enable_gqa`` and ``repeat`` for these tensors' device, dtype and shapes
    (and mask), measured once with gradients off (median of ``repeats`` calls after a warm-up)
    and cached for the process."""
    mask = None if attn_mask is None else (attn_mask.dtype, tuple(attn_mask.shape))
    key = (str(q.device), q.dtype, tuple(q.shape), tuple(k.shape), is_causal, mask)
    if key not in _FASTEST:
        sync = torch.cuda.synchronize if q.is_cuda else (lambda: None)
        sdpa: dict[str, Any] = {"attn_mask": attn_mask, "is_causal": is_causal, "scale": scale}
        times = {}
        with torch.no_grad():
            for path in ("enable_gqa", "repeat"):
                _sdpa(q, k, v, path, **sdpa)
                samples = []
                for _ in range(repeats):
                    sync()
                    start = time.perf_counter()
                    _sdpa(q, k, v, path, **sdpa)
                    sync()
                    samples.append(time.perf_counter() - start)
                times[path] = statistics.median(samples)
        _FASTEST[key] = min(times, key=times.__getitem__)
    return _FASTEST[key]


def _allocation_index(norms: torch.Tensor, heads: int, allow_empty: bool) -> torch.Tensor:
    return query_groups(allocate_queries(norms, heads, allow_empty=allow_empty), heads)


def kdgqa_index(norms: torch.Tensor, heads: int, allow_empty: bool = False, *, fused: bool = False) -> torch.Tensor:
    """KDGQA's K/V head for each query head, from the key norms of this forward pass
    (:func:`~graphkit.attention.allocation.allocate_queries`, then
    :func:`~graphkit.attention.allocation.query_groups`).

    With ``fused`` (the forward passes it for real GPU tensors outside tracing) the allocation's
    twenty-odd operations on a handful of numbers run as one ``torch.compile``d graph, compiled
    once per (groups, heads): on a GPU each would be a kernel launch, and their launches, not
    their arithmetic, made KDGQA 1.5x GQA's time on an H100. Where compiling fails (no compiler
    for this device or torch), it warns once and runs eagerly, as on the CPU."""
    if fused and not _COMPILED.get("failed"):
        try:
            if "index" not in _COMPILED:
                _COMPILED["index"] = torch.compile(_allocation_index, fullgraph=True, dynamic=False)
            return _COMPILED["index"](norms, heads, allow_empty)
        except Exception as e:  # noqa: BLE001 - any compiler failure degrades to the eager path
            _COMPILED["failed"] = True
            warnings.warn(
                f"KDGQA: compiling the head allocation failed ({type(e).__name__}: {e}); it runs eagerly",
                RuntimeWarning,
                stacklevel=2,
            )
    return _allocation_index(norms, heads, allow_empty)


class GroupedQueryAttention(nn.Module):
    """Scaled dot-product attention with ``heads`` query heads over ``kv_heads`` K/V heads."""

    counts: torch.Tensor  # DGQA's buffers: queries per K/V head, the cached key norms, the step
    cached_norms: torch.Tensor
    step: torch.Tensor

    def __init__(
        self,
        heads: int,
        kv_heads: int,
        variant: str = "gqa",
        *,
        window: int = 300,
        evolution: str = "ema",
        alpha: float = 0.5,
        allow_empty: bool = False,
        perturb_in_eval: bool = False,
        path: str = "auto",
        **options: Any,
    ) -> None:
        super().__init__()
        if variant not in ATTENTION_VARIANTS:
            raise ValueError(f"unknown attention variant {variant!r}; accepted: {', '.join(ATTENTION_VARIANTS)}")
        spec = ATTENTION_VARIANTS[variant]
        foreign = next((name for name in options if name not in spec.options), None)
        if foreign is not None:
            raise ValueError(f"attention variant {variant} takes no option {foreign!r}; its options: {spec.options}")
        if kv_heads < 1 or heads % kv_heads:
            raise ValueError(f"kv_heads must divide heads ({heads}), got {kv_heads}")
        if evolution not in ("ema", "difference"):
            raise ValueError(f"evolution must be 'ema' or 'difference', got {evolution!r}")
        if path not in GQA_PATHS:
            raise ValueError(f"path must be one of {', '.join(GQA_PATHS)}, got {path!r}")
        self.path = path
        self.heads, self.kv_heads, self.variant = heads, kv_heads, variant
        self.update_every, self.evolution, self.alpha = window, evolution, alpha
        self.allow_empty, self.perturb_in_eval = allow_empty, perturb_in_eval
        self.options = options  # a registered variant's own options (the built-in ones are above)
        #: which K/V heads of the original model each K/V head pools (set by ``convert``; None: neighbours)
        self.groups: list[list[int]] | None = None
        if spec.setup is not None:
            spec.setup(self)

    @property
    def attention_variant(self) -> str:
        """What the tracer records in the attention node's ``variant`` attribute."""
        return self.variant

    def extra_repr(self) -> str:
        return f"heads={self.heads}, kv_heads={self.kv_heads}, variant={self.variant}"

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        is_causal: bool = False,
        attn_mask: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        spec = ATTENTION_VARIANTS[self.variant]
        if spec.route is not None:
            index = spec.route(self, q, k)
            k, v = k[:, index], v[:, index]  # one gather each (advanced indexing beats index_select on CPU)
        sdpa: dict[str, Any] = {"attn_mask": attn_mask, "is_causal": is_causal, "scale": scale}
        path = self.path
        if path == "auto":
            path = fastest_gqa_path(q, k, v, **sdpa) if k.shape[1] != q.shape[1] and _measurable(q) else "enable_gqa"
        out = _sdpa(q, k, v, path, **sdpa)
        return out if spec.adjust is None else spec.adjust(self, out)

    def _dgqa_counts(self, k: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return self.counts
        norms = key_norms(k)
        first = self.step.eq(0)
        if self.evolution == "ema":
            cache = torch.where(first, norms, self.alpha * norms + (1 - self.alpha) * self.cached_norms)
            importance = cache
        else:
            cache, importance = norms, (norms - self.cached_norms).abs()
        update = self.step % self.update_every == 0
        with torch.no_grad():
            self.counts.copy_(
                torch.where(update, allocate_queries(importance, self.heads, allow_empty=self.allow_empty), self.counts)
            )
            self.cached_norms.copy_(torch.where(update, cache, self.cached_norms))
            self.step.add_(1)
        return self.counts

    def _perturbed(self, out: torch.Tensor) -> torch.Tensor:
        """``out`` minus its perturbation (eq. 9): per group, Gaussian noise standardised to the
        group output's mean and standard deviation, zero on each head's diagonal. The diagonal
        mask is made once per shape and the subtraction is one fused multiply-add, so the
        perturbation takes five passes over the output's size (two statistics, the draw, the
        standardisation, the subtraction) and no more."""
        b, h, length, d = out.shape
        grouped = out.reshape(b, self.kv_heads, h // self.kv_heads, length, d)
        dims = (0, 2, 3, 4)
        sigma, mu = torch.std_mean(grouped.detach(), dims, keepdim=True)
        # contiguous on purpose: randn_like keeps SDPA's transposed strides and samples ~8x slower
        noise = torch.randn(grouped.shape, dtype=out.dtype, device=out.device)
        noise_sigma, noise_mu = torch.std_mean(noise, dims, keepdim=True)
        scale = sigma / noise_sigma.clamp_min(1e-6)
        noise = torch.addcmul(mu - noise_mu * scale, noise, scale)  # sigma (R - mean R) / std R + mu
        return torch.addcmul(grouped, noise, _off_diagonal(length, d, out.dtype, out.device), value=-1).reshape(
            b, h, length, d
        )


def _dgqa_state(core: GroupedQueryAttention) -> None:
    core.register_buffer("counts", torch.full((core.kv_heads,), core.heads // core.kv_heads, dtype=torch.long))
    core.register_buffer("cached_norms", torch.zeros(core.kv_heads))
    core.register_buffer("step", torch.zeros((), dtype=torch.long))


def _dgqa_metadata(core: GroupedQueryAttention) -> dict[str, str]:
    recorded = {"graphkit_window": str(core.update_every), "graphkit_evolution": core.evolution}
    if core.evolution == "ema":
        recorded["graphkit_alpha"] = repr(float(core.alpha))
    return recorded


register_variant(AttentionVariant("gqa"))
register_variant(
    AttentionVariant(
        "kdgqa",
        options=("allow_empty",),
        route=lambda core, q, k: kdgqa_index(key_norms(k), core.heads, core.allow_empty, fused=_measurable(q)),
    )
)
register_variant(
    AttentionVariant(
        "dgqa",
        options=("window", "evolution", "alpha", "allow_empty"),
        setup=_dgqa_state,
        route=lambda core, q, k: query_groups(core._dgqa_counts(k), core.heads),
        metadata=_dgqa_metadata,
    )
)
register_variant(
    AttentionVariant(
        "pgqa",
        options=("perturb_in_eval",),
        adjust=lambda core, out: core._perturbed(out) if core.training or core.perturb_in_eval else out,
    )
)


def _off_diagonal(length: int, d: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """1 off and 0 on the diagonal of a head's ``length x d`` output, as ``dtype``: made once per
    shape and device outside tracing (a cached fake or meta tensor would leak into real runs)."""
    key = (length, d, dtype, str(device))
    mask = _MASKS.get(key)
    if mask is None:
        mask = (~torch.eye(length, d, dtype=torch.bool, device=device)).to(dtype)
        if type(mask) is torch.Tensor and not mask.is_meta and len(_MASKS) < 64:
            _MASKS[key] = mask
    return mask
