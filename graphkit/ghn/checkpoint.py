"""Hypernetwork checkpoints: a folder with ``model.safetensors`` (the weights) and ``config.json``
(the LoGAH config, the op vocabulary version, the ops and family it was trained on, how it was
trained). A training checkpoint adds ``optimizer.safetensors`` and ``trainer_state.json``.

Which bundled checkpoint predicts a model is chosen by what the model is, not by its family's
name (:func:`bundled_for`): its input task (``task`` in config.json: token ids or images) and
its ops (``trained_ops``: a checkpoint predicts no op it never trained on), then its family. A
Mistral, whose ops are all a LLaMA's, gets the one trained across transformers' decoders, which
trained on its family, at any vocabulary; a model with an op no checkpoint of its task trained
on is refused in one line naming that op.

A checkpoint folder is written beside its final place and renamed into it, so an interrupted save
leaves the previous checkpoint intact; in a folder that holds more (a training run's output, with
its metrics and ``checkpoint/``) each file is replaced atomically, config.json last.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import fields as dataclass_fields
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from graphkit.errors import CheckpointError, UntrainedOpError
from graphkit.families import FamilyTable
from graphkit.families.equivalents import PlainForm, plain_form
from graphkit.fileio import check_output_dir, marked_json, save_safetensors, write_folder, write_text_atomic
from graphkit.ghn.config import LOGAH_VARIANTS, LoGAHConfig, VariantError
from graphkit.ghn.model import LoGAH
from graphkit.ghn.space import TASK_READERS, input_task, model_family, space_distance
from graphkit.graph import ArchGraph
from graphkit.ops import OPS_VERSION, VOCABULARY_SIZES
from graphkit.params import memory_shortfall
from graphkit.training.state import first_line, load_tensors, read_json, save_optimizer_state
from graphkit.validation import is_count

#: the checkpoints that ship with graphkit, by the family whose own each is (``Family.bundled_ghn``),
#: a live view of the family registry; :func:`bundled_for` picks among all of them for a model
BUNDLED = FamilyTable("bundled_ghn")
#: the checkpoints that ship trained across many families (a mini zoo's train families: timm's
#: vision transformers, transformers' decoders), owned by none; :func:`bundled_for` weighs them
#: beside the families' own, so that a Swin or a Qwen3-MoE (its experts) finds one trained on its ops
ZOO_BUNDLED = ("logah-tiny-zoo-vision", "logah-tiny-zoo-decoders")
#: the checkpoints of ZOO_BUNDLED that predict a hand-written model (of no graphkit family) better
#: than the nearest family's, so :func:`bundled_for` puts them first there: the decoders' one, ahead
#: of the GPT-2 and LLaMA checkpoints on nanoGPT and a LLaMA written by hand at 300 fine-tuning
#: steps in every seed, at 100 in 11 of 12 (BENCHMARKS.md, "Hand-written decoders: which checkpoint"); not
#: the vision one, whose prediction of a hand-written ViT at 32 px trails its own init (2.35 against
#: 2.06 after 100 steps) where the ViT checkpoint's leads (1.08)
HAND_WRITTEN_FIRST = ("logah-tiny-zoo-decoders",)
FILES = {"model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json"}


def save_checkpoint(
    path: str | Path,
    ghn: LoGAH,
    info: Mapping[str, Any],
    *,
    optimizer: torch.optim.Optimizer | None = None,
    state: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``ghn`` (and, for resuming, the optimizer and trainer state) to the folder ``path``,
    atomically; ``info`` (family, trained ops, data, ...) goes into config.json. ``path`` may be
    ``.``: it names the folder it resolves to. The files are staged in a freshly made folder of
    a unique name (:func:`~graphkit.fileio.write_folder`), so no earlier file of any name is
    removed but the checkpoint's own."""
    path = Path(os.path.abspath(check_output_dir(path, "checkpoint folder", kind="hypernetwork")))
    in_place = path.is_dir() and bool(set(os.listdir(path)) - FILES)  # a training run's folder: replace our files only

    def write(staging: Path) -> None:
        weights = {k: v.detach().contiguous().cpu() for k, v in ghn.state_dict().items()}
        save_safetensors(weights, staging / "model.safetensors", "hypernetwork", {"format": "pt"})
        config = {"logah": ghn.config_dict(), "ops_version": OPS_VERSION, **info}
        # marked: the mark tells a training run's or a checkpoint's folder apart (fileio.folder_kind)
        (staging / "config.json").write_text(marked_json("hypernetwork", config, indent=2, sort_keys=True) + "\n")
        if optimizer is not None:
            save_optimizer_state(staging, optimizer, state or {})

    return write_folder(path, write, in_place=in_place)


def load_checkpoint(path: str | Path, *, variant: str | None = None, device: str | torch.device = "cpu") -> LoGAH:
    """The LoGAH stored in the folder ``path`` (or a bundled name such as ``logah-tiny-vits``),
    in eval mode, with its config.json as ``ghn.info``. CheckpointError if the folder is not a
    checkpoint, its vocabulary version is newer than this graphkit's (older ones read the ids
    they knew, which never change meaning), or ``variant`` is given
    and the checkpoint holds another one. The size config.json describes is checked against
    the weights file's header and the memory available before anything is allocated."""
    path = _locate(path)
    info = read_json(path / "config.json", "hypernetwork checkpoint")
    version = info.get("ops_version")
    if type(version) is not int or version not in VOCABULARY_SIZES:
        raise CheckpointError(
            f"{path}: trained with op vocabulary v{version}, but this graphkit reads v1 to "
            f"v{OPS_VERSION}; retrain it with `graphkit train-ghn`"
        )
    logah = info.get("logah")
    if isinstance(logah, dict):  # before v2, config.json did not say: the size of its version, append-only
        logah = {"num_ops": VOCABULARY_SIZES[version], **logah}
    config = _logah_config(path / "config.json", logah)
    if variant is not None:
        expected = LOGAH_VARIANTS.get(variant)
        if expected is None:
            raise CheckpointError(f"unknown LoGAH variant {variant!r}; known: {', '.join(LOGAH_VARIANTS)}")
        if (expected.hidden, expected.layers, expected.heads, expected.rank) != (
            config.hidden,
            config.layers,
            config.heads,
            config.rank,
        ):
            raise CheckpointError(
                f"{path}: holds LoGAH {info.get('variant', 'custom')} (d {config.hidden}, {config.layers} layers, "
                f"r {config.rank}), not {variant}"
            )
    _check_size(path / "model.safetensors", config)
    ghn = LoGAH(config)
    try:
        ghn.load_state_dict(load_tensors(path / "model.safetensors"))
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0]
        raise CheckpointError(f"{path / 'model.safetensors'}: does not match its config.json ({first})") from None
    ghn.info = info
    return ghn.to(device).eval()


def _logah_config(file: Path, fields: Any) -> LoGAHConfig:
    """The LoGAHConfig of config.json's ``logah`` section, every size checked (a positive
    integer, heads dividing hidden) so that a damaged or hand-edited file fails here in one line."""

    known = [f.name for f in dataclass_fields(LoGAHConfig)]
    if not isinstance(fields, dict):
        raise CheckpointError(
            f"{file}: not a graphkit hypernetwork checkpoint (no 'logah' section of {', '.join(known)})"
        )
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise CheckpointError(f"{file}: logah.{unknown[0]} is not a LoGAH setting; known: {', '.join(known)}")
    for name, value in fields.items():
        if name in ("tie_feature", "init_anchors", "level_head", "role_factors", "role_vectors", "role_prototypes"):
            if not isinstance(value, bool):
                raise CheckpointError(f"{file}: logah.{name} must be true or false; got {value!r}")
            continue
        if name == "table_gain":  # LoGAHConfig checks it (a positive number)
            continue
        least = 0 if name == "depth_buckets" else 1
        if name not in ("decoder", "roles", "role_key") and not is_count(value, least):
            raise CheckpointError(f"{file}: logah.{name} must be an integer >= {least}; got {value!r}")
    if not isinstance(fields.get("roles", []), list):
        raise CheckpointError(f"{file}: logah.roles must be a list of parameter names; got {fields['roles']!r}")
    try:
        config = LoGAHConfig(**fields)
    except VariantError as e:
        raise CheckpointError(f"{file}: logah.{e.field}: {e}") from None
    if config.hidden % config.heads:
        raise CheckpointError(f"{file}: logah.hidden {config.hidden} must be a multiple of logah.heads {config.heads}")
    return config


def _check_size(file: Path, config: LoGAHConfig) -> None:
    """Refuse, before allocating, a config whose LoGAH (measured on the meta device) holds another
    number of values than the weights file, or one too large for the memory available."""

    with torch.device("meta"):
        wanted = sum(t.numel() for t in LoGAH(config).state_dict().values())
    try:
        with safe_open(file, "pt") as f:
            stored = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"{file}: not a readable safetensors file ({first_line(e)})") from None
    if stored != wanted:
        raise CheckpointError(
            f"{file}: does not match its config.json (the file holds {stored:,} values, the config "
            f"describes a LoGAH of {wanted:,})"
        )
    needed = 2 * 4 * wanted  # the model and the loaded file, fp32
    limit = memory_shortfall(needed, torch.device("cpu"))
    if limit is not None:
        raise CheckpointError(
            f"{file}: a LoGAH of {wanted:,} parameters needs {needed / 1e9:.2f} GB to load but "
            f"{limit / 1e9:.2f} GB are available"
        )


def bundled_checkpoint(family: str | None) -> Path:
    """The folder of the checkpoint that ships for ``family`` (vit, gpt2 or llama): a dataset's
    own, for ``eval-ghn``. A model is matched by :func:`bundled_for`."""
    if family is None or family not in BUNDLED:
        raise CheckpointError(
            f"no bundled hypernetwork for {family or 'this'} models (bundled: {', '.join(BUNDLED)}); "
            "train one with `graphkit train-ghn` and pass --ghn"
        )
    return _locate(BUNDLED[family])


def checkpoint_task(info: Mapping[str, Any]) -> str | None:
    """The input task a checkpoint trained on (``"text"`` or ``"image"``): config.json's
    ``task``, else read off its ``trained_ops`` as :func:`~graphkit.ghn.space.input_task` reads
    a graph (an ``embedding`` reads tokens; a ``patch_embed`` or ``conv``, pixels), for
    checkpoints written before the task was recorded. None when neither tells."""
    task = info.get("task")
    if isinstance(task, str):
        return task
    tasks = {TASK_READERS[op] for op in info.get("trained_ops") or () if op in TASK_READERS}
    return tasks.pop() if len(tasks) == 1 else None


@functools.cache
def bundled_info(name: str) -> dict[str, Any]:
    """The config.json of the bundled checkpoint ``name``, read once per process (the weights
    are not loaded)."""
    return read_json(_locate(name) / "config.json", "hypernetwork checkpoint")


def bundled_names() -> list[str]:
    """Every bundled checkpoint's name, once: the families' own (one family may share another's),
    then those trained across families (``ZOO_BUNDLED``)."""
    return list(dict.fromkeys([*BUNDLED.values(), *ZOO_BUNDLED]))


def _missing_ops(info: Mapping[str, Any], ops: AbstractSet[str]) -> tuple[str, ...]:
    trained = info.get("trained_ops")
    return () if trained is None else tuple(sorted(ops - set(trained)))


def knows_every_op(info: Mapping[str, Any], graph: ArchGraph) -> bool:
    """Whether a checkpoint of config ``info`` trained on every op kind ``graph`` has (one
    without a record of them: on all)."""
    return not _missing_ops(info, {node.op for node in graph.nodes})


def plain_for(info: Mapping[str, Any], graph: ArchGraph, form: PlainForm | None = None) -> PlainForm | None:
    """The plain form (:func:`~graphkit.families.equivalents.plain_form`; ``form`` when the
    caller has it) that a checkpoint of config ``info`` predicts ``graph``'s model as: the form,
    when the checkpoint trained on every op kind it has (the bundled ViT hypernetwork never saw
    layer scale's ``scale``, which the plain ViT lacks). None otherwise."""
    form = form if form is not None else plain_form(graph)
    return form if form is not None and not _missing_ops(info, form.ops) else None


def hand_written_first(graph: ArchGraph, name: str) -> bool:
    """Whether :func:`bundled_for` puts the bundled checkpoint ``name`` first for ``graph`` as a
    hand-written model's: one of ``HAND_WRITTEN_FIRST``, and a graph of no graphkit family (the
    tracer's family ``custom``). ``graphkit predict`` says so when it is the one chosen."""
    return graph.meta.get("family") == "custom" and name in HAND_WRITTEN_FIRST


def bundled_for(graph: ArchGraph) -> Path:
    """The folder of the bundled checkpoint that predicts ``graph``: among those trained on its
    input task (:func:`checkpoint_task` against :func:`~graphkit.ghn.space.input_task`; all of
    them when either is unknown) and on every op kind it has, its own family's (``BUNDLED``);
    for a hand-written model (no family), another family's before one trained across families
    (``ZOO_BUNDLED``), except ``HAND_WRITTEN_FIRST``'s, first; for a library's model of another
    family, another family's only where it trained on that family, else one trained across
    families (a Mistral, at 256 tokens or its own 32,000; timm's ConViT);
    then the one whose training space it lies nearest
    (:func:`~graphkit.ghn.space.space_distance`), else the first registered. Works for
    checkpoints added later as for today's: each is judged by its config.json alone.

    UntrainedOpError, in one line, when none qualifies: the op kinds the nearest one
    (fewest missing ops) never trained on, and which checkpoints exist."""
    names = bundled_names()
    if not names:
        raise CheckpointError("no hypernetwork is bundled; train one with `graphkit train-ghn` and pass --ghn")
    infos = {name: bundled_info(name) for name in names}
    task = input_task(graph)
    same_task = [n for n in names if task is None or checkpoint_task(infos[n]) in (None, task)]
    candidates = same_task or names
    ops = {node.op for node in graph.nodes}
    # a model that computes a plainer one of its family (layer scale's gains at 1) is predicted as that
    # one (graphkit.ghn.grow), and misses only the ops that one has
    form = plain_form(graph)
    missing = {name: _missing_ops(infos[name], form.ops if form is not None else ops) for name in candidates}
    own = BUNDLED.get(str(graph.meta.get("family")))
    family = model_family(graph)

    def trained_for(name: str) -> bool:
        """Whether checkpoint ``name`` trained on the model's family."""
        space = infos[name].get("space")
        return family in ((space.get("families") if isinstance(space, Mapping) else None) or ())

    def rank(name: str) -> int:
        """HAND_WRITTEN_FIRST's for a model of no family, then the model's own family's (measured
        on its held-out architectures). A hand-written model gets the nearest family's before one
        trained across families (a many-family pool's training stays near the unigram loss or
        chance, issue #45); a library's model of another family gets another family's only where
        that one trained on the model's family. Measured on 7 decoders at 256 tokens and 4 at
        their own 32,000-50,257, and on ConViT and NaFlexViT: the one trained across families is
        lower after 300 fine-tuning steps in every seed. At their own vocabularies the LLaMA and
        GPT-2 checkpoints start a Mistral, a Phi-3 and a GPT-Neo 2.4-4.4 nats lower at step 0, a
        head start gone by step 100 (BENCHMARKS.md, "Library models: which checkpoint")."""
        across = name in ZOO_BUNDLED
        if hand_written_first(graph, name):
            return 0
        if name == own:
            return 1
        if family is None:
            return 3 if across else 2
        if not across and trained_for(name):
            return 2
        return 3 if across else 4

    best = min(candidates, key=lambda n: (len(missing[n]), rank(n), space_distance(infos[n], graph)))
    if missing[best]:
        by_task: dict[str, list[str]] = {}
        for name in names:
            by_task.setdefault(checkpoint_task(infos[name]) or "any input", []).append(name)
        listed = "; ".join(f"{kind}: {', '.join(group)}" for kind, group in by_task.items())
        kinds = ", ".join(missing[best])
        raise UntrainedOpError(
            f"no bundled hypernetwork was trained on every op of this {task or ''}{' ' if task else ''}model: "
            f"the nearest, {best}, never saw {kinds} (bundled: {listed}); train one with `graphkit train-ghn` "
            "on models with these ops and pass --ghn",
            missing[best],
        )
    return _locate(best)


def check_graph(ghn: LoGAH, graph: ArchGraph, plain: bool = False) -> None:
    """Refuse a graph with an op the hypernetwork never saw in training (its prediction for that
    node would be untrained noise); a hypernetwork without training info accepts every graph.
    ``plain`` accepts, too, a graph whose plain form has none such (:func:`plain_for`), for a
    caller that predicts the model as that form (predict, through its twin)."""
    info = getattr(ghn, "info", {})
    if knows_every_op(info, graph):
        return
    form = plain_for(info, graph)
    if plain and form is not None:
        return
    missing = _missing_ops(info, {node.op for node in graph.nodes})
    unseen = next(node for node in graph.nodes if node.op in missing)
    raise UntrainedOpError(
        f"node {unseen.name!r} has op {unseen.op!r}, which this hypernetwork was not trained on "
        f"(trained on: {', '.join(sorted(info['trained_ops']))})"
        + (f"; predicted through a twin (grow) it is: its twin {' and '.join(form.parts)}" if form else ""),
        missing,
    )


def record_evaluation(
    path: str | Path, summary: Mapping[str, Any], *, dataset: str, split: str, data: str
) -> dict[str, Any]:
    """Store a held-out evaluation (``evaluate.summarize``'s summary) in the checkpoint's
    config.json, atomically, so that the checkpoint carries its measured effect; returns the
    record. ``describe`` reads it back. With keep_init rows, ``keep_init`` holds that start's
    scores: step 0, the final step, its verdict against random and its ``wins`` at every horizon
    (against each other start), what ``predict`` writes for a family that keeps its init."""
    path = _locate(path)
    final = str(summary["horizons"][-1])
    record = {
        "dataset": dataset,
        "split": split,
        "data": data,
        "archs": summary["archs"],
        "horizons": summary["horizons"],
        "steps": int(final),
        "wins": summary["wins"],
        "residual_scale": bool(summary.get("residual_scale", False)),
        "warmup": summary.get("warmup", 0),
        "predicted_beats_random": summary["predicted_beats_random"],
        "predicted_alone": {"loss": summary["predicted"]["loss_0"], "accuracy": summary["predicted"]["accuracy_0"]},
        "final": {
            init: {"loss": summary[init]["loss"], "accuracy": summary[init]["accuracy"]}
            for init in ("predicted", "random", "orthogonal")
            if init in summary
        },
    }
    if "predicted_beats_orthogonal" in summary:  # eval-ghn --inits without orthogonal leaves it out
        record["predicted_beats_orthogonal"] = summary["predicted_beats_orthogonal"]
    if "keep_init" in summary:  # what predict writes for a family that keeps its init (GPT-2)
        record["keep_init"] = {
            "alone": {"loss": summary["keep_init"]["loss_0"], "accuracy": summary["keep_init"]["accuracy_0"]},
            "beats_random": summary["keep_init_beats_random"],
            "final": {"loss": summary["keep_init"]["loss"], "accuracy": summary["keep_init"]["accuracy"]},
            "shrink": summary.get("shrink", 1.0),
        }
        if "keep_init_wins" in summary:  # at every horizon, as ``wins`` holds the prediction alone's
            record["keep_init"]["wins"] = summary["keep_init_wins"]
    config = read_json(path / "config.json", "hypernetwork checkpoint")
    config["evaluation"] = record
    try:
        write_text_atomic(path / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    except OSError as e:
        raise CheckpointError(
            f"{path / 'config.json'}: cannot record the evaluation there ({e.strerror or e})"
        ) from None
    return record


def _steps(count: Any) -> str:
    """``count`` steps, in words: "1 step", "1500 steps"."""
    return f"{count} step" if count == 1 else f"{count} steps"


def describe(ghn: LoGAH, keep_init: bool = False, shrink: float = 1.0) -> str:
    """One line on what a checkpoint was trained on and its recorded held-out effect, e.g.
    "LoGAH-tiny trained on vits-digits with digits (400 steps); held out: 8 architectures, the
    predicted parameters alone 0.62 accuracy; after 300 fine-tuning steps they beat random on 88%
    and orthogonal on 50%"; a checkpoint trained further names each stage ("trained on vits-digits
    with digits (3500 steps), then on vits-digits-mixed with digits (3000 steps)"). With
    ``keep_init`` (predict adds the prediction onto the model's own init, times ``shrink``), the
    recorded effect of that instead, or, where none was recorded with that ``shrink``, a note that
    the scores are the prediction alone's."""
    info = getattr(ghn, "info", {})
    stages = info.get("stages")  # a checkpoint trained further on another dataset: each run, in order
    history = [stage for stage in stages if isinstance(stage, Mapping)] if isinstance(stages, list) else []
    history = history or [info]
    trained = f"LoGAH-{info.get('variant', 'custom')} trained on " + ", then on ".join(
        f"{Path(str(stage.get('dataset', '?'))).name} with {stage.get('data', '?')} ({_steps(stage.get('steps', '?'))})"
        for stage in history
    )
    record = info.get("evaluation")
    if record is None:
        return f"{trained}; no held-out evaluation recorded (graphkit eval-ghn --record measures one)"
    try:
        scaled = ", residual branches scaled as the family's init does" if record.get("residual_scale") else ""
        held_out = f"{trained}; held out: {record['archs']} {Path(record['dataset']).name} architectures{scaled}"
        times = "" if shrink == 1 else f" x {shrink:g}"
        steps = f"{record['steps']} fine-tuning steps" + (
            f" (a {record['warmup']}-step warm-up)" if record.get("warmup") else ""
        )
        if keep_init and "keep_init" in record and record["keep_init"].get("shrink", 1.0) == shrink:
            added = record["keep_init"]
            return (
                f"{held_out}, the prediction{times} added onto their init {added['alone']['accuracy']:.2f} accuracy "
                f"(loss {added['alone']['loss']:.2f}); after {steps} it beats random on "
                f"{100 * added['beats_random']:.0f}%"
            )
        alone = record["predicted_alone"]
        return (
            f"{held_out}, the predicted parameters alone {alone['accuracy']:.2f} accuracy (loss {alone['loss']:.2f}); "
            f"after {steps} they beat random on "
            f"{100 * record['predicted_beats_random']:.0f}%"
            + (
                f" and orthogonal on {100 * record['predicted_beats_orthogonal']:.0f}%"
                if "predicted_beats_orthogonal" in record
                else ""
            )
        ) + (
            f"; measured on the prediction alone, not on the prediction{times} added onto the init as predict "
            "writes it here (graphkit eval-ghn --inits predicted,random,keep_init"
            f"{'' if shrink == 1 else f' --shrink {shrink:g}'} --record measures that)"
            if keep_init
            else ""
        )
    except (KeyError, TypeError, ValueError):  # a hand-edited or damaged config.json: the weights are still usable
        return f"{trained}; its recorded evaluation is unreadable (graphkit eval-ghn --record measures it again)"


def _locate(path: str | Path) -> Path:
    folder = Path(path)
    if not folder.exists() and str(path) in bundled_names():
        folder = Path(str(resources.files("graphkit.ghn") / "pretrained" / str(path)))
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        raise CheckpointError(
            f"{path}: no hypernetwork checkpoint there (expected config.json and model.safetensors; "
            f"bundled: {', '.join(bundled_names())})"
        )
    return folder
