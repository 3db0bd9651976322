"""Forward latency of MHA, GQA, the key-driven variants and MLA on ViT-B/16 geometry, in one run.

    .venv/bin/python benchmarks/attention_speed.py            # print the table
    .venv/bin/python benchmarks/attention_speed.py --write    # also update BENCHMARKS.md
    python benchmarks/attention_speed.py --gpu --write        # on a GPU machine: its rows, own section

One ViT-B attention layer (dim 768, 12 heads, 6 K/V heads where grouped, batch 32, 197
tokens): qkv projection, attention core, output projection, in inference mode, on CPU (and on
CUDA when there is one). The reference approaches are MHA (12 K/V heads) and GQA that
materialises repeated K/V (``repeat_interleave``, then SDPA), the way many implementations do.
KDGQA and DGQA run as at inference (DGQA's allocation frozen, KDGQA's recomputed every call);
PGQA is measured with its noise on (training behaviour), since in eval it is exactly GQA. MLA
(``graphkit.attention.mla``) is measured with the same KV cache per token as GQA: a latent of
2 x 6 x 64 numbers, rebuilt into every head's K and V by its up projections; and at a quarter of
MHA's cache, against GQA with 3 K/V heads.

A second table measures decoding, where MLA's cache is meant to pay: one new token per sequence
(batch 8) reads a cache of 2,048 tokens, a quarter of MHA's (GQA: 3 K/V heads; MLA: a latent of
384), and MHA with its whole cache, through the query projection, the attention over the cache
and the output projection (the cache append is left out of every row alike). MLA runs absorbed
(attention over the latent, its default when decoding) and expanded (K and V rebuilt from the
whole cache every step).
"GQA (auto)" is graphkit's default: on a GPU it measures both uniform-group paths once and takes
the faster (``graphkit.attention.core.fastest_gqa_path``); the last column compares every row
with the faster of the two GQA paths measured here.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from graphkit.attention import ViTGroupedAttention, core  # noqa: E402
from graphkit.attention.mla import LatentKV, ViTLatentAttention, latent_attention  # noqa: E402

DIM, HEADS, KV, BATCH, TOKENS = 768, 12, 6, 32, 197
#: decoding: sequences, cached tokens, and K/V heads of the quarter-cache GQA it is compared with
DECODE_BATCH, CACHED, DECODE_KV = 8, 2048, 3


class RepeatKV(torch.nn.Module):
    """The reference GQA core: repeat K/V to every query head, then one SDPA call."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.groups = groups

    def forward(self, q, k, v, **kwargs):
        return F.scaled_dot_product_attention(
            q, k.repeat_interleave(self.groups, 1), v.repeat_interleave(self.groups, 1)
        )


def layers(device: str) -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    out = {
        "MHA": ViTGroupedAttention(DIM, HEADS, HEADS, "gqa"),
        "GQA (enable_gqa)": ViTGroupedAttention(DIM, HEADS, KV, "gqa", path="enable_gqa"),
        "GQA (repeat_kv)": ViTGroupedAttention(DIM, HEADS, KV, "gqa"),
        "GQA (auto)": ViTGroupedAttention(DIM, HEADS, KV, "gqa"),
        "KDGQA": ViTGroupedAttention(DIM, HEADS, KV, "kdgqa"),
        "DGQA": ViTGroupedAttention(DIM, HEADS, KV, "dgqa"),
        "PGQA (noise on)": ViTGroupedAttention(DIM, HEADS, KV, "pgqa", perturb_in_eval=True),
        # MLA with GQA's KV cache: a latent of 2 x KV x head_dim numbers per token
        f"MLA (kv_rank {2 * KV * DIM // HEADS}, GQA's cache)": ViTLatentAttention(DIM, HEADS, 2 * KV * DIM // HEADS),
        f"GQA ({DECODE_KV} K/V heads)": ViTGroupedAttention(DIM, HEADS, DECODE_KV, "gqa", path="enable_gqa"),
        f"MLA (kv_rank {2 * DECODE_KV * DIM // HEADS}, that GQA's cache)": ViTLatentAttention(
            DIM, HEADS, 2 * DECODE_KV * DIM // HEADS
        ),
    }
    out["GQA (repeat_kv)"].core = RepeatKV(HEADS // KV)
    return {name: layer.to(device).eval() for name, layer in out.items()}


class DecodeStep(torch.nn.Module):
    """One decoding step's attention for a batch of new tokens over a fixed cache: the query
    projection, attention over the cache and the output projection. ``form`` is ``gqa`` (the
    cache holds K and V, as many heads as its width says: all of them for MHA) or MLA's
    ``absorbed`` or ``expanded`` (it holds the latent)."""

    def __init__(self, form: str, cache: torch.Tensor) -> None:
        super().__init__()
        self.form, self.cache = form, cache
        self.q, self.out = torch.nn.Linear(DIM, DIM), torch.nn.Linear(DIM, DIM)
        self.latent = LatentKV(DIM, DIM, cache.shape[-1], bias=True)
        if form == "gqa":  # K and V laid out as a KV cache holds them, (batch, K/V heads, tokens, head_dim)
            self.k, self.v = cache.view(*cache.shape[:2], 2, -1, DIM // HEADS).permute(2, 0, 3, 1, 4).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x).view(x.shape[0], 1, HEADS, DIM // HEADS).transpose(1, 2)
        if self.form == "gqa":
            y = F.scaled_dot_product_attention(q, self.k, self.v, enable_gqa=True)
        else:
            y = latent_attention(q, self.cache, self.latent, kv_heads=HEADS, form=self.form)
        return self.out(y.transpose(1, 2).flatten(2))


def decode_rows(device: str, repeat: int) -> list[str]:
    """The decoding table's rows on ``device``: each form's median step, as a ratio to GQA's."""
    torch.manual_seed(0)
    width = 2 * DECODE_KV * DIM // HEADS  # the same numbers per cached token for every row
    cache = torch.randn(DECODE_BATCH, CACHED, width, device=device)
    steps = {
        f"MHA ({HEADS} K/V heads, 4x the cache)": DecodeStep(
            "gqa", torch.randn(DECODE_BATCH, CACHED, 2 * DIM, device=device)
        ),
        f"GQA ({DECODE_KV} K/V heads)": DecodeStep("gqa", cache),
        f"MLA absorbed (kv_rank {width})": DecodeStep("absorbed", cache),
        f"MLA expanded (kv_rank {width})": DecodeStep("expanded", cache),
    }
    x = torch.randn(DECODE_BATCH, 1, DIM, device=device)
    results: dict[str, list[float]] = {}
    for _ in range(3):
        for name, step in steps.items():
            results.setdefault(name, []).append(timing(step.to(device).eval(), x, repeat))
    medians = {name: statistics.median(t) for name, t in results.items()}
    base = medians[f"GQA ({DECODE_KV} K/V heads)"]
    return [
        f"| {device} | {name} | {seconds * 1000:.2f} ms | {seconds / base:.3f} |" for name, seconds in medians.items()
    ]


def timing(layer: torch.nn.Module, x: torch.Tensor, repeat: int) -> float:
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    with torch.inference_mode():
        for _ in range(2):
            layer(x)
        times = []
        for _ in range(repeat):
            sync()
            start = time.perf_counter()
            layer(x)
            sync()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def table(repeat: int, gpu: bool = False) -> str:
    if gpu and not torch.cuda.is_available():
        raise SystemExit("--gpu: no CUDA GPU here")
    devices = ["cuda"] if gpu else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = [
        "| device | variant | median forward | vs GQA (enable_gqa) | vs fastest GQA path |",
        "|---|---|---|---|---|",
    ]
    for device in devices:
        x = torch.randn(BATCH, TOKENS, DIM, device=device)
        # interleave the variants over rounds, so drift on a noisy machine hits them alike
        results: dict[str, list[float]] = {}
        built = layers(device)
        for _ in range(3):
            for name, layer in built.items():
                results.setdefault(name, []).append(timing(layer, x, repeat))
        medians = {name: statistics.median(t) for name, t in results.items()}
        base = medians["GQA (enable_gqa)"]
        fastest = min(base, medians["GQA (repeat_kv)"])
        chosen = sorted({path for key, path in core._FASTEST.items() if key[0].startswith(device)}) or ["enable_gqa"]
        for name, seconds in medians.items():
            label = f"GQA (auto: {', '.join(chosen)})" if name == "GQA (auto)" else name
            rows.append(
                f"| {device} | {label} | {seconds * 1000:.1f} ms | {seconds / base:.3f} | {seconds / fastest:.3f} |"
            )
            print(rows[-1], flush=True)
    decoding = [
        "| device | decoding step | median | vs GQA at the same cache |",
        "|---|---|---|---|",
    ]
    for device in devices:
        decoding += decode_rows(device, repeat)
        print("\n".join(decoding[-4:]), flush=True)
    where = torch.cuda.get_device_name() if gpu else f"{common.cores()} CPU cores"
    head = (
        f"Measured {time.strftime('%Y-%m-%d')} on {where}, torch {torch.__version__}; one ViT-B "
        f"attention layer (dim {DIM}, {HEADS} heads, {KV} K/V heads where grouped, batch {BATCH}, {TOKENS} tokens), "
        f"inference mode, median of 3 interleaved rounds of {repeat}. Command: "
        f"`python benchmarks/attention_speed.py{' --gpu' if gpu else ''} --write`."
    )
    second = (
        f"Decoding: {DECODE_BATCH} sequences, one new token each over a cache of {CACHED:,} tokens holding "
        f"{2 * DECODE_KV * DIM // HEADS} numbers per token (a quarter of MHA's); query projection, attention "
        "and output projection."
    )
    return head + "\n\n" + "\n".join(rows) + "\n\n" + second + "\n\n" + "\n".join(decoding) + "\n"


def main() -> None:
    gpu = "--gpu" in sys.argv  # the GPU's rows alone, in a section of their own
    if gpu:
        sys.argv.remove("--gpu")
    common.main(
        __doc__,
        "attention_speed_gpu" if gpu else "attention_speed",
        lambda args: table(args.repeat, gpu),
        lambda parser: parser.add_argument("--repeat", type=int, default=5),
    )


if __name__ == "__main__":
    main()
