"""What an attention lets each query see, read off the values of its mask, wherever the mask
comes from and wherever it is applied.

A model can make its attention causal, or give it a sliding window, in many ways: SDPA's
``is_causal`` flag; a ``tril`` buffer registered in ``__init__`` (nanoGPT, minGPT), used with
``masked_fill`` or passed to SDPA as ``attn_mask``; a mask built in ``forward`` from ``arange``
comparisons (transformers); a mask passed in as an argument; a mask that multiplies the
probabilities after the softmax, which are then renormalised. Reading the op names catches some
of these and misses the rest, so the tracer computes the probabilities instead: the ops between
the scores and the product with V, and the masks they read, are constants of the program once the
scores are set, since masks depend on shapes, buffers and the inputs' values, not on the
activations. :class:`ConstantEvaluator` runs them on the CPU, with the queries and keys set to
zero and every learned tensor (a relative-position bias, ALiBi slopes held as parameters) set
to zero too: a learned bias is not a mask. A key a query cannot see is one whose weight lies far
below the best key of its row (:func:`visibility`). :func:`read_pattern` then says whether the
attention is causal (no query sees a later key) and whether it has a sliding window (every query
sees exactly the last W keys up to itself).

What cannot be computed is named: a buffer or an input on the ``meta`` device has no values.
The attention rules then fall back on what the code says (``is_causal`` attributes, a
``tril`` in the mask's ops) and refuse the model when nothing does, rather than guess.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import fx

from graphkit.compat import flatten_inputs
from graphkit.tracing.mutation import Aliases
from graphkit.tracing.naming import functional_name, is_float

#: a key whose pre-softmax value is this far below its row's best has weight below e^-20
HIDDEN_GAP = 20.0
#: a key this far below is masked: the least masks add is Swin's -100
MASKED_GAP = 100.0
#: ops evaluated for one mask at most: a mask is a handful of ops, more means it reads activations
MAX_OPS = 2000
#: elements of one tensor at most (a mask over a long context is still far below this)
MAX_NUMEL = 1 << 24
#: ops that check metadata and compute nothing
_CHECKS = {"_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size", "sym_constrain_range"}


class Unknown(Exception):
    """A value the tracer cannot compute; the message names why (one phrase)."""


class ConstantEvaluator:
    """Concrete values, on the CPU, of the parts of an exported program that do not depend on
    activations: masks, position tables, anything built from shapes, buffers and inputs."""

    def __init__(
        self, program: torch.export.ExportedProgram, inputs: tuple[tuple, dict] | None, aliases: Aliases
    ) -> None:
        self.aliases = aliases
        self.leaves: dict[str, tuple[Any, str]] = {}  # placeholder -> (value, what it is)
        self.params: set[str] = set()
        user = flatten_inputs(inputs, program)
        specs = [s for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
        if user is not None and len(user) == len(specs):
            for spec, value in zip(specs, user, strict=True):
                self.leaves[spec.arg.name] = (value, f"input {spec.arg.name!r}")
        for spec in program.graph_signature.input_specs:
            kind, name = spec.kind.name, spec.arg.name
            if kind == "PARAMETER":
                self.params.add(name)
            elif kind in ("BUFFER", "CONSTANT_TENSOR"):
                value = program.state_dict.get(spec.target, program.constants.get(spec.target))
                self.leaves[name] = (value, f"buffer {spec.target!r}" if kind == "BUFFER" else "a constant tensor")
        self.inputs = {spec.arg.name for spec in specs}
        self._learned: dict[fx.Node, bool] = {}
        self._input_based: dict[fx.Node, bool] = {}

    def evaluate(
        self,
        target: fx.Node,
        overrides: Mapping[fx.Node, torch.Tensor],
        live: Callable[[fx.Node], str | None],
        through: Collection[fx.Node] = (),
        fill: float = 0.0,
    ) -> Any:
        """The value of ``target``, with ``overrides`` standing in for some nodes and the nodes in
        ``through`` passing their first input on (a linear map over the heads of the scores mixes
        heads and hides no key; with its weights at zero it would hide them all). ``live(node)``
        says why a node computed from the inputs is an activation (another node's output), or
        returns None: a floating-point activation counts as ``fill``, as learned values do, a
        boolean or integer one (a mask computed from activations) cannot be computed. ``fill``
        is zero where these values are added to the scores (a learned bias is no mask), one where
        they multiply the probabilities (ConViT's learned gate between two softmaxes hides no
        key). Raises :class:`Unknown` with the reason when something ``target`` needs has no
        value."""
        needed: set[fx.Node] = set()
        overrides = dict(overrides)
        stack = [target]
        while stack:
            node = stack.pop()
            if node in needed:
                continue
            needed.add(node)
            if len(needed) > MAX_OPS:
                raise Unknown(f"it is computed by more than {MAX_OPS} ops")
            if node in overrides or node.op == "placeholder" or self.learned(node):
                continue
            if node in through:
                stack.append(cast(fx.Node, node.args[0]))
                continue
            if node.op != "call_function":
                raise Unknown(f"it reads {node.op} {node.name!r}")
            reason = live(node) if self._from_input(node) else None
            if reason is not None and is_float(node.meta.get("val")):
                # an activation read into the scores (a relative-position bias computed from the
                # query, SAM's and MViTv2's; XCiT's normalised channels) hides no key by its
                # position: a stand-in, like a learned bias
                overrides[node] = _filled(node, fill)
                continue
            if reason is not None:  # a mask computed from activations: it has no value here
                raise Unknown(reason)
            stack.extend(node.all_input_nodes)
            stack.extend(self.aliases.writers(node, target))  # writes into its storage (copy_ into a slice)
        env: dict[fx.Node, Any] = {}
        with torch.device("cpu"):  # also inside a caller's `with torch.device("meta")`
            for node in sorted(needed, key=lambda n: n.meta["_gk_pos"]):
                if node in through and node not in overrides:
                    env[node] = env[cast(fx.Node, node.args[0])]
                else:
                    self._run(node, env, overrides, fill)
        if isinstance(env[target], _Missing):
            raise Unknown(env[target].reason)
        return env[target]

    def _run(
        self, node: fx.Node, env: dict[fx.Node, Any], overrides: Mapping[fx.Node, torch.Tensor], fill: float
    ) -> None:
        """Compute ``node`` into ``env``, or record why it cannot be."""
        try:
            env[node] = self._value(node, env, overrides, fill)
        except Unknown as e:
            if not self._parametric(node):
                env[node] = _Missing(str(e))
                return
            # a learned bias that cannot be computed (timm's relative-position MLP output,
            # gathered by an index buffer on meta) is no mask: a stand-in, like every learned value
            env[node] = _filled(node, fill)

    def learned(self, node: fx.Node) -> bool:
        """True for a parameter, or a floating-point value computed from learned values alone and
        not from the inputs (a relative-position bias gathered from its table by an index
        buffer): a stand-in here. Activations are computed from the inputs, so they never are."""
        if node not in self._learned:
            if node.op == "placeholder":
                self._learned[node] = node.name in self.params
            elif node.op == "call_function" and is_float(node.meta.get("val")) and not self._from_input(node):
                floats = [a for a in node.all_input_nodes if is_float(a.meta.get("val"))]
                self._learned[node] = bool(floats) and all(self.learned(a) for a in floats)
            else:
                self._learned[node] = False
        return self._learned[node]

    def _parametric(self, node: fx.Node) -> bool:
        """Whether ``node`` is a floating-point value computed from a parameter and not from
        the inputs (a learned bias, whatever else it reads)."""
        if node.op != "call_function" or not is_float(node.meta.get("val")) or self._from_input(node):
            return False
        return any(n.op == "placeholder" and n.name in self.params for n in upstream(node))

    def _from_input(self, node: fx.Node) -> bool:
        """Whether ``node`` is computed from a user input (token ids, images, a mask argument)."""
        if node not in self._input_based:
            if node.op == "placeholder":
                self._input_based[node] = node.name in self.inputs
            else:
                self._input_based[node] = any(self._from_input(a) for a in node.all_input_nodes)
        return self._input_based[node]

    def _value(
        self, node: fx.Node, env: dict[fx.Node, Any], overrides: Mapping[fx.Node, torch.Tensor], fill: float
    ) -> Any:
        if node in overrides:
            return overrides[node]
        if self.learned(node):
            return _filled(node, fill)
        if node.op == "placeholder":
            if node.name not in self.leaves:
                raise Unknown(f"input {node.name!r} was not given")
            value, what = self.leaves[node.name]
            if isinstance(value, torch.Tensor):
                if value.is_meta:
                    raise Unknown(f"{what} is on the meta device and holds no values")
                if value.numel() > MAX_NUMEL:
                    raise Unknown(f"{what} is too large to read")
                return value.detach().to("cpu", copy=True)  # ops may write into it; the model's stays as it is
            return value
        name = functional_name(node.target)
        if name in _CHECKS:
            return None
        missing = next((env[a] for a in node.all_input_nodes if isinstance(env[a], _Missing)), None)
        if missing is not None:
            raise Unknown(missing.reason)
        args = fx.node.map_aggregate(node.args, lambda a: _on_cpu(env[a] if isinstance(a, fx.Node) else a))
        kwargs = fx.node.map_aggregate(node.kwargs, lambda a: _on_cpu(env[a] if isinstance(a, fx.Node) else a))
        try:
            result = cast(Callable, node.target)(*args, **kwargs)
        except Exception as e:  # an op that runs on fake tensors may still refuse these values
            raise Unknown(f"{name} could not be computed ({type(e).__name__})") from e
        if node.target is not operator.getitem and isinstance(result, torch.Tensor) and result.is_meta:
            raise Unknown(f"{name} gave a value on the meta device")
        return result


def upstream(start: fx.Node | None, limit: int = MAX_OPS) -> Iterator[fx.Node]:
    """``start`` and the nodes it is computed from (at most ``limit``), each once."""
    seen: set[fx.Node] = set()
    stack = [start] if isinstance(start, fx.Node) else []
    while stack and len(seen) < limit:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            yield node
            stack.extend(node.all_input_nodes)


@dataclass(frozen=True)
class _Missing:
    """A value that could not be computed, and why: what reads it cannot be computed either."""

    reason: str


def _filled(node: fx.Node, fill: float) -> torch.Tensor:
    """A tensor of ``fill``, on the CPU, of the shape and type ``node`` has in the program."""
    fake = node.meta["val"]
    return torch.full(tuple(fake.shape), fill, dtype=fake.dtype)


def _on_cpu(value: Any) -> Any:
    """A device argument pointed at the CPU: factory ops recorded on meta or a GPU run here."""
    return torch.device("cpu") if isinstance(value, torch.device) else value


class Visibility:
    """Which keys each query sees, over the leading dimensions of a (..., queries, keys) map
    (batch, heads): ``some`` where some map shows the key, ``every`` where every one does, each
    (queries, keys) or broadcasting to it; and :attr:`sharp`."""

    def __init__(self, some: torch.Tensor, every: torch.Tensor, maps: torch.Tensor | None = None) -> None:
        self.some, self.every = some, every
        self._maps = maps  # the logits' (queries, keys) maps sharp is read off, on demand: only a causal attention asks

    @classmethod
    def of_mask(cls, visible: torch.Tensor) -> Visibility:
        """The visibility of a boolean map (True: seen)."""
        maps = _maps(visible)
        return cls(maps.any(dim=0), maps.all(dim=0))

    @functools.cached_property
    def sharp(self) -> bool:
        """Whether every key no query sees is masked, more than ``MASKED_GAP`` below its row's
        best: what masks add (-inf, the dtype's minimum, -1e9, -1e4, Swin's -100), unlike a bias
        that grows with distance (ALiBi's), whose far keys fade without a sharp edge and make no
        window. A boolean mask always is."""
        if self._maps is None:
            return True
        for values, best in _rows(self._maps):
            if bool(((values >= best - MASKED_GAP) & (values <= best - HIDDEN_GAP)).any()):
                return False
        return True


def _maps(values: torch.Tensor) -> torch.Tensor:
    """``values`` as a stack of (queries, keys) maps: its leading dimensions flattened, a missing
    query (or key) dimension added."""
    values = values.reshape(*([1] * (2 - values.dim())), *values.shape) if values.dim() < 2 else values
    return values.reshape(-1, *values.shape[-2:])


#: elements of the logits read at once: a long context's full map (SAM: 2 x 12 heads x 4,096^2)
#: goes through a few maps at a time, so its intermediates stay small
CHUNK_NUMEL = 1 << 22


def _rows(maps: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """A few of the (queries, keys) ``maps`` (:func:`_maps`) at a time, in float, with each
    row's best value; NaN for a row whose every key is masked (-inf), so that it shows no key."""
    for chunk in maps.split(max(1, CHUNK_NUMEL // max(1, maps[0].numel()))):
        values = chunk.float()
        yield values, values.amax(dim=-1, keepdim=True).nan_to_num(nan=math.nan, posinf=math.inf, neginf=math.nan)


def visibility(logits: torch.Tensor) -> Visibility:
    """Which keys each query sees, from the values a softmax runs over (keys on the last
    dimension; for probabilities, their logarithm): those less than ``HIDDEN_GAP`` below the
    best key of their row (weight above e^-20)."""
    maps = _maps(logits)  # reshaped once: a map moved out of place is copied here, not at each read
    some = torch.zeros(maps.shape[-2:], dtype=torch.bool, device=maps.device)
    every = torch.ones(maps.shape[-2:], dtype=torch.bool, device=maps.device)
    for values, best in _rows(maps):
        visible = values > best - HIDDEN_GAP
        some |= visible.any(dim=0)
        every &= visible.all(dim=0)
    return Visibility(some, every, maps)


@dataclass(frozen=True)
class Pattern:
    """What an attention's mask lets its queries see, as attributes: ``causal`` when no query
    sees a later key; ``window`` W when, besides, every query sees exactly the last W keys up to
    itself and some query has earlier keys it does not see (a sliding window, shorter than the
    keys)."""

    causal: bool
    window: int | None


def read_pattern(seen: Visibility, queries: int, keys: int) -> Pattern | None:
    """The :class:`Pattern` of the keys each query sees, queries aligned with the last keys (as
    with a KV cache); None if the maps do not broadcast to (queries, keys). Causal when no map
    lets a query see a later key; a window is read only where every map is the same band and
    ``sharp`` (its keys either seen or masked: :func:`visibility`). With a single key there is
    no later key to hide: the caller must not read causality off it."""
    try:
        some, every = (torch.broadcast_to(m, (queries, keys)) for m in (seen.some, seen.every))
    except RuntimeError:
        return None
    position = torch.arange(queries, device=some.device).unsqueeze(1) + (keys - queries)  # among the keys
    key = torch.arange(keys, device=some.device).unsqueeze(0)
    future = key > position
    if not bool(future.any()) or bool(some[future].any()):
        return Pattern(causal=False, window=None)
    width = int(some.sum(dim=-1).max())
    band = (key <= position) & (key > position - width)
    sliding = seen.sharp and 0 < width < keys and bool((some == band).all()) and bool((every == band).all())
    return Pattern(causal=True, window=width if sliding else None)


__all__ = ["ConstantEvaluator", "Pattern", "Unknown", "Visibility", "read_pattern", "upstream", "visibility"]
