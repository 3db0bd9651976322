"""Hypernetwork commands: train-ghn, predict, eval-ghn."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Optional

import typer

from graphkit.cli.app import (
    ARCHITECTURE_ONLY,
    app,
    command,
    console,
    errors,
    model_argument,
    stopped_in_one_line,
    trace_loaded,
)


@app.command("train-ghn")
@command
def train_ghn(
    dataset: Path = typer.Option(
        ..., "--dataset", "-d", help="Graph dataset folder (from `graphkit generate`); trains on its train split."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Run folder: final hypernetwork, checkpoint/, metrics.jsonl."),
    data: Optional[str] = typer.Option(
        None,
        "--data",
        help="digits, cifar10:DIR, cifar100:DIR, imagefolder:DIR, stdlib-text, text:PATH "
        "or wikitext:DIR (default: digits for image models, stdlib-text for LMs).",
    ),
    variant: str = typer.Option("tiny", "--variant", help="LoGAH size: tiny, small, base or large (Table 1)."),
    decoder: str = typer.Option(
        "low_rank", "--decoder", help="low_rank (LoGAH) or ghn3 (GHN-3's tiling decoder, the baseline)."
    ),
    depth_buckets: int = typer.Option(
        0,
        "--depth-buckets",
        help="Relative-depth embeddings of the encoder (16 is a good size), so that repeated "
        "blocks get different parameters; 0: none, as GHN-3 and the bundled checkpoints.",
    ),
    tie_feature: bool = typer.Option(
        False,
        "--tie-feature/--no-tie-feature",
        help="Let the encoder read which nodes share a tied token table (the embedding and the output "
        "head that reuses it), so that a pool of tied and untied language models gets a table for each job "
        '(docs/experiments.md, "Tied embeddings, predicted").',
    ),
    init_anchors: bool = typer.Option(
        True,
        "--init-anchors/--no-init-anchors",
        help="Decode each 1-D parameter around the constant its model's constructor fills it with (Gemma's "
        "norm gains at 0, Zaya's residual gains at 1, a zero-initialised BatchNorm), read from each model built "
        "with weights; --no-init-anchors: around its kind's (norm gains 1, anything else 0), as checkpoints "
        'before 2026-11-29 did (docs/experiments.md, "One-dimensional parameters").',
    ),
    table_gain: float = typer.Option(
        1.0,
        "--table-gain",
        help="Decode token and position tables at this many times the RMS every other weight gets "
        "(a tied table only where the final norm can undo it on the logits), so that what the blocks write "
        "is smaller beside the stream's input; needs --init-anchors "
        '(docs/experiments.md, "The stream\'s input").',
    ),
    level_head: bool = typer.Option(
        False,
        "--level-head/--no-level-head",
        help="Give each 1-D parameter (norm gains, biases, layer-scale gains) a learned level of its own, added "
        "after its output function, so that it can move where the weights' gradients leave it (a layer-scale "
        'gain that starts near 0 can open its block; docs/experiments.md, "A level of their own").',
    ),
    role_factors: bool = typer.Option(
        False,
        "--role-factors/--no-role-factors",
        help="Give each role map a pair of factors of its own, added to what the decoder's MLP gives each "
        "of its weights and trained at the base lr: the role's weights then train as directly trained weights "
        'do, and the MLP tells architectures apart; needs --role-maps (docs/experiments.md, "Role factors").',
    ),
    role_means_start: bool = typer.Option(
        False,
        "--role-means-start/--no-role-means-start",
        help="Start each role's factors at the mean of what the fresh decoder MLP gives that role's weights over "
        "the train split (all of it, as the role maps, with --zoo-families too), the MLP's last layer at zero, so "
        "that the MLP only corrects the roles "
        "(the bundled zoo-vision checkpoint's start); needs --role-factors "
        '(docs/experiments.md, "The role-means start, shipped").',
    ),
    role_vectors: bool = typer.Option(
        False,
        "--role-vectors/--no-role-vectors",
        help="Give each role map a vector of its own, added to the values of each of its 1-D parameters (norm "
        "gains, biases) and trained at the base lr: a role's 1-D parameters then train as one tensor per role "
        'trained directly does; needs --role-maps (docs/experiments.md, "Role vectors").',
    ),
    keep_init: bool = typer.Option(
        False,
        "--keep-init/--no-keep-init",
        help="Train the prediction as `predict --keep-init` writes it: added onto each model's own "
        "initialisation (weight matrices init + prediction), drawn afresh every step, so that the "
        "hypernetwork learns a correction to the init rather than whole matrices.",
    ),
    initial_checkpoint: Optional[str] = typer.Option(
        None,
        "--initial-checkpoint",
        metavar="<path>",
        help="Start from this hypernetwork's weights (a run folder or a bundled name) instead of a fresh "
        "LoGAH with the same options: a curriculum's next stage, e.g. a pool of 4 LLaMAs first, then llamas-1k, "
        "which leaves the unigram plateau where a fresh start does not (docs/experiments.md). One of an older op "
        "vocabulary (the bundled ones) starts the run's newer one, the op ids it never read fresh.",
    ),
    zoo_families: Optional[str] = typer.Option(
        None,
        "--zoo-families",
        metavar="<names>",
        help="Train on only these families of a mini zoo, comma-separated (e.g. mistral,qwen2,qwen3,helium), "
        "with the role maps of the whole split: a curriculum's first stage, from which --initial-checkpoint "
        "starts the whole zoo; the decoder zoo leaves the unigram plateau so (docs/experiments.md).",
    ),
    mix_families: bool = typer.Option(
        False,
        "--mix-families/--no-mix-families",
        help="Draw each step's architectures from --meta-batch different families of a mini zoo, every family "
        "as likely as any other, instead of uniformly over the architectures (where a large family takes most "
        "steps).",
    ),
    role_maps: bool = typer.Option(
        False,
        "--role-maps/--no-role-maps",
        help="Give each parameter role (its name without the block index) its own rows of the decoder's r -> K map "
        "instead of one map for all; a GPT-2 pool leaves the unigram plateau with it (docs/experiments.md).",
    ),
    role_key: str = typer.Option(
        "name",
        "--role-key",
        help="How a parameter's name becomes its role (with --role-maps): name (without block indices, "
        "one family's own roles), leaf (its last module name and parameter, q_proj.weight, which "
        "families that name their layers alike share), layer (leaf, but a wrapper named for its type "
        "skipped: Moshi's q_proj.linear.weight is q_proj.weight) or siblings (leaf, keyed by the parameter names "
        "of the module holding the layer: timm's Mlp and Attention get maps of their own).",
    ),
    max_roles: Optional[int] = typer.Option(
        None,
        "--max-roles",
        help="With --role-maps: maps for only the N roles that most architectures of the train split have; "
        "the rest, and roles a predicted model has but training never saw, use the shared map "
        "(default: every role).",
    ),
    role_rows: int = typer.Option(
        4096, "--role-rows", help="With --role-maps: the leading rows of the r -> K map each role owns (1 to K)."
    ),
    meta_batch: int = typer.Option(4, "--meta-batch", "-m", help="Architectures per step (per process)."),
    batch_size: int = typer.Option(32, "--batch-size", "-b", help="Images or sequences per architecture."),
    seq_len: int = typer.Option(64, "--seq-len", help="Tokens per sequence (language models)."),
    steps: int = typer.Option(1000, "--steps", help="Optimisation steps."),
    lr: float = typer.Option(3e-4, "--lr", help="AdamW learning rate (cosine schedule to 0)."),
    lr_fan_in: float = typer.Option(
        64,
        "--lr-fan-in",
        help="Linear weights of the hypernetwork train at lr * min(1, C / fan-in) (muP's Adam "
        "rule); 64 fits one architecture fastest, 8 suits pools mixing many widths and depths.",
    ),
    weight_decay: float = typer.Option(1e-2, "--weight-decay"),
    gamma: float = typer.Option(3e-5, "--gamma", help="Weight of the predicted-parameter norm penalty."),
    spread: float = typer.Option(
        0.0,
        "--spread",
        help="Weight of the penalty on predicted blocks with their energy in one direction (the low-rank "
        "decoder's mean inverse participation ratio; 1.0 in the bundled LLaMA's second stage).",
    ),
    correction: float = typer.Option(
        0.0,
        "--correction",
        help="Weight of the penalty on the decoder MLP's share of each weight's factors beside its role's own "
        "(needs --role-factors), so that the role factors carry what the roles share.",
    ),
    look_ahead: int = typer.Option(
        0,
        "--look-ahead",
        metavar="N",
        help="Score each prediction also by its loss after N AdamW steps of fine-tuning from it, first-order "
        "(the gradient where the steps end, as first-order MAML), to move predictions towards starts that train; "
        "each step costs about N more model passes per architecture (0: off). "
        'See docs/experiments.md, "A look-ahead objective".',
    ),
    look_ahead_lr: float = typer.Option(
        3e-4, "--look-ahead-lr", help="The look-ahead's AdamW learning rate (eval-ghn's --lr by default)."
    ),
    clip: float = typer.Option(5.0, "--clip", help="Gradient-norm clipping."),
    amp: Optional[bool] = typer.Option(None, "--amp/--no-amp", help="bf16 autocast (default: on with a GPU)."),
    seed: int = typer.Option(0, "--seed"),
    checkpoint_every: int = typer.Option(100, "--checkpoint-every", help="Steps between checkpoints."),
    log_every: int = typer.Option(10, "--log-every", help="Steps between metrics.jsonl lines."),
    device: Optional[str] = typer.Option(
        None, "--device", help="cpu, cuda, cuda:1 (default: $GRAPHKIT_DEVICE, else the local GPU, else cpu)."
    ),
    deterministic: bool = typer.Option(
        False,
        "--deterministic",
        help="Deterministic GPU kernels, so that a run and its resume give "
        "the same weights on a GPU (slower; CPU runs repeat without it).",
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue from OUT/checkpoint with the same options."),
) -> None:
    """Train a LoGAH hypernetwork on a graph dataset.

    Run under `torchrun --nproc-per-node N` for several GPUs or nodes (DDP).
    """
    from graphkit.ghn.training import TrainConfig, train

    config = TrainConfig(
        dataset=str(dataset),
        out=str(out),
        data=data,
        variant=variant,
        decoder=decoder,
        depth_buckets=depth_buckets,
        tie_feature=tie_feature,
        init_anchors=init_anchors,
        table_gain=table_gain,
        level_head=level_head,
        role_factors=role_factors,
        role_means_start=role_means_start,
        role_vectors=role_vectors,
        keep_init=keep_init,
        initial_checkpoint=initial_checkpoint,
        zoo_families=None if zoo_families is None else [name.strip() for name in zoo_families.split(",")],
        mix_families=mix_families,
        role_maps=role_maps,
        role_key=role_key,
        max_roles=max_roles,
        role_rows=role_rows,
        meta_batch=meta_batch,
        batch_size=batch_size,
        seq_len=seq_len,
        steps=steps,
        lr=lr,
        lr_fan_in=lr_fan_in,
        weight_decay=weight_decay,
        gamma=gamma,
        spread=spread,
        correction=correction,
        look_ahead=look_ahead,
        look_ahead_lr=look_ahead_lr,
        clip=clip,
        amp=amp,
        seed=seed,
        checkpoint_every=checkpoint_every,
        log_every=log_every,
        device=device,
        deterministic=deterministic,
    )
    last = train(config, resume=resume)
    if last:
        console.print(
            f"step {last['step']}: loss {last['loss']:.4f}, accuracy {last['metric']:.3f}, "
            f"{last['archs_per_s']:.2f} architectures/s; wrote {out}",
            highlight=False,
        )


@app.command()
@command
def predict(
    model: str = model_argument(f"Build a MODEL.py on meta too: its weights are predicted. {ARCHITECTURE_ONLY}"),
    ghn: Optional[str] = typer.Option(
        None,
        "--ghn",
        help="Hypernetwork checkpoint folder (default: the bundled LoGAH-tiny trained on the model's input "
        "(tokens or images) and on every op it has, its family's own first).",
    ),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Save the predicted parameters (safetensors)."),
    residual_scale: Optional[bool] = typer.Option(
        None,
        "--residual-scale/--no-residual-scale",
        help="Scale the weights that write each residual branch by 1/sqrt(branches), "
        "as the family's own init does (default: for families that do, GPT-2).",
    ),
    grow: bool = typer.Option(
        True,
        "--grow/--no-grow",
        help="Predict a model wider than any the hypernetwork trained on, or with a patch size or a finer "
        "token grid it never trained on, as its twin inside the training space, grown to its width (Net2Net), "
        "its patch embedding resized (FlexiViT), its position table resized to its grid and its output layer "
        "scaled by the grids' ratio, and transformers' ViT as the timm ViT it computes the same function as; "
        "--no-grow decodes it directly.",
    ),
    calibrate: bool = typer.Option(
        False,
        "--calibrate",
        help="Then shrink each residual branch and the output layer so that the stream and "
        "logits are no larger than the family's init gives on a random batch (graphkit's "
        "families; see docs/experiments.md for what it costs in fine-tuning).",
    ),
    balance_on: Optional[str] = typer.Option(
        None,
        "--balance-on",
        help="Then shift the output layer's bias so that every class has the same mean predicted probability "
        "over 128 training images of this data (digits, cifar10:DIR, cifar100:DIR or imagefolder:DIR; their labels "
        "unused): the one guess for every image that a prediction gives on an architecture unlike those it trained "
        "on, taken out. Image classifiers whose output layer has a bias; BatchNorm statistics are estimated on the "
        "same images (docs/experiments.md, 'Balancing the logits').",
    ),
    keep_init: Optional[bool] = typer.Option(
        None,
        "--keep-init/--no-keep-init",
        help="Add the prediction onto the model's own initialisation (weight matrices init + prediction, "
        "norms and biases as predicted) rather than replace it (default: for families where it fine-tunes "
        "better, GPT-2 and LLaMA; docs/experiments.md).",
    ),
    shrink: Optional[float] = typer.Option(
        None,
        "--shrink",
        help="Add the prediction scaled by this factor (above 0, at most 1) onto the model's own "
        "initialisation: init + shrink x prediction, a start for fine-tuning rather than a model to use "
        "as it is (shrink and perturb). Implies --keep-init. Default: the family's factor, 0.5 for LLaMA "
        "(on 8 held-out LLaMAs it beats the own init after 0, 100 and 300 steps on 7, 8 and 8; "
        "docs/experiments.md), 1 for the others.",
    ),
) -> None:
    """Predict every parameter of a model with a graph hypernetwork."""
    import torch

    from graphkit.errors import PredictError
    from graphkit.finetune import LR_SCALE_KEY, lr_scale_phrase
    from graphkit.ghn import load_checkpoint
    from graphkit.ghn import predict as predict_params
    from graphkit.ghn.calibrate import check_balancing_data
    from graphkit.ghn.checkpoint import (
        bundled_for,
        check_graph,
        checkpoint_task,
        describe,
        hand_written_first,
        knows_every_op,
        plain_for,
    )
    from graphkit.ghn.evaluate import NORM_BATCHES
    from graphkit.ghn.grow import lr_scale, twin_of, twin_phrase
    from graphkit.ghn.keep_init import (
        SATURATED,
        default_shrink,
        keep_init_choice,
        keeps_init,
        start_family,
        trained_onto_init,
    )
    from graphkit.ghn.predict import with_init_record
    from graphkit.ghn.space import outside_training_space
    from graphkit.params import check_params_output, save_params
    from graphkit.sources import load_model_source
    from graphkit.training.data import calibration_inputs, data_config, load_source

    keep_init, shrink = keep_init_choice(keep_init, shrink, PredictError)  # before the model is loaded
    if out is not None:
        check_params_output(out, kind="predicted-weights")
    images = load_source(balance_on) if balance_on is not None else None
    if images is not None:
        check_balancing_data(images, "--balance-on", PredictError)
    loaded = load_model_source(model, weights=False)
    start = time.perf_counter()
    loaded, graph = trace_loaded(loaded)
    balance = None
    if images is not None:  # the images shaped as the model reads them, before the long work
        balance = torch.cat(
            calibration_inputs(
                data_config(loaded.model, loaded.example_inputs), images, batches=NORM_BATCHES, batch_size=32
            )
        )
    chosen = bundled_for(graph) if ghn is None else None
    hypernet = load_checkpoint(chosen if chosen is not None else str(ghn))
    # a model it cannot predict is one error line, with no scores or warning before it
    check_graph(hypernet, graph, plain=grow)
    if chosen is not None:  # chosen by what the model is: say which, since it need not be its family's
        task = checkpoint_task(hypernet.info)
        # a model with an op it never saw is predicted as the plain model it computes (layer scale's gains at 1)
        plain = plain_for(hypernet.info, graph) if grow and not knows_every_op(hypernet.info, graph) else None
        across = "; trained across families, it fine-tunes a hand-written model better than a family's"
        console.print(
            f"bundled hypernetwork {chosen.name}: trained on {task + ' models and on ' if task else ''}every op "
            f"kind {loaded.name} has"
            + (f" as its twin {' and '.join(plain.parts)}" if plain is not None else "")
            + (across if hand_written_first(graph, chosen.name) else ""),
            highlight=False,
            soft_wrap=True,
        )
    factor = default_shrink(graph, hypernet.info, shrink)
    keeping, saturated = keeps_init(loaded.model, graph, keep_init, hypernet.info, loaded.example_inputs)
    console.print(
        describe(hypernet, keeping, factor),
        highlight=False,
        soft_wrap=True,
    )
    beyond = outside_training_space(hypernet.info, graph)
    if beyond:
        errors.print(
            f"warning: {loaded.name} lies outside the space this hypernetwork was trained on: {beyond}; "
            "the scores above were measured on the held-out architectures of its training data, not on this model",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    graph = with_init_record(loaded.model, graph, hypernet)  # as predict encodes it: a meta trace records no init
    stand_ins = hypernet.stand_ins(graph)
    if stand_ins:
        shown = [f"{role} as {' or '.join(trained)}" for role, trained in stand_ins.items()]
        console.print(
            f"{len(shown)} of {loaded.name}'s parameter roles are none this hypernetwork trained on; each decodes "
            "through the trained role nearest its node: " + ", ".join(shown[:6]) + (", ..." if len(shown) > 6 else ""),
            highlight=False,
            soft_wrap=True,
        )
    batch_norm = any(node.op == "batch_norm" for node in graph.nodes)
    if batch_norm and balance is None:
        console.print(
            f"{loaded.name} has BatchNorm: its running statistics stay its constructor's (mean 0, variance 1); "
            "estimate them on your inputs before scoring it in eval mode (torch.optim.swa_utils.update_bn), "
            "as eval-ghn does; fine-tuning estimates them as it trains",
            highlight=False,
            soft_wrap=True,
        )
    twin = twin_of(hypernet, graph, loaded.model, loaded.example_inputs) if grow else None
    if twin is not None:
        console.print(
            f"predicting it as {twin_phrase(graph, twin)} (--no-grow: decode it directly)",
            highlight=False,
            soft_wrap=True,
        )
    family = start_family(graph, hypernet.info)  # the one whose default it is, when no option chose
    if saturated is not None:  # read only where a family's default kept the init: there is a family
        assert family is not None
        console.print(
            f"predicting {loaded.name} alone, not onto its own initialisation (the default for "
            f"{family.name} models): its logits there are saturated, scoring a "
            f"uniform target at {saturated[0]:.1f} nats, more than {SATURATED:g} x a uniform guess's "
            f"{saturated[1]:.2f}, and the prediction added onto them would keep them (--keep-init: add it anyway)",
            highlight=False,
            soft_wrap=True,
        )
    if keeping:
        why = (
            "the way this hypernetwork trained"
            if trained_onto_init(hypernet.info)
            else f"the default for {family.name} models"
            if family is not None
            else None
        )
        console.print(
            f"adding the prediction{'' if factor == 1 else f' x {factor:g}'} onto {loaded.name}'s own initialisation"
            + ("" if keep_init is not None or why is None else f" ({why}; --no-keep-init: the prediction alone)"),
            highlight=False,
            soft_wrap=True,
        )
    if calibrate:
        console.print(
            "calibrating its residual stream and logits to its family's init on a random batch",
            highlight=False,
            soft_wrap=True,
        )
    if balance is not None:
        console.print(
            f"balancing its classes over {len(balance)} training images of {balance_on} (labels unused)"
            + ("; its BatchNorm statistics estimated on them" if batch_norm else ""),
            highlight=False,
            soft_wrap=True,
        )
    params = predict_params(  # the file holds the state dict: buffers outside it may stay on meta
        loaded.model,
        hypernet,
        graph=graph,
        residual_scale=residual_scale,
        grow=twin if twin is not None else grow,  # the twin found above is built once
        calibrate=calibrate,
        balance_on=balance,
        buffers="saved",
        keep_init=keeping,  # resolved above, the saturation check included
        shrink=shrink,
    )
    seconds = time.perf_counter() - start
    total = sum(p.numel() for p in loaded.model.parameters())
    predicted = sum(t.numel() for t in params.values())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    console.print(
        f"{type(loaded.model).__name__}: predicted {predicted:,} of {total:,} "
        f"parameters ({100 * predicted / total:.1f}%) in {seconds:.2f} s; "
        f"peak memory {peak:,.0f} MB",
        highlight=False,
    )
    spare = graph.meta.get("spare", {})
    if spare:
        console.print(
            f"left at the model's own init, as they cannot change its output (spare): {', '.join(spare)}",
            highlight=False,
        )
    # a prediction added onto the model's own init keeps the init's kernel, which wants the usual lr
    scales = {} if keeping else lr_scale(graph, twin)
    if scales:
        console.print(
            f"fine-tune {lr_scale_phrase(scales)}: their values are smaller than the twin's (a kernel resized to a "
            "larger one, a value split among the copies of a grown width), and at one lr fine-tuning rewrites them "
            "within a few steps and erases the prediction's head start"
            + ("; --out records the factors, which graphkit finetune --params applies" if out is not None else ""),
            highlight=False,
            soft_wrap=True,
        )
    if out is not None:
        metadata = {"graphkit_ghn": ghn or "bundled"}
        if scales:
            metadata[LR_SCALE_KEY] = json.dumps(scales)
        save_params(loaded.model, out, metadata=metadata, kind="predicted-weights")
        console.print(f"wrote {out}", highlight=False, soft_wrap=True)


@app.command("eval-ghn")
@command
def eval_ghn(
    dataset: Path = typer.Option(
        ..., "--dataset", "-d", help="Graph dataset folder; its architectures of --split are evaluated."
    ),
    ghn: Optional[str] = typer.Option(
        None, "--ghn", help="Hypernetwork checkpoint folder (default: the bundled one for the dataset's family)."
    ),
    out: Path = typer.Option(
        Path("eval-ghn"), "--out", "-o", help="Folder for eval.json (every row and the summary) and eval.png."
    ),
    split: str = typer.Option("eval", "--split", help="Dataset split: eval (held-out architectures) or train."),
    data: Optional[str] = typer.Option(
        None, "--data", help="Data source, as for train-ghn (default: the family's bundled data)."
    ),
    archs: int = typer.Option(16, "--archs", help="At most this many distinct architectures."),
    steps: int = typer.Option(
        300,
        "--steps",
        help="Fine-tuning steps after initialisation; scored at 0, 100 and this step, verdicts at this step.",
    ),
    batch_size: int = typer.Option(32, "--batch-size", "-b"),
    seq_len: int = typer.Option(64, "--seq-len"),
    lr: float = typer.Option(3e-4, "--lr", help="AdamW learning rate for fine-tuning."),
    warmup: int = typer.Option(
        0,
        "--warmup",
        help="Steps over which each fine-tuning's learning rate rises linearly to --lr, every initialisation "
        "alike (0: none).",
    ),
    seed: int = typer.Option(0, "--seed"),
    device: Optional[str] = typer.Option(
        None, "--device", help="cpu, cuda, cuda:1 (default: $GRAPHKIT_DEVICE, else the GPU if there is one, else cpu)."
    ),
    residual_scale: Optional[bool] = typer.Option(
        None,
        "--residual-scale/--no-residual-scale",
        help="Scale the predicted residual branches as the family's own init "
        "does, as `predict` does (default: for families that do, GPT-2).",
    ),
    calibrate: bool = typer.Option(
        False, "--calibrate", help="Calibrate the predicted stream to the family's init, as `predict --calibrate` does."
    ),
    balance_logits: bool = typer.Option(
        False,
        "--balance-logits",
        help="Balance every start's logits before step 0: the output layer's bias shifted so that, over the first "
        "training batches' images (their labels unused), every class has the same mean predicted probability. "
        "Image classifiers only.",
    ),
    workers: Optional[int] = typer.Option(
        None,
        "--workers",
        "-w",
        help="CPU processes fine-tuning side by side, one thread each (default: one per "
        "core; the rows do not depend on it). A GPU runs them one after another.",
    ),
    record: bool = typer.Option(
        False,
        "--record",
        help="Store the summary in the checkpoint's config.json (its measured effect, which `predict` prints).",
    ),
    inits: str = typer.Option(
        "predicted,random,orthogonal",
        "--inits",
        help="Initialisations to compare, comma-separated: predicted and random (the model's own init) always; "
        "orthogonal: orthogonal weights (the default adds it); selected: "
        "weight selection (Xu et al., 2024) from the train split's smallest model, trained first on the same "
        "data for --select-steps steps; keep_init: random's init plus the prediction (predict --keep-init).",
    ),
    select_steps: Optional[int] = typer.Option(
        None, "--select-steps", help="Training steps of the model `selected` selects from (default: --steps)."
    ),
    shrink: Optional[float] = typer.Option(
        None,
        "--shrink",
        help="keep_init adds the prediction times this factor (above 0, at most 1) onto random's init, "
        "as `predict --shrink` does (default: as `predict` does, the family's factor).",
    ),
    lr_scale: bool = typer.Option(
        True,
        "--lr-scale/--no-lr-scale",
        help="Fine-tune the predicted row's parameters that its twin made smaller at --lr times their factor: a "
        "patch embedding resized to a larger kernel, the kernels' area ratio; a weight reading a grown width, the "
        "widths' ratio; as `predict --out` records and `finetune` applies; --no-lr-scale: one lr.",
    ),
) -> None:
    """Compare predicted parameters with each model's own (random) initialisation, orthogonal
    initialisation (unless --inits leaves it out) and weight selection (with --inits ...,selected)
    on held-out architectures."""
    from rich.table import Table

    from graphkit.fileio import check_output_dir, check_output_file, write_text_atomic
    from graphkit.ghn.evaluate import INITS, EvalConfig, evaluate, plot, report_json, summarize

    config = EvalConfig(
        dataset=str(dataset),
        ghn=ghn,
        split=split,
        data=data,
        archs=archs,
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        lr=lr,
        warmup=warmup,
        seed=seed,
        device=device,
        residual_scale=residual_scale,
        calibrate=calibrate,
        balance_logits=balance_logits,
        workers=workers,
        inits=tuple(i.strip() for i in inits.split(",")),
        select_steps=select_steps,
        shrink=shrink,
        lr_scale=lr_scale,
    )
    if record and balance_logits:
        from graphkit.errors import EvalError

        raise EvalError(
            "--record stores the effect `graphkit predict` prints, and it does not balance the logits unless "
            "given images (--balance-on); "
            "evaluate without --balance-logits to record"
        )
    # before the evaluation, which takes minutes: a bad --out must not lose its results
    check_output_dir(out, kind="evaluation")
    for name, kind in (("eval.json", "evaluation"), ("eval.png", "evaluation-figure")):
        check_output_file(out / name, kind=kind)
    with stopped_in_one_line(f"its workers are stopped and nothing was written to {out}; run it again to evaluate"):
        rows = evaluate(config, on_skip=lambda record, why: console.print(f"skipped {record}: {why}", highlight=False))
    summary = summarize(rows)
    at = summary["horizons"]
    table = Table(
        title=f"{dataset.name}: {summary['archs']} {split} architectures, "
        "held-out loss / accuracy after N fine-tuning steps",
        show_edge=False,
    )
    table.add_column("init")
    for h in at:
        table.add_column(f"@{h}", justify="right")
    others = [init for init in INITS if init in config.inits and init != "predicted"]
    for init in (i for i in INITS if i in config.inits):
        s = summary[init]
        table.add_row(init, *(f"{s[f'loss_{h}']:.3f} / {s[f'accuracy_{h}']:.3f}" for h in at))
    table.add_row(
        "predicted wins",
        *(" / ".join(f"{100 * summary['wins'][str(h)][other]:.0f}%" for other in others) for h in at),
    )
    if "keep_init" in config.inits:
        table.add_row(
            "keep_init wins",
            *(f"{100 * summary['keep_init_wins'][str(h)]['random']:.0f}%" for h in at),
        )
    console.print(table)
    console.print(
        f"(predicted wins: architectures where predicted has a lower held-out loss than {' / than '.join(others)}"
        + ("; keep_init wins: where keep_init has a lower one than random)" if "keep_init" in config.inits else ")"),
        highlight=False,
    )
    resized = sum(bool(row.get("lr_scale")) for row in rows)
    if resized:
        console.print(
            f"({resized} predicted rows fine-tuned what their twin resized or grew at --lr times its factor, "
            "as `finetune --params` does with predict's file; --no-lr-scale: one lr)",
            highlight=False,
            soft_wrap=True,
        )
    if config.warmup:
        console.print(f"each fine-tuning warmed up its lr over {config.warmup} steps", highlight=False)
    if summary["balanced"]:
        console.print(
            "every start's logits were balanced on the first training batches' images before step 0", highlight=False
        )
    if summary.get("shrink", 1) != 1:
        console.print(f"keep_init: random's init plus the prediction x {summary['shrink']:g}", highlight=False)
    if "selected" in config.inits:
        console.print(
            f"selected: weight selection from the train split's smallest model, trained for "
            f"{config.select_steps or steps} steps on the same data",
            highlight=False,
            soft_wrap=True,
        )
    verdicts = [("predicted", other) for other in others] + [("keep_init", "random")] * ("keep_init" in config.inits)
    for init, other in verdicts:
        console.print(
            f"{init} beats {other} after {steps} steps on {100 * summary[f'{init}_beats_{other}']:.0f}% "
            f"of {summary['archs']} architectures",
            highlight=False,
        )
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "eval.json", report_json(config, summary, rows))
    plot(rows, str(out / "eval.png"), f"{dataset.name}, {summary['archs']} {split} architectures")
    console.print(f"wrote {out / 'eval.json'} and {out / 'eval.png'}", highlight=False, soft_wrap=True)
    if record:  # after eval.json: a checkpoint that cannot be written loses no results
        from graphkit.ghn.checkpoint import bundled_checkpoint, record_evaluation
        from graphkit.ghn.pool import ArchPool
        from graphkit.training.data import default_source

        family = ArchPool(dataset, split).family
        recorded = record_evaluation(
            ghn or bundled_checkpoint(family),
            summary,
            dataset=str(dataset),
            split=split,
            data=data or default_source(family),
        )
        console.print(
            f"recorded the evaluation in {ghn or bundled_checkpoint(family)}/config.json "
            f"(beats random on {100 * recorded['predicted_beats_random']:.0f}%)",
            highlight=False,
            soft_wrap=True,
        )
