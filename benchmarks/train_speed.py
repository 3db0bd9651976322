"""Hypernetwork training throughput, and kernel launches per step, against the code before the
vectorised decoder in the same run.

    .venv/bin/python benchmarks/train_speed.py            # print the table
    .venv/bin/python benchmarks/train_speed.py --write    # also update BENCHMARKS.md

Rows: LoGAH-tiny as it is now; LoGAH-tiny as of ``--baseline`` (default 3096027, the last commit
with the per-parameter decoder; its ``graphkit/`` is extracted with ``git archive`` into a
temporary folder and imported from there); GHN-3's tiling decoder (same encoder) as it is now;
and the bound, the target models alone (same meta-batches and data, forward and backward with free
parameters, no hypernetwork), which no hypernetwork can beat, with the floating-point work of those
models (``FlopCounterMode``) set against this machine's float32 matmul rate: the most architectures/s any
code could reach here. Each row trains for ``--steps`` steps in a fresh process on a 40-record dataset generated on the
spot (meta-batch 4 ViTs x 32 images on vits-digits, or 2 GPT-2s x 8 sequences of 64 bytes on
gpts-1k); the first 2 steps (model building, caches) are not timed.

Kernel launches: one meta-batch-8 training step on vits-digits as each code's ``train`` takes it
(forward with the norm regulariser, backward, gradient clipping, optimiser), after two warm-up
steps on the same architectures, with bf16 autocast on as ``train`` has it on a GPU, counted with
``torch.profiler`` on the CPU the way a GPU sees them (:func:`kernel_launches`): every ATen
operator that does work of its own, views, reshapes and allocations left out.

    .venv/bin/python benchmarks/train_speed.py --one launches 8        # the CPU proxy, one number
    .venv/bin/python benchmarks/train_speed.py --gpu --write           # on a GPU machine: see gpu_table
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

RUNS = {
    "vit": ("vits-digits", dict(meta_batch=4, batch_size=32)),
    "gpt2": ("gpts-1k", dict(meta_batch=2, batch_size=8, seq_len=64)),
}
HYPERNETS = {"LoGAH-tiny": ("tiny", "low_rank"), "GHN-3-tiny (tiling)": ("tiny", "ghn3")}
#: operators that launch no kernel of their own on a GPU: views, reshapes, allocations, host reads,
#: and wrappers whose work (a copy, a cast) is a child operator that counts instead
NO_KERNEL = {
    "view",
    "_unsafe_view",
    "as_strided",
    "as_strided_",
    "t",
    "mT",
    "mH",
    "adjoint",
    "transpose",
    "expand",
    "unsqueeze",
    "squeeze",
    "select",
    "slice",
    "permute",
    "detach",
    "alias",
    "empty",
    "empty_strided",
    "new_empty",
    "resize_",
    "reshape",
    "_reshape_alias",
    "flatten",
    "unflatten",
    "unbind",
    "split",
    "chunk",
    "narrow",
    "lift_fresh",
    "numpy_T",
    "view_as",
    "expand_as",
    "split_with_sizes",
    "contiguous",
    "to",
    "_to_copy",
    "result_type",
    "is_nonzero",
    "item",
    "_local_scalar_dense",
    "empty_like",
    "set_",
    "resolve_conj",
    "resolve_neg",
    "detach_",
    # a dropout of p = 0 returns its input; one that draws a mask does it in child operators, which count
    "dropout",
}


def kernel_launches(events) -> int:
    """Kernel launches among ``torch.profiler`` CPU events, as a GPU would see them: an ATen
    operator counts when it is not in :data:`NO_KERNEL` and no operator below it counts (its work
    is its own: ``mm``, ``native_layer_norm``, a cast's ``copy_``), so a wrapper and its child are
    one launch, and an operator whose only children are allocations or views still counts."""
    seen: dict[int, tuple[bool, bool]] = {}  # per event: (it counts, something below it counts)

    def visit(event) -> tuple[bool, bool]:
        if id(event) not in seen:
            below = any(any(visit(c)) for c in event.cpu_children if c.name.startswith("aten::"))
            seen[id(event)] = (event.name.removeprefix("aten::") not in NO_KERNEL and not below, below)
        return seen[id(event)]

    return sum(visit(e)[0] for e in events if e.name.startswith("aten::"))


def archs_per_second(family: str, hypernet: str, steps: str) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    from graphkit.datasets.generate import generate
    from graphkit.ghn.training import TrainConfig, train

    recipe, options = RUNS[family]
    variant, decoder = HYPERNETS[hypernet]
    with tempfile.TemporaryDirectory() as tmp:
        generate(recipe, Path(tmp) / "data", num=40)
        common_args = dict(
            dataset=str(Path(tmp) / "data"),
            variant=variant,
            decoder=decoder,
            log_every=1,
            checkpoint_every=10_000,
            **options,
        )
        train(TrainConfig(out=str(Path(tmp) / "run"), steps=int(steps) + 2, **common_args), progress=False)
        lines = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    elapsed = [options["meta_batch"] * m["step"] / m["archs_per_s"] for m in lines]  # seconds since the start
    seconds = elapsed[-1] - elapsed[1]
    return {"archs_per_s": options["meta_batch"] * int(steps) / seconds}


def floor(family: str, steps: str) -> dict:
    """Architectures/s of the target models alone: the same meta-batches and data batches as
    ``archs_per_second``, forward and backward with the parameters as free tensors (made outside the timing),
    no hypernetwork. No hypernetwork can train faster than this on the same machine. Also the
    floating-point work of those steps (matmuls and attention, counted by ``FlopCounterMode`` in a
    second, untimed pass), per architecture."""
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from graphkit.datasets.generate import generate
    from graphkit.ghn.training import ArchPool, TrainConfig, run_models
    from graphkit.training.data import default_source, load_source
    from graphkit.training.loop import step_seed

    recipe, options = RUNS[family]
    with tempfile.TemporaryDirectory() as tmp:
        generate(recipe, Path(tmp) / "data", num=40)
        pool = ArchPool(Path(tmp) / "data")
        config = TrainConfig(dataset="-", out="-", **options)
        source = load_source(default_source(pool.family), seq_len=config.seq_len)

        def step_of(step: int) -> Callable[[], None]:
            generator = torch.Generator().manual_seed(step_seed(0, step))  # train's draw at seed 0
            indices = torch.randint(len(pool), (config.meta_batch,), generator=generator).tolist()
            params = [
                {name: (torch.randn(p.shape) * 0.02).requires_grad_() for name, p in pool.model(i).named_parameters()}
                for i in indices
            ]
            return lambda: run_models(pool, indices, params, source, config, generator)[0].backward()

        seconds = 0.0
        for step in range(int(steps) + 2):
            work = step_of(step)
            tic = time.perf_counter()
            work()
            seconds += (
                (time.perf_counter() - tic) if step >= 2 else 0.0
            )  # as ``archs_per_second``: the first 2 steps untimed
        with FlopCounterMode(display=False) as counter:
            for step in range(2, int(steps) + 2):
                step_of(step)()
    archs = options["meta_batch"] * int(steps)
    return {"archs_per_s": archs / seconds, "flops_per_arch": counter.get_total_flops() / archs}


def peak(seconds: str = "3") -> dict:
    """This machine's float32 matrix-multiply rate (FLOP/s): 2048 x 2048 products for about
    ``seconds`` after a warm-up, every core in use; the ceiling for work made of matmuls."""
    import torch

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    for _ in range(3):
        a @ b
    count, tic = 0, time.perf_counter()
    while time.perf_counter() - tic < float(seconds):
        a @ b
        count += 1
    return {"flops_per_s": 2 * 2048**3 * count / (time.perf_counter() - tic)}


def launches(meta_batch: str, amp: str = "1", device: str = "cpu", family: str = "vit") -> dict:
    """Kernel launches of one training step as each code's ``train`` takes it, with bf16 autocast
    on (``amp`` "1") as on a GPU (see the module docstring and :func:`kernel_launches`). On a
    GPU (``device`` cuda) also the kernels the GPU ran (``gpu_kernels``, memory copies and sets
    included) and the share of the step's wall time they kept it busy (``gpu_busy``), over
    ``PROFILED`` steps."""
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    from torch.profiler import ProfilerActivity, profile

    from graphkit.datasets.generate import generate
    from graphkit.ghn import LoGAH, training
    from graphkit.training.data import load_source

    recipe, options = RUNS[family]
    with tempfile.TemporaryDirectory() as tmp:
        generate(recipe, Path(tmp) / "data", num=40)
        pool = training.ArchPool(Path(tmp) / "data", device=device)
        torch.manual_seed(0)
        ghn = LoGAH.from_variant("tiny").to(device)
        options = {k: v for k, v in options.items() if k != "meta_batch"}
        source = load_source("digits" if family == "vit" else "stdlib-text", seq_len=options.get("seq_len", 64))
        config = training.TrainConfig(dataset="-", out="-", **options)
        indices = list(range(int(meta_batch)))
        data = lambda: torch.Generator().manual_seed(0)  # noqa: E731
        if hasattr(training, "meta_batch_loss"):  # this code: train's own forward and optimiser
            optimizer = training.make_optimizer(ghn, config)
            graphs = [pool.encoded(i, ghn.config) for i in indices]

            def forward() -> torch.Tensor:
                return training.meta_batch_loss(ghn, graphs, pool, indices, source, config, data(), amp == "1")[0]
        else:  # the baseline's train(): PyG data plus targets, the norms summed over the decoded parameters
            optimizer = torch.optim.AdamW(ghn.parameters(), lr=config.lr, weight_decay=config.weight_decay)
            inputs = tuple(map(list, zip(*(pool.graph(i) for i in indices))))

            def forward() -> torch.Tensor:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "1"):
                    predicted = ghn(*inputs)
                    ce, _ = training.run_models(pool, indices, predicted, source, config, data())
                    return ce + config.gamma * torch.stack([training.norm_penalty(p) for p in predicted]).mean()

        def step() -> None:
            loss = forward()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ghn.parameters(), config.clip)
            optimizer.step()

        step(), step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        result = {"launches": kernel_launches(prof.events())}
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                tic = time.perf_counter()
                for _ in range(PROFILED):
                    step()
                torch.cuda.synchronize()
                wall = time.perf_counter() - tic
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e6
            result |= {
                "gpu_kernels": len(kernels) / PROFILED,
                "gpu_busy": busy / wall,
                "step_ms": 1e3 * wall / PROFILED,
            }
    return result


#: steps profiled on a GPU (launches): enough to average out one slow step
PROFILED = 5
#: train()'s targets on one H100 at meta-batch 8, steps/s over a whole run
GPU_TARGETS = {"vit": 13.0, "gpt2": 6.0}


def gpu_run(family: str, steps: str) -> dict:
    """Steps/s of a whole ``train`` run at meta-batch 8 on the GPU (bf16 autocast, as train picks
    there), model building and the first steps included, on the family's full recipe."""
    import warnings

    warnings.filterwarnings("ignore")
    from graphkit.datasets.generate import generate
    from graphkit.ghn.training import TrainConfig, train

    recipe, options = RUNS[family]
    options = {k: v for k, v in options.items() if k != "meta_batch"}
    with tempfile.TemporaryDirectory() as tmp:
        generate(recipe, Path(tmp) / "data")
        config = TrainConfig(
            dataset=str(Path(tmp) / "data"),
            out=str(Path(tmp) / "run"),
            meta_batch=8,
            steps=int(steps),
            device="cuda",
            log_every=int(steps),
            checkpoint_every=10 * int(steps),
            **options,
        )
        tic = time.perf_counter()
        train(config, progress=False)
        return {"steps_per_s": int(steps) / (time.perf_counter() - tic)}


def gpu_table(args) -> str:
    """BENCHMARKS' GPU section: per family, steps/s over a whole run at meta-batch 8 against the
    issue's targets, and one profiled step's kernels, GPU-busy share and the CPU proxy's count."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--gpu: no CUDA GPU here; the CPU proxy is `--one launches 8`")
    rows = [
        "| family (recipe) | steps/s, whole run, meta-batch 8 | target | GPU kernels per step | GPU busy | "
        "CPU-proxy launches |",
        "|---|---|---|---|---|---|",
    ]
    for family, (recipe, _) in RUNS.items():
        speed = fresh(None, "gpu_run", family, str(args.steps))["steps_per_s"]
        profiled = fresh(None, "launches", "8", "1", "cuda", family)
        rows.append(
            f"| {family} ({recipe}) | {speed:.1f} | {GPU_TARGETS[family]:.0f} | {profiled['gpu_kernels']:.0f} | "
            f"{100 * profiled['gpu_busy']:.0f}% | {profiled['launches']} |"
        )
        print(rows[-1], flush=True)
    head = (
        f"Measured {time.strftime('%Y-%m-%d')} on {torch.cuda.get_device_name()} (torch {torch.__version__}): "
        f"`train` at meta-batch 8 for {args.steps} steps per family, the whole run timed (model building included); "
        f"one step profiled with torch.profiler ({PROFILED} steps averaged). Command: "
        "`python benchmarks/train_speed.py --gpu --write`."
    )
    return head + "\n\n" + "\n".join(rows) + "\n"


def baseline_tree(rev: str, into: str) -> str:
    """``graphkit/`` as of ``rev``, extracted under ``into``; returns the folder to put on PYTHONPATH."""
    archive = subprocess.run(
        ["git", "-C", str(common.ROOT), "archive", rev, "graphkit"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    return into


def fresh(pythonpath: str | None, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    out = subprocess.run(
        [sys.executable, __file__, "--one", *args],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=pythonpath or None,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(args) -> str:
    rows = [
        "| code | hypernetwork | ViTs (vits-digits), architectures/s | GPT-2s (gpts-1k), architectures/s | "
        "kernel launches, one meta-batch-8 ViT step, bf16 autocast (CPU proxy) |",
        "|---|---|---|---|---|",
    ]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        old = baseline_tree(args.baseline, tmp)
        for label, path, hypernet in (
            ("now", None, "LoGAH-tiny"),
            (args.baseline, old, "LoGAH-tiny"),
            ("now", None, "GHN-3-tiny (tiling)"),
        ):
            speed = {f: fresh(path, "speed", f, hypernet, str(args.steps))["archs_per_s"] for f in RUNS}
            count = fresh(path, "launches", "8")["launches"] if hypernet == "LoGAH-tiny" else None
            results[label, hypernet] = speed
            if count is not None:
                results[label, "launches"] = count
            rows.append(
                f"| {label} | {hypernet} | {speed['vit']:.2f} | {speed['gpt2']:.2f} | "
                f"{count if count is not None else '-'} |"
            )
            print(rows[-1], flush=True)
        alone = {f: fresh(None, "floor", f, str(args.steps)) for f in RUNS}
        bound = {f: alone[f]["archs_per_s"] for f in RUNS}
        rows.append(
            f"| now | none: the target models alone, free parameters (the bound) | {bound['vit']:.2f} | "
            f"{bound['gpt2']:.2f} | - |"
        )
        print(rows[-1], flush=True)
        rate = fresh(None, "peak")["flops_per_s"]
    now, before = results["now", "LoGAH-tiny"], results[args.baseline, "LoGAH-tiny"]
    families = (("vit", "ViTs"), ("gpt2", "GPT-2s"))
    ratio = " and ".join(f"{now[f] / before[f]:.2f}x on {label}" for f, label in families)
    ceiling = " and ".join(f"{bound[f] / before[f]:.2f}x on {label}" for f, label in families)
    cut = results[args.baseline, "launches"] / results["now", "launches"]
    head = (
        f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} cores (CPU), {args.steps} timed steps per row, "
        f"each row a fresh process. LoGAH-tiny now against {args.baseline} (the per-parameter decoder): {ratio} "
        f"the architectures/s, {cut:.1f}x fewer kernel launches per step. The target models' own forward and "
        f"backward, with no hypernetwork at all, run at {ceiling} the baseline's architectures/s: no hypernetwork "
        "can go faster on this machine. "
        + work_bound(alone, rate, before, families)
        + " Command: `.venv/bin/python benchmarks/train_speed.py --write`."
    )
    return head + "\n\n" + "\n".join(rows) + "\n"


def work_bound(alone: dict, rate: float, before: dict, families: tuple) -> str:
    """The sentence that turns the target models' counted work and the machine's matmul rate into
    the most architectures/s any code could train at, as a multiple of the baseline's."""
    work = " and ".join(f"{alone[f]['flops_per_arch'] / 1e9:.1f} GFLOP per {label[:-1]}" for f, label in families)
    reach = " and ".join(f"{rate / alone[f]['flops_per_arch'] / before[f]:.1f}x on {label}" for f, label in families)
    achieved = " and ".join(f"{alone[f]['flops_per_arch'] * alone[f]['archs_per_s'] / 1e9:.0f}" for f, _ in families)
    return (
        f"Their matmuls and attention alone are {work} (forward and backward, counted with FlopCounterMode); "
        f"at this machine's float32 matmul rate, {rate / 1e9:.0f} GFLOP/s on 2048 x 2048 products, the most any "
        f"code could train at is {reach} the baseline, where the target models alone already run at {achieved} "
        "GFLOP/s."
    )


def main() -> None:
    if "--one" in sys.argv:
        i = sys.argv.index("--one")
        kind, rest = sys.argv[i + 1], sys.argv[i + 2 :]
        print(
            json.dumps(
                {"speed": archs_per_second, "floor": floor, "launches": launches, "peak": peak, "gpu_run": gpu_run}[
                    kind
                ](*rest)
            )
        )
        return
    if "--gpu" in sys.argv:
        sys.argv.remove("--gpu")
        common.main(__doc__, "train_speed_gpu", gpu_table, lambda p: p.add_argument("--steps", type=int, default=300))
        return
    common.main(
        __doc__,
        "train_speed",
        table,
        lambda p: (p.add_argument("--steps", type=int, default=10), p.add_argument("--baseline", default="3096027")),
    )


if __name__ == "__main__":
    main()
