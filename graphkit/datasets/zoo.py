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

import hashlib
import inspect
import json
import multiprocessing
import os
import re
import shutil
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch
from torch import nn

from graphkit.datasets.runs import LOCK_FILE, folder_lock
from graphkit.datasets.store import (
    RUN_FILE,
    check_dataset_folder,
    finalize_dataset,
    graph_to_row,
    shard_name,
    write_shard,
)
from graphkit.errors import GraphkitError, NeedsValuesError, UnusedParameterError
from graphkit.fileio import check_output_dir, write_text_atomic
from graphkit.graph import ArchGraph
from graphkit.tracing import trace
from graphkit.tracing.inputs import example_inputs_for, text_config
from graphkit.validation import is_count
from graphkit.workers import ended_by_sigterm, worker_started

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


class ZooError(GraphkitError):
    """A zoo cannot be generated: an unknown zoo, bad options or an output folder in the way."""


@dataclass(frozen=True)
class Zoo:
    """One zoo: which library it reads, how it lists its models and builds one on meta, and
    the config a record stores (``build_zoo_model`` rebuilds the model from it)."""

    name: str
    library: str
    description: str
    candidates: Callable[[], list[str]]
    config: Callable[[str], dict[str, Any]]


def _timm_candidates() -> list[str]:
    import timm  # noqa: PLC0415 - the zoo's library, loaded when it is used

    return sorted({name for module in TIMM_TRANSFORMER_MODULES for name in timm.list_models(module=module)})


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


ZOOS: dict[str, Zoo] = {
    "zoo-vits": Zoo(
        "zoo-vits",
        "timm",
        "every vision-transformer architecture of timm's registry, built with pretrained=False",
        _timm_candidates,
        lambda name: {"family": "timm", "model": name},
    ),
    "zoo-decoders": Zoo(
        "zoo-decoders",
        "transformers",
        "every decoder-only causal-LM architecture of transformers, at its reference config",
        _decoder_candidates,
        lambda name: {"family": "transformers", "model_type": name},
    ),
}
#: the ``family`` of zoo records, by library: ``build_zoo_model`` reads them
ZOO_FAMILIES = ("timm", "transformers")


def build_zoo_model(config: Mapping[str, Any], device: str | torch.device = "meta") -> nn.Module:
    """The model a zoo record's ``config`` names, on ``device`` (weights as the library
    initialises them; on meta none are allocated): ``timm.create_model(model,
    pretrained=False)``, or transformers' causal LM of ``model_type`` at its config class's
    defaults. Raises :class:`ZooError` naming the model when its library cannot build it."""
    family = config.get("family")
    name = config.get("model") if family == "timm" else config.get("model_type")
    if family not in ZOO_FAMILIES or not isinstance(name, str):
        raise ZooError(
            f"not a zoo config: {dict(config)!r}; zoo configs name a timm model or a transformers model_type"
        )
    try:
        with warnings.catch_warnings(), torch.device(device):
            warnings.simplefilter("ignore")  # libraries warn about their own defaults while building
            if family == "timm":
                import timm  # noqa: PLC0415

                return timm.create_model(name, pretrained=False).eval()
            from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415
            from transformers.utils import logging as hf_logging  # noqa: PLC0415

            from graphkit.compat import skip_weight_init  # noqa: PLC0415

            verbosity = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()  # a reference config's own inconsistencies are not the user's
            try:
                reference = AutoConfig.for_model(name)
                if str(device) != "meta":
                    return AutoModelForCausalLM.from_config(reference).eval()
                with skip_weight_init():  # nothing to fill on meta; initialisation is most of a build
                    model = AutoModelForCausalLM.from_config(reference)
                model.tie_weights()
                return model.eval()
            finally:
                hf_logging.set_verbosity(verbosity)
    except Exception as e:  # whatever the library raises, named with the model it was building
        raise ZooError(f"{family} cannot build {name!r}: {type(e).__name__}: {_first_line(e)}") from e


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return " ".join(text.splitlines()[0].split()) if text else "(no message)"


def _outcome(zoo_name: str, name: str) -> dict[str, Any]:
    """Worker: build and trace one model; its row (without id and split), or why not."""

    start = time.perf_counter()
    config = ZOOS[zoo_name].config(name)
    try:
        model = build_zoo_model(config)
    except ZooError as e:  # the library cannot build its own model: reported, not counted against the tracer
        return {"model": name, "error": str(e), "unbuildable": True, "seconds": round(time.perf_counter() - start, 2)}
    try:
        try:
            graph = _trace_all_branches(model)
        except NeedsValuesError:
            # a mask buffer made in __init__ (GPT-1), a tensor made on the CPU in forward (XLNet):
            # a model small enough is built with values
            if sum(p.numel() for p in model.parameters()) > CPU_BUILD_LIMIT:
                raise
            graph = _trace_all_branches(build_zoo_model(config, "cpu"))
    except Exception as e:  # every failure is a report line, never the end of the run
        reason = _first_line(e) if isinstance(e, GraphkitError) else f"{type(e).__name__}: {_first_line(e)}"
        return {"model": name, "error": reason, "seconds": round(time.perf_counter() - start, 2)}
    from graphkit.ghn.predict import refusal_reason  # noqa: PLC0415

    others = sorted({n.op for n in graph.nodes if n.op.startswith("other:")})
    refusal = refusal_reason(graph)  # None: a bundled hypernetwork predicts it
    return {
        "model": name,
        "row": graph_to_row(graph, config, id=name, split=""),
        "other_ops": others,
        "predict": None if refusal is None else refusal.message,
        "predict_reason": None if refusal is None else refusal.reason,
        "predict_missing": [] if refusal is None else list(refusal.missing),
        "seconds": round(time.perf_counter() - start, 2),
    }


#: tokens in the inputs that retry a model whose short inputs leave a branch untaken
LONG_SEQUENCE = 256


def _trace_all_branches(model: nn.Module) -> ArchGraph:
    """``trace(model)``; where a parameter goes unused, once more with inputs that take more of
    the forward: ``LONG_SEQUENCE`` tokens (DeepSeek-V4 compresses its keys every 128 tokens) and,
    where the forward takes them, encoder states for its cross-attention (TrOCR's decoder)."""
    try:
        return trace(model)
    except UnusedParameterError:
        args, kwargs = example_inputs_for(model, length=LONG_SEQUENCE)
        tokens = kwargs.get("input_ids")
        if tokens is None:
            raise
        config = text_config(getattr(model, "config", None))
        width = getattr(config, "cross_attention_hidden_size", None) or getattr(config, "hidden_size", None)
        if "encoder_hidden_states" in inspect.signature(model.forward).parameters and width:
            dtype = next(model.parameters()).dtype
            kwargs["encoder_hidden_states"] = torch.zeros(tokens.shape[0], 4, width, dtype=dtype, device=tokens.device)
        return trace(model, (args, kwargs))


def _cache_path(out: Path, name: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    return out / CACHE_DIR / f"{safe}-{hashlib.sha1(name.encode()).hexdigest()[:8]}.json"


def _child(zoo_name: str, name: str, send: Connection, run: int) -> None:
    """A tracing process of the run whose process id is ``run``: one model's outcome, sent back
    whole."""
    worker_started(run)
    send.send(_outcome(zoo_name, name))
    send.close()


def _traced(zoo: Zoo, out: Path, names: list[str], workers: int, timeout: float) -> Iterator[dict[str, Any]]:
    """Every name's outcome, each traced in a process of its own, ``workers`` at a time, and saved
    as it arrives. A process is forked per model so that one that runs past ``timeout`` seconds,
    or dies (a library's own crash), is stopped and becomes a report line instead of stopping
    the run."""
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # meta tensors do no arithmetic; the processes share the cores
    if names:
        _warm_up()
    pending, running = list(names), {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                name = pending.pop(0)
                receive, send = context.Pipe(duplex=False)
                process = context.Process(target=_child, args=(zoo.name, name, send, os.getpid()), daemon=True)
                process.start()
                send.close()
                running[receive] = (process, name, time.monotonic())
            finished = []
            for receive in wait(list(running), timeout=1.0):
                process, name, started = running.pop(receive)
                try:
                    finished.append(receive.recv())
                except EOFError:  # it died before sending
                    process.join()
                    finished.append(_failure(name, f"the tracing process died (exit code {process.exitcode})", started))
                process.join()
                receive.close()
            for receive, (process, name, started) in list(running.items()):
                if time.monotonic() - started > timeout:
                    process.kill()
                    process.join()
                    receive.close()
                    del running[receive]
                    finished.append(_failure(name, f"not traced within {timeout:.0f} s", started))
            for outcome in finished:
                write_text_atomic(_cache_path(out, outcome["model"]), json.dumps(outcome))
                yield outcome
    finally:
        for process, _, _ in running.values():
            process.kill()
            process.join()
        torch.set_num_threads(threads)


def _warm_up() -> None:
    """What every tracing process would otherwise pay again, paid once before they fork: the
    tracer's and the hypernetwork's imports, torch.export's one-time set-up (one tiny export)
    and the bundled hypernetworks that ``prediction_refusal`` reads."""
    from graphkit.families import build_model  # noqa: PLC0415
    from graphkit.ghn.checkpoint import BUNDLED, bundled_info  # noqa: PLC0415
    from graphkit.ghn.predict import bundled_hypernetwork  # noqa: PLC0415

    trace(build_model({"family": "gpt2", "num_layers": 1, "hidden": 8, "heads": 1, "context": 8}))
    for name in set(BUNDLED.values()):
        bundled_info(name)
        bundled_hypernetwork(name)


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
) -> ZooResult:
    """Generate the zoo ``name`` (``zoo-vits`` or ``zoo-decoders``) into the dataset folder
    ``out`` (default: its name): every candidate built on meta and traced by ``workers``
    processes, one record per distinct architecture, ``report.json`` / ``report.md`` naming
    every model that failed and why. ``limit`` takes the first candidates only (a sample).
    ``resume`` keeps the outcomes an interrupted run saved. ``progress(done, total)`` is called
    after each model. Options and the folder are checked before anything is written; the folder
    is locked while the run writes it (a second run is refused, as recipes' are), and SIGTERM or
    Ctrl-C stops every tracing process and leaves the folder for ``resume``
    (:mod:`graphkit.datasets.runs`, :mod:`graphkit.workers`)."""
    start = time.perf_counter()
    if name not in ZOOS:
        raise ZooError(f"unknown zoo {name!r}; known zoos: {', '.join(ZOOS)}")
    for option, value in (("--workers", workers), ("--num", limit)):  # the names graphkit generate gives them
        if value is not None and not is_count(value):
            raise ZooError(f"{option} must be an integer of at least 1, got {value!r}")
    zoo = ZOOS[name]
    out = Path(out if out is not None else name)
    if out.exists() and not out.is_dir():
        raise ZooError(f"{out} exists and is not a folder")
    check_output_dir(out)
    check_dataset_folder(out)
    identity = {"zoo": name, "limit": limit, "libraries": library_versions(zoo)}
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
                outcomes[candidate] = json.loads(saved.read_text())
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


def _assemble(zoo: Zoo, out: Path, outcomes: list[dict[str, Any]], identity: Mapping[str, Any]) -> dict[str, Any]:
    """Write the records (one per fingerprint, aliases in the config), the manifest, the card and
    the report; return the report."""
    by_fingerprint: dict[str, list[dict[str, Any]]] = {}
    for outcome in outcomes:
        if "row" in outcome:
            by_fingerprint.setdefault(outcome["row"]["fingerprint"], []).append(outcome)
    rows = []
    for fingerprint, same in sorted(by_fingerprint.items(), key=lambda item: item[1][0]["model"]):
        first, aliases = same[0], [o["model"] for o in same[1:]]
        row = dict(first["row"])
        config = {**json.loads(row["config"]), **({"aliases": aliases} if aliases else {})}
        held_out = int(hashlib.sha256(fingerprint.encode()).hexdigest(), 16) % EVAL_EVERY == 0
        row.update(
            config=json.dumps(config, sort_keys=True, separators=(",", ":")), split="eval" if held_out else "train"
        )
        rows.append(row)
    for split in ("train", "eval"):
        write_shard([r for r in rows if r["split"] == split], out / "data" / shard_name(split, 0, 1))
    unbuildable = [{"model": o["model"], "reason": o["error"]} for o in outcomes if o.get("unbuildable")]
    failed = [
        {"model": o["model"], "reason": o["error"]} for o in outcomes if "error" in o and not o.get("unbuildable")
    ]
    other = [{"model": o["model"], "ops": o["other_ops"]} for o in outcomes if o.get("other_ops")]
    clean = sum(1 for o in outcomes if "row" in o and not o["other_ops"])
    traced = [o for o in outcomes if "row" in o]
    buildable = len(outcomes) - len(unbuildable)
    refusals = Counter(  # an outcome saved before reasons were: its error, the node it names left out
        o.get("predict_reason") or re.sub(r"node '[^']*'", "node '...'", o["predict"]) for o in traced if o["predict"]
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
    write_text_atomic(out / "report.json", json.dumps(report, indent=1) + "\n")
    write_text_atomic(out / "report.md", _report_markdown(report))
    finalize_dataset(out, name=zoo.name, info={**identity, "source": zoo.description})
    return report


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
        "## Could not be traced",
        "",
        *([f"- `{f['model']}`: {f['reason']}" for f in report["failed"]] or ["None."]),
        "",
        "## Traced with ops outside the vocabulary",
        "",
        *([f"- `{o['model']}`: {', '.join(o['ops'])}" for o in report["other_ops"]] or ["None."]),
        "",
    ]
    return "\n".join(lines)


__all__ = ["ZOOS", "Zoo", "ZooError", "ZooResult", "generate_zoo", "build_zoo_model", "TIMM_TRANSFORMER_MODULES"]
