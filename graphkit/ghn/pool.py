"""The architectures a hypernetwork trains on: a dataset split's distinct graphs, each encoded
once for the hypernetwork and built once as a model shell whose parameters ``functional_call``
supplies, so that a training step allocates no target-model weights."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from graphkit.datasets import load
from graphkit.datasets.dataset import Record
from graphkit.errors import TrainError
from graphkit.families import build_model
from graphkit.ghn.config import LoGAHConfig
from graphkit.ghn.encoding import EncodedGraph, encode, frequent_roles
from graphkit.graph import ArchGraph
from graphkit.tracing.tracer import init_record


class ArchPool:
    """The distinct architectures of a dataset split, each with its encoding for the hypernetwork
    and a parameter-less model for ``functional_call``, built on first use."""

    def __init__(self, dataset: str | Path, split: str = "train", device: str | torch.device = "cpu") -> None:

        distinct: dict[str, Any] = {}
        everything = load(dataset)
        for record in everything.filter(split=split):
            distinct.setdefault(record["fingerprint"], record)
        self.records = list(distinct.values())
        if not self.records:
            splits = sorted(set(everything.metadata("arrow").column("split").to_pylist()))
            raise TrainError(
                f"{dataset}: no records in split {split!r}; its splits: {', '.join(splits) or 'none (empty)'}"
            )
        families = {r.config["family"] for r in self.records}
        if len(families) > 1:
            raise TrainError(f"{dataset}: mixes families {sorted(families)}; train one hypernetwork per family")
        self.family = families.pop()
        self.device = torch.device(device)
        self.dataset, self.split = dataset, split
        self.dropped: list[Record] = []  # what keep_zoo_families left out of the split

    def __len__(self) -> int:
        return len(self.records)

    @functools.cache
    def encoded(self, index: int, config: LoGAHConfig) -> EncodedGraph:
        """Architecture ``index`` encoded for a LoGAH of ``config`` (once per pool), its init
        constants added first when the LoGAH decodes around them (:func:`graph_for`)."""
        return encode(graph_for(self.records[index], config), config)

    def split_encoded(self, config: LoGAHConfig) -> Iterator[EncodedGraph]:
        """Every architecture of the whole split encoded for ``config``: the pool's through
        :meth:`encoded` (cached, as training reads them), then those :meth:`keep_zoo_families` left
        out (encoded once, not kept). What is the whole split's although a stage trains on a few
        families reads these (``train-ghn --role-means-start``)."""
        yield from (self.encoded(index, config) for index in range(len(self)))
        yield from (encode(graph_for(record, config), config) for record in self.dropped)

    @functools.lru_cache(maxsize=256)
    def model(self, index: int) -> nn.Module:
        """Architecture ``index`` with real buffers and parameters on meta (functional_call
        supplies them), so a cached model costs no weight memory."""
        return functional_model(self.records[index].config, self.device)

    def initialised(self, index: int) -> dict[str, torch.Tensor]:
        """Architecture ``index``'s parameters as its library initialises them at construction,
        drawn afresh from the global generator (a training step seeds it, so a resumed step draws
        the same), by state-dict name with tied aliases: the ``W0`` of ``--keep-init``."""
        model = build_model(self.records[index].config, self.device)
        return {name: param.detach() for name, param in model.named_parameters(remove_duplicate=False)}

    def zoo_families(self, option: str) -> dict[str, list[int]]:
        """The indices of the pool's architectures by mini-zoo family (their ``zoo_family``), the
        families by name. TrainError naming the dataset and ``option`` (the flag that needs
        families) when the architectures have none, as a sampled dataset's (vits-1k) do not."""
        families: dict[str, list[int]] = {}
        for index, record in enumerate(self.records):
            if record.config.get("zoo_family") is not None:
                families.setdefault(record.config["zoo_family"], []).append(index)
        if not families:
            raise TrainError(f"{self.dataset}: its architectures have no zoo family ({option} is for a mini zoo)")
        return dict(sorted(families.items()))

    def draw(
        self, count: int, generator: torch.Generator, families: Sequence[Sequence[int]] | None = None
    ) -> list[int]:
        """``count`` architectures for one training step, drawn with ``generator``: uniformly over
        the pool (GHN-3's and LoGAH's sampling), or, given ``families`` (the pool's indices by
        family, :meth:`zoo_families`' values), one from each of ``count`` different families,
        every family as likely as any other whatever its size (families repeat only where there
        are fewer than ``count``).

        Why the second: a mini zoo's families differ in size (zoo-vits-mini's train split gives
        ``vision_transformer`` 89 of its 343 architectures and 21 of its 36 families 5 or fewer),
        so uniform draws spend a quarter of the meta-batch on one family and seldom meet most of
        the others; a hypernetwork meant for families it never saw is trained on every family
        alike (issue #45's lead "meta-batches that mix families")."""
        if families is None:
            return torch.randint(len(self), (count,), generator=generator).tolist()
        if count <= len(families):
            picked = torch.randperm(len(families), generator=generator)[:count].tolist()
        else:
            picked = torch.randint(len(families), (count,), generator=generator).tolist()
        members = [families[family] for family in picked]
        return [indices[int(torch.randint(len(indices), (1,), generator=generator))] for indices in members]

    def keep_zoo_families(self, names: Sequence[str]) -> None:
        """Keep only the architectures of the mini-zoo families ``names`` (their ``zoo_family``):
        a curriculum's first stage, on a few families, before the whole zoo. Call it before any
        architecture is encoded or built, and after reading what must stay the whole split's
        (:meth:`roles`: a later stage on the whole zoo starts from this one's weights). TrainError
        naming the dataset and a family the split does not have."""
        have = self.zoo_families("--zoo-families")
        missing = [name for name in names if name not in have]
        if missing:
            raise TrainError(
                f"{self.dataset}: split {self.split!r} has no zoo family {missing[0]!r}; "
                f"it has {', '.join(sorted(have))}"
            )
        kept = set(names)
        self.dropped = [r for r in self.records if r.config.get("zoo_family") not in kept]
        self.records = [r for r in self.records if r.config.get("zoo_family") in kept]

    def ops(self) -> list[str]:
        """Every op the pool's graphs use."""
        return sorted({node.op for r in self.records for node in r.graph.nodes})

    def roles(self, key: str = "name", limit: int | None = None) -> list[str]:
        """The parameter roles of the pool's graphs (:func:`~graphkit.ghn.encoding.frequent_roles`:
        with ``limit``, only the most frequent)."""
        return frequent_roles((r.graph for r in self.records), key, limit)


def functional_model(config: dict[str, Any], device: str | torch.device) -> nn.Module:
    """The model of ``config`` on ``device`` with its parameters on meta (ties kept): a shell for
    ``functional_call`` that allocates no weights but has real buffers (rotary tables, masks).
    A zoo record's config (a mini zoo's: small) is built by its library, which initialises it."""

    model = build_model(config, device, init=False)  # a zoo's library initialises; the values are dropped
    metas: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                if id(param) not in metas:
                    metas[id(param)] = nn.Parameter(param.to("meta"), requires_grad=False)
                module._parameters[name] = metas[id(param)]
    return model


def graph_for(record: Record, config: LoGAHConfig) -> ArchGraph:
    """The graph of a dataset ``record`` as a LoGAH of ``config`` reads it (:func:`as_read`)."""
    return as_read(record.graph, record.config, config)


def as_read(graph: ArchGraph, model_config: dict[str, Any], config: LoGAHConfig) -> ArchGraph:
    """``graph``, of the model of ``model_config``, as a LoGAH of ``config`` reads it: with the
    model's init constants (:func:`with_init_constants`) when the LoGAH decodes around them, as it
    is otherwise."""
    return with_init_constants(graph, model_config) if config.init_anchors else graph


def with_init_constants(graph: ArchGraph, config: dict[str, Any]) -> ArchGraph:
    """``graph`` with its model's init record (``meta["init"]``, the init constants, and
    ``meta["logit_scale"]``: :func:`~graphkit.tracing.tracer.init_record`), read from the model
    of ``config`` built with weights when the graph has none: a dataset's graphs were traced on
    the meta device.
    Building a mini zoo's model takes well under a second; a pool does it once per architecture,
    on a generator of its own, so that a training step draws the same whenever its architectures
    were first encoded (a resumed run repeats the uninterrupted one)."""
    if "init" in graph.meta:
        return graph
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        record = init_record(build_model(config, "cpu"), graph)
    return ArchGraph(nodes=graph.nodes, edges=graph.edges, meta={**graph.meta, **record})
