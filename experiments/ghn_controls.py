"""Why a predicted GPT-2 sits on the unigram plateau: single-architecture controls.

A control, and on purpose a partial copy of the library: its arms replace the part of the
hypernetwork that the library's code would run through, so it keeps its own copy of the
decoder's block assembly (a weight as ``A B^T`` reshaped to the parameter) and of ``train()``'s
step (the loss plus gamma times the norm penalty, clipping, AdamW). The RMS rule comes from the
library (:func:`graphkit.ghn.model.weight_rms`). A change to the decoder's assembly or to the
training step must be mirrored here, or the arms stop measuring what they claim.

One GPT-2 of gpts-1k's size (6 layers, width 128, 8 heads, GPT-2's 50,257-token vocabulary,
untied head), trained for ``--steps`` AdamW steps at lr 3e-4 (constant) on the same batches of
stdlib text (8 x 64 bytes), then scored on held-out text. Each arm changes one thing:

- **direct**: the model's own parameters from its framework initialisation;
- **direct, blocks tied**: every block shares block 0's parameters, the most a hypernetwork that
  predicts the same weights for every block can express;
- **free factors, rank r**: LoGAH's output rule (each matrix ``W[:rows] F_A F_B^T W[:cols]^T``
  through the shared r -> K map, scaled to its RMS) with ``F_A, F_B`` free per parameter instead of
  coming from the decoder MLP: what the rule itself can express at LoGAH-tiny's r = 32 and
  LoGAH-small's r = 90;
- **free A, B per matrix, rank 32**: the same rule without the shared map, every weight matrix
  ``A B^T`` with its own free ``A`` (rows x 32) and ``B`` (cols x 32), scaled to the same RMS, the
  1-D parameters free from the framework's init: what rank 32 and the normalisation cost alone;
- **LoGAH-tiny / LoGAH-small**: the hypernetwork trained on the one architecture (its
  fan-in-scaled learning rates, the norm penalty);
- **LoGAH-tiny, role maps**: the same with ``--role-maps``: its decoder's matrices go through one
  r -> K map per parameter role (the state-dict name without its block index: 17 for this GPT-2;
  its own first 4,096 rows, the vocabulary's rows beyond them shared) instead of one for all, so
  that matrices of different roles no longer share one subspace.

Every arm but the two direct ones trains as ``train()`` trains a hypernetwork (gradients clipped to
5, the norm penalty); the direct arms fine-tune as ``eval-ghn`` does (no clipping).

    .venv/bin/python experiments/ghn_controls.py            # print the table (about 25 min on 2 cores)
    .venv/bin/python experiments/ghn_controls.py --write    # also update BENCHMARKS.md

The reference approach is direct training, in the same run on the same batches.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # common: BENCHMARKS.md sections
import json
import math
import warnings

import common  # noqa: E402
import torch
from torch import nn
from torch.func import functional_call

import graphkit
from graphkit.compiler import load_params
from graphkit.families import build_model
from graphkit.ghn import LoGAH
from graphkit.ghn.encoding import role_of, targets
from graphkit.ghn.evaluate import fine_tune, score
from graphkit.ghn.model import weight_rms
from graphkit.ghn.pool import functional_model
from graphkit.ghn.training import TrainConfig, make_optimizer
from graphkit.training.data import load_source, output_loss

CONFIG = dict(family="gpt2", num_layers=6, hidden=128, heads=8, mlp=512, vocab_size=50257, context=1024, tied=False)
#: each arm's kind and the LoGAH variant it uses (its rank r)
ARMS = {
    "direct": ("direct", None),
    "direct, blocks tied": ("tied", None),
    "free factors, rank 32 (LoGAH-tiny's)": ("free", "tiny"),
    "free factors, rank 90 (LoGAH-small's)": ("free", "small"),
    "free A, B per matrix, rank 32 (no shared map)": ("per_matrix", None),
    "LoGAH-tiny": ("hypernetwork", "tiny"),
    "LoGAH-small": ("hypernetwork", "small"),
    "LoGAH-tiny, role maps (--role-maps)": ("roles", "tiny"),
}


def tie_blocks(model) -> None:
    """Make every block of a GPT-2 use block 0's parameter tensors."""
    blocks = model.transformer.h
    for block in blocks[1:]:
        for name, module in block.named_modules():
            for param_name, _ in list(module.named_parameters(recurse=False)):
                setattr(module, param_name, getattr(blocks[0].get_submodule(name), param_name))


def at_decoder_rms(matrix, target, gain):
    """``matrix`` scaled to the RMS LoGAH's decoder gives ``target``'s weight
    (:func:`~graphkit.ghn.model.weight_rms`; ``gain`` in (0, 2), 1 at init)."""

    rms = weight_rms(gain, math.sqrt(target.fan_in))
    return matrix * (rms / matrix.square().mean().add(1e-12).sqrt())


def per_matrix_factors(model, rank: int = 32, std: float = 0.02):
    """The ``per_matrix`` arm's parameters for ``model``: a module whose ``forward()`` gives every
    parameter by name (with a zero norm penalty), each weight ``A B^T`` scaled to the RMS LoGAH's
    decoder gives it (:func:`at_decoder_rms`), its gain ``2 sigmoid(s / 2)`` with ``s`` free and 0
    at init. ``A`` and ``B`` start at ``std``, the scale of GPT-2's own weights: under the
    normalisation their scale only sets how fast Adam moves them."""

    class PerMatrix(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            plan = targets(graphkit.trace(model))
            self.weights = [t for t in plan if t.kind == "weight"]
            self.vector_names = [t.name for t in plan if t.kind != "weight"]
            self.a = nn.ParameterList(torch.randn(t.matrix_shape[0], rank) * std for t in self.weights)
            self.b = nn.ParameterList(torch.randn(t.matrix_shape[1], rank) * std for t in self.weights)
            self.s = nn.Parameter(torch.zeros(len(self.weights)))
            self.vectors = nn.ParameterList(model.get_parameter(n).detach().clone() for n in self.vector_names)

        def forward(self) -> tuple[dict, torch.Tensor]:
            out = dict(zip(self.vector_names, self.vectors))
            for t, a, b, s in zip(self.weights, self.a, self.b, self.s):
                out[t.name] = t.reshape(at_decoder_rms(a @ b.t(), t, 2 * torch.sigmoid(s / 2)))
            return out, torch.zeros(())

    return PerMatrix()


def train_arm(arm: str, steps: str) -> dict:
    """One arm's held-out loss and accuracy after ``steps`` steps, and its training-loss curve."""

    warnings.filterwarnings("ignore")

    source = load_source("stdlib-text", seq_len=64)
    generator = torch.Generator().manual_seed(123)
    held_out = [source.batch(CONFIG, 128, generator, split="eval") for _ in range(4)]
    generator = torch.Generator().manual_seed(0)
    batches = [source.batch(CONFIG, 8, generator) for _ in range(int(steps))]
    torch.manual_seed(0)
    model = build_model(CONFIG, "cpu")
    kind, variant = ARMS[arm]
    if kind in ("direct", "tied"):
        if kind == "tied":
            tie_blocks(model)
        losses, _ = fine_tune(model, batches, source.task, 3e-4)
        return {"loss": score(model, held_out, source.task), "curve": losses}

    config = TrainConfig(dataset="-", out="-")
    if kind == "per_matrix":
        predictor = per_matrix_factors(model)
        optimizer = torch.optim.AdamW(predictor.parameters(), lr=3e-4)
        return train_predictor(predictor, optimizer, model, batches, held_out, source.task, config)
    traced = graphkit.trace(model)
    ghn = LoGAH.from_variant(
        variant, roles=sorted({role_of(t.name) for t in targets(traced)}) if kind == "roles" else ()
    )
    graph = ghn.encode(traced)
    if kind == "free":

        class FreeFactors(nn.Module):
            """The decoder MLP's output for this one graph, as a free parameter (set from the MLP's
            output at init)."""

            def __init__(self, mlp: nn.Module) -> None:
                super().__init__()
                self.mlp, self.table = mlp, None

            def forward(self, query: torch.Tensor) -> torch.Tensor:
                if self.table is None:
                    self.table = nn.Parameter(self.mlp(query).detach().clone())
                return self.table

        ghn.decoder.mlp = FreeFactors(ghn.decoder.mlp)
        with torch.no_grad():
            ghn([graph])  # makes the table, so that the optimiser sees it
        ghn.decoder.mlp.mlp.requires_grad_(False)

    class Hypernetwork(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ghn = ghn

        def forward(self) -> tuple[dict, torch.Tensor]:
            prediction = ghn([graph], details=True)
            return prediction.params[0], prediction.norms.mean()

    predictor = Hypernetwork()
    return train_predictor(predictor, make_optimizer(ghn, config), model, batches, held_out, source.task, config)


def train_predictor(predictor, optimizer, model, batches, held_out, task: str, config) -> dict:
    """Train ``predictor`` (a module whose ``forward()`` gives ``model``'s parameters by name and a
    norm penalty) as ``train()`` trains a hypernetwork: one step per batch, the loss of ``model``'s
    architecture run on the predicted parameters plus ``config.gamma`` times the penalty, gradients
    clipped to ``config.clip``. Returns the final parameters' held-out score and the loss curve."""

    shell = functional_model(CONFIG, "cpu")
    losses = []
    for x, y in batches:
        params, penalty = predictor()
        loss, _ = output_loss(task, functional_call(shell.train(), params, (x,)), y)
        optimizer.zero_grad(set_to_none=True)
        (loss + config.gamma * penalty).backward()
        nn.utils.clip_grad_norm_(predictor.parameters(), config.clip)
        optimizer.step()
        losses.append(loss.item())
    with torch.no_grad():
        load_params(model, predictor()[0])
    return {"loss": score(model, held_out, task), "curve": losses}


def table(args) -> str:

    results = {arm: common.run_fresh(__file__, arm, str(args.steps)) for arm in ARMS}

    unigram = load_source("stdlib-text").unigram_loss()
    rows = ["| parameters from | held-out loss | accuracy | training loss, last 50 steps |", "|---|---|---|---|"]
    for arm, result in results.items():
        (loss, accuracy), curve = result["loss"], result["curve"]
        rows.append(f"| {arm} | {loss:.3f} | {accuracy:.3f} | {sum(curve[-50:]) / len(curve[-50:]):.3f} |")
        print(rows[-1], flush=True)
    head = (
        f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} cores; one GPT-2 (6 layers, width 128, 50,257 "
        f"tokens, untied head), {args.steps} AdamW steps at lr 3e-4 on the same batches of 8 x 64 bytes; held-out "
        f"loss of the final parameters (unigram: {unigram:.2f}, uniform over the vocabulary: "
        f"{math.log(50257):.2f}). Command: `.venv/bin/python experiments/ghn_controls.py --write`."
    )
    return head + "\n\n" + "\n".join(rows) + "\n"


def main() -> None:

    if "--one" in sys.argv:
        i = sys.argv.index("--one")
        print(json.dumps(train_arm(*sys.argv[i + 1 :])))
        return
    common.main(__doc__, "ghn_controls", table, lambda p: p.add_argument("--steps", type=int, default=300))


if __name__ == "__main__":
    main()
