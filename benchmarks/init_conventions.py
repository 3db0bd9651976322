"""Where a prediction breaks a model's own init conventions (issue #45 item 1): 1-D parameters
decoded by convention against around their init constants, and BatchNorm statistics.

    .venv/bin/python benchmarks/init_conventions.py          # print the tables (about 6 min on 2 cores)
    .venv/bin/python benchmarks/init_conventions.py --write  # and update BENCHMARKS.md

One architecture of each family of both mini zoos (the first of the train split, then of the
held-out split; `graphkit generate zoo-vits-mini`, `zoo-decoders-mini` into out/), built from
seed 0; 2 held-out batches (8 sequences of 64 bytes of stdlib-text, 32 digits).

Table 1, a fresh LoGAH-tiny (seed 0, never trained), with and without init anchors
(`LoGAHConfig.init_anchors`: each 1-D parameter decoded around the constant its constructor fills
it with, `graphkit.tracing.tracer.init_constants`): the held-out loss of its prediction alone,
and its outputs' spread (the standard deviation over the batch, averaged over the rest): 0 means
the same output for every input, a model that cannot start learning. BatchNorm statistics are
estimated on 4 training batches for every model, the own init's included. Families whose loss
differs by more than 0.005 or spread by more than 10% are listed; the rest have no 1-D parameter
that matters off its kind's convention.

Table 2, the bundled `logah-tiny-zoo-vision` on the families with BatchNorm: its prediction
alone scored with the constructor's running statistics (mean 0, variance 1), as step 0 was
scored before 2026-11-29, and with statistics estimated on 4 training batches
(`graphkit.training.loop.estimate_batch_norm`, what eval-ghn does now); the own init beside.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from graphkit.families import build_model  # noqa: E402
from graphkit.ghn.config import LoGAHConfig  # noqa: E402
from graphkit.ghn.evaluate import initialise  # noqa: E402
from graphkit.ghn.model import LoGAH  # noqa: E402
from graphkit.ghn.pool import ArchPool, graph_for, with_init_constants  # noqa: E402
from graphkit.ghn.predict import bundled_hypernetwork, predicted_params  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.loop import BATCH_NORMS, estimate_batch_norm, score  # noqa: E402

ZOOS = {"zoo-decoders-mini": ("stdlib-text", 8), "zoo-vits-mini": ("digits", 32)}


def first_of_each(zoo: Path) -> list[tuple[str, Any]]:
    """(split, record): the first architecture of each family, train split first."""
    chosen: list[tuple[str, Any]] = []
    for split in ("train", "eval"):
        seen: set[str] = set()
        for record in ArchPool(zoo, split).records:
            if record.config["zoo_family"] not in seen:
                seen.add(record.config["zoo_family"])
                chosen.append((split, record))
    return chosen


def spread(model: torch.nn.Module, inputs: torch.Tensor) -> float:
    """The standard deviation of the model's outputs over the batch, averaged over the rest."""
    with torch.no_grad():
        out = model(inputs)
    logits = getattr(out, "logits", out)
    return float(logits.float().std(dim=0).mean())


def fresh_logah(anchors: bool) -> LoGAH:
    """LoGAH-tiny from seed 0: the same weights with anchors or without."""
    torch.manual_seed(0)
    return LoGAH(LoGAHConfig(init_anchors=anchors)).eval()


def anchors_table(zoo: Path, data: str, batch_size: int) -> list[str]:
    source = load_source(data, seq_len=64)
    fresh = {flag: fresh_logah(flag) for flag in (False, True)}
    rows = []
    for split, record in first_of_each(zoo):
        generator = torch.Generator().manual_seed(0)
        batches = [source.batch(record.config, batch_size, generator, split="eval") for _ in range(2)]
        inputs = [source.batch(record.config, batch_size, generator)[0] for _ in range(4)]
        graph = with_init_constants(record.graph, record.config)
        torch.manual_seed(0)
        own_model = build_model(record.config, "cpu")
        estimate_batch_norm(own_model, inputs)
        own = score(own_model, batches, source.task)[0]
        cells = []
        for ghn in fresh.values():
            torch.manual_seed(0)
            model = initialise(build_model(record.config, "cpu"), "predicted", predicted_params(ghn, graph))
            estimate_batch_norm(model, inputs)
            cells.append((score(model, batches, source.task)[0], spread(model, batches[0][0])))
        if abs(cells[0][0] - cells[1][0]) > 0.005 or abs(math.log((cells[0][1] + 1e-12) / (cells[1][1] + 1e-12))) > 0.1:
            (plain, plain_spread), (anchored, anchored_spread) = cells
            family = record.config["zoo_family"] + (" (held out)" if split == "eval" else "")
            rows.append(
                f"| {family} | {own:.3f} | {plain:.3f} | {plain_spread:.1e} | {anchored:.3f} | {anchored_spread:.1e} |"
            )
    return rows


def batch_norm_table(zoo: Path) -> list[str]:
    source = load_source("digits")
    ghn = bundled_hypernetwork("logah-tiny-zoo-vision")
    rows = []
    for split, record in first_of_each(zoo):
        torch.manual_seed(0)
        model = build_model(record.config, "cpu")
        if not any(isinstance(m, BATCH_NORMS) for m in model.modules()):
            continue
        generator = torch.Generator().manual_seed(0)
        held_out = [source.batch(record.config, 32, generator, split="eval") for _ in range(4)]
        inputs = [source.batch(record.config, 32, generator)[0] for _ in range(4)]
        own = score(model, held_out, source.task)
        initialise(model, "predicted", predicted_params(ghn, graph_for(record, ghn.config)))
        constructors = score(model, held_out, source.task)
        estimate_batch_norm(model, inputs)
        estimated = score(model, held_out, source.task)
        family = record.config["zoo_family"] + (" (held out)" if split == "eval" else "")
        cells = " | ".join(f"{loss:.3f} / {accuracy:.2f}" for loss, accuracy in (own, constructors, estimated))
        rows.append(f"| {family} | {cells} |")
    return rows


def table(args) -> str:
    root = common.ROOT / "out"
    lines = [
        "One architecture of each mini-zoo family, a fresh LoGAH-tiny (never trained), its prediction alone",
        "(`benchmarks/init_conventions.py`; families where init anchors change it; BatchNorm statistics",
        "estimated on 4 training batches). Held-out loss, and the outputs' spread over the batch (0: one",
        "output for every input):",
        "",
        "| family | own init | by convention | spread | init anchors | spread |",
        "|---|---|---|---|---|---|",
    ]
    for name, (data, batch_size) in ZOOS.items():
        lines += anchors_table(root / name, data, batch_size)
    lines += [
        "",
        "The bundled zoo-vision checkpoint's prediction alone on the families with BatchNorm, loss / accuracy",
        "(chance 2.303 / 0.10):",
        "",
        "| family | own init | constructor's statistics | estimated on 4 training batches |",
        "|---|---|---|---|",
        *batch_norm_table(root / "zoo-vits-mini"),
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} CPU cores, torch {torch.__version__}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    torch.set_num_threads(common.cores())
    common.main(__doc__, "init_conventions", table)
