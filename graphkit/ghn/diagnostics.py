"""What a training run logs besides its loss, to show where training goes wrong: the gradient
norm of each part of the hypernetwork, how alike the decoder's factors are (a collapse drives
them together), how little the predicted models' output depends on their input (a plateau),
and the run's curves as a PNG. None of it changes training; ``Stopwatch`` keeps its time out
of the throughput the log reports."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call

from graphkit.fileio import save_figure
from graphkit.ghn.encoding import EncodedGraph
from graphkit.ghn.model import LoGAH, LowRankDecoder
from graphkit.ghn.pool import ArchPool


def gradient_norms(ghn: LoGAH) -> dict[str, float]:
    """The gradient norm of each part of the hypernetwork (encoder, decoder MLP, low-rank map,
    gain head, level head, role factors and role vectors where there are, decoder embeddings), for
    metrics.jsonl: a part whose norm collapses or explodes shows where training goes wrong."""
    parts: dict[str, list[torch.Tensor]] = {}
    for name, param in ghn.named_parameters():
        if param.grad is not None:
            top, _, rest = name.partition(".")
            part = top if top == "encoder" else rest.split(".")[0]
            parts.setdefault("embed" if part.endswith("_embed") else part, []).append(
                param.grad.detach().float().norm()
            )
    return {part: torch.stack(norms).norm().item() for part, norms in parts.items()}


def factor_similarity(ghn: LoGAH, nodes: torch.Tensor, graphs: Sequence[EncodedGraph]) -> dict[str, float]:
    """The step's factor similarity from the node embeddings its forward made (no second encoder
    pass); {} for the GHN-3 baseline, which has no factors."""
    if not isinstance(ghn.decoder, LowRankDecoder):
        return {}
    return {"factor_similarity": ghn.decoder.factor_similarity(nodes.detach().float(), graphs)}


def feature_constancy(model: nn.Module, params: dict[str, torch.Tensor], inputs: torch.Tensor, head: str) -> float:
    """How little a model's output depends on its input: the features entering its output head
    (module path ``head``), run in eval mode with ``params``, as the norm of their mean over the
    batch (and tokens) over their mean distance from that mean. Below 1 at random init; far above
    when the output hardly depends on the input, as on the plateaus a hypernetwork can train
    into: a ViT's class token that ignores the image, a GPT-2 whose residual stream is a constant
    (docs/experiments.md has the values checkpoints gave)."""
    captured: list[torch.Tensor] = []
    hook = model.get_submodule(head).register_forward_pre_hook(lambda module, args: captured.append(args[0].detach()))
    try:
        with torch.no_grad():
            functional_call(model.eval(), params, (inputs,))
    finally:
        hook.remove()
    features = captured[0].float().flatten(0, -2)
    mean = features.mean(0)
    return (mean.norm() / (features - mean).norm(dim=-1).mean().clamp_min(1e-12)).item()


def decoded_feature_constancy(
    ghn: LoGAH,
    nodes: torch.Tensor,
    graph: EncodedGraph,
    pool: ArchPool,
    index: int,
    source,
    batch_size: int,
    seed: int,
) -> dict[str, float]:
    """The step's :func:`feature_constancy` for the meta-batch's first architecture, decoded again
    from the step's node embeddings on a batch of its own (the training draws are left as they
    are); {} for a graph without an output head."""
    head = next((node.module for node in pool.records[index].graph.nodes if node.op == "head"), None)
    if head is None:
        return {}
    with torch.no_grad():
        decoded = ghn.decoder(nodes[: graph.num_nodes].detach().float(), [graph]).params
    params = decoded[0]
    inputs, _ = source.batch(pool.records[index].config, batch_size, torch.Generator().manual_seed(seed))
    return {"feature_constancy": feature_constancy(pool.model(index), params, inputs.to(pool.device), head)}


class Stopwatch:
    """Seconds spent inside its ``with`` blocks, summed: the log's diagnostics (per-part gradient
    norms, factor similarity, feature constancy) cost a decode and a forward of their own, which
    ``archs_per_s`` leaves out so that it measures training, whatever ``--log-every`` is."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> None:
        self._tic = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._tic


def plot_metrics(metrics_file: str | Path, png: str | Path) -> None:
    """The run's curves as a PNG: training loss (and the look-ahead's, where the run has one) and
    accuracy, the gradient norm of each part of the hypernetwork (log scale), the factor similarity
    and the feature constancy, by step. A collapse
    shows as gradient norms falling by orders of magnitude while the similarity climbs towards 1;
    a plateau where the predicted models ignore their input, as a constancy far above 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [json.loads(line) for line in Path(metrics_file).read_text().splitlines()]
    steps = [m["step"] for m in lines]
    fig, (loss_ax, grad_ax, sim_ax, const_ax) = plt.subplots(1, 4, figsize=(17, 3.6))
    loss_ax.plot(steps, [m["ce"] for m in lines], label="as predicted")
    if any("look_ahead" in m for m in lines):  # --look-ahead: where the fine-tuning steps took the predictions
        loss_ax.plot(
            steps, [m.get("look_ahead", float("nan")) for m in lines], color="tab:green", label="after the look-ahead"
        )
        loss_ax.legend(fontsize=7)
    loss_ax.set(xlabel="step", ylabel="training cross-entropy", title="loss")
    accuracy_ax = loss_ax.twinx()
    accuracy_ax.plot(steps, [m["metric"] for m in lines], color="tab:orange", alpha=0.6)
    accuracy_ax.set_ylabel("accuracy (orange)")
    for part in sorted({p for m in lines for p in m.get("grad_norms", {})}):
        grad_ax.plot(steps, [m.get("grad_norms", {}).get(part, float("nan")) for m in lines], label=part)
    grad_ax.set(xlabel="step", ylabel="gradient norm (before clipping)", yscale="log", title="gradients per part")
    grad_ax.legend(fontsize=7)
    sim_ax.plot(steps, [m.get("factor_similarity", float("nan")) for m in lines])
    sim_ax.set(xlabel="step", ylabel="mean cosine of factors", ylim=(0, 1), title="factor similarity")
    const_ax.plot(steps, [m.get("feature_constancy", float("nan")) for m in lines])
    const_ax.set(
        xlabel="step",
        ylabel="|mean| / spread of the head's input",
        yscale="log",
        title="feature constancy (high: output ignores input)",
    )
    fig.tight_layout()
    save_figure(fig, png, "training-figure", dpi=110)  # a PNG is complete or not there
    plt.close(fig)
