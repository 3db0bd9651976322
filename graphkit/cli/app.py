"""The ``graphkit`` command line: thin commands that parse options and call the library."""

from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from graphkit import sources
from graphkit.compat import is_usage_error
from graphkit.errors import GraphkitError
from graphkit.fileio import check_output_file, marked_json, marked_text, write_text_atomic
from graphkit.workers import ended_by_sigterm

errors = Console(stderr=True)


def print_error(text: str) -> None:
    """The one red ``error:`` line on stderr every failure prints."""
    errors.print(f"[bold red]error:[/] {escape(text)}", markup=True, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def stopped_in_one_line(kept: str) -> Iterator[None]:
    """For a command that starts workers: SIGTERM, like Ctrl-C, unwinds the block
    (:func:`graphkit.workers.ended_by_sigterm`), the workers are killed on the way out, and
    one ``error:`` line says what stopped the command and what is left (``kept``) before it
    exits as a shell expects (143 for SIGTERM, 130 for Ctrl-C), with no traceback."""
    with ended_by_sigterm():
        try:
            yield
        except KeyboardInterrupt:
            print_error(f"stopped by Ctrl-C; {kept}")
            raise
        except SystemExit as e:
            if e.code == 128 + signal.SIGTERM:
                print_error(f"stopped by SIGTERM; {kept}")
            raise


@contextlib.contextmanager
def _usage_errors_in_one_line() -> Iterator[None]:
    """A malformed command line raised in the block (see :func:`graphkit.compat.is_usage_error`)
    becomes one error line and its exit code (2), as Click's message says it: the option and
    what it accepts ("Invalid value for '--kv-rank': Input should be a valid integer ...")."""
    try:
        yield
    except Exception as e:
        if not is_usage_error(e):
            raise
        usage: Any = e  # click's UsageError, which typer vendors privately: read by its methods
        print_error(usage.format_message().rstrip("."))
        raise typer.Exit(usage.exit_code) from None


class OneLineUsageErrors(TyperGroup):
    """Typer's command group, with every malformed command line (a non-integer ``--kv-rank``,
    a ``--format`` out of its choices, an unknown option or command) answered in one line like
    every other bad option, not Click's usage box: the group's own options are parsed in
    ``make_context``, a command's (and the command's name) in ``invoke``."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with _usage_errors_in_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with _usage_errors_in_one_line():
            return super().invoke(ctx)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The command, its summary in ``graphkit --help``'s list (its docstring's first
        paragraph) reflowed: under ``rich_markup_mode="rich"`` Typer keeps the docstring's line
        breaks there, which broke each summary at the source's line ends."""
        command = super().get_command(ctx, cmd_name)
        if command is not None and command.short_help is None and command.help:
            command.short_help = " ".join(inspect.cleandoc(command.help).split("\n\n")[0].split())
        return command


if TYPE_CHECKING:
    from graphkit.graph import ArchGraph
    from graphkit.modelfile import ModelFile

app = typer.Typer(
    cls=OneLineUsageErrors,
    name="graphkit",
    help="Neural-network architectures as data and back: trace models into computation graphs, "
    "build graph datasets, predict parameters, compile graphs into models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
console = Console()
_state = {"debug": False}


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show the full traceback when a command fails."),
) -> None:
    _state["debug"] = debug or os.environ.get("GRAPHKIT_DEBUG") == "1"


def command(fn: Callable) -> Callable:
    """Turn library errors into one red line and exit code 1 (the traceback with --debug); and
    SIGTERM, like Ctrl-C, into an exception where the command stands (exit 143), so that what it
    was writing is removed on the way out (:func:`graphkit.fileio.atomic_path`)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            with ended_by_sigterm():
                return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except Exception as e:
            if _state["debug"]:
                raise
            known = isinstance(e, GraphkitError)
            print_error(
                str(e) if known else f"unexpected {type(e).__name__}: {e} (rerun with --debug for the traceback)"
            )
            raise typer.Exit(1) from None

    return wrapper


def model_argument(weights: str) -> Any:
    """The MODEL argument of a command that takes a model, every form of :mod:`graphkit.sources`
    in its --help; ``weights`` says what the command does with the model's weights."""
    prefixed = " or ".join(f"{form.usage} ({form.meaning})" for form in sources.PREFIXES.values())
    return typer.Argument(
        ...,
        metavar=sources.METAVAR,
        help="A Python file defining `model` or `build_model()` (optionally `example_inputs()`), a Hugging Face "
        f"model folder (config.json and safetensors weights, from save_pretrained), {prefixed}; quote the "
        f"prefixed forms in the shell. {weights}",
    )


#: what the commands that only read a model's architecture say about its weights
ARCHITECTURE_ONLY = "Folders, timm: and hf: are built on the meta device: no weight is read."


def trace_loaded(loaded: ModelFile, **options: Any) -> tuple[ModelFile, ArchGraph]:
    """``loaded`` traced (``options`` go to ``graphkit.trace``). A folder, timm: or hf: model
    built on meta that the tracer needs values from (a causal-mask buffer made in ``__init__``,
    as GPT-1's) is built again with weights and traced again; a MODEL.py decides its own device."""
    from graphkit.errors import NeedsValuesError
    from graphkit.sources import load_model_source
    from graphkit.tracing import trace

    try:
        return loaded, trace(loaded.model, loaded.example_inputs, **options)
    except NeedsValuesError:
        if loaded.path is not None and loaded.path.is_file():
            raise
    loaded = load_model_source(loaded.source, weights=True)
    return loaded, trace(loaded.model, loaded.example_inputs, **options)


class GraphFormat(str, enum.Enum):
    json = "json"
    text = "text"


#: the extensions `trace --out` writes each format under: a graph is JSON, a summary text or
#: Markdown; a picture is `graphkit draw`'s
GRAPH_SUFFIXES = {GraphFormat.json: (".json",), GraphFormat.text: (".txt", ".md")}


def graph_format(out: Path | None, chosen: GraphFormat | None) -> tuple[GraphFormat, tuple[str, ...]]:
    """`trace`'s format, and the extensions ``out`` may have: ``chosen`` and its extensions;
    else the format ``out``'s extension names (JSON when it names none), and every extension
    either format takes. An ``out`` whose extension is not among them is refused, before the
    model runs, by :func:`~graphkit.fileio.check_output_file` (``trace --out graph.png`` once
    wrote JSON into a .png)."""
    if chosen is not None:
        return chosen, GRAPH_SUFFIXES[chosen]
    if out is None:
        return GraphFormat.text, ()
    suffix = out.suffix.lower()
    named = next((fmt for fmt, suffixes in GRAPH_SUFFIXES.items() if suffix in suffixes), GraphFormat.json)
    return named, tuple(s for suffixes in GRAPH_SUFFIXES.values() for s in suffixes)


@app.command()
@command
def trace(
    model: str = model_argument(ARCHITECTURE_ONLY),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Write the graph here: .json (the graph) or .txt / .md (its summary)."
    ),
    format: Optional[GraphFormat] = typer.Option(
        None, "--format", "-f", help="json or text; default: what --out's extension names, text without --out."
    ),
    fold: bool = typer.Option(
        True,
        "--fold/--no-fold",
        help="Trace one block of a repeated stack and replicate it (fast), or export every block.",
    ),
) -> None:
    """Trace a model into a computation graph and print its summary.

    Folders, timm: and hf: models are built on the meta device, as a MODEL.py may be
    (`with torch.device("meta"):`): billion-parameter models trace in about a second.
    """
    from graphkit.sources import load_model_source

    fmt, suffixes = graph_format(out, format)
    if out is not None:  # before the model runs: a bad --out costs nothing
        check_output_file(out, "--out", suffixes, kind="graph" if fmt is GraphFormat.json else "summary")
    _, graph = trace_loaded(load_model_source(model, weights=False), fold_repeats=fold)
    if fmt is GraphFormat.json:  # the same marked document on stdout and in --out
        text = marked_json("graph", graph.to_dict(), indent=1)
    else:  # marked as graphkit's in --out only: a summary piped or appended into notes stays theirs
        text = f"{graph.summary()}\nfingerprint {graph.fingerprint()}\n"
    if out is None and fmt is GraphFormat.json:
        print(text)
        return
    print_graph(graph)
    if out is not None:
        write_text_atomic(out, text if fmt is GraphFormat.json else marked_text("summary", text))
        console.print(f"wrote {out}")


@app.command()
@command
def draw(
    source: str = typer.Argument(
        ...,
        metavar=f"{sources.METAVAR}|GRAPH.json|DATASET",
        help="A model to trace, in any form `graphkit trace` takes (a folder, timm: and hf: are built on the meta "
        "device), a graph from `graphkit trace --out`, or a dataset folder followed by a record ID.",
    ),
    record_id: Optional[str] = typer.Argument(
        None, metavar="[ID]", help="Record id in the DATASET folder, e.g. vits-1k-00042."
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", help="The picture: .svg (hover a box for its parameter shapes), .png or .pdf."
    ),
    expand: bool = typer.Option(
        False, "--expand", help="Draw every block instead of folding repeats into one block marked 'x N'."
    ),
) -> None:
    """Draw an architecture top to bottom: repeated blocks folded, attention and MoE annotated.

    Uses Graphviz's `dot` for the layout where it is installed, grandalf (pure Python) otherwise.
    """
    from graphkit.draw import SUFFIXES
    from graphkit.draw import draw as draw_graph

    check_output_file(out, "--out", SUFFIXES, kind="drawing")
    path = Path(source)
    if record_id is None:
        if path.is_dir() and not (path / "config.json").is_file():
            raise GraphkitError(
                f"{source}: is a folder; give a MODEL.py, a Hugging Face model folder (with config.json), "
                "or a dataset folder and a record ID"
            )
        graph = _read_graph(path) if path.suffix.lower() == ".json" and not path.is_dir() else _traced_graph(source)
    else:
        if path.is_file():
            raise GraphkitError(
                f"{source}: is a file; with a record ID, give a dataset folder (or drop the ID to trace a MODEL.py)"
            )
        from graphkit.datasets import load

        graph = load(source)[record_id].graph
    drawing = draw_graph(graph, out, expand=expand)
    console.print(f"layout: {drawing.layout}", highlight=False)
    folded = f", {drawing.folded} folded repeat{'s' * (drawing.folded != 1)}" if drawing.folded else ""
    console.print(
        f"wrote {out} ({drawing.boxes} boxes for {len(graph.nodes)} nodes{folded})", highlight=False, soft_wrap=True
    )


def _traced_graph(model: str):
    """The graph of a model source, as `graphkit trace` makes it."""
    from graphkit.sources import load_model_source

    return trace_loaded(load_model_source(model, weights=False))[1]


def _read_graph(path: Path):
    """A graph JSON file as `graphkit trace --out` writes it; unreadable files name themselves."""
    from graphkit.graph import ArchGraph

    try:
        graph = ArchGraph.from_json(path.read_text())
        graph.validate()
    except OSError as e:
        raise GraphkitError(f"{path}: cannot read: {e.strerror or e}") from e
    except (UnicodeDecodeError, GraphkitError) as e:
        raise GraphkitError(f"{path}: {' '.join(str(e).split())}") from e
    return graph


class Variant(str, enum.Enum):
    gqa = "gqa"
    kdgqa = "kdgqa"
    dgqa = "dgqa"
    pgqa = "pgqa"
    mla = "mla"


class Grouping(str, enum.Enum):
    mean = "mean"
    keynorm = "keynorm"
    similarity = "similarity"
    search = "search"


class ModelFormat(str, enum.Enum):
    graphkit = "graphkit"
    hf = "hf"


@app.command()
@command
def convert(
    model: str = model_argument(
        "It needs weights: a folder's safetensors are loaded in float32; timm:, hf: and a folder without "
        "weights get the library's random initialisation."
    ),
    attention: Variant = typer.Option(
        ...,
        "--attention",
        "-a",
        help="gqa, kdgqa (key-norm allocation), dgqa (allocation updated "
        "every --window steps), pgqa (Gaussian perturbation) or mla (multi-head latent attention: K and V "
        "from one shared latent of --kv-rank numbers per token, by SVD of the K/V projections).",
    ),
    kv_heads: Optional[int] = typer.Option(
        None, "--kv-heads", "-k", help="K/V heads per layer (must divide the heads; default: as many as heads)."
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Converted parameters (safetensors), or with --format hf a model folder."
    ),
    format: ModelFormat = typer.Option(
        ModelFormat.graphkit,
        "--format",
        help="graphkit: a safetensors file of the parameters, the conversion in its metadata (graphkit compile "
        "rebuilds it); hf: a folder stock transformers loads (AutoModelForCausalLM.from_pretrained, no custom "
        "code): GQA as the model's own class with fewer num_key_value_heads, MLA as DeepSeek-V3 (LLaMA-style "
        "decoders only).",
    ),
    window: Optional[int] = typer.Option(
        None, "--window", help="DGQA: training steps between allocation updates, >= 1 (default 300)."
    ),
    evolution: Optional[str] = typer.Option(None, "--evolution", help="DGQA: 'ema' (default) or 'difference'."),
    alpha: Optional[float] = typer.Option(
        None, "--alpha", help="DGQA with ema: weight of the current key norms, in [0, 1] (default 0.5)."
    ),
    grouping: Grouping = typer.Option(
        Grouping.mean,
        "--grouping",
        help="GQA: which K/V heads are pooled together. mean: neighbours (Ainslie et al., 2023; no data); "
        "keynorm: heads of similar key norm on calibration data (KDGQA's signal); similarity: heads whose "
        "keys and values are most alike on calibration data (AsymGQA); search: the groups that minimise the "
        "attention output's error on calibration data (QCQA). The groups go into the metadata.",
    ),
    data: Optional[str] = typer.Option(
        None,
        "--data",
        help="Calibration data for --grouping keynorm, similarity or search and for --rope-dims, as train-ghn's --data "
        "(default: the family's bundled data: digits for image models, stdlib-text for language models).",
    ),
    kv_rank: Optional[int] = typer.Option(
        None, "--kv-rank", help="MLA: numbers per token in the latent K and V are read from (1 to the width)."
    ),
    rope_dims: Optional[int] = typer.Option(
        None,
        "--rope-dims",
        help="MLA for RoPE models (LLaMA, Mistral): keep this many rotary dimensions per K/V head out of the "
        "latent, cached beside it, and drop RoPE from the rest (MHA2MLA's partial RoPE, chosen on calibration "
        "data; even, 2 to head_dim - 2). Decoding then reads the latent without rebuilding K; the model "
        "changes and wants up-training. Without it the conversion is exact but rebuilds K every step. "
        "With --format hf (needed there): DeepSeek's rotary key, D dimensions shared by all heads (TransMLA's "
        "RoRoPE; even, dividing head_dim).",
    ),
) -> None:
    """Convert a model's attention to GQA or a key-driven variant (K/V heads mean-pooled over
    neighbours or measured groups), or to MLA (a shared low-rank latent), and save it (the variant,
    K/V heads or rank, groups and DGQA's options go into the file's metadata), or with --format hf
    as a folder stock transformers loads. Prints the KV cache per token before and after."""
    from graphkit.conversion import ConvertConfig, check_convert_output, convert_attention, save_conversion
    from graphkit.sources import load_model_source
    from graphkit.tracing import trace as trace_model

    check_convert_output(out, format.value)
    config = ConvertConfig(
        attention=attention.value, kv_heads=kv_heads, format=format.value, window=window, evolution=evolution,
        alpha=alpha, grouping=grouping.value, data=data, kv_rank=kv_rank, rope_dims=rope_dims,
    )  # fmt: skip
    loaded = load_model_source(model, weights=True)
    conversion = convert_attention(loaded.model, config, example_inputs=loaded.example_inputs, source=model)
    graph = trace_model(conversion.model, loaded.example_inputs)
    save_conversion(conversion, out, config)
    before, after = conversion.before, conversion.after
    console.print(
        f"KV cache per token: {before:,} bytes before, {after:,} after ({100 * after / max(before, 1):.0f}%)",
        highlight=False,
    )
    print_graph(graph)
    console.print(f"wrote {out}", highlight=False, soft_wrap=True)


@app.command()
@command
def finetune(
    model: str = model_argument(
        "The model to train, converted or not; it needs weights: a folder's safetensors are loaded in float32; "
        "timm:, hf: and a folder without weights get the library's random initialisation."
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Run folder: the trained model (as --format says), checkpoint/, metrics.jsonl."
    ),
    data: Optional[str] = typer.Option(
        None,
        "--data",
        help="digits, cifar10:DIR, cifar100:DIR, imagefolder:DIR, stdlib-text, text:PATH or wikitext:DIR "
        "(default: digits for image models, stdlib-text for language models).",
    ),
    params: Optional[Path] = typer.Option(
        None,
        "--params",
        "-p",
        help="Start from these parameters (safetensors: `predict --out`, an earlier run's model.safetensors) "
        "instead of the model's own weights; give it again with --resume.",
    ),
    steps: int = typer.Option(100, "--steps", help="AdamW steps, one batch each."),
    lr: float = typer.Option(3e-4, "--lr", help="AdamW learning rate (constant after --warmup)."),
    warmup: int = typer.Option(
        0,
        "--warmup",
        help="Steps over which the learning rate rises linearly to --lr (0: none; resume with the same). "
        "AdamW's first steps move every weight by about --lr, which a predicted start (--params) feels most: "
        "fine-tune one with --warmup 25 (measured: as good or better at 100 steps on every model tried and at 300 "
        "on the decoders, up to 0.1 nats worse at 300 on grown ViTs; "
        'docs/experiments.md, "The same starts under a warm-up").',
    ),
    batch_size: int = typer.Option(16, "--batch-size", "-b", help="Images or sequences per step."),
    seq_len: int = typer.Option(64, "--seq-len", help="Tokens per sequence (language models)."),
    weight_decay: float = typer.Option(0.01, "--weight-decay"),
    seed: int = typer.Option(0, "--seed", help="Seed of the batches and dropout (step i draws from its own)."),
    checkpoint_every: int = typer.Option(100, "--checkpoint-every", help="Steps between checkpoints."),
    log_every: int = typer.Option(10, "--log-every", help="Steps between metrics.jsonl lines."),
    format: ModelFormat = typer.Option(
        ModelFormat.graphkit,
        "--format",
        help="graphkit: OUT/model.safetensors, a converted model's conversion in its metadata; hf: OUT holds what "
        "save_pretrained writes, so AutoModelForCausalLM.from_pretrained(OUT) loads it (transformers models "
        "whose attention is their own or GQA; convert -a mla --format hf gives DeepSeek's MLA).",
    ),
    device: Optional[str] = typer.Option(
        None, "--device", help="cpu, cuda, cuda:1 (default: $GRAPHKIT_DEVICE, else the local GPU, else cpu)."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue from OUT/checkpoint with the same options."),
    lr_scale: bool = typer.Option(
        True,
        "--lr-scale/--no-lr-scale",
        help="Train each parameter for which the --params file records a learning-rate factor at --lr times it "
        "(predict records one for a patch embedding it resized to a larger kernel, patch 2 to 16: 1/64, and for "
        "each weight reading a width it grew, 128 to 512: 1/4; else fine-tuning erases the prediction's head "
        "start; docs/experiments.md); --no-lr-scale: one lr for all.",
    ),
) -> None:
    """Up-train a model, converted or not, from its own weights or a --params file (its predicted
    parameters), on the bundled data or yours, in a resumable run folder, and save it in either
    format. Conversion papers up-train after converting (MHA2MLA, TransMLA)."""

    from graphkit.attention.hf_format import check_stock
    from graphkit.finetune import (
        RUN_FILES,
        FinetuneConfig,
        lr_scale_of,
        lr_scale_phrase,
        save_finetuned,
        starting_weights,
    )
    from graphkit.finetune import finetune as up_train_model
    from graphkit.params import read_params
    from graphkit.sources import load_model_source
    from graphkit.training.run_folder import run_folder

    header = read_params(params, tensors=False)[1] if params is not None else {}  # a bad file fails before loading
    config = FinetuneConfig(
        steps=steps,
        lr=lr,
        warmup=warmup,
        batch_size=batch_size,
        seq_len=seq_len,
        weight_decay=weight_decay,
        data=data,
        seed=seed,
        checkpoint_every=checkpoint_every,
        log_every=log_every,
        device=device,
        lr_scale=lr_scale_of(params, header) if params is not None and lr_scale else {},
    )
    folder = run_folder(out, resume, RUN_FILES, "finetune")
    if config.lr_scale:
        console.print(
            f"training {lr_scale_phrase(config.lr_scale)}, the factors {params} records for what predict resized "
            "or grew (--no-lr-scale: one lr)",
            highlight=False,
            soft_wrap=True,
        )
    loaded = load_model_source(model, weights=True)
    starting_weights(loaded.model, model, params, config.lr_scale)
    if format is ModelFormat.hf:
        check_stock(loaded.model)  # before training, not after
    last = up_train_model(loaded.model, folder, config, resume=resume, example_inputs=loaded.example_inputs)
    record: dict[str, Any] = {"steps": steps, "data": data, "lr": lr, "batch_size": batch_size, "seed": seed}
    if config.lr_scale:
        record["lr_scale"] = config.lr_scale
    if warmup:
        record["warmup"] = warmup
    if params is not None:
        record["params"] = params.name
    save_finetuned(loaded.model, folder, format.value, record)
    trained = f"loss {last['loss']:.4f}, " if last["loss"] is not None else ""
    console.print(
        f"step {steps}: {trained}held-out loss {last['eval_loss']:.4f}, accuracy {last['eval_accuracy']:.3f}; "
        f"wrote {folder}",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
@command
def ops(
    markdown: bool = typer.Option(False, "--markdown", help="Print the Markdown table of docs/vocabulary.md."),
) -> None:
    """List the op vocabulary: id, op, meaning and GHN-3 primitive."""
    from graphkit.ops import GHN3_PRIMITIVES, OP_DOCS, OPS, OPS_VERSION, vocabulary_markdown

    if markdown:
        print(vocabulary_markdown(), end="")
        return
    table = Table(title=f"graphkit op vocabulary v{OPS_VERSION}", show_edge=False)
    for column in ("id", "op", "meaning", "GHN-3"):
        table.add_column(column)
    for i, op in enumerate(OPS):
        table.add_row(str(i), op, OP_DOCS[op], GHN3_PRIMITIVES[op] or "-")
    console.print(table)


def print_graph(graph) -> None:
    """Rich summary of a graph: headline, op table, attention layout."""
    first, *rest = graph.summary().splitlines()
    console.print(f"[bold]{first}[/]", highlight=False)
    params_by_op: dict[str, int] = {}
    for node in graph.nodes:
        params_by_op[node.op] = params_by_op.get(node.op, 0) + node.num_params
    table = Table(show_edge=False, box=None, pad_edge=False)
    table.add_column("op")
    table.add_column("nodes", justify="right")
    table.add_column("parameters", justify="right")
    for op, count in graph.op_counts().items():
        table.add_row(op, str(count), f"{params_by_op[op]:,}")
    console.print(table)
    for line in rest[1:]:
        console.print(line, highlight=False)
    console.print(f"fingerprint {graph.fingerprint()}", highlight=False)


def main() -> None:
    """Console-script entry point."""
    app()
