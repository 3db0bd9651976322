"""What the mini zoos cost, model by model (issue #44 item 5 targets: `graphkit generate
zoo-vits-mini` within 30 minutes on 2 cores, `zoo-decoders-mini` within 15).

    .venv/bin/python benchmarks/mini_zoo_speed.py --num 40        # a sample: 40 models of each, 40 families
    .venv/bin/python benchmarks/mini_zoo_speed.py --write         # both whole mini zoos; updates BENCHMARKS.md
    .venv/bin/python benchmarks/mini_zoo_speed.py --zoo zoo-decoders-mini --workers 1
    .venv/bin/python benchmarks/mini_zoo_speed.py --from out/zoo-vits-mini  # a finished run, not rerun

Each mini zoo is generated afresh into out/mini-zoo-speed/ (`--workers`, default one per core).
Every model's outcome records the seconds of each step: the full model built on meta (with
timm, while its constructor's arguments are read) and traced, the shrunk variants built and
traced (every plan of the ladder that was tried), and the trainability check (a CPU build,
forward and backward on a batch of 2). The table gives the wall time, the mean and the slowest
of each step, and how many models were shrunk; with `--num`, the wall time of the whole zoo is
projected from the sample (the first N, a family at a time): the workers' start-up, then the
sample's mean seconds per model for every candidate, shared by the workers.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from graphkit.datasets.zoo import ZOOS, generate_zoo  # noqa: E402

STEPS = ("build", "trace", "shrink", "check")
MINI_ZOOS = [name for name, zoo in ZOOS.items() if zoo.mini]


def table(args) -> str:
    workers = args.workers or common.cores()
    rows = [
        "| zoo | models | shrunk, trainable | not shrunk | records (held-out families) | wall time "
        "| per model, mean (slowest): full build | full trace | shrink | check |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    versions = {}
    notes = []
    for name, report, wall in _runs(args, workers):
        versions.update(report["libraries"])
        per_model = report["model_timings"]
        cells = []
        for step in STEPS:
            values = [t.get(step, 0.0) for t in per_model.values()]
            slowest = max(per_model, key=lambda m: per_model[m].get(step, 0.0))
            cells.append(f"{statistics.mean(values):.2f} s ({max(values):.1f} s, `{slowest}`)")
        seconds = [t["seconds"] for t in per_model.values()]
        if wall is None:  # a finished run's folder: what its models took, and shared by 2 workers
            wall_text = f"{sum(seconds) / 60:.1f} min of model time; {sum(seconds) / 120:.1f} min on 2 workers"
        else:
            wall_text = f"{wall / 60:.1f} min"
        if args.num and wall is not None:  # the workers' start, then the sample's mean seconds a model for all
            total = len(ZOOS[name].candidates())
            start = max(0.0, wall - sum(seconds) / workers)
            projected = start + statistics.mean(seconds) * total / workers
            wall_text += f" for {report['candidates']}; {projected / 60:.0f} min projected for all {total}"
        split = report["split"]
        rows.append(
            f"| {name} | {report['candidates']} | {report['clean']} | {len(report['failed'])} "
            f"(+{len(report['unbuildable'])} unbuildable) | {report['records']} "
            f"({len(split['held_out_zoo_families'])} of {split['zoo_families']}) | {wall_text} | "
            + " | ".join(cells)
            + " |"
        )
        print(rows[-1], flush=True)
        reasons = _reasons(report["failed"])
        notes.append(f"- {name}, not shrunk by reason: " + ("; ".join(f"{n} {r}" for r, n in reasons) or "none") + ".")
    sample = f"the first {args.num} models of each mini zoo, a family at a time; " if args.num else ""
    if args.runs:
        sample = f"tabulated from finished runs ({', '.join(args.runs)}); "
    folders = args.runs or ["out/mini-zoo-speed/zoo-*-mini"]
    reports = ", ".join(f"{folder}/report.md" for folder in folders)
    head = (
        f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} CPU cores"
        f"{'' if args.runs else f' ({workers} workers)'}, {sample}with "
        f"{', '.join(f'{k} {v}' for k, v in versions.items())}"
        f"{'' if args.runs else ', from an empty folder'}. Command: "
        f"`.venv/bin/python benchmarks/mini_zoo_speed.py{_options(args)} --write`; "
        f"every failure is in {reports}." + (f" {args.note}" if args.note else "")
    )
    return head + "\n\n" + "\n".join(rows) + "\n\n" + "\n".join(notes) + "\n"


def _options(args) -> str:
    """The options that reproduce the table, as the command line gives them."""
    runs = "".join(f" --from {folder}" for folder in args.runs or [])
    runs += "".join(f" --zoo {name}" for name in args.zoo or [])
    return runs + (f" --num {args.num}" if args.num else "") + (f" --workers {args.workers}" if args.workers else "")


def _runs(args, workers: int) -> Iterator[tuple[str, dict, float | None]]:
    """(zoo, report, wall seconds) of each mini zoo generated now into out/, or of each finished
    run folder given with --from (its wall time unknown: None)."""
    if args.runs:
        for folder in args.runs:
            report = json.loads((Path(folder) / "report.json").read_text())
            yield report["zoo"], report, None
        return
    for name in args.zoo or MINI_ZOOS:
        out = common.fresh_folder("mini-zoo-speed", name)
        began = time.perf_counter()
        result = generate_zoo(name, out, workers=workers, limit=args.num)
        yield name, result.report, time.perf_counter() - began


def _reasons(failed: list[dict]) -> list[tuple[str, int]]:
    """The failures counted by kind of reason: the tracer's single-key refusal, a library that
    refuses the smaller arguments, a lost kind, not trainable, the full model not tracing."""
    kinds = {
        "single key at 32 px": "a single key",
        "the library refuses the arguments": "cannot build",
        "loses a kind": "loses",
        "not trainable": "not trainable",
        "the full model does not trace": "the full model does not trace",
        "timed out": "not traced within",
        "its process died": "process died",
    }
    counts: dict[str, int] = {}
    for failure in failed:
        kind = next((k for k, text in kinds.items() if text in failure["reason"]), "other trace failures")
        counts[kind] = counts.get(kind, 0) + 1
    return sorted(counts.items(), key=lambda item: -item[1])


def main() -> None:
    common.main(
        __doc__,
        "mini_zoo_speed",
        table,
        lambda p: (
            p.add_argument("--zoo", choices=MINI_ZOOS, action="append", help="only this mini zoo (repeatable)"),
            p.add_argument("--num", type=int, help="only the first N models of each (a sample)"),
            p.add_argument("--workers", type=int, help="worker processes (default: one per core)"),
            p.add_argument("--note", help="a sentence added to the section (e.g. that the machine was shared)"),
            p.add_argument("--from", dest="runs", action="append", help="tabulate this finished run's folder instead"),
        ),
    )


if __name__ == "__main__":
    main()
