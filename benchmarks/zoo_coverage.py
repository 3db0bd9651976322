"""How much of the real zoo graphkit traces, and how fast: `graphkit generate zoo-vits` and
`zoo-decoders` from scratch (issue #29 targets: at least 95% of each source traced and
validated with no `other:` op; generation within 15 minutes on 2 cores). Coverage counts the
candidates the library itself builds: a reference config that transformers cannot instantiate
is listed in the report, not held against the tracer.

    .venv/bin/python benchmarks/zoo_coverage.py --zoo zoo-vits  # one zoo, into out/zoo-coverage/zoo-vits
    .venv/bin/python benchmarks/zoo_coverage.py --num 10        # a quick check: the first 10 of each
    .venv/bin/python benchmarks/zoo_coverage.py --zoo zoo-vits --sample 60 --workers 1  # 60 spread over it
    .venv/bin/python benchmarks/zoo_coverage.py --write         # both zoos; updates BENCHMARKS.md

Each zoo is generated afresh into out/zoo-coverage/ with one worker per core; the table gives
the candidates, the coverage, the records, the models `graphkit predict` accepts with the bundled
hypernetworks, the failures and the wall time; below it, the refusals by reason (the op kinds no
bundled hypernetwork of the model's input trained on). The reports (out/zoo-coverage/zoo-*/report.md) name
every model that failed and why. ``--sample N`` takes N candidates spread evenly over the zoo's
sorted list (every k-th), for a shared machine.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from graphkit.datasets.zoo import ZOOS, generate_zoo  # noqa: E402


def table(args) -> str:
    rows = [
        "| zoo | candidates | built by the library | traced, validated | no `other:` op (coverage of those built) "
        "| records | predictable | wall time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    versions, refusals = {}, Counter()
    workers = args.workers or common.cores()
    for name in args.zoo or [name for name, zoo in ZOOS.items() if not zoo.mini]:  # mini zoos: mini_zoo_speed.py
        out = common.fresh_folder("zoo-coverage", name)
        zoo = ZOOS[name]
        if args.sample:  # the worker processes fork from here and see the sampled zoo
            everything = zoo.candidates()
            step = max(1, len(everything) // args.sample)
            ZOOS[name] = dataclasses.replace(zoo, candidates=lambda: everything[::step][: args.sample])
        try:
            result = generate_zoo(name, out, workers=workers, limit=args.num)
        finally:
            ZOOS[name] = zoo
        report = result.report
        refusals.update({f"{name}: {reason}": n for reason, n in report["predict_refusals"].items()})
        versions.update(report["libraries"])
        rows.append(
            f"| {name} | {report['candidates']} | {report['buildable']} | {report['traced']} | {report['clean']} "
            f"({100 * report['coverage']:.1f}%) | {report['records']} | {report['predictable']} | "
            f"{result.seconds / 60:.1f} min |"
        )
        print(rows[-1], flush=True)
    sample = f"the first {args.num} models of each zoo, " if args.num else ""
    sample += f"{args.sample} models spread over each zoo (every k-th), " if args.sample else ""
    head = (
        f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} CPU cores, {sample}with "
        f"{', '.join(f'{k} {v}' for k, v in versions.items())}; {workers} worker(s), from an empty folder. "
        "Command: `.venv/bin/python benchmarks/zoo_coverage.py --write`; the failures are in "
        "out/zoo-coverage/zoo-*/report.md."
    )
    reasons = [f"- {reason}: {n}" for reason, n in refusals.most_common()] or ["- none"]
    return (
        head + "\n\n" + "\n".join(rows) + "\n\n`graphkit predict` refuses, by reason:\n\n" + "\n".join(reasons) + "\n"
    )


def main() -> None:
    common.main(
        __doc__,
        "zoo_coverage",
        table,
        lambda p: (
            p.add_argument(
                "--zoo", choices=sorted(n for n, z in ZOOS.items() if not z.mini), action="append", help="only this zoo"
            ),
            p.add_argument("--num", type=int, help="only the first N models of each zoo (a quick check)"),
            p.add_argument("--sample", type=int, help="N models spread evenly over each zoo (every k-th)"),
            p.add_argument("--workers", type=int, help="tracing processes (default: one per core)"),
        ),
    )


if __name__ == "__main__":
    main()
