"""Zoo datasets: the architectures timm's registry and transformers can build, traced as published.

ViTs-1K and GPTs-1K sample synthetic spaces; a zoo holds the models people run:

- ``zoo-vits``: every model of timm's registry whose module builds it from self-attention blocks
  (:data:`TIMM_TRANSFORMER_MODULES`: plain, hierarchical and hybrid ViTs), built with
  ``pretrained=False``.
- ``zoo-decoders``: every decoder-only causal-LM architecture of transformers (its causal-LM
  auto mapping, less the encoder models that can also decode, the encoder-decoder ones and the
  multimodal ones with a vision, audio or VQ tower), each at its reference config (the config
  class's defaults: the shape of the model it was written for).

Every model is built on the meta device (no weight is allocated) and traced. One record per
distinct architecture (graph fingerprint): the first name in sort order, carrying the others as
``aliases`` in its config; the record's id is that name. What cannot be built or traced, or
traces with ops outside the vocabulary (``other:``), goes to ``report.json`` and ``report.md``
with a one-line reason, and so does how many models ``graphkit predict`` would predict with the
bundled hypernetworks (:func:`graphkit.ghn.predict.refusal_reason`) and, counted by reason (the
op kinds no bundled hypernetwork trained on: ``missing op: scale``), why it refuses the rest.
The candidates, their order and the split (a tenth of the architectures held out, by
fingerprint hash) depend on nothing but the library versions, which the manifest and the card
record: the same versions give the same dataset.

Generation runs in worker processes, and each model's outcome is written to
``.graphkit-zoo/`` in the folder as it finishes: ``resume=True`` traces only the rest.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import multiprocessing
import os
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from graphkit.datasets import shrink
from graphkit.datasets.runs import LOCK_FILE, folder_lock
from graphkit.datasets.store import (
    RUN_FILE,
    check_dataset_folder,
    finalize_dataset,
    graph_to_row,
    shard_name,
    write_shard,
)
from graphkit.errors import GraphkitError, NeedsValuesError, ZooError
from graphkit.families import build_model
from graphkit.families.libraries import first_line, library_family
from graphkit.fileio import check_output_dir, write_text_atomic
from graphkit.graph import ArchGraph
from graphkit.tracing import trace
from graphkit.validation import is_count
from graphkit.workers import ended_by_sigterm, signals_deferred, worker_context, worker_started

#: timm modules whose models are built from self-attention blocks (timm.list_models(module=...))
TIMM_TRANSFORMER_MODULES = (
    "beit",
    "cait",
    "coat",
    "convit",
    "crossvit",
    "davit",
    "deepseek_vit",
    "deit",
    "efficientformer",
    "efficientformer_v2",
    "efficientvit_mit",
    "efficientvit_msra",
    "eva",
    "fastvit",
    "gcvit",
    "gemma4_vit",
    "hiera",
    "hieradet_sam2",
    "iformer",
    "levit",
    "lowformer",
    "maxxvit",
    "mobilevit",
    "mvitv2",
    "naflexvit",
    "nest",
    "nextvit",
    "pit",
    "pvt_v2",
    "qwen3_vit",
    "shvit",
    "swiftformer",
    "swin_transformer",
    "swin_transformer_v2",
    "swin_transformer_v2_cr",
    "tiny_vit",
    "tnt",
    "twins",
    "visformer",
    "vision_transformer",
    "vision_transformer_hybrid",
    "vision_transformer_relpos",
    "vision_transformer_sam",
    "vitamin",
    "volo",
    "xcit",
)
#: where each model's outcome waits until the dataset is assembled (the unit of resume)
CACHE_DIR = ".graphkit-zoo"
#: one architecture in this many is held out (by fingerprint hash)
EVAL_EVERY = 10
#: seconds one model may take to build and trace before it is stopped and reported (the slowest
#: reference configs, mixtures of hundreds of experts, take about two minutes on one core)
MODEL_TIMEOUT = 300.0
#: parameters of a model built on the CPU when the meta device lacks a value the tracer needs
CPU_BUILD_LIMIT = 500_000_000


@dataclass(frozen=True)
class Zoo:
    """One zoo: the library family its records name (``timm`` or ``transformers``,
    :mod:`graphkit.families.libraries`, which builds each from the config a record stores) and
    how it lists its models. A worker makes each model's ``outcome(zoo name, model name)``
    (default: build and trace it on meta) after ``warm_up()`` (default: the tracer's and the
    bundled hypernetworks' set-up), in processes started by ``start_method``. A ``mini`` zoo
    splits its records by zoo family (timm module, model type: :mod:`graphkit.datasets.shrink`),
    not by fingerprint."""

    name: str
    library: str
    description: str
    candidates: Callable[[], list[str]]
    outcome: Callable[[str, str], dict[str, Any]] | None = None
    warm_up: Callable[[], None] | None = None
    start_method: str = "fork"
    mini: bool = False

    def config(self, model: str) -> dict[str, Any]:
        """The config a record of ``model`` stores: the library's family and its name for the model."""
        return {"family": self.library, library_family(self.library).model_key: model}


def _timm_candidates() -> list[str]:
    import timm  # noqa: PLC0415 - the zoo's library, loaded when it is used

    return sorted({name for module in TIMM_TRANSFORMER_MODULES for name in timm.list_models(module=module)})


@functools.cache
def timm_modules() -> dict[str, str]:
    """Every zoo-vits model's zoo family: the timm module that defines it."""
    import timm  # noqa: PLC0415 - the zoo's library, loaded when it is used

    return {name: module for module in TIMM_TRANSFORMER_MODULES for name in timm.list_models(module=module)}


def _timm_candidates_by_module() -> list[str]:
    """zoo-vits' models taken a timm module at a time: the first of each, then the second of
    each, and so on, so that the first N (``--num``) span as many modules as they can."""
    modules = timm_modules()
    by_module: dict[str, list[str]] = {}
    for name in _timm_candidates():
        by_module.setdefault(modules[name], []).append(name)
    rounds = max(map(len, by_module.values()), default=0)
    return [names[i] for i in range(rounds) for names in by_module.values() if i < len(names)]


#: sub-configs that make a model more than a decoder: an image, audio or image-token tower
TOWER_CONFIGS = ("vision_config", "audio_config", "vq_config")


def _decoder_candidates() -> list[str]:
    """Model types of transformers' causal-LM auto mapping that are decoder-only: not encoders
    (they are also masked LMs), not encoder-decoders (sequence-to-sequence LMs, or a reference
    config that says ``is_encoder_decoder``: Whisper, MusicGen), and without a vision, audio or
    VQ tower (Gemma 3's multimodal model, whose decoder is ``gemma3_text``), and not reading image
    patches itself (Fuyu: a config with ``patch_size`` and ``num_channels``). A reference config
    that cannot be made stays a candidate: the report says why it fails."""
    from transformers import AutoConfig  # noqa: PLC0415
    from transformers.models.auto import modeling_auto  # noqa: PLC0415
    from transformers.utils import logging as hf_logging  # noqa: PLC0415

    causal = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    encoders = set(modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES)
    seq2seq = set(modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()

    def decoder_only(model_type: str) -> bool:
        try:
            config = AutoConfig.for_model(model_type)
        except Exception:  # reported when it is built
            return True
        towers = set(getattr(config, "sub_configs", None) or {}) & set(TOWER_CONFIGS)
        reads_images = bool(getattr(config, "patch_size", None) and getattr(config, "num_channels", None))
        return not towers and not reads_images and not getattr(config, "is_encoder_decoder", False)

    try:
        return sorted(t for t in causal if t not in encoders and t not in seq2seq and decoder_only(t))
    finally:
        hf_logging.set_verbosity(verbosity)


def _mini_outcome(zoo_name: str, name: str) -> dict[str, Any]:
    """A mini zoo's outcome for one model: its shrunk variant, or why there is none."""
    return mini_outcome(ZOOS[zoo_name].library, name)


@dataclass(frozen=True)
class Shrinker:
    """How a mini zoo shrinks the models of one library family: ``zoo_family_of(name)``, the
    model's zoo family (what the split holds out); ``ladder(name, zoo_family)``, the full model on
    meta, its shrink plans from the smallest up and its reference config (None for timm, whose
    plans read the constructor's arguments); ``warm_up()``, what a worker loads once."""

    zoo_family_of: Callable[[str], str]
    ladder: Callable[[str, str], tuple[nn.Module, list, dict[str, Any] | None]]
    warm_up: Callable[[], None]


def _timm_ladder(name: str, module: str) -> tuple[nn.Module, list, None]:
    full, arguments = shrink.timm_arguments(name)
    return full, shrink.vision_plans(module, arguments), None


def _decoder_ladder(name: str, model_type: str) -> tuple[nn.Module, list, dict[str, Any]]:
    reference = shrink.reference_config(name)
    plans = shrink.decoder_plans(reference, name)
    return build_model({"family": "transformers", "model_type": name}), plans, reference


def _warm_up_timm() -> None:
    importlib.import_module("timm")
    timm_modules()


def _warm_up_transformers() -> None:
    importlib.import_module("transformers")
    importlib.import_module("transformers.modeling_utils")  # what every causal LM's build loads first
    importlib.import_module("transformers.models.auto.modeling_auto")
    # a spawned worker of its own: the library's notes on its reference kernels would fill the terminal
    importlib.import_module("transformers.utils.logging").set_verbosity_error()


#: per library family, how its mini zoo shrinks a model
SHRINKERS: dict[str, Shrinker] = {
    "timm": Shrinker(lambda name: timm_modules().get(name, "timm"), _timm_ladder, _warm_up_timm),
    "transformers": Shrinker(lambda name: name, _decoder_ladder, _warm_up_transformers),
}


def _mini_warm_up(library: str) -> Callable[[], None]:
    """What a mini zoo's worker pays once: the library, the tracer and the bundled hypernetworks."""

    def warm_up() -> None:
        _warm_up()
        SHRINKERS[library].warm_up()

    return warm_up


def _mini_zoo(name: str, library: str, description: str, candidates: Callable[[], list[str]]) -> Zoo:
    """A mini zoo of ``library``'s models: each shrunk by a spawned worker, split by zoo family."""
    return Zoo(
        name,
        library,
        description,
        candidates,
        outcome=_mini_outcome,
        warm_up=_mini_warm_up(library),
        start_method="spawn",
        mini=True,
    )


ZOOS: dict[str, Zoo] = {
    "zoo-vits": Zoo(
        "zoo-vits",
        "timm",
        "every vision-transformer architecture of timm's registry, built with pretrained=False",
        _timm_candidates,
    ),
    "zoo-decoders": Zoo(
        "zoo-decoders",
        "transformers",
        "every decoder-only causal-LM architecture of transformers, at its reference config",
        _decoder_candidates,
    ),
    "zoo-vits-mini": _mini_zoo(
        "zoo-vits-mini",
        "timm",
        "every zoo-vits architecture shrunk through its own constructor: 32-pixel images (64 or 128 where "
        "a last stage would see one token), 10 classes, a few blocks, width at most 192, every op kind and "
        "parameter kind of the full model",
        _timm_candidates_by_module,
    ),
    "zoo-decoders-mini": _mini_zoo(
        "zoo-decoders-mini",
        "transformers",
        "every zoo-decoders architecture shrunk through its own config: 2 to 4 layers, width 128 to 256, "
        "a byte vocabulary, every op kind and parameter kind of the full model",
        _decoder_candidates,
    ),
}


def _outcome(zoo_name: str, name: str) -> dict[str, Any]:
    """Worker: build and trace one model; its row (without id and split), or why not."""

    start = time.perf_counter()
    config = ZOOS[zoo_name].config(name)
    try:
        model = build_model(config)
    except ZooError as e:  # the library cannot build its own model: reported, not counted against the tracer
        return {"model": name, "error": str(e), "unbuildable": True, "seconds": round(time.perf_counter() - start, 2)}
    try:
        graph = trace_zoo_model(model, config)
    except Exception as e:  # every failure is a report line, never the end of the run
        reason = first_line(e) if isinstance(e, GraphkitError) else f"{type(e).__name__}: {first_line(e)}"
        return {"model": name, "error": reason, "seconds": round(time.perf_counter() - start, 2)}
    from graphkit.ghn.predict import refusal_reason  # noqa: PLC0415

    others = sorted({n.op for n in graph.nodes if n.op.startswith("other:")})
    return {
        "model": name,
        "row": graph_to_row(graph, config, id=name, split=""),
        "other_ops": others,
        **_predictability(refusal_reason(graph)),  # a bundled hypernetwork predicts it, or why not
        "seconds": round(time.perf_counter() - start, 2),
    }


def _predictability(refusal: Any) -> dict[str, Any]:
    """An outcome's fields on ``graphkit predict`` from :func:`graphkit.ghn.predict.refusal_reason`
    (None: a bundled hypernetwork predicts it): the refusal's line, its reason and the op kinds
    it names, which the report counts."""
    return {
        "predict": None if refusal is None else refusal.message,
        "predict_reason": None if refusal is None else refusal.reason,
        "predict_missing": [] if refusal is None else list(refusal.missing),
    }


def trace_zoo_model(model: nn.Module, config: Mapping[str, Any]) -> ArchGraph:
    """The graph of the zoo model ``model`` built on meta from ``config``: every branch taken
    (:func:`~graphkit.tracing.trace` tries guessed inputs that leave one untaken again with
    more), and where the tracer needs values that meta lacks (a mask buffer made in
    ``__init__``, GPT-1's; a tensor made on the CPU in forward, XLNet's), the model built on the
    CPU when it is small enough (:data:`CPU_BUILD_LIMIT`)."""
    try:
        return trace(model)
    except NeedsValuesError:
        if sum(p.numel() for p in model.parameters()) > CPU_BUILD_LIMIT:
            raise
        return trace(build_model(config, "cpu"))


def _cache_path(out: Path, name: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    return out / CACHE_DIR / f"{safe}-{hashlib.sha1(name.encode()).hexdigest()[:8]}.json"


def _serve(zoo_name: str, tasks: Connection, run: int) -> None:
    """A worker process of the run whose process id is ``run``: the zoo's imports and set-up paid
    once, then one outcome for each model name it receives, sent back whole, until it receives
    None."""
    worker_started(run)
    zoo = ZOOS[zoo_name]
    torch.set_num_threads(1)  # the processes share the cores
    if zoo.start_method == "spawn":  # a forked worker has the run's warm-up already
        (zoo.warm_up or _warm_up)()
    outcome = zoo.outcome or _outcome
    while (name := tasks.recv()) is not None:
        tasks.send(outcome(zoo_name, name))
    tasks.close()


def _traced(zoo: Zoo, out: Path, names: list[str], workers: int, timeout: float) -> Iterator[dict[str, Any]]:
    """Every name's outcome, from ``workers`` worker processes that take one model at a time,
    each saved as it arrives. A worker that runs past ``timeout`` seconds on a model, or dies (a
    library's own crash), is stopped and replaced, and that model becomes a report line instead of
    stopping the run. Workers are forked after the run's warm-up (the full zoos: their models only
    trace on meta), or spawned where they compute (the mini zoos' trainability check: a forked
    child of a process whose thread pool had run can crash), each importing the libraries once."""
    methods = multiprocessing.get_all_start_methods()
    method = zoo.start_method if zoo.start_method in methods else "spawn"
    context: Any = worker_context(method)  # a start method's context: its Process and Pipe
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # meta tensors do no arithmetic; the processes share the cores
    if names and method == "fork":
        (zoo.warm_up or _warm_up)()
    pending = list(names)
    idle: list[tuple[Any, Connection]] = []
    busy: dict[Connection, tuple[Any, str, float]] = {}

    def start() -> tuple[Any, Connection]:
        with signals_deferred():  # a Ctrl-C midway would leave a worker started and untracked
            mine, theirs = context.Pipe(duplex=True)
            process = context.Process(target=_serve, args=(zoo.name, theirs, os.getpid()), daemon=True)
            process.start()
            theirs.close()
        return process, mine

    def stop(process: Any, pipe: Connection) -> None:
        process.kill()
        process.join()
        pipe.close()

    try:
        while pending or busy:
            while pending and len(busy) < workers:
                process, pipe = idle.pop() if idle else start()
                name = pending.pop(0)
                pipe.send(name)
                busy[pipe] = (process, name, time.monotonic())
            finished = []
            for ready in wait(list(busy), timeout=1.0):
                pipe = cast(Connection, ready)  # wait() returns what it was given: the busy pipes
                process, name, started = busy.pop(pipe)
                try:
                    finished.append(pipe.recv())
                    idle.append((process, pipe))
                except (EOFError, OSError):  # it died before sending
                    process.join()
                    pipe.close()
                    finished.append(_failure(name, f"the tracing process died (exit code {process.exitcode})", started))
            for pipe, (process, name, started) in list(busy.items()):
                if time.monotonic() - started > timeout:
                    stop(process, pipe)
                    del busy[pipe]
                    finished.append(_failure(name, f"not traced within {timeout:.0f} s", started))
            for outcome in finished:
                write_text_atomic(_cache_path(out, outcome["model"]), json.dumps(outcome))
                yield outcome
    finally:
        for process, pipe in [*idle, *((p, pipe) for pipe, (p, _, _) in busy.items())]:
            stop(process, pipe)
        torch.set_num_threads(threads)


def _warm_up() -> None:
    """What every tracing process would otherwise pay again, paid once before they fork: the
    tracer's and the hypernetwork's imports, torch.export's one-time set-up (one tiny export)
    and the bundled hypernetworks that ``refusal_reason`` reads."""
    from graphkit.families import build_model  # noqa: PLC0415
    from graphkit.ghn.checkpoint import bundled_info, bundled_names  # noqa: PLC0415
    from graphkit.ghn.predict import bundled_hypernetwork  # noqa: PLC0415

    trace(build_model({"family": "gpt2", "num_layers": 1, "hidden": 8, "heads": 1, "context": 8}))
    for name in bundled_names():
        bundled_info(name)
        bundled_hypernetwork(name)


def mini_outcome(library: str, name: str) -> dict[str, Any]:
    """Worker: the mini variant of the zoo model ``name`` (``library`` "timm" or "transformers"):
    the full model built and traced on meta, then each plan of its ladder built, traced and
    checked until one keeps every kind and trains. Its row (id and split set later), its zoo family,
    the seconds each step took; or why no plan passed: the reason of the plan that got furthest
    (built, then traced, then kept every kind, then trained), the first of those."""
    from graphkit.ghn.predict import refusal_reason  # noqa: PLC0415 - the hypernetwork is not the dataset's

    seconds = dict.fromkeys(("build", "trace", "shrink", "check"), 0.0)
    start = time.perf_counter()

    def lap(step: str, began: float) -> None:
        seconds[step] += time.perf_counter() - began

    def result(**fields: Any) -> dict[str, Any]:
        return {
            "model": name,
            "zoo_family": zoo_family,
            **fields,
            "timings": {k: round(v, 3) for k, v in seconds.items()},
            "seconds": round(time.perf_counter() - start, 2),
        }

    shrinker, zoo_family = SHRINKERS[library], name
    base = {"family": library, library_family(library).model_key: name}
    began = time.perf_counter()
    try:
        zoo_family = shrinker.zoo_family_of(name)
        full, plans, reference = shrinker.ladder(name, zoo_family)
    except shrink.ShrinkError as e:
        lap("build", began)
        return result(error=f"not shrunk: {e}")
    except Exception as e:  # the library cannot build its own model: not shrunk, reported
        lap("build", began)
        return result(error=f"cannot build the full model: {_first_error(e)}", unbuildable=True)
    lap("build", began)
    began = time.perf_counter()
    try:
        full_graph = trace_zoo_model(full, base)
    except Exception as e:
        lap("trace", began)
        return result(error=f"the full model does not trace: {_first_error(e)}")
    lap("trace", began)
    reasons: list[tuple[int, str]] = []  # (how far the plan got, why it stopped): the furthest is reported
    for plan, overrides in plans:
        config = {**base, "shrink": overrides, "zoo_family": zoo_family, **shrink.data_keys(overrides, reference)}
        began = time.perf_counter()
        try:
            small = build_model(config)
        except Exception as e:
            lap("shrink", began)
            reasons.append((0, f"{plan.describe()}: {_first_error(e)}"))
            continue
        try:
            graph = trace_zoo_model(small, config)
        except Exception as e:
            lap("shrink", began)
            reasons.append((1, f"{plan.describe()}: {_first_error(e)}"))
            continue
        lap("shrink", began)
        lost = shrink.missing_kinds(full_graph, graph)
        if lost:
            reasons.append((2, f"{plan.describe()}: {lost}"))
            continue
        began = time.perf_counter()
        try:
            trained = shrink.trainability(build_model(config, "cpu"), library_family(library).task)
        except Exception as e:
            trained = f"cannot be built on the CPU: {_first_error(e)}"
        lap("check", began)
        if trained:
            reasons.append((3, f"{plan.describe()}: not trainable: {trained}"))
            continue
        extra = sorted(shrink.kinds(graph)[0] - shrink.kinds(full_graph)[0])
        return result(
            row=graph_to_row(graph, config, id=name, split=""),
            other_ops=sorted(op for op in shrink.kinds(graph)[0] if op.startswith("other:")),
            **_predictability(refusal_reason(graph)),  # a bundled hypernetwork predicts the mini model, or why not
            extra_ops=extra,
            plan=plan.describe(),
            full_params=full_graph.num_params,
        )
    furthest = max(reasons, key=lambda r: r[0])[1] if reasons else "no plan"
    return result(error=f"not shrunk: {furthest}")


def _first_error(error: BaseException) -> str:
    """A one-line reason: a graphkit error's message, else the exception's type and message."""
    text = " ".join(str(error).split())[:300] or "(no message)"
    return text if isinstance(error, GraphkitError) else f"{type(error).__name__}: {text}"


def _failure(name: str, reason: str, started: float) -> dict[str, Any]:
    return {"model": name, "error": reason, "seconds": round(time.monotonic() - started, 2)}


def library_versions(zoo: Zoo) -> dict[str, str]:
    """The versions the zoo's content depends on: its library and torch."""
    return {package: importlib_metadata.version(package) for package in (zoo.library, "torch")}


@dataclass
class ZooResult:
    """What a zoo run did: the folder, candidates, records (distinct architectures), failures,
    candidates the library itself cannot build, models traced now and models whose outcome an
    earlier run had saved."""

    path: Path
    candidates: int
    records: int
    failed: int
    unbuildable: int
    traced: int
    resumed: int
    seconds: float
    coverage: float  # share of the candidates the library builds that trace, validate and hold no other: op
    report: dict[str, Any] = field(repr=False, default_factory=dict)


def generate_zoo(
    name: str,
    out: str | Path | None = None,
    *,
    workers: int = 1,
    resume: bool = False,
    limit: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    seed: int = 0,
) -> ZooResult:
    """Generate the zoo ``name`` (``zoo-vits``, ``zoo-decoders`` or their mini zoos
    ``zoo-vits-mini`` and ``zoo-decoders-mini``) into the dataset folder
    ``out`` (default: its name): every candidate built on meta and traced by ``workers``
    processes, one record per distinct architecture, ``report.json`` / ``report.md`` naming
    every model that failed and why. ``limit`` takes the first candidates only (a sample).
    ``resume`` keeps the outcomes an interrupted run saved. ``progress(done, total)`` is called
    after each model. Options and the folder are checked before anything is written; the folder
    is locked while the run writes it (a second run is refused, as recipes' are), and SIGTERM or
    Ctrl-C stops every tracing process and leaves the folder for ``resume``
    (:mod:`graphkit.datasets.runs`, :mod:`graphkit.workers`). A mini zoo holds out whole zoo families, chosen by
    ``seed`` (:func:`graphkit.datasets.shrink.held_out_zoo_families`); a full zoo's split is by fingerprint and
    takes no seed."""
    start = time.perf_counter()
    if name not in ZOOS:
        raise ZooError(f"unknown zoo {name!r}; known zoos: {', '.join(ZOOS)}")
    for option, value in (("--workers", workers), ("--num", limit)):  # the names graphkit generate gives them
        if value is not None and not is_count(value):
            raise ZooError(f"{option} must be an integer of at least 1, got {value!r}")
    zoo = ZOOS[name]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ZooError(f"--seed must be an integer of at least 0, got {seed!r}")
    if seed and not zoo.mini:
        raise ZooError(f"--seed applies to recipes and mini zoos, not to {name}: its split is by fingerprint")
    out = Path(out if out is not None else name)
    if out.exists() and not out.is_dir():
        raise ZooError(f"{out} exists and is not a folder")
    check_output_dir(out)
    check_dataset_folder(out)
    identity = {"zoo": name, "limit": limit, "libraries": library_versions(zoo), **({"seed": seed} if zoo.mini else {})}
    out.mkdir(parents=True, exist_ok=True)
    with folder_lock(out, ZooError), ended_by_sigterm():
        return _locked_run(zoo, out, identity, workers=workers, resume=resume, progress=progress, start=start)


def _locked_run(
    zoo: Zoo,
    out: Path,
    identity: dict[str, Any],
    *,
    workers: int,
    resume: bool,
    progress: Callable[[int, int], None] | None,
    start: float,
) -> ZooResult:
    """:func:`generate_zoo` once it holds the folder: refuse a folder holding another run, or
    any run without ``resume``; trace what no earlier run saved; assemble the dataset."""
    run_file = out / RUN_FILE
    if any(entry.name != LOCK_FILE for entry in out.iterdir()):
        recorded = json.loads(run_file.read_text()) if run_file.is_file() else None
        if not resume:
            raise ZooError(f"{out} already holds a dataset; pass --resume to finish it or choose another --out")
        if recorded != identity:
            raise ZooError(
                f"{out} holds a run made with {json.dumps(recorded)}; this run is {json.dumps(identity)}. "
                "Rerun with the same zoo, --limit and library versions, or choose another --out"
            )
    if resume and (out / "report.json").is_file() and not (out / CACHE_DIR).is_dir():  # finished before
        report = json.loads((out / "report.json").read_text())
        if "split" in report:
            report["split"] = _renamed(report["split"])
        return ZooResult(
            path=out,
            candidates=report["candidates"],
            records=report["records"],
            failed=len(report["failed"]),
            unbuildable=len(report.get("unbuildable", [])),
            traced=0,
            resumed=report["candidates"],
            seconds=time.perf_counter() - start,
            coverage=report["coverage"],
            report=report,
        )
    names = zoo.candidates()[: identity["limit"]]
    write_text_atomic(run_file, json.dumps(identity, indent=1) + "\n")
    outcomes: dict[str, dict[str, Any]] = {}
    for candidate in names:
        saved = _cache_path(out, candidate)
        if saved.is_file():
            try:
                outcomes[candidate] = _renamed(json.loads(saved.read_text()))
            except ValueError:  # a file cut short by a kill: trace that model again
                saved.unlink()
    resumed = len(outcomes)
    todo = [n for n in names if n not in outcomes]
    for outcome in _traced(zoo, out, todo, workers, MODEL_TIMEOUT):
        outcomes[outcome["model"]] = outcome
        if progress is not None:
            progress(len(outcomes), len(names))
    report = _assemble(zoo, out, [outcomes[n] for n in names], identity)
    if (out / CACHE_DIR).is_dir():  # with any temporary file a killed run left there
        shutil.rmtree(out / CACHE_DIR)
    return ZooResult(
        path=out,
        candidates=len(names),
        records=report["records"],
        failed=len(report["failed"]),
        unbuildable=len(report["unbuildable"]),
        traced=len(todo),
        resumed=resumed,
        seconds=time.perf_counter() - start,
        coverage=report["coverage"],
        report=report,
    )


#: keys an earlier graphkit wrote in a mini zoo's saved outcomes and its report's split, and their
#: names now: "family" alone names a graphkit model family (issue #47), a zoo's is a "zoo family"
RENAMED_KEYS = {
    "family": "zoo_family",
    "families": "zoo_families",
    "held_out_families": "held_out_zoo_families",
    "train_families": "train_zoo_families",
}


def _renamed(saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` (an outcome or a report's split, as a run wrote it) with the keys renamed since
    under their names now, so that ``resume`` finishes a run an earlier graphkit started."""
    return {RENAMED_KEYS.get(key, key): value for key, value in saved.items()}


def _assemble(zoo: Zoo, out: Path, outcomes: list[dict[str, Any]], identity: Mapping[str, Any]) -> dict[str, Any]:
    """Write the records (one per fingerprint, aliases in the config), the manifest, the card and
    the report; return the report."""
    by_fingerprint: dict[str, list[dict[str, Any]]] = {}
    for outcome in outcomes:
        if "row" in outcome:
            by_fingerprint.setdefault(outcome["row"]["fingerprint"], []).append(outcome)
    held_out = set(_held_out_zoo_families(zoo, outcomes, identity))
    rows = []
    for fingerprint, same in sorted(by_fingerprint.items(), key=lambda item: item[1][0]["model"]):
        first, aliases = same[0], [o["model"] for o in same[1:]]
        row = dict(first["row"])
        config = {**json.loads(row["config"]), **({"aliases": aliases} if aliases else {})}
        if zoo.mini:  # an architecture a held-out zoo family shares with another is held out with it
            in_eval = any(o["zoo_family"] in held_out for o in same)
        else:
            in_eval = int(hashlib.sha256(fingerprint.encode()).hexdigest(), 16) % EVAL_EVERY == 0
        row.update(
            config=json.dumps(config, sort_keys=True, separators=(",", ":")), split="eval" if in_eval else "train"
        )
        rows.append(row)
    for part in ("train", "eval"):
        write_shard([r for r in rows if r["split"] == part], out / "data" / shard_name(part, 0, 1))
    unbuildable = [{"model": o["model"], "reason": o["error"]} for o in outcomes if o.get("unbuildable")]
    failed = [
        {"model": o["model"], "reason": o["error"]} for o in outcomes if "error" in o and not o.get("unbuildable")
    ]
    other = [{"model": o["model"], "ops": o["other_ops"]} for o in outcomes if o.get("other_ops")]
    clean = sum(1 for o in outcomes if "row" in o and not o["other_ops"])
    traced = [o for o in outcomes if "row" in o]
    buildable = len(outcomes) - len(unbuildable)
    from graphkit.ghn.predict import reason_of  # noqa: PLC0415 - the hypernetwork is not the dataset's

    refusals = Counter(  # an outcome saved before reasons were: its error, the node it names left out
        o.get("predict_reason") or reason_of(o["predict"]) for o in traced if o["predict"]
    )
    lacking = Counter(op for o in traced for op in o.get("predict_missing", ()))
    report = {
        "zoo": zoo.name,
        "description": zoo.description,
        "libraries": identity["libraries"],
        "limit": identity["limit"],
        "candidates": len(outcomes),
        "buildable": buildable,
        "traced": len(traced),
        "clean": clean,
        "coverage": round(clean / max(buildable, 1), 4),
        "records": len(rows),
        "predictable": sum(1 for o in traced if o["predict"] is None),
        "predict_refusals": dict(refusals.most_common()),
        "predict_missing_ops": dict(lacking.most_common()),
        "unbuildable": unbuildable,
        "failed": failed,
        "other_ops": other,
        "aliases": {r["id"]: a for r in rows if (a := json.loads(r["config"]).get("aliases"))},
    }
    split: dict[str, Any] = {}
    if zoo.mini:
        zoo_families = sorted({o["zoo_family"] for o in traced})
        split = {
            "seed": identity["seed"],
            "zoo_families": len(zoo_families),
            "held_out_zoo_families": sorted(held_out),
            "train_zoo_families": [f for f in zoo_families if f not in held_out],
        }
        report.update(
            split=split,
            not_trainable=sum(1 for f in failed if "not trainable" in f["reason"]),
            timings={
                step: round(sum(o.get("timings", {}).get(step, 0.0) for o in outcomes), 1)
                for step in ("build", "trace", "shrink", "check")
            },
            model_timings={o["model"]: {**o.get("timings", {}), "seconds": o["seconds"]} for o in outcomes},
        )
    write_text_atomic(out / "report.json", json.dumps(report, indent=1) + "\n")
    write_text_atomic(out / "report.md", _report_markdown(report))
    finalize_dataset(out, name=zoo.name, info={**identity, "source": zoo.description, **split})
    return report


def _held_out_zoo_families(zoo: Zoo, outcomes: list[dict[str, Any]], identity: Mapping[str, Any]) -> list[str]:
    """A mini zoo's held-out zoo families, among those with a record, each of whose op kinds a
    training one has too; none for a full zoo."""
    if not zoo.mini:
        return []
    by_fingerprint: dict[str, tuple[set[str], set[str]]] = {}  # an architecture: its zoo families, its ops
    for outcome in outcomes:
        if "row" in outcome:
            owners, ops = by_fingerprint.setdefault(outcome["row"]["fingerprint"], (set(), set()))
            owners.add(outcome["zoo_family"])
            ops.update(outcome["row"]["node_op"])
    zoo_families = [owner for owners, _ in by_fingerprint.values() for owner in owners]
    return shrink.held_out_zoo_families(zoo_families, identity["seed"], by_fingerprint.values())


def _report_markdown(report: Mapping[str, Any]) -> str:
    """The report for people: coverage, then every model that failed or kept ops outside the
    vocabulary, one line each."""
    versions = ", ".join(f"{k} {v}" for k, v in report["libraries"].items())
    lines = [
        f"# {report['zoo']}: coverage report",
        "",
        f"{report['description'][0].upper()}{report['description'][1:]} ({versions}).",
        "",
        f"- candidates: {report['candidates']:,}",
        f"- built by the library: {report['buildable']:,}",
        f"- traced and validated: {report['traced']:,}",
        f"- with no `other:` op: {report['clean']:,} ({100 * report['coverage']:.1f}% of those built)",
        f"- records (distinct architectures): {report['records']:,}",
        f"- predictable by graphkit's bundled hypernetworks (`graphkit predict`): {report['predictable']:,} "
        f"of {report['traced']:,} traced",
        "",
        "## Why `graphkit predict` refuses the others",
        "",
        "By reason, most common first: the op kinds no bundled hypernetwork of the model's input task trained on "
        "(those the nearest one lacks), or the error.",
        "",
        *([f"- {reason}: {count:,}" for reason, count in report["predict_refusals"].items()] or ["None."]),
        "",
        "By op kind: how many refused models lack each (a model that lacks several counts under each; what one "
        "checkpoint trained on it would need):",
        "",
        *([f"- {op}: {count:,}" for op, count in report.get("predict_missing_ops", {}).items()] or ["None."]),
        "",
        "## The library cannot build them (not counted)",
        "",
        *([f"- `{f['model']}`: {f['reason']}" for f in report["unbuildable"]] or ["None."]),
        "",
        "## Could not be shrunk, or not trainable" if "split" in report else "## Could not be traced",
        "",
        *([f"- `{f['model']}`: {f['reason']}" for f in report["failed"]] or ["None."]),
        "",
        "## Traced with ops outside the vocabulary",
        "",
        *([f"- `{o['model']}`: {', '.join(o['ops'])}" for o in report["other_ops"]] or ["None."]),
        "",
    ]
    if "split" in report:
        split, timings = report["split"], report["timings"]
        lines += [
            "## Split by zoo family",
            "",
            f"{len(split['held_out_zoo_families'])} of {split['zoo_families']} zoo families (timm modules, model "
            f"types) held out whole (seed {split['seed']}), their records in the eval split: "
            f"{', '.join(split['held_out_zoo_families']) or 'none'}.",
            "",
            "## Seconds spent, all models together",
            "",
            f"Full model built on meta {timings['build']:,}, traced {timings['trace']:,}; shrunk variants built and "
            f"traced {timings['shrink']:,}; trainability checks {timings['check']:,}.",
            "",
        ]
    return "\n".join(lines)


__all__ = [
    "ZOOS",
    "Zoo",
    "ZooError",
    "ZooResult",
    "generate_zoo",
    "trace_zoo_model",
    "mini_outcome",
    "timm_modules",
    "TIMM_TRANSFORMER_MODULES",
]
