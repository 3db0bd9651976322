"""Is the hypernetwork worth using? Held-out architectures, three initialisations each, and two
more on request:

- ``predicted``: the hypernetwork's parameters;
- ``keep_init``: the framework's own initialisation plus the prediction (the rule of
  :mod:`graphkit.ghn.keep_init`, ``predict(keep_init=True)``), drawn from the same seed as
  ``random``, so that it and ``random`` differ by the prediction alone;
- ``random``: the framework's own initialisation (timm's, Hugging Face's);
- ``orthogonal``: random, then every weight with 2+ dimensions orthogonal (GHN papers' ORTHINIT);
- ``selected``: weight selection (:mod:`graphkit.ghn.selection`) from the smallest architecture
  of the dataset's train split, trained directly on the same data for ``select_steps`` steps
  (default: as many as the evaluation fine-tunes), the budget a user without a hypernetwork
  spends to have a model of the family to select from.

Each model is fine-tuned for ``steps`` AdamW steps on the same training batches whatever its
initialisation and scored on fixed held-out batches at the horizons 0, 100 and ``steps``; a
model with BatchNorm first gets its running statistics from the inputs of its first
``NORM_BATCHES`` training batches, whatever its initialisation (:func:`estimate_batch_norm`). A head
start that fine-tuning erases is no better initialisation, so the verdicts ("beats random",
"beats orthogonal": a lower held-out loss) are taken at the final step, after hundreds of steps
(300 by default), where the baselines have learned; the summary also gives them at every horizon.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import as_completed
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch
from rich.progress import Progress
from torch import nn

from graphkit.compiler import load_params
from graphkit.errors import CalibrationError, EvalError
from graphkit.families import build_model
from graphkit.fileio import marked_json, save_figure
from graphkit.ghn.calibrate import balance_logits, balanced_head, calibrate, check_balancing_data
from graphkit.ghn.checkpoint import UntrainedOpError, bundled_checkpoint, check_graph, load_checkpoint
from graphkit.ghn.grow import lr_scale, twin_of
from graphkit.ghn.keep_init import add_prediction, check_shrink, default_shrink, shrunk
from graphkit.ghn.model import LoGAH
from graphkit.ghn.pool import ArchPool, graph_for
from graphkit.ghn.predict import predicted_params, should_scale_residuals
from graphkit.ghn.selection import select_params
from graphkit.training.data import default_source, load_source
from graphkit.training.loop import estimate_batch_norm, up_train
from graphkit.validation import check_counts, check_device, check_flag, check_number, check_seed, default_device
from graphkit.workers import ended_by_sigterm, worker_pool

INITS = ("predicted", "random", "orthogonal", "selected", "keep_init")
#: what every evaluation compares: the prediction and the model's own init (its constructor's)
REQUIRED_INITS = ("predicted", "random")
#: what an evaluation compares unless told; ``selected`` (it trains a model first) and ``keep_init`` on request
DEFAULT_INITS = ("predicted", "random", "orthogonal")
#: training batches whose inputs give a BatchNorm model its running statistics before step 0
NORM_BATCHES = 4


@dataclass
class EvalConfig:
    """What to evaluate and how long to fine-tune."""

    dataset: str
    ghn: str | None = None  # checkpoint folder; None: the bundled one for the dataset's family
    split: str = "eval"
    data: str | None = None  # None: the family's bundled data
    archs: int = 16  # at most this many distinct architectures
    steps: int = 300  # fine-tuning steps: the verdicts are taken after the last
    batch_size: int = 32
    seq_len: int = 64
    lr: float = 3e-4  # AdamW; ViTs trained from scratch diverge at 1e-3 without warm-up
    warmup: int = 0  # steps of linear lr warm-up, every initialisation alike (graphkit.training.loop.warmup_factor)
    eval_batches: int = 4
    seed: int = 0
    device: str | None = None  # None: $GRAPHKIT_DEVICE, else cuda if available, else cpu
    residual_scale: bool | None = None  # scale residual branches as the family's init does; None: when it does (GPT-2)
    calibrate: bool = (
        False  # calibrate the predicted stream to the init's (graphkit.ghn.calibrate), as predict(calibrate=True)
    )
    # every start's output-layer bias shifted so that its classes are predicted equally often on average
    # over the first training batches' inputs, their labels unused (graphkit.ghn.calibrate.balance_logits);
    # image classifiers only
    balance_logits: bool = False
    workers: int | None = None  # CPU processes fine-tuning side by side; None: one per core (see evaluate)
    inits: tuple[str, ...] = DEFAULT_INITS  # REQUIRED_INITS and any of INITS's others
    select_steps: int | None = None  # training steps of the model selected from; None: ``steps``
    shrink: float | None = None  # keep_init adds the prediction times this (W0 + shrink P); None: as predict does
    lr_scale: bool = True  # fine-tune what a twin resized or grew at its lr factor (graphkit.ghn.grow.lr_scale)

    def __post_init__(self) -> None:
        self.inits = tuple(self.inits)
        unknown = [i for i in self.inits if i not in INITS]
        if unknown or not set(REQUIRED_INITS) <= set(self.inits) or len(set(self.inits)) != len(self.inits):
            raise EvalError(
                f"inits {','.join(map(str, self.inits))}: must name predicted and random, and may add orthogonal, "
                f"selected and keep_init, each once; accepted: {', '.join(INITS)}"
            )
        if self.select_steps is not None:
            check_counts(self, ("select_steps",), EvalError)
        check_counts(self, ("steps", "archs", "batch_size", "seq_len", "eval_batches"), EvalError)
        check_counts(self, ("warmup",), EvalError, least=0)
        if self.workers is not None:
            check_counts(self, ("workers",), EvalError)
        check_number("lr", self.lr, EvalError, positive=True)
        check_seed(self.seed, EvalError)
        check_device(self.device, EvalError)
        check_flag("calibrate", self.calibrate, EvalError)
        check_flag("balance_logits", self.balance_logits, EvalError)
        check_flag("lr_scale", self.lr_scale, EvalError)
        if self.shrink is not None:
            self.shrink = check_shrink(self.shrink, EvalError)
            if "keep_init" not in self.inits:
                raise EvalError(f"shrink {self.shrink:g} scales the keep_init row; add keep_init to inits")


def initialise(model: nn.Module, init: str, predicted: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """Apply ``init`` (see :data:`INITS`) to a model built with the framework's initialisation;
    ``predicted`` holds the parameters of ``predicted``, ``keep_init`` (the same prediction) and
    ``selected``."""

    if init in ("predicted", "selected", "keep_init"):
        if predicted is None:
            raise ValueError(f"initialisation {init!r} needs the parameters made for the model")
        # parameters made for this model (the hypernetwork's or the selection's), or, for keep_init,
        # the framework's init kept and the prediction added (graphkit.ghn.keep_init)
        (add_prediction if init == "keep_init" else load_params)(model, predicted)
    elif init == "orthogonal":
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() >= 2:
                    nn.init.orthogonal_(param.view(param.shape[0], -1))
    elif init != "random":
        raise ValueError(f"unknown initialisation {init!r}; accepted: {', '.join(INITS)}")
    return model


def family_turns(records: Sequence[Any]) -> list[Any]:
    """``records`` reordered so that each zoo family (a config's ``zoo_family``) gives its first
    architecture before any gives its second: the first record of every family in the order the
    families first appear, then the second of each, and so on; records without a family keep their
    order, each its own family.

    Why: a mini zoo's split lists a family's architectures together, so the first 8 of
    zoo-vits-mini's held-out split are 2 of its 7 families (2 ConViTs, 6 EfficientViT-MITs), and a
    verdict on "held-out families" taken there speaks for two of them. A split of one architecture
    a family (zoo-decoders-mini's) or of no families (vits-1k's) is returned as it is."""
    by_family: dict[Any, list[Any]] = {}
    for number, record in enumerate(records):
        by_family.setdefault(record.config.get("zoo_family", ("record", number)), []).append(record)
    turns = max((len(family) for family in by_family.values()), default=0)
    return [family[turn] for turn in range(turns) for family in by_family.values() if turn < len(family)]


def horizons(steps: int) -> list[int]:
    """The steps at which a fine-tuned model is scored: 0, 100 and the last."""
    return sorted({0, min(100, steps), steps})


def fine_tune(
    model: nn.Module,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    task: str,
    lr: float,
    held_out: Sequence[tuple[torch.Tensor, torch.Tensor]] = (),
    at: Sequence[int] = (),
    lr_scale: dict[str, float] | None = None,
    warmup: int = 0,
) -> tuple[list[float], dict[int, tuple[float, float]]]:
    """Train ``model`` one AdamW step per batch (:func:`graphkit.training.loop.up_train`, the loop every
    up-training runs; the parameters ``lr_scale`` names at ``lr`` times their factor; the rate warmed
    up over ``warmup`` steps); returns the training losses and the held-out (loss, accuracy) after
    each step count in ``at`` (0: before the first step)."""
    return up_train(
        model, task, batches.__getitem__, len(batches), lr, held_out=held_out, at=at, lr_scale=lr_scale, warmup=warmup
    )


def evaluate(
    config: EvalConfig,
    ghn: LoGAH | None = None,
    progress: bool = True,
    on_skip: Callable[[str, str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per architecture and initialisation: loss and accuracy at step 0 and after
    ``config.steps`` steps, and the training-loss curve.

    The first ``config.archs`` records of the split whose ops the hypernetwork all trained on,
    taken a family at a time (:func:`family_turns`), are evaluated; each record passed over for an
    op it never saw is given to ``on_skip`` (its id, the reason in one line), so that one such
    model in a split of many families (Apertus's ``xielu`` among the decoders) does not refuse the
    whole evaluation. EvalError when no record is left.

    On the CPU the fine-tunings (one per architecture and initialisation) run in
    ``config.workers`` processes (default: one per core), each on one thread, largest models
    first. Why: these models are small, so a matmul split over two threads keeps each core
    busy less than one process per core does (a 2-core machine evaluates the bundled ViT
    checkpoint 1.3x faster), and single-threaded arithmetic gives the same rows whatever the
    number of workers. On a GPU they run one after another in this process. SIGTERM, like
    Ctrl-C, kills the workers and raises (:mod:`graphkit.workers`)."""

    device = torch.device(config.device or default_device(EvalError))
    pool = ArchPool(config.dataset, config.split)
    if ghn is None:
        ghn = load_checkpoint(config.ghn or bundled_checkpoint(pool.family))
    ghn = ghn.to(device)
    source = load_source(config.data or default_source(pool.family), seq_len=config.seq_len)
    if config.balance_logits:
        check_balancing_data(source, "balance_logits", EvalError)
    chosen: list[Any] = []  # the pool's records evaluated
    refusals: list[str] = []
    for record in family_turns(pool.records):
        if len(chosen) == config.archs:
            break
        try:
            check_graph(ghn, record.graph, plain=True)  # predicted through its twin below
        except UntrainedOpError as e:
            refusals.append(f"{record.id}: {e}")
            if on_skip is not None:
                on_skip(record.id, str(e))
            continue
        chosen.append(record)
    if not chosen:
        raise EvalError(f"no architecture of {config.dataset} ({config.split}) can be evaluated: {refusals[0]}")
    at = horizons(config.steps)
    teacher = _selection_source(config, source) if "selected" in config.inits else None
    tasks: list[_FineTuning] = []
    rows: dict[int, dict[str, Any]] = {}
    for record in chosen:
        source.check(record.config)
        graph = graph_for(record, ghn.config)
        # found once: the prediction grows from it, its resized and grown weights train slower; the model
        # (on meta) gives a transformers decoder of no graphkit family its twin, as predict's does
        shell = build_model(record.config, "meta")
        if config.balance_logits:
            try:
                balanced_head(shell, record.graph)
            except CalibrationError as e:
                raise EvalError(f"{record.id}: balance_logits: {e}") from e
        twin = twin_of(ghn, graph, shell)
        made = {"predicted": _pack(predicted_params(ghn, graph, config.residual_scale, twin or False))}
        scales = lr_scale(graph, twin) if config.lr_scale else {}
        factor = default_shrink(record.graph, ghn.info, config.shrink)
        made["keep_init"] = made["predicted"] if factor == 1 else _pack(shrunk(_unpack(made["predicted"]), factor))
        if teacher is not None:
            torch.manual_seed(config.seed)  # the random init the workers draw: selection keeps what it cannot fill
            made["selected"] = _pack(select_params(teacher, build_model(record.config, "cpu")))
        generator = torch.Generator().manual_seed(config.seed)
        held_out = _stack(
            [
                source.batch(record.config, config.batch_size, generator, split="eval")
                for _ in range(config.eval_batches)
            ]
        )
        train_batches = _stack([source.batch(record.config, config.batch_size, generator) for _ in range(config.steps)])
        for init in config.inits:
            tasks.append(
                _FineTuning(
                    len(tasks),
                    record.config,
                    record.graph if config.calibrate or config.balance_logits else None,
                    config.calibrate,
                    config.balance_logits,
                    init,
                    made.get(init),
                    train_batches,
                    held_out,
                    source.task,
                    config.lr,
                    config.warmup,
                    scales if init == "predicted" else {},
                    at,
                    config.seed,
                    str(device),
                )
            )
            rows[len(tasks) - 1] = {
                "id": record.id,
                "task": source.task,
                "num_params": record["num_params"],
                "init": init,
                "residual_scale": should_scale_residuals(record.graph, config.residual_scale),
                "calibrated": config.calibrate and init == "predicted",
                "balanced": config.balance_logits,
                "lr_scale": scales if init == "predicted" else {},
                "warmup": config.warmup,
                "horizons": at,
            }
            if init == "keep_init":
                rows[len(tasks) - 1]["shrink"] = factor
    workers = 1 if device.type != "cpu" else min(config.workers or len(os.sched_getaffinity(0)), len(tasks))
    order = sorted(tasks, key=lambda t: -rows[t.number]["num_params"])  # largest first: no long task at the end
    with ended_by_sigterm(), Progress(disable=not progress) as bar:  # SIGTERM, like Ctrl-C, kills the workers
        progress_task = bar.add_task("eval-ghn", total=len(tasks))
        for number, curve, scores in _run_all(order, workers):
            rows[number]["curve"] = curve
            for h in at:
                rows[number][f"loss_{h}"], rows[number][f"accuracy_{h}"] = scores[h]
            rows[number]["loss"], rows[number]["accuracy"] = scores[config.steps]
            bar.advance(progress_task)
    return [rows[number] for number in sorted(rows)]


def _selection_source(config: EvalConfig, source: Any) -> dict[str, torch.Tensor]:
    """The trained model ``selected`` selects from: the train split's smallest architecture (a
    model of the family smaller than those evaluated), trained directly for ``select_steps``
    steps on the same data and learning rate; its state dict."""
    pool = ArchPool(config.dataset, "train")
    smallest = min(pool.records, key=lambda record: (record["num_params"], record.id))
    generator = torch.Generator().manual_seed(config.seed + 1)
    steps = config.select_steps or config.steps
    batches = [source.batch(smallest.config, config.batch_size, generator) for _ in range(steps)]
    torch.manual_seed(config.seed)
    model = build_model(smallest.config, "cpu")
    fine_tune(model, batches, source.task, config.lr)
    return {name: value.detach() for name, value in model.state_dict().items()}


class _FineTuning(NamedTuple):
    """One fine-tuning of :func:`evaluate`: everything a worker process needs, in a few tensors
    (each travels to a worker as one shared-memory file: the parameters packed into one, the
    batches stacked)."""

    number: int
    config: dict[str, Any]
    graph: Any  # the architecture's graph where the predictions are calibrated or the logits balanced, else None
    calibrate: bool  # the prediction's stream calibrated to the init's
    balance: bool  # the start's logits balanced on the first NORM_BATCHES batches' inputs
    init: str
    predicted: tuple[list[tuple[str, torch.Size]], torch.Tensor] | None  # predicted or selected; see _pack
    batches: tuple[torch.Tensor, torch.Tensor]  # inputs and labels, one batch per step
    held_out: tuple[torch.Tensor, torch.Tensor]
    task: str
    lr: float
    warmup: int
    lr_scale: dict[str, float]  # the factors of what a prediction's twin resized or grew (graphkit.ghn.grow.lr_scale)
    at: list[int]
    seed: int
    device: str


def _fine_tune_one(job: _FineTuning) -> tuple[int, list[float], dict[int, tuple[float, float]]]:
    """Build, initialise and fine-tune one model of :func:`evaluate` (in a worker, or inline)."""

    device = torch.device(job.device)
    torch.manual_seed(job.seed)  # every initialisation draws the same random init first
    model = initialise(build_model(job.config, "cpu"), job.init, _unpack(job.predicted) if job.predicted else None)
    if job.calibrate and job.init == "predicted":
        calibrate(model, job.graph)
    model = model.to(device)
    batches, held_out = (
        list(zip(*(part.to(device).unbind(0) for part in pair))) for pair in (job.batches, job.held_out)
    )
    estimate_batch_norm(model, [x for x, _ in batches[:NORM_BATCHES]])
    if job.balance:  # on the inputs the BatchNorm statistics came from; no label is read
        balance_logits(model, job.graph, torch.cat([x for x, _ in batches[:NORM_BATCHES]]))
    curve, scores = fine_tune(model, batches, job.task, job.lr, held_out, job.at, job.lr_scale, job.warmup)
    return job.number, curve, scores


def _pack(params: dict[str, torch.Tensor]) -> tuple[list[tuple[str, torch.Size]], torch.Tensor]:
    """Parameters as (names and shapes, one flat CPU float tensor): one tensor to send, not hundreds."""
    return [(name, value.shape) for name, value in params.items()], torch.cat(
        [v.detach().float().flatten().cpu() for v in params.values()]
    )


def _unpack(packed: tuple[list[tuple[str, torch.Size]], torch.Tensor]) -> dict[str, torch.Tensor]:
    layout, flat = packed
    values = flat.split([math.prod(shape) for _, shape in layout])
    return {name: value.view(shape) for (name, shape), value in zip(layout, values)}


def _stack(batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([x for x, _ in batches]), torch.stack([y for _, y in batches])


_JOBS: Sequence[_FineTuning] = ()  # a worker's copy of the jobs (see _run_all)


def _receive(jobs: Sequence[_FineTuning]) -> None:
    global _JOBS
    _JOBS = jobs
    torch.set_num_threads(1)


def _fine_tune_number(i: int) -> tuple[int, list[float], dict[int, tuple[float, float]]]:
    return _fine_tune_one(_JOBS[i])


def _run_all(
    jobs: Sequence[_FineTuning], workers: int
) -> Iterator[tuple[int, list[float], dict[int, tuple[float, float]]]]:
    """Every job's result as it finishes: in ``workers`` single-threaded processes on the CPU,
    inline on one thread for one CPU worker (the same arithmetic), inline as is on a GPU."""
    on_cpu = jobs and jobs[0].device == "cpu"
    threads = torch.get_num_threads()
    if on_cpu:
        torch.set_num_threads(1)  # inline runs compute as the workers do (_receive)
    try:
        if workers <= 1:
            yield from map(_fine_tune_one, jobs)
            return
        # spawned, not forked: a process that has run autograd cannot fork one that runs it again;
        # the jobs reach each worker once, when it starts; a job is then its number
        with worker_pool(workers, fork=False, initializer=_receive, initargs=(jobs,)) as pool:
            for future in as_completed([pool.submit(_fine_tune_number, i) for i in range(len(jobs))]):
                yield future.result()
    finally:
        torch.set_num_threads(threads)


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Means per initialisation at every horizon, and at each horizon the fraction of
    architectures where ``predicted`` has a lower held-out loss than each other initialisation
    (``random``, and ``orthogonal`` and ``selected`` when evaluated); ``residual_scale``, whether
    the predictions had their residual branches scaled
    (:func:`graphkit.ghn.predict.scale_residuals`); ``calibrated``, on how many architectures the
    predicted stream was calibrated (:mod:`graphkit.ghn.calibrate`); ``balanced``, whether every
    start's logits were balanced (:func:`graphkit.ghn.calibrate.balance_logits`); ``warmup``, the steps of the
    fine-tunings' warm-up; ``predicted_beats_random``
    (and ``_orthogonal``, ``_selected``, ``_keep_init`` when evaluated) are the verdicts at the
    final step. With ``keep_init`` rows, ``keep_init_wins`` holds its fractions as ``wins`` holds
    predicted's (against predicted and the others), ``keep_init_beats_random`` its verdict and
    ``shrink`` the factor its prediction was added with."""
    at = rows[0]["horizons"]
    keys = [f"{m}_{h}" for h in at for m in ("loss", "accuracy")] + ["loss", "accuracy"]
    summary: dict[str, Any] = {"horizons": at}
    inits = [init for init in INITS if any(r["init"] == init for r in rows)]
    for init in inits:
        mine = [r for r in rows if r["init"] == init]
        summary[init] = {k: sum(r[k] for r in mine) / len(mine) for k in keys}
        if mine[0]["task"] == "text":
            summary[init]["perplexity"] = math.exp(min(summary[init]["loss"], 50))
    ids = sorted({r["id"] for r in rows})
    loss = {(r["id"], r["init"], h): r[f"loss_{h}"] for r in rows for h in at}
    summary["archs"] = len(ids)
    summary["residual_scale"] = any(r.get("residual_scale", False) for r in rows)
    summary["calibrated"] = sum(bool(r.get("calibrated")) for r in rows)
    summary["balanced"] = any(r.get("balanced", False) for r in rows)
    summary["warmup"] = rows[0].get("warmup", 0)
    if "keep_init" in inits:
        summary["shrink"] = next(r.get("shrink", 1.0) for r in rows if r["init"] == "keep_init")
    for init in ("predicted", "keep_init") if "keep_init" in inits else ("predicted",):
        key = "wins" if init == "predicted" else f"{init}_wins"
        summary[key] = {
            str(h): {
                other: sum(loss[i, init, h] < loss[i, other, h] for i in ids) / len(ids)
                for other in inits
                if other != init
            }
            for h in at
        }
        for other, fraction in summary[key][str(at[-1])].items():
            if init == "predicted" or other == "random":
                summary[f"{init}_beats_{other}"] = fraction
    return summary


def report_json(config: EvalConfig, summary: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """eval.json's text: the config, the summary and every row. A fine-tuning that diverged has
    NaN or Inf losses, which JSON cannot hold (a bare ``NaN`` breaks strict readers): they are
    written as null."""

    def finite(value: Any) -> Any:
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(v) for v in value]
        return value

    report = finite({"config": asdict(config), "summary": summary, "rows": list(rows)})
    return marked_json("evaluation", report, indent=1, allow_nan=False) + "\n"


def plot(rows: Sequence[dict[str, Any]], png: str, title: str) -> None:
    """Every initialisation's fine-tuning loss over all steps (a thin line per architecture, a
    thick one for the mean) beside its held-out loss at each horizon, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (train_ax, held_ax) = plt.subplots(1, 2, figsize=(10, 4))
    at = rows[0]["horizons"]
    for init, color in zip(INITS, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")):
        mine = [r for r in rows if r["init"] == init]
        if not mine:
            continue
        curves = torch.tensor([r["curve"] for r in mine])
        steps = range(1, curves.shape[1] + 1)
        for curve in curves:
            train_ax.plot(steps, curve, color=color, alpha=0.15, linewidth=0.7)
        train_ax.plot(steps, curves.mean(0), color=color, linewidth=2, label=init)
        held_ax.plot(at, [sum(r[f"loss_{h}"] for r in mine) / len(mine) for h in at], "o-", color=color, label=init)
    train_ax.set(xlabel="fine-tuning step", ylabel="training loss", title=title)
    held_ax.set(xlabel="fine-tuning step", ylabel="held-out loss (mean over architectures)", xticks=at)
    train_ax.legend()
    held_ax.legend()
    fig.tight_layout()
    save_figure(fig, png, "evaluation-figure", dpi=120)  # a PNG is complete or not there
    plt.close(fig)
