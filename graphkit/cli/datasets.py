"""Dataset commands: generate, ls, show, stats, compile."""

from __future__ import annotations

import contextlib
import enum
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from graphkit.cli.app import app, command, console, errors, print_graph, stopped_in_one_line
from graphkit.errors import GraphkitError
from graphkit.fileio import check_output_file, save_figure

if TYPE_CHECKING:
    from graphkit.datasets.dataset import GraphDataset

#: figure formats ``stats --png`` writes (matplotlib picks the format from the extension)
FIGURE_SUFFIXES = (".png", ".svg", ".pdf")
#: more histogram bins than this are unreadable as text and a typo
MAX_BINS = 1000


def _check_at_least(low: int, **options: int | None) -> None:
    """Refuse an option below ``low`` in one line naming it (``min_params`` is --min-params)."""
    for name, value in options.items():
        if value is not None and value < low:
            raise GraphkitError(f"--{name.replace('_', '-')} must be at least {low}, got {value}")


def _load_warning_if_incomplete(path: Path) -> GraphDataset:
    """The dataset at ``path``; warns on stderr (one line) when an interrupted generate left it unfinished."""
    from graphkit.datasets import load
    from graphkit.datasets.generate import incomplete

    dataset = load(path)
    warning = incomplete(path, len(dataset))
    if warning:
        errors.print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)
    return dataset


#: what an interrupted generate says it leaves (graphkit.cli.app.stopped_in_one_line)
RESUME_HINT = "its workers are stopped and {kept} are kept; run it again with --resume to finish the dataset"


@app.command()
@command
def generate(
    recipe: str = typer.Argument(
        ...,
        help="vits-1k, gpts-1k, llamas-1k, vits-digits, vits-digits-grids24, a .json / .yaml recipe file, "
        "or a zoo of real architectures: zoo-vits (timm's vision transformers) or zoo-decoders "
        "(transformers' causal LMs), and their trainable mini versions zoo-vits-mini and zoo-decoders-mini.",
    ),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Dataset folder (default: the recipe's name)."),
    num: Optional[int] = typer.Option(
        None,
        "--num",
        "-n",
        help="Records to draw (default: the recipe's, 1000); for a zoo, its first N models (a mini zoo's: "
        "a family at a time).",
    ),
    seed: int = typer.Option(
        0,
        "--seed",
        help="Same recipe and seed, same dataset, on any machine and worker count; for a mini zoo, "
        "which families are held out.",
    ),
    workers: int = typer.Option(1, "--workers", "-w", help="Processes that trace in parallel."),
    num_shards: int = typer.Option(
        1, "--num-shards", help="Split the work into K shards (an array job on a cluster)..."
    ),
    shard_index: int = typer.Option(0, "--shard-index", help="...and make shard i of them; shards fill one folder."),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Finish an interrupted run with the same options: intact parts are kept, missing or damaged ones made.",
    ),
    attention: Optional[str] = typer.Option(
        None,
        "--attention",
        "-a",
        help="mha, gqa, kdgqa, dgqa or pgqa: convert every model, K/V heads drawn from the divisors of its heads.",
    ),
) -> None:
    """Generate a graph dataset (Parquet, Hugging Face layout) from a recipe or a zoo."""
    from graphkit.datasets.generate import generate as run
    from graphkit.datasets.zoo import ZOOS

    if recipe in ZOOS:
        defaults = {"--num-shards": (num_shards, 1), "--shard-index": (shard_index, 0)}
        if not ZOOS[recipe].mini:
            defaults = {"--seed": (seed, 0), **defaults}
        changed = [option for option, (value, default) in defaults.items() if value != default]
        if attention is not None:
            changed.append("--attention")
        if changed:
            raise GraphkitError(
                f"{changed[0]} applies to recipes, not to {recipe}: a zoo is every model its library has"
            )
        _generate_zoo(recipe, out, num, workers, resume, seed)
        return

    with (
        stopped_in_one_line(RESUME_HINT.format(kept="the parts written")),
        _tracing_bar("tracing architectures", transient=True) as progress,
    ):
        result = run(
            recipe,
            out,
            num=num,
            seed=seed,
            workers=workers,
            num_shards=num_shards,
            shard_index=shard_index,
            resume=resume,
            attention=attention,
            progress=progress,
        )
    for line in result.repaired:
        errors.print(f"warning: {line}", markup=False, highlight=False, soft_wrap=True)
    manifest = json.loads((result.path / "manifest.json").read_text())
    counts = (
        ", ".join(f"{n:,} {split}" for split, n in manifest["counts"].items())
        or "no records yet (other shards to come)"
    )
    console.print(
        f"[bold]{manifest['name']}[/]: wrote {result.records:,} "
        f"records ({result.architectures:,} architectures traced) "
        f"in {result.parts_written} parts, {result.parts_skipped} already there, {result.seconds:.1f} s",
        highlight=False,
    )
    console.print(f"dataset now holds {counts}; {manifest['architectures']:,} distinct architectures", highlight=False)
    console.print(f"{result.path}", highlight=False, soft_wrap=True)


@contextlib.contextmanager
def _tracing_bar(label: str, transient: bool = False) -> Iterator[Callable[[int, int], None]]:
    """A progress bar labelled ``label`` for the block, and the ``progress(done, total)``
    callback the generators call after each traced architecture. The bar is drawn from the first
    call on, so that options refused before any work print their one line and no empty bar."""
    bar = Progress(
        TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=transient
    )
    task = bar.add_task("trace", total=None)

    def progress(done: int, total: int) -> None:
        if not bar.live.is_started:
            bar.start()
        bar.update(task, completed=done, total=total)

    try:
        yield progress
    finally:
        if bar.live.is_started:
            bar.stop()


def _generate_zoo(name: str, out: Path | None, limit: int | None, workers: int, resume: bool, seed: int) -> None:
    """``graphkit generate zoo-...``: trace the zoo with a progress bar, then say what it holds."""
    from graphkit.datasets.zoo import ZOOS, generate_zoo

    with (
        stopped_in_one_line(RESUME_HINT.format(kept="the outcomes saved")),
        _tracing_bar(f"{'shrinking' if ZOOS[name].mini else 'tracing'} {name}") as progress,
    ):
        result = generate_zoo(name, out, workers=workers, resume=resume, limit=limit, progress=progress, seed=seed)
    console.print(
        f"[bold]{name}[/]: {result.candidates:,} models ({result.traced:,} traced now, {result.resumed:,} from an "
        f"earlier run), {result.records:,} distinct architectures, {result.failed:,} failed, "
        f"{result.unbuildable:,} the library cannot build; {100 * result.coverage:.1f}% of those it builds "
        f"{'shrunk and trainable' if 'split' in result.report else 'traced'} with no other: op, "
        f"{result.seconds:.1f} s",
        highlight=False,
    )
    split = result.report.get("split")
    if split:
        console.print(
            f"{len(split['held_out_zoo_families'])} of {split['zoo_families']} zoo families held out whole "
            "(eval split)",
            highlight=False,
        )
    console.print(f"{result.path} (report: {result.path / 'report.md'})", highlight=False, soft_wrap=True)


class ListFormat(str, enum.Enum):
    table = "table"
    csv = "csv"
    json = "json"


#: the columns `ls` shows, with the table's short headers
LS_COLUMNS = {
    "id": "id",
    "family": "family",
    "split": "split",
    "num_layers": "layers",
    "hidden": "hidden",
    "heads": "heads",
    "kv_heads": "kv",
    "attention": "attn",
    "num_params": "params",
    "num_nodes": "nodes",
}


@app.command("ls")
@command
def list_records(
    path: Path = typer.Argument(..., help="Dataset folder."),
    split: Optional[str] = typer.Option(None, "--split", help="train or eval."),
    layers: Optional[int] = typer.Option(None, "--layers", help="Only this many layers."),
    hidden: Optional[int] = typer.Option(None, "--hidden", help="Only this hidden size."),
    heads: Optional[int] = typer.Option(None, "--heads", help="Only this many heads."),
    min_params: Optional[int] = typer.Option(None, "--min-params", help="At least this many parameters."),
    max_params: Optional[int] = typer.Option(None, "--max-params", help="At most this many parameters."),
    limit: int = typer.Option(20, "--limit", help="Rows to show (0: all)."),
    format: ListFormat = typer.Option(
        ListFormat.table, "--format", "-f", help="table (every value whole), csv or json (a list of records)."
    ),
) -> None:
    """List the records of a dataset, filtered."""
    _check_at_least(0, limit=limit, min_params=min_params, max_params=max_params)
    _check_at_least(1, layers=layers, hidden=hidden, heads=heads)
    if min_params is not None and max_params is not None and min_params > max_params:
        raise GraphkitError(f"--min-params {min_params:,} is above --max-params {max_params:,}")
    dataset = _load_warning_if_incomplete(path)
    if split is not None and split not in dataset.splits:
        raise GraphkitError(f"--split {split}: {path} has no such split; its splits: {', '.join(dataset.splits)}")
    conditions: dict[str, Any] = {
        k: v for k, v in dict(split=split, num_layers=layers, hidden=hidden, heads=heads).items() if v is not None
    }
    if min_params is not None or max_params is not None:
        conditions["num_params"] = (min_params, max_params)
    frame = dataset.filter(**conditions).metadata()
    shown = (frame if limit == 0 else frame.head(limit))[list(LS_COLUMNS)]
    if format is ListFormat.csv:
        sys.stdout.write(shown.to_csv(index=False))
        return
    if format is ListFormat.json:
        records = json.loads(shown.to_json(orient="records"))  # numpy numbers as plain JSON numbers
        sys.stdout.write(json.dumps(records, indent=1) + "\n")
        return
    table = Table(show_edge=False, box=None, pad_edge=False)
    for column, header in LS_COLUMNS.items():
        table.add_column(
            header, no_wrap=True, justify="left" if column in ("id", "family", "split", "attention") else "right"
        )
    for row in shown.itertuples(index=False):
        table.add_row(*(f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v) for v in row))
    # every column and every value whole, on a terminal too: fitted to a narrow terminal, Rich cut
    # ids (which `show` needs whole) and numbers and dropped the kv column; a terminal narrower
    # than the table wraps its lines instead
    out = Console(width=Console(width=1 << 16).measure(table).maximum, highlight=False)
    out.print(table)
    out.print(f"{len(shown)} of {len(frame):,} matching records", highlight=False)


@app.command()
@command
def show(
    path: Path = typer.Argument(..., help="Dataset folder."),
    record_id: str = typer.Argument(..., metavar="ID", help="Record id, e.g. vits-1k-00042."),
) -> None:
    """Show one architecture: its config and graph summary."""
    from graphkit.datasets import load

    record = load(path)[record_id]
    console.print(f"[bold]{record.id}[/] ({record['split']})", highlight=False)
    console.print_json(json.dumps(record.config))
    print_graph(record.graph)


@app.command()
@command
def stats(
    path: Path = typer.Argument(..., help="Dataset folder."),
    png: Optional[Path] = typer.Option(
        None, "--png", help="Figure to write: .png, .svg or .pdf (default: <dataset>-params.png here)."
    ),
    bins: int = typer.Option(20, "--bins", help=f"Histogram bins (1 to {MAX_BINS})."),
) -> None:
    """Counts and the parameter-count histogram, as text and as a PNG (LoGAH's Figure 8)."""
    import numpy as np

    if not 1 <= bins <= MAX_BINS:
        raise GraphkitError(f"--bins must be in 1..{MAX_BINS}, got {bins}")
    png = check_output_file(
        png or Path(f"{path.resolve().name}-params.png"), "--png", FIGURE_SUFFIXES, kind="histogram"
    )
    frame = _load_warning_if_incomplete(path).metadata()
    if frame.empty:
        raise GraphkitError(f"{path}: holds no records")
    params = frame["num_params"].to_numpy()
    console.print(
        f"[bold]{path}[/]: {len(frame):,} records, {frame['fingerprint'].nunique():,} distinct architectures",
        highlight=False,
    )
    for split, group in frame.groupby("split"):
        console.print(
            f"  {split}: {len(group):,} records, {group['fingerprint'].nunique():,} architectures", highlight=False
        )
    console.print(
        f"parameters: min {params.min():,}, median {int(np.median(params)):,}, max {params.max():,}", highlight=False
    )
    counts, edges = np.histogram(params, bins=bins)
    widest = max(counts.max(), 1)
    for count, low, high in zip(counts, edges[:-1], edges[1:], strict=True):
        console.print(
            f"{low / 1e6:7.2f}M-{high / 1e6:6.2f}M {'#' * round(40 * count / widest):<40} {count}", highlight=False
        )
    _plot_params(params, bins, png, title=f"{path.resolve().name}: {len(frame):,} records")
    console.print(f"wrote {png}", highlight=False, soft_wrap=True)


def _plot_params(params, bins: int, png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.hist(params / 1e6, bins=bins, color="#4c72b0", edgecolor="white")
    ax.set_xlabel("parameters (millions)")
    ax.set_ylabel("records")
    ax.set_title(title)
    fig.tight_layout()
    try:
        save_figure(fig, png, "histogram")
    finally:
        plt.close(fig)


@app.command("compile")
@command
def compile_record(
    path: Path = typer.Argument(..., help="Dataset folder."),
    record_id: str = typer.Argument(..., metavar="ID", help="Record id, e.g. vits-1k-00042."),
    out: Path = typer.Option(..., "--out", "-o", help="Checkpoint to write (safetensors, config in its metadata)."),
    params: Optional[Path] = typer.Option(
        None, "--params", "-p", help="Parameters to load (safetensors); default: the library's initialisation."
    ),
    attention: Optional[str] = typer.Option(
        None,
        "--attention",
        "-a",
        help="Convert the attention: gqa, kdgqa, dgqa or pgqa (MLA comes from a --params file's metadata).",
    ),
    kv_heads: Optional[int] = typer.Option(
        None, "--kv-heads", "-k", help="K/V heads for --attention (default: the record's)."
    ),
) -> None:
    """Build a record's model, check it traces to the stored graph, convert its attention if asked
    (or as a --params file written by `graphkit convert` records), load parameters, save it."""
    from graphkit.compiler import compile_model, converted_config, load_params, save_params
    from graphkit.datasets import load
    from graphkit.errors import GraphkitError
    from graphkit.params import check_params_output, read_params

    check_params_output(out, kind="compiled-weights")
    carried: dict[str, Any] = {}
    mla: dict[str, Any] | None = None
    if params is not None:
        _, metadata = read_params(params, tensors=False)
        recorded = metadata.get("graphkit_attention"), metadata.get("graphkit_kv_heads")
        if recorded[0] == "mla":
            if attention not in (None, "mla") or kv_heads is not None:
                raise GraphkitError(
                    f"--params {params}: converted to MLA (its metadata); leave --attention and --kv-heads out"
                )
            attention = "mla"
            mla = {
                name: int(metadata[f"graphkit_{name}"]) if f"graphkit_{name}" in metadata else None
                for name in ("kv_rank", "rope_dims")
            }
        elif recorded[0] is not None:
            kv = int(recorded[1]) if recorded[1] is not None else None
            if (attention or recorded[0]) != recorded[0] or (kv_heads or kv) != kv:
                raise GraphkitError(
                    f"--params {params}: converted to {recorded[0]} with {kv} K/V heads (its metadata), not "
                    f"{attention or recorded[0]} with {kv_heads or kv}; leave --attention and --kv-heads out "
                    "to use its own"
                )
            attention, kv_heads = recorded[0], kv
        carried = {k: v for k, v in metadata.items() if k.startswith("graphkit_") and k != "graphkit_config"}
    elif attention == "mla":
        raise GraphkitError(
            "--attention mla: compile builds MLA from the --params file `graphkit convert -a mla` wrote "
            "(its rank is in the metadata)"
        )
    record = load(path)[record_id]
    if mla:
        config = record.config
        model = compile_model(record, attention=attention, **mla)
    else:
        config = converted_config(record.config, attention, kv_heads, names=("--attention", "--kv-heads"))
        model = compile_model(record, attention=attention, kv_heads=kv_heads)
    report = load_params(model, params) if params is not None else None
    # the converted model's config, not the record's
    save_params(model, out, config=config, metadata=carried, kind="compiled-weights")
    total = sum(p.numel() for p in model.parameters())
    converted = f", attention converted to {attention} with {kv_heads or 'the same'} K/V heads" if attention else ""
    if mla:
        rope = f" and {mla['rope_dims']} rotary dimensions per K/V head" if mla["rope_dims"] else ""
        converted = f", attention converted to MLA with a rank-{mla['kv_rank']} latent{rope}"
    console.print(
        f"[bold]{record.id}[/]: {type(model).__name__}, {total:,} parameters, "
        f"traces to the stored fingerprint {record['fingerprint']}{converted}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(
        str(report) if report else "parameters: the library's initialisation", highlight=False, soft_wrap=True
    )
    console.print(f"wrote {out}", highlight=False, soft_wrap=True)
