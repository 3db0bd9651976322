"""Where a hypernetwork's predictions lose context (issue #45 item 1): per role, how much of each
predicted weight matrix's energy lies in its top singular value; per model, how much of each
block's output varies from token to token; and the loss with the predicted blocks against the
loss with the blocks zeroed.

    .venv/bin/python benchmarks/role_spectra.py          # print the tables
    .venv/bin/python benchmarks/role_spectra.py --write  # and update BENCHMARKS.md

One 4-layer, 256-wide model of each family with a bundled checkpoint (ViT at 8 px, patch 2;
GPT-2 and LLaMA at their vocabularies), built from seed 0. Parameters compared:

- own init: the model as its library builds it;
- fresh LoGAH: the checkpoint's architecture freshly initialised (seed 0), never trained;
- checkpoint: the bundled checkpoint's prediction alone (no keep_init; GPT-2's residual
  branches scaled as its init scales them, as eval-ghn's `predicted` does);
- trained directly: the model trained from its own init for `--steps` AdamW steps (lr 3e-4,
  batch 8, on the family's bundled data), the reference a prediction should resemble.

Top singular value share: sigma_1^2 / sum sigma_i^2 of each matrix (2-D or more, flattened to
out x in), averaged over the blocks for each role (its leaf name). A near-rank-1 block adds
about the same vector to every token: frequency information with no context.

Token-varying share: over held-out batches, the mean square of each block's output left after
each sequence's mean over tokens is removed, over its whole mean square, averaged over blocks
(1: every token differs; 0: the block adds one vector to all of them).

Blocks zeroed: every residual writer (`graphkit.ghn.calibrate.residual_writers`) set to zero, so
that only the embeddings, final norm and head act. A prediction whose blocks do not beat that
has learnt nothing that depends on context.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from graphkit.families import build_model, get_family  # noqa: E402
from graphkit.ghn.calibrate import residual_writers  # noqa: E402
from graphkit.ghn.encoding import role_of  # noqa: E402
from graphkit.ghn.model import LoGAH  # noqa: E402
from graphkit.ghn.predict import bundled_hypernetwork, predict  # noqa: E402
from graphkit.ghn.space import input_task  # noqa: E402
from graphkit.tracing import trace  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.loop import score, up_train  # noqa: E402

SHAPE = {"num_layers": 4, "hidden": 256, "heads": 4}
FAMILIES = {
    "vit": {"family": "vit", "image_size": 8, "patch_size": 2, **SHAPE},
    "gpt2": {"family": "gpt2", **SHAPE},
    "llama": {"family": "llama", **SHAPE},
}
BATCHES, BATCH_SIZE, LR = 4, 8, 3e-4
INITS = ("own init", "fresh LoGAH", "checkpoint", "trained directly")


def built(config: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(config, "cpu")


def top_share(weight: torch.Tensor) -> float:
    """sigma_1^2 / sum sigma_i^2 of ``weight`` flattened to (out, in)."""
    values = torch.linalg.svdvals(weight.detach().float().reshape(weight.shape[0], -1))
    return (values[0] ** 2 / (values**2).sum()).item()


def role_shares(model: torch.nn.Module, blocks: str) -> dict[str, float]:
    """The mean top singular value share of each block role's matrices."""
    shares: dict[str, list[float]] = {}
    for name, param in model.named_parameters():
        if param.dim() >= 2 and name.startswith(blocks + "."):
            shares.setdefault(role_of(name, "leaf"), []).append(top_share(param))
    return {role: sum(values) / len(values) for role, values in shares.items()}


def token_varying_share(model: torch.nn.Module, blocks: str, batches: list) -> float:
    """The mean over blocks of the share of each block's output (what it adds to the stream)
    that varies from token to token."""
    parts: list[float] = []

    def hook(module, args, kwargs, output):
        stream = args[0] if args else kwargs["hidden_states"]
        added = ((output[0] if isinstance(output, tuple) else output) - stream).float()
        centred = added - added.mean(dim=1, keepdim=True)
        parts.append((centred.pow(2).sum() / added.pow(2).sum().clamp_min(1e-12)).item())

    handles = [block.register_forward_hook(hook, with_kwargs=True) for block in model.get_submodule(blocks)]
    try:
        score(model, batches, "text" if batches[0][0].dim() == 2 else "image")
    finally:
        for handle in handles:
            handle.remove()
    return sum(parts) / len(parts)


def family_rows(name: str, config: dict, source, steps: int) -> tuple[list[str], str]:
    family = get_family(name)
    model = built(config)
    graph = trace(model)
    task = input_task(graph)
    held_out, train = common.fixed_batches(source, model, BATCH_SIZE, BATCHES, steps)
    ghn = bundled_hypernetwork(family.bundled_ghn)
    torch.manual_seed(0)
    fresh = LoGAH(ghn.config).eval()
    fresh.info = ghn.info
    models = {"own init": model}
    for label, hypernet in (("fresh LoGAH", fresh), ("checkpoint", ghn)):
        models[label] = built(config)
        predict(models[label], hypernet, graph=graph, keep_init=False, grow=False)
    models["trained directly"] = built(config)
    up_train(models["trained directly"], task, train.__getitem__, steps, LR)
    shares = {label: role_shares(m, family.blocks) for label, m in models.items()}
    rows = [
        f"| {name} | `{role}` | " + " | ".join(f"{100 * shares[label][role]:.0f}%" for label in INITS) + " |"
        for role in sorted(shares["own init"])
    ]
    losses = {label: score(m, held_out, task)[0] for label, m in models.items()}
    varying = {label: token_varying_share(m, family.blocks, held_out) for label, m in models.items()}
    zeroed = {}
    for label in ("checkpoint", "trained directly"):
        with torch.no_grad():
            for writer in residual_writers(graph):
                models[label].get_parameter(writer).zero_()
        zeroed[label] = score(models[label], held_out, task)[0]
    summary = (
        f"| {name} | "
        + " | ".join(f"{losses[label]:.2f}" for label in INITS)
        + f" | {zeroed['checkpoint']:.2f} | {zeroed['trained directly']:.2f} | "
        + " | ".join(f"{varying[label]:.2f}" for label in INITS)
        + " |"
    )
    return rows, summary


def table(args) -> str:
    roles = ["| family | role | " + " | ".join(INITS) + " |", "|---|---|---|---|---|---|"]
    summaries = [
        "| family | loss: " + " | ".join(INITS) + " | checkpoint, blocks zeroed | trained, blocks zeroed "
        "| token-varying: " + " | ".join(INITS) + " |",
        "|---|" + "---|" * 10,
    ]
    for name, config in FAMILIES.items():
        source = load_source(get_family(name).data)
        rows, summary = family_rows(name, config, source, args.steps)
        roles += rows
        summaries.append(summary)
        print("\n".join([*rows, summary]), flush=True)
    return (
        f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} CPU cores, torch {torch.__version__}; "
        f"4 x 256 models, held-out loss on each family's bundled data ({BATCHES} batches of {BATCH_SIZE}), "
        f"trained directly for {args.steps} steps. Command: `.venv/bin/python benchmarks/role_spectra.py "
        "--write`.\n\nTop singular value share of the block matrices, by role:\n\n"
        + "\n".join(roles)
        + "\n\nLoss, the same with the blocks zeroed, and the blocks' token-varying share:\n\n"
        + "\n".join(summaries)
        + "\n"
    )


def options(parser) -> None:
    parser.add_argument("--steps", type=int, default=300, help="direct training steps of the reference model")


if __name__ == "__main__":
    common.main(__doc__, "role_spectra", table, options)
