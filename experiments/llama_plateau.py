"""Why LLaMA predictions sit on the unigram plateau (issue #45, items 1 and 5): two leads, each a
control that must move what it targets, trained as the bundled LLaMA checkpoint is (llamas-1k,
the Makefile's recipe, 1,200 steps) and probed on one 4 x 256 LLaMA.

Arms:
- ``control``: ``train()`` as it is.
- ``spread``: the training loss plus ``SPREAD`` times the mean inverse participation ratio of
  every weight query's r x r product M (``sum s^4 / (sum s^2)^2`` of its singular values, 1 for
  rank 1, 1/r when flat), the decoder's source of near-rank-1 blocks (BENCHMARKS.md, "Where
  predictions lose context"). It must lower the predicted blocks' top singular-value share.
- ``curriculum``: the control's recipe started from the pool of 4's trained weights (``--pools
  4`` first) instead of a fresh LoGAH: a small pool first, then the whole space. What it must
  keep is the pool of 4's token table.
- ``curriculum-spread``: both, the curriculum's start and the spread penalty: whether the
  curriculum's context survives the blocks being held below item 5's 30% top share.
- ``centred``: each predicted token table (``embed_tokens.weight``) centred over its rows, so
  that it carries no vector common to every token, in training and in the probe. It must raise
  the token-varying share of the embedding's output.

``spread`` is ``train-ghn --spread`` now (``TrainConfig.spread``, the decoder's ``Decoded.spread``).
Copies (mirror a change there): ``centred`` wraps ``LoGAH.forward`` (the parameters it returns)
and applies the same centring after ``predict``.

Pools (``--pools 1 2 4 8``): the control's recipe on a pool of K LLaMA architectures of llamas-1k's
space (:data:`SHAPES`, the probed 4 x 256 first, so K = 1 is the single-architecture control),
600 steps: where between one architecture and llamas-1k's hundreds learning stops.

``--finetune``: the probed LLaMA fine-tuned for 300 steps from each arm's prediction (and from
its token table with the byte rows' mean taken out) against its own init, the horizons where a
head start must hold.

Probe, per arm: the held-out loss of the predicted 4 x 256 LLaMA (4 batches of 8 from the
bundled text), the top singular-value share of its block matrices by role (mean over layers),
and the token-varying share (the mean square left after each sequence's mean over tokens is
removed, over the whole) of what the embedding and block 0's projections output.

    .venv/bin/python experiments/llama_plateau.py --arms control spread centred   # about 50 min on 2 cores
    .venv/bin/python experiments/llama_plateau.py --arms --pools 1 2 4 8           # about 45 min
    .venv/bin/python experiments/llama_plateau.py --probe-only --pools 1 2 4 8    # the runs in runs/
    .venv/bin/python experiments/llama_plateau.py --arms curriculum --probe-only --finetune  # 300 fine-tuning steps
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
import common  # noqa: E402
from role_spectra import BATCH_SIZE, BATCHES, FAMILIES, built, role_shares  # noqa: E402

from graphkit.datasets.store import graph_to_row, write_dataset  # noqa: E402
from graphkit.families import build_model, get_family, resolve_config  # noqa: E402
from graphkit.ghn import load_checkpoint, training  # noqa: E402
from graphkit.ghn import model as ghn_model  # noqa: E402
from graphkit.ghn.predict import predict  # noqa: E402
from graphkit.ghn.space import input_task  # noqa: E402
from graphkit.tracing import trace  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.loop import score, up_train  # noqa: E402

SPREAD = 1.0
TOKEN_TABLE = "embed_tokens.weight"
#: the bundled LLaMA checkpoint's recipe (Makefile, `bundled`)
RECIPE = dict(
    dataset=str(ROOT / "out" / "llamas-1k"), meta_batch=2, batch_size=8, seq_len=64, lr_fan_in=32.0, role_maps=True
)
#: the pools' architectures (depth, width), in llamas-1k's space (its width_by_depth), 64-wide heads
SHAPES = [(4, 256), (6, 128), (3, 512), (8, 192), (5, 384), (9, 128), (3, 384), (7, 256)]
#: the fine-tuning horizons of ``--finetune``
FINETUNED_AT = (0, 50, 100, 200, 300)
PROBED = ("embed_tokens", "q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj")


def centred(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The token tables of ``params`` with their mean row taken out."""
    return {k: v - v.mean(0, keepdim=True) if k.endswith(TOKEN_TABLE) else v for k, v in params.items()}


def with_centred_tables() -> None:
    forward = ghn_model.LoGAH.forward

    def centred_forward(self, graphs, *, details=False):
        out = forward(self, graphs, details=details)
        params = [centred(p) for p in (out.params if details else out)]
        return out._replace(params=params) if details else params

    ghn_model.LoGAH.forward = centred_forward


def from_pool_of_4() -> None:
    start = load_checkpoint(ROOT / "runs" / "llama-pool4-600")
    build = ghn_model.LoGAH.from_variant

    def started(*args, **kwargs):
        ghn = build(*args, **kwargs)
        ghn.load_state_dict(start.state_dict())
        return ghn

    training.LoGAH.from_variant = started


def train_arm(arm: str, steps: int) -> Path:
    out = ROOT / "runs" / f"llama-{arm}-{steps}"
    wrappers = {
        "centred": with_centred_tables,
        "curriculum": from_pool_of_4,
        "curriculum-spread": from_pool_of_4,
    }
    wrappers.get(arm, lambda: None)()
    spread = SPREAD if arm.endswith("spread") else 0.0  # train-ghn --spread
    training.train(training.TrainConfig(**RECIPE, out=str(out), steps=steps, spread=spread), progress=True)
    return out


def train_pool(k: int, steps: int) -> Path:
    """The control's recipe on the first ``k`` of :data:`SHAPES` (one more, the last, as the eval split)."""
    rows = []
    for i, (depth, width) in enumerate(SHAPES[:k] + SHAPES[k - 1 : k]):
        config = resolve_config({"family": "llama", "num_layers": depth, "hidden": width, "heads": width // 64})
        graph = trace(build_model(config, "meta"))
        rows.append(graph_to_row(graph, config, id=f"pool{k}-{i}", split="train" if i < k else "eval"))
    dataset = ROOT / "out" / f"llama-pool{k}"
    write_dataset(rows, dataset, name=f"llama-pool{k}")
    out = ROOT / "runs" / f"llama-pool{k}-{steps}"
    training.train(
        training.TrainConfig(**{**RECIPE, "dataset": str(dataset)}, out=str(out), steps=steps), progress=True
    )
    return out


def varying(t: torch.Tensor) -> float:
    t = t.float()
    return ((t - t.mean(1, keepdim=True)).pow(2).sum() / t.pow(2).sum().clamp_min(1e-12)).item()


def probe(run: Path, arm: str, shape: tuple[int, int] = (4, 256)) -> dict:
    family = get_family("llama")
    config = {**FAMILIES["llama"], "num_layers": shape[0], "hidden": shape[1], "heads": shape[1] // 64}
    model = built(config)
    graph = trace(model)
    task = input_task(graph)
    held_out, _ = common.fixed_batches(load_source(family.data), model, BATCH_SIZE, BATCHES, 0)
    predict(model, load_checkpoint(run), graph=graph, keep_init=False, grow=False)
    if arm == "centred":
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(centred({name: param})[name])
    outputs: dict[str, float] = {}

    def record(key: str):
        def hook(module, args, output) -> None:  # returns None: the output goes on unchanged
            outputs[key] = varying(output)

        return hook

    hooks = [
        module.register_forward_hook(record(key))
        for name, module in model.named_modules()
        for key in PROBED
        if name.endswith(key) and (key == "embed_tokens" or ".layers.0." in name)
    ]
    with torch.no_grad():
        model(held_out[0][0])
    for hook in hooks:
        hook.remove()
    curve = [json.loads(line)["ce"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {
        "arm": arm,
        "probed": f"{shape[0]} x {shape[1]}",
        "training CE, last 100 steps": statistics.mean(curve[-10:]),
        "held-out loss": score(model, held_out, task)[0],
        "top share": role_shares(model, family.blocks),
        "token-varying": outputs,
    }


def finetuned(run: Path | None, shape: tuple[int, int], centre_bytes: bool = False) -> dict[int, float]:
    """Held-out loss of the ``shape`` LLaMA fine-tuned for 300 AdamW steps (batch 8, lr 3e-4, the
    same batches for every start) from ``run``'s prediction, or from its own init (``run`` None),
    at 0, 50, 100, 200 and 300 steps; ``centre_bytes`` takes the mean of the 256 byte rows the
    text reads out of the predicted token table first."""
    family = get_family("llama")
    config = {**FAMILIES["llama"], "num_layers": shape[0], "hidden": shape[1], "heads": shape[1] // 64}
    torch.manual_seed(0)
    model = built(config)
    if run is not None:
        predict(model, load_checkpoint(run), keep_init=False, grow=False)
    if centre_bytes:
        with torch.no_grad():
            table = model.model.embed_tokens.weight
            table[:256] -= table[:256].mean(0, keepdim=True)
    held_out, batches = common.fixed_batches(load_source(family.data), model, BATCH_SIZE, BATCHES, 300)
    _, scores = up_train(model, "text", batches.__getitem__, 300, 3e-4, held_out=held_out, at=FINETUNED_AT)
    return {step: round(loss, 3) for step, (loss, _) in scores.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="*", default=["control", "spread", "centred"])
    parser.add_argument("--pools", nargs="*", type=int, default=[], help="pool sizes to train (600 steps)")
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--shape", default="4x256", help="the LLaMA probed, DEPTHxWIDTH")
    parser.add_argument("--probe-only", action="store_true", help="probe the runs already in runs/")
    parser.add_argument("--finetune", action="store_true", help="also fine-tune the probed LLaMA from each arm")
    args = parser.parse_args()
    shape = tuple(int(n) for n in args.shape.split("x"))
    if args.finetune:
        print(json.dumps({"own init": finetuned(None, shape)}))
    for arm in args.arms:
        run = ROOT / "runs" / f"llama-{arm}-{args.steps}"
        if not args.probe_only:  # each arm in a process of its own: the wrappers stay on
            import subprocess  # noqa: PLC0415

            code = f"import sys; sys.argv=['x']; from llama_plateau import train_arm; train_arm({arm!r}, {args.steps})"
            subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent, check=True)
        print(json.dumps(probe(run, arm, shape), indent=1))
        if args.finetune:
            print(json.dumps({arm: finetuned(run, shape), f"{arm}, byte rows centred": finetuned(run, shape, True)}))
    for k in args.pools:
        run = ROOT / "runs" / f"llama-pool{k}-600"
        if not args.probe_only:
            train_pool(k, 600)
        print(json.dumps(probe(run, f"pool of {k}", shape), indent=1))


if __name__ == "__main__":
    main()
