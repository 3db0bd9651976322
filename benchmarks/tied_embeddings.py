"""Tied input and output embeddings, predicted (issue #44 item 6: a language model whose head
reuses its token embedding is predicted below the unigram loss at step 0, as its untied twin is).

    .venv/bin/python benchmarks/tied_embeddings.py          # print the table
    .venv/bin/python benchmarks/tied_embeddings.py --write  # and update BENCHMARKS.md

Each model is built on the CPU from seed 0, tied and untied (its twin: the same config with a
head of its own). The table gives the held-out loss on stdlib-text (4 eval batches of 16 x 64
bytes, the same for every column) of the model's own init, and of what `predict` writes with
each bundled text checkpoint that takes the model (trained on every op kind it has), with
predict's defaults for its family (GPT-2 keeps its init under the prediction). The checkpoint
`predict` picks by itself (`bundled_for`) is marked. Below the unigram loss is what a predicted
language model must reach; own init is about the uniform loss over the vocabulary.

A second table does the same for the decoder zoo: transformers' causal LMs of several model
types at the mini zoo's smallest plan (`shrink.decoder_plans`: 2 layers, its byte vocabulary),
with `tie_word_embeddings` true and false, predicted by logah-tiny-zoo-decoders.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from graphkit.datasets.shrink import decoder_plans  # noqa: E402
from graphkit.families import build_model  # noqa: E402
from graphkit.ghn.checkpoint import (  # noqa: E402
    ZOO_BUNDLED,
    bundled_for,
    bundled_info,
    bundled_names,
    checkpoint_task,
)
from graphkit.ghn.keep_init import keep_init_as_is  # noqa: E402
from graphkit.ghn.predict import bundled_hypernetwork, predict  # noqa: E402
from graphkit.ghn.space import tied_embeddings  # noqa: E402
from graphkit.tracing import trace  # noqa: E402
from graphkit.training.data import data_config, load_source  # noqa: E402
from graphkit.training.loop import score  # noqa: E402

#: label -> config (without ``tied``): the issue's rows
MODELS = {
    "GPT-2, 4 x 128": {"family": "gpt2", "num_layers": 4, "hidden": 128, "heads": 4},
    "GPT-2, 4 x 256": {"family": "gpt2", "num_layers": 4, "hidden": 256, "heads": 4},
    "GPT-2 small, 12 x 768": {"family": "gpt2", "num_layers": 12, "hidden": 768, "heads": 12},
    "LLaMA, 4 x 256": {"family": "llama", "num_layers": 4, "hidden": 256, "heads": 4, "vocab_size": 32000},
}
BATCHES, BATCH_SIZE = 4, 16
#: transformers model types for the decoder zoo's table: tied by default (Gemma) or not
ZOO_TYPES = (
    "qwen2",
    "llama",
    "mistral",
    "gemma",
    "gemma2",
    "qwen3",
    "phi3",
    "olmo2",
    "gpt_neox",
    "granite",
    "stablelm",
)


def built(config: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(config, "cpu")


def losses(config: dict, batches: list) -> tuple[float, dict[str, float], str]:
    """Own init's held-out loss, each taking checkpoint's, and the one predict chooses."""
    model = built(config)
    graph = trace(model)
    assert tied_embeddings(graph) is config["tied"]
    own = score(model, batches, "text")[0]
    ops = {node.op for node in graph.nodes}
    predicted = {}
    for name in bundled_names():
        info = bundled_info(name)
        if checkpoint_task(info) != "text" or not ops <= set(info["trained_ops"]):
            continue
        model = built(config)
        predict(model, bundled_hypernetwork(name), graph=graph, keep_init=keep_init_as_is(graph, info))
        predicted[name] = score(model, batches, "text")[0]
    return own, predicted, bundled_for(graph).name


def zoo_config(model_type: str, tied: bool) -> dict:
    """The decoder zoo's record config of ``model_type`` at its smallest mini plan, ``tied`` or not."""
    from transformers import AutoConfig

    overrides = decoder_plans(AutoConfig.for_model(model_type).to_dict(), model_type)[0][1]
    return {"family": "transformers", "model_type": model_type, "shrink": {**overrides, "tie_word_embeddings": tied}}


def zoo_checkpoint() -> str:
    """The bundled checkpoint trained across transformers' decoders."""
    return next(name for name in ZOO_BUNDLED if checkpoint_task(bundled_info(name)) == "text")


def zoo_rows(source) -> list[str]:
    """The decoder zoo's table: each model type, tied and untied, its own init and predicted."""
    ghn = bundled_hypernetwork(zoo_checkpoint())
    rows = [
        "| model type (2 layers, 256 tokens) | own init, tied | predicted, tied | own init, untied "
        "| predicted, untied |",
        "|---|---|---|---|---|",
    ]
    for model_type in ZOO_TYPES:
        cells = []
        for tied in (True, False):
            torch.manual_seed(0)
            model = build_model(zoo_config(model_type, tied), "cpu")
            graph = trace(model)
            assert tied_embeddings(graph) is tied
            generator = torch.Generator().manual_seed(0)
            batches = [source.batch(data_config(model), BATCH_SIZE, generator, "eval") for _ in range(BATCHES)]
            own = score(model, batches, "text")[0]
            predict(model, ghn, graph=graph, keep_init=keep_init_as_is(graph, ghn.info))
            cells += [f"{own:.2f}", f"{score(model, batches, 'text')[0]:.2f}"]
        rows.append(f"| {model_type} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    return rows


def table(args) -> str:
    source = load_source("stdlib-text")
    names = [n for n in bundled_names() if checkpoint_task(bundled_info(n)) == "text"]
    rows = [
        "| model | embeddings | own init | " + " | ".join(f"predicted, {n}" for n in names) + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    for label, base in MODELS.items():
        for tied in (True, False):
            config = {**base, "tied": tied}
            generator = torch.Generator().manual_seed(0)
            batch_config = data_config(built(config))
            batches = [source.batch(batch_config, BATCH_SIZE, generator, "eval") for _ in range(BATCHES)]
            own, predicted, chosen = losses(config, batches)
            cells = [
                "not trained on its ops"
                if n not in predicted
                else f"**{predicted[n]:.2f}** (chosen)"
                if n == chosen
                else f"{predicted[n]:.2f}"
                for n in names
            ]
            rows.append(f"| {label} | {'tied' if tied else 'untied twin'} | {own:.2f} | " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    return (
        f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} CPU cores, torch {torch.__version__}. "
        f"Held-out loss on stdlib-text at step 0 (the unigram loss: {source.unigram_loss():.2f}). Command: "
        "`.venv/bin/python benchmarks/tied_embeddings.py --write`.\n\n"
        + "\n".join(rows)
        + f"\n\nThe decoder zoo, predicted by {zoo_checkpoint()}:\n\n"
        + "\n".join(zoo_rows(source))
        + "\n"
    )


if __name__ == "__main__":
    common.main(__doc__, "tied_embeddings", table)
