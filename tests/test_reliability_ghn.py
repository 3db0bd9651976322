"""Bad input to the hypernetwork: train-ghn and eval-ghn refuse bad options and outputs before
any work, a resume repeats the run it continues, checkpoints and CIFAR folders are read safely."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ON_EVERY_DEVICE
from PIL import Image
from typer.testing import CliRunner

import graphkit.ghn.checkpoint as checkpoint_module
import graphkit.ghn.evaluate as evaluate_module
import graphkit.ghn.training as training
from graphkit.cli import app
from graphkit.datasets.generate import generate
from graphkit.ghn import (
    CheckpointError,
    DataError,
    LoGAH,
    LoGAHConfig,
    TrainConfig,
    TrainError,
    load_checkpoint,
    save_checkpoint,
    train,
)
from graphkit.ghn.checkpoint import describe
from graphkit.ghn.evaluate import EvalConfig, report_json
from graphkit.training.data import load_source
from graphkit.validation import default_device

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
#: a two-step run; an option given again after these overrides it (the command line's last value wins)
TINY = ("--steps", "2", "--meta-batch", "1", "--batch-size", "2", "--seq-len", "8", "--checkpoint-every", "1")


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def listing(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its content's hash: equal listings, nothing written or lost."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


@pytest.fixture(scope="module")
def gpts(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "tiny-gpts"
    generate(str(ROOT / "tests" / "recipes" / "tiny-gpts.json"), out)
    return out


@pytest.fixture(scope="module")
def trained(gpts, tmp_path_factory):
    """A finished two-step run folder (never modified by the tests that use it)."""
    out = tmp_path_factory.mktemp("runs") / "run"
    result = run("train-ghn", "--dataset", gpts, "--out", out, *TINY)
    assert result.exit_code == 0, result.output
    return out


# -- options are checked where they enter ---------------------------------------------------------

NO_GPU = (
    []
    if torch.cuda.is_available()
    else [("--device", "cuda", "device 'cuda': no CUDA GPU is available here; use --device cpu")]
)


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--steps", "0", "steps must be an integer >= 1; got 0"),
        ("--steps", "-3", "steps must be an integer >= 1; got -3"),
        ("--checkpoint-every", "0", "checkpoint-every must be an integer >= 1; got 0"),
        ("--log-every", "0", "log-every must be an integer >= 1; got 0"),
        ("--meta-batch", "0", "meta-batch must be an integer >= 1; got 0"),
        ("--batch-size", "0", "batch-size must be an integer >= 1; got 0"),
        ("--seq-len", "0", "seq-len must be an integer >= 1; got 0"),
        ("--lr", "nan", "lr must be a positive number; got nan"),
        ("--lr", "-0.1", "lr must be a positive number; got -0.1"),
        ("--weight-decay", "-1", "weight-decay must be a number >= 0; got -1.0"),
        ("--gamma", "nan", "gamma must be a number >= 0; got nan"),
        ("--clip", "0", "clip must be a positive number; got 0.0"),
        ("--clip", "inf", "clip must be a positive number; got inf"),
        ("--lr-fan-in", "0", "lr-fan-in must be a positive number; got 0.0"),
        ("--lr-fan-in", "nan", "lr-fan-in must be a positive number; got nan"),
        ("--table-gain", "0", "table-gain must be a positive number; got 0.0"),
        ("--table-gain", "-4", "table-gain must be a positive number; got -4.0"),
        ("--table-gain", "inf", "table-gain must be a positive number; got inf"),
        ("--seed", "-1", "seed must be an integer from 0 to 4294967295; got -1"),
        ("--device", "bogus", "unknown device 'bogus'; accepted: cpu, cuda, cuda:N"),
        ("--device", "meta", "unknown device 'meta'; accepted: cpu, cuda, cuda:N"),
        ("--variant", "huge", "unknown LoGAH variant 'huge'; known: tiny, small, base, large"),
        ("--decoder", "dense", "unknown decoder 'dense'; accepted: low_rank, ghn3"),
        ("--depth-buckets", "-1", "depth-buckets must be an integer >= 0; got -1"),
    ]
    + NO_GPU,
)
@pytest.mark.slow
def test_train_ghn_refuses_bad_options_before_any_work(gpts, tmp_path, option, value, message):
    result = run("train-ghn", "--dataset", gpts, "--out", tmp_path / "run", option, value)
    assert result.exit_code == 1 and result.stderr == f"error: {message}\n", result.output
    assert os.listdir(tmp_path) == []


NEEDS_ROLE_MAPS = "needs --role-maps (it shapes the role maps); add --role-maps or leave it out"


@pytest.mark.parametrize(
    "options, message",
    [
        (("--role-maps", "--role-key", "op"), "role-key must be one of name, leaf, layer, siblings; got 'op'"),
        (("--role-maps", "--max-roles", "0"), "max-roles must be an integer >= 1 (left out: every role"),
        (("--role-maps", "--max-roles", "-2"), "max-roles must be an integer >= 1 (left out: every role"),
        (("--role-maps", "--role-rows", "0"), "role-rows must be an integer from 1 to 32768 (the decoder's K); got 0"),
        (("--role-maps", "--role-rows", "-1"), "role-rows must be an integer from 1 to 32768"),
        (("--role-maps", "--role-rows", "32769"), "role-rows must be an integer from 1 to 32768"),
        (("--max-roles", "8"), f"--max-roles {NEEDS_ROLE_MAPS}"),
        (("--role-key", "leaf"), f"--role-key {NEEDS_ROLE_MAPS}"),
        (("--role-rows", "64"), f"--role-rows {NEEDS_ROLE_MAPS}"),
        (("--role-maps", "--decoder", "ghn3", "--role-key", "leaf"), "--role-maps needs the low_rank decoder"),
        (("--table-gain", "8", "--no-init-anchors"), "--table-gain needs --init-anchors (it decodes with them)"),
        (("--level-head", "--decoder", "ghn3"), "--level-head needs the low_rank decoder, not 'ghn3'"),
        (("--role-factors",), "--role-factors needs the low_rank decoder and --role-maps"),
        (("--role-factors", "--role-maps", "--decoder", "ghn3"), "--role-factors needs the low_rank decoder"),
        (("--role-vectors",), "--role-vectors needs the low_rank decoder and --role-maps"),
        (("--role-vectors", "--role-maps", "--decoder", "ghn3"), "--role-vectors needs the low_rank decoder"),
        (("--correction", "1"), "--correction needs --role-factors (it weighs the MLP's share beside them)"),
        (("--role-maps", "--role-means-start"), "--role-means-start needs --role-factors (it sets the role factors)"),
        (
            ("--role-maps", "--role-factors", "--role-means-start", "--initial-checkpoint", "logah-tiny-gpts"),
            "--role-means-start starts a fresh LoGAH; --initial-checkpoint starts from its checkpoint: give one",
        ),
        (("--role-maps", "--role-factors", "--correction", "-1"), "correction must be"),
    ],
)
def test_role_map_options_are_checked_before_any_work(tmp_path, options, message):
    """Before the dataset is even looked for (it does not exist here) or anything is written."""
    result = run("train-ghn", "--dataset", tmp_path / "missing", "--out", tmp_path / "run", *options)
    assert result.exit_code == 1 and result.stderr.startswith(f"error: {message}"), result.output
    assert result.stderr.count("\n") == 1 and os.listdir(tmp_path) == []


@pytest.mark.parametrize("option", ["max_roles", "role_rows"])
def test_a_nan_role_map_option_is_refused(tmp_path, option):
    """The CLI parses these as integers; Python callers can pass anything."""
    with pytest.raises(TrainError, match=f"{option.replace('_', '-')} must be an integer .*; got nan"):
        TrainConfig(dataset=str(tmp_path), out=str(tmp_path / "run"), role_maps=True, **{option: float("nan")})


@pytest.mark.parametrize("command", ["train-ghn", "eval-ghn"])
@pytest.mark.parametrize(
    "value, message",
    [
        ("tpu", "unknown device 'tpu'; accepted: cpu, cuda, cuda:N"),
        *[
            (device, text)
            for device, text in (("cuda:7", "device 'cuda:7': no CUDA GPU is available here; use --device cpu"),)
            if not torch.cuda.is_available()
        ],
    ],
)
def test_a_bad_graphkit_device_variable_is_refused_before_any_work(
    command, value, message, gpts, tmp_path, monkeypatch
):
    """$GRAPHKIT_DEVICE stands in for --device and is checked as it is, naming the variable."""
    monkeypatch.setenv("GRAPHKIT_DEVICE", value)
    result = run(command, "--dataset", gpts, "--out", tmp_path / "out", *(TINY if command == "train-ghn" else ()))
    assert result.exit_code == 1 and result.stderr == f"error: $GRAPHKIT_DEVICE: {message}\n", result.output
    assert os.listdir(tmp_path) == []


def test_without_the_variable_a_run_picks_the_gpu_if_there_is_one(monkeypatch):

    monkeypatch.delenv("GRAPHKIT_DEVICE")
    assert default_device(TrainError, local_rank=0) == ("cuda:0" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("GRAPHKIT_DEVICE", "cpu")
    assert default_device(TrainError) == "cpu"


@pytest.mark.parametrize(
    "option, value, message",
    [  # --steps -2, --archs 0, --batch-size 0: tests/test_ghn_train.py
        ("--seq-len", "-1", "seq-len must be an integer >= 1; got -1"),
        ("--lr", "-1", "lr must be a positive number; got -1.0"),
        ("--seed", "4294967296", "seed must be an integer from 0 to 4294967295; got 4294967296"),
        ("--device", "meta", "unknown device 'meta'; accepted: cpu, cuda, cuda:N"),
    ],
)
def test_eval_ghn_refuses_bad_options_before_any_work(gpts, tmp_path, option, value, message):
    result = run("eval-ghn", "--dataset", gpts, "--out", tmp_path / "eval", option, value)
    assert result.exit_code == 1 and result.stderr == f"error: {message}\n", result.output
    assert os.listdir(tmp_path) == []


def test_a_split_the_dataset_lacks_is_named_with_the_ones_it_has(gpts, tmp_path):
    result = run("eval-ghn", "--dataset", gpts, "--out", tmp_path / "eval", "--split", "bogus")
    assert (
        result.exit_code == 1
        and result.stderr == f"error: {gpts}: no records in split 'bogus'; its splits: eval, train\n"
    )
    assert os.listdir(tmp_path) == []


def test_eval_json_never_holds_a_bare_nan():

    row = {"id": "a", "loss": float("nan"), "curve": [1.0, float("inf")]}
    text = report_json(EvalConfig(dataset="-"), {"predicted": {"loss": float("nan")}}, [row])
    strict = json.loads(text, parse_constant=lambda name: pytest.fail(f"eval.json holds {name}"))
    assert (
        strict["rows"][0] == {"id": "a", "loss": None, "curve": [1.0, None]}
        and strict["summary"]["predicted"]["loss"] is None
    )


# -- outputs are checked before the work; "." is a run folder ------------------------------------


@pytest.mark.slow
def test_train_ghn_into_the_current_folder_writes_the_final_model_and_keeps_the_users_files(
    gpts, tmp_path, monkeypatch
):
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("mine")
    monkeypatch.chdir(project)
    result = run("train-ghn", "--dataset", gpts, "--out", ".", *TINY)
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(project)) == [
        "checkpoint",
        "config.json",
        "metrics.jsonl",
        "metrics.png",
        "model.safetensors",
        "notes.txt",
    ]
    assert (project / "notes.txt").read_text() == "mine" and os.listdir(tmp_path) == [
        "project"
    ]  # nothing beside it either
    assert load_checkpoint(project).info["steps"] == 2


def test_train_ghn_refuses_a_folder_holding_files_of_a_runs_names(gpts, tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text('{"mine": true}')
    before = listing(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = run("train-ghn", "--dataset", gpts, "--out", ".", *TINY)
    assert result.exit_code == 1 and result.stderr == (
        "error: --out .: already holds config.json; continue that run "
        "with --resume, or choose another --out (nothing was changed)\n"
    )
    assert listing(tmp_path) == before


def test_train_ghn_refuses_an_out_that_is_a_file(gpts, tmp_path):
    (tmp_path / "run").write_text("mine")
    result = run("train-ghn", "--dataset", gpts, "--out", tmp_path / "run", *TINY)
    assert result.exit_code == 1 and result.stderr == f"error: --out {tmp_path / 'run'}: is a file, not a folder\n"
    assert (tmp_path / "run").read_text() == "mine"


@pytest.mark.parametrize("inside", ["", "runs/a"])
def test_train_ghn_refuses_an_out_in_the_dataset_folder(gpts, inside):
    before = listing(gpts)
    result = run("train-ghn", "--dataset", gpts, "--out", gpts / inside, *TINY)
    assert (
        result.exit_code == 1
        and result.stderr == f"error: --out {gpts / inside}: lies in the dataset folder {gpts}; choose another --out\n"
    )
    assert listing(gpts) == before


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda out: out.write_text("mine"), "--out {out}: is a file, not a folder"),
        (lambda out: (out / "eval.json").mkdir(parents=True), "--out {out}/eval.json: is a folder; give a file name"),
    ],
)
def test_eval_ghn_checks_its_output_before_evaluating(gpts, tmp_path, monkeypatch, make, message):

    monkeypatch.setattr(evaluate_module, "evaluate", lambda *a, **k: pytest.fail("evaluated before checking --out"))
    out = tmp_path / "eval"
    make(out)
    before = listing(tmp_path)
    result = run("eval-ghn", "--dataset", gpts, "--out", out)
    assert result.exit_code == 1 and result.stderr == f"error: {message.format(out=out)}\n", result.output
    assert listing(tmp_path) == before


# -- a resume repeats the run it continues ----------------------------------------------------------


def copy_of(run_folder: Path, tmp_path: Path) -> Path:

    return Path(shutil.copytree(run_folder, tmp_path / "run"))


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--lr", "0.001"), "was trained with --lr 0.0003, not 0.001"),
        (("--seed", "7"), "was trained with --seed 0, not 7"),
        (("--data", "text:{readme}"), "was trained with --data stdlib-text, not text:{readme}"),
        (("--batch-size", "4"), "was trained with --batch-size 2, not 4"),
    ],
)
@pytest.mark.slow
def test_a_resume_with_other_options_is_refused_and_nothing_changes(gpts, trained, tmp_path, extra, message):
    out = copy_of(trained, tmp_path)
    before = listing(out)
    result = run(
        "train-ghn",
        "--dataset",
        gpts,
        "--out",
        out,
        "--resume",
        *TINY,
        *(e.format(readme=ROOT / "README.md") for e in extra),
    )
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: --resume: {out} {message.format(readme=ROOT / 'README.md')}; resume with the run's "
        "options, or train into another --out\n"
    )
    assert listing(out) == before


@pytest.mark.slow
def test_a_resume_over_another_dataset_or_below_the_steps_done_is_refused(gpts, trained, tmp_path):
    out = copy_of(trained, tmp_path)
    before = listing(out)
    other = tmp_path / "other"
    generate(str(ROOT / "tests" / "recipes" / "tiny-gpts.json"), other, num=4)
    result = run("train-ghn", "--dataset", other, "--out", out, "--resume", *TINY)
    assert result.exit_code == 1 and f"was trained with --dataset {gpts}, not {other}" in result.stderr
    result = run("train-ghn", "--dataset", gpts, "--out", out, "--resume", *TINY, "--steps", "1")
    assert result.exit_code == 1 and result.stderr == (
        f"error: --steps 1: {out} has already trained 2 steps; resume with --steps 2 or more\n"
    )
    assert listing(out) == before


def test_a_rerun_without_resume_into_a_run_folder_is_refused(gpts, trained, tmp_path):
    out = copy_of(trained, tmp_path)
    before = listing(out)
    result = run("train-ghn", "--dataset", gpts, "--out", out, *TINY)
    assert result.exit_code == 1 and result.stderr == (
        f"error: --out {out}: already holds model.safetensors; "
        "continue that run with --resume, or choose another --out "
        "(nothing was changed)\n"
    )
    assert listing(out) == before


@pytest.mark.slow
@pytest.mark.parametrize("device", ON_EVERY_DEVICE)
def test_an_interrupted_run_resumes_to_the_same_checkpoint_hash(device, gpts, tmp_path, monkeypatch):
    """GPT-2s train with dropout, which draws from the global generator: the resumed steps repeat
    only because every step seeds it. On a GPU with --deterministic (train-ghn's option for it)."""

    def config(out):
        return TrainConfig(
            dataset=str(gpts),
            out=str(out),
            meta_batch=2,
            batch_size=2,
            seq_len=8,
            steps=5,
            checkpoint_every=2,
            log_every=1,
            device=device,
            deterministic=device != "cpu",
        )

    train(config(tmp_path / "straight"), progress=False)
    original, calls = training.run_models, []

    def interrupt_at_step_4(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(training, "run_models", interrupt_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        train(config(tmp_path / "resumed"), progress=False)
    monkeypatch.setattr(training, "run_models", original)
    train(config(tmp_path / "resumed"), resume=True, progress=False)

    def digest(run_folder):
        return hashlib.sha256((run_folder / "model.safetensors").read_bytes()).hexdigest()

    assert digest(tmp_path / "straight") == digest(tmp_path / "resumed")
    steps = [json.loads(line)["step"] for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]


# -- checkpoints are checked before they are allocated ---------------------------------------------


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    return save_checkpoint(
        tmp_path / "ckpt",
        LoGAH(LoGAHConfig(hidden=32, layers=1, heads=2, rank=8, max_mask=4096)),
        {"variant": "custom"},
    )


def test_a_truncated_checkpoint_is_named(gpts, checkpoint):
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    result = run("eval-ghn", "--dataset", gpts, "--ghn", checkpoint, "--out", checkpoint.parent / "eval")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: {weights}: not a readable safetensors file (")
    assert not (checkpoint.parent / "eval").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden": 200000}, "model.safetensors: does not match its config.json (the file holds"),
        ({"hidden": "lots"}, "config.json: logah.hidden must be an integer >= 1; got 'lots'"),
        ({"heads": 0}, "config.json: logah.heads must be an integer >= 1; got 0"),
        ({"heads": 3}, "config.json: logah.hidden 32 must be a multiple of logah.heads 3"),
        ({"depth": 3}, "config.json: logah.depth is not a LoGAH setting; known: hidden, layers"),
        ({"depth_buckets": -1}, "config.json: logah.depth_buckets must be an integer >= 0; got -1"),
        ({"depth_buckets": 4}, "model.safetensors: does not match its config.json (the file holds"),
        ({"tie_feature": 1}, "config.json: logah.tie_feature must be true or false; got 1"),
        ({"tie_feature": True}, "model.safetensors: does not match its config.json (the file holds"),
        ({"init_anchors": "yes"}, "config.json: logah.init_anchors must be true or false; got 'yes'"),
        ({"level_head": "yes"}, "config.json: logah.level_head must be true or false; got 'yes'"),
        ({"level_head": True}, "model.safetensors: does not match its config.json (the file holds"),
        ({"role_factors": "yes"}, "config.json: logah.role_factors must be true or false; got 'yes'"),
        ({"role_factors": True}, "config.json: logah.role_factors: role factors need the low_rank decoder and role"),
        ({"role_vectors": "yes"}, "config.json: logah.role_vectors must be true or false; got 'yes'"),
        ({"role_vectors": True}, "config.json: logah.role_vectors: role vectors need the low_rank decoder and role"),
        ({"role_prototypes": 1}, "config.json: logah.role_prototypes must be true or false; got 1"),
        (
            {"role_prototypes": True},
            "config.json: logah.role_prototypes: role prototypes need the low_rank decoder and role",
        ),
        ({"table_gain": 0}, "config.json: logah.table_gain: table gain must be a positive number; got 0"),
        ({"table_gain": "4"}, "config.json: logah.table_gain: table gain must be a positive number; got '4'"),
        ({"table_gain": True}, "config.json: logah.table_gain: table gain must be a positive number; got True"),
        ({"decoder": "dense"}, "config.json: logah.decoder: unknown decoder 'dense'; accepted: low_rank, ghn3"),
        ({"roles": "h.attn.c_attn.weight"}, "config.json: logah.roles must be a list of parameter names; got 'h.attn"),
        ({"roles": ["a.weight", "a.weight"]}, "config.json: logah.roles: roles must be distinct parameter names"),
        ({"roles": [3]}, "config.json: logah.roles: roles must be distinct parameter names"),
        (
            {"roles": ["a.weight"], "decoder": "ghn3"},
            "config.json: logah.roles: role maps need the low_rank decoder, not 'ghn3'",
        ),
        ({"roles": ["a.weight"]}, "model.safetensors: does not match its config.json (the file holds"),
        ({"role_key": "op"}, "config.json: logah.role_key: unknown role key 'op'; accepted: name, leaf"),
    ],
)
def test_a_checkpoint_config_is_checked_before_anything_is_allocated(checkpoint, monkeypatch, change, message):
    build = LoGAH.__init__

    def only_on_meta(self, *args, **kwargs):
        assert torch.get_default_device().type == "meta", "a LoGAH was allocated before its size was checked"
        build(self, *args, **kwargs)

    monkeypatch.setattr(LoGAH, "__init__", only_on_meta)
    config = json.loads((checkpoint / "config.json").read_text())
    config["logah"].update(change)
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(checkpoint)
    assert f"{checkpoint}/{message}" in str(error.value)


def test_a_checkpoint_larger_than_memory_is_refused(checkpoint, monkeypatch):
    monkeypatch.setattr(importlib.import_module("graphkit.params"), "available_memory", lambda device: 1000)
    with pytest.raises(
        CheckpointError, match=r"model.safetensors: a LoGAH of [\d,]+ parameters needs 0.00 GB to load but 0.00 GB"
    ):
        load_checkpoint(checkpoint)


def test_a_damaged_training_checkpoint_is_named_on_resume(gpts, trained, tmp_path):
    out = copy_of(trained, tmp_path)
    optimizer = out / "checkpoint" / "optimizer.safetensors"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    result = run("train-ghn", "--dataset", gpts, "--out", out, "--resume", *TINY, "--steps", "3")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert result.stderr.startswith(f"error: {optimizer}: not a readable safetensors file (")
    (out / "checkpoint" / "trainer_state.json").write_text("{")
    result = run("train-ghn", "--dataset", gpts, "--out", out, "--resume", *TINY, "--steps", "3")
    assert result.exit_code == 1 and result.stderr.startswith(
        f"error: {out}/checkpoint/trainer_state.json: not a graphkit"
    ), result.output


# -- CIFAR folders are read without running code ---------------------------------------------------


class RunsAShellCommand:
    """What a crafted pickle holds: unpickling it calls os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def write_cifar10(root: Path, protocol: int, data_batch_1=None) -> Path:
    """A tiny CIFAR-10 folder in the release's format (numpy arrays and lists pickled), two images per batch."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i, name in enumerate([*(f"data_batch_{k}" for k in range(1, 6)), "test_batch"]):
        data = np.full((2, 3072), 10 * i, dtype=np.uint8)
        batch = {"batch_label": name, "labels": [i, 9 - i], "data": data, "filenames": ["a.png", "b.png"]}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=protocol))
    if data_batch_1 is not None:
        (folder / "data_batch_1").write_bytes(pickle.dumps(data_batch_1, protocol=protocol))
    (folder / "batches.meta").write_bytes(
        pickle.dumps({"label_names": [f"class{i}" for i in range(10)]}, protocol=protocol)
    )
    return folder


@pytest.mark.parametrize("protocol", [2, 4, 5])  # 2: as Python 2 wrote the release; 5: numpy's out-of-band form
def test_a_genuine_cifar_folder_loads(tmp_path, protocol):

    folder = write_cifar10(tmp_path, protocol)
    source = load_source(f"cifar10:{folder}")
    assert source.describe() == f"cifar10:{folder}: 10 train / 2 eval images, 10 classes, 32x32x3"
    images, labels = source.splits["train"]
    assert (
        images.shape == (10, 3, 32, 32) and images[2].eq(10).all() and labels.tolist() == [0, 9, 1, 8, 2, 7, 3, 6, 4, 5]
    )


@pytest.mark.parametrize("command", ["train-ghn", "eval-ghn"])
def test_a_crafted_cifar_batch_is_refused_without_running_its_code(gpts, tmp_path, command):
    marker = tmp_path / "ran"
    folder = write_cifar10(tmp_path / "cifar", 2, data_batch_1={"data": RunsAShellCommand(marker), "labels": [0]})
    before = listing(tmp_path)
    result = run(command, "--dataset", gpts, "--out", tmp_path / "out", "--data", f"cifar10:{tmp_path / 'cifar'}")
    assert not marker.exists()
    assert result.exit_code == 1 and result.stderr == (
        f"error: {folder / 'data_batch_1'}: names posix.system, which "
        "a CIFAR batch never holds; refused without running it "
        "(accepted: numpy arrays, lists, dicts, strings and numbers)\n"
    ), result.output
    assert listing(tmp_path) == before


@pytest.mark.parametrize(
    "batch, message",
    [
        ({"labels": [0, 1]}, "'data' must be a uint8 array of N rows of 3072 pixels"),
        ({"data": np.zeros((2, 3072), np.float32), "labels": [0, 1]}, "'data' must be a uint8 array"),
        (
            {"data": np.zeros((2, 3072), np.uint8), "labels": [0, 10]},
            "'labels' must list 2 labels from 0 to 9, one per image",
        ),
        ([1, 2], "not a CIFAR pickle (holds a list, not a dict)"),
    ],
)
def test_a_cifar_batch_of_the_wrong_shape_is_named(tmp_path, batch, message):

    folder = write_cifar10(tmp_path, 4, data_batch_1=batch)
    with pytest.raises(DataError) as error:
        load_source(f"cifar10:{tmp_path}")
    assert str(error.value).startswith(f"{folder / 'data_batch_1'}: {message}")


# -- an error is the first line of stderr ------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["predict", str(ROOT / "examples" / "vit_tiny_cifar.py"), "--ghn", "{tmp}/nowhere"],
        ["train-ghn", "--dataset", "{gpts}", "--out", "{tmp}/run", "--data", "digits"],
        ["eval-ghn", "--dataset", "{gpts}", "--ghn", "{tmp}/nowhere", "--out", "{tmp}/eval"],
    ],
)
@pytest.mark.slow
def test_an_error_is_the_first_line_of_stderr(gpts, tmp_path, command):
    """torch_geometric's import scripts a function with torch.jit.script, whose FutureWarning came
    first on every predict, train-ghn and eval-ghn while ghn/model.py imported it; these commands
    must not import it (or anything else that warns) on their way to an error."""
    args = [part.format(tmp=tmp_path, gpts=gpts) for part in command]
    result = subprocess.run(
        [sys.executable, "-W", "default", "-m", "graphkit", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 1 and result.stderr.startswith("error: "), result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Warning" not in result.stderr


# -- failures mid-run are named, and stop before they damage the weights ---------------------------


def test_a_damaged_image_is_named_when_a_batch_reaches_it(tmp_path):

    for name, colour in (("red", (255, 0, 0)), ("blue", (0, 0, 255))):
        (tmp_path / name).mkdir()
        Image.new("RGB", (4, 4), colour).save(tmp_path / name / "0.png")
    (tmp_path / "blue" / "0.png").write_bytes(b"not a png")
    source = load_source(f"imagefolder:{tmp_path}")
    config = {"family": "vit", "image_size": 8, "in_chans": 3, "num_classes": 2}
    with pytest.raises(
        DataError,
        match=rf"imagefolder:{tmp_path}: cannot read the image {tmp_path}/blue/0.png \(UnidentifiedImageError",
    ):
        for split in ("train", "eval"):  # one image each: one of them is the damaged one
            source.batch(config, 4, torch.Generator().manual_seed(0), split=split)


def test_an_unreadable_text_file_is_named(tmp_path, monkeypatch):

    text = tmp_path / "corpus.txt"
    text.write_text("x" * 100)

    def refused(self):  # chmod 0 is no obstacle to root, who runs the suite on some machines
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refused)
    with pytest.raises(DataError, match=f"data source 'text:{text}': {text}: Permission denied"):
        load_source(f"text:{text}")


def test_a_non_finite_step_is_skipped_and_five_in_a_row_stop_training(gpts, tmp_path, monkeypatch, capsys):
    """One meta-batch whose gradient norm is NaN changes no weight and training goes on, counting
    it; a NaN at every step stops training after SKIPPED_IN_A_ROW steps, with no checkpoint of NaN
    weights written."""

    clip, calls = training.nn.utils.clip_grad_norm_, []

    def nan_at(steps):
        def clipped(params, limit):
            calls.append(1)
            return clip(params, limit) * (float("nan") if len(calls) - 1 in steps else 1.0)

        return clipped

    config = dict(dataset=str(gpts), meta_batch=1, batch_size=2, seq_len=8, log_every=1)
    monkeypatch.setattr(training.nn.utils, "clip_grad_norm_", nan_at({1}))
    train(TrainConfig(**config, out=str(tmp_path / "once"), steps=3), progress=False)
    lines = [json.loads(line) for line in (tmp_path / "once" / "metrics.jsonl").read_text().splitlines()]
    assert [line["skipped_steps"] for line in lines] == [0, 1, 1]
    assert "warning: step 1: the gradient norm is nan; skipped, the weights unchanged" in capsys.readouterr().out
    assert all(torch.isfinite(p).all() for p in load_checkpoint(tmp_path / "once").parameters())

    calls.clear()
    monkeypatch.setattr(training.nn.utils, "clip_grad_norm_", nan_at(range(100)))
    with pytest.raises(
        training.TrainError,
        match=r"steps 0-4: the gradient norm is nan at each; rerun with a lower --lr",  # no checkpoint to resume
    ):
        train(TrainConfig(**{**config, "log_every": 10}, out=str(tmp_path / "run"), steps=8), progress=False)
    assert len(calls) == training.SKIPPED_IN_A_ROW == 5
    assert not (tmp_path / "run").exists()  # no metrics line, no checkpoint, and the folder it made is gone
    calls.clear()
    monkeypatch.setattr(training.nn.utils, "clip_grad_norm_", nan_at(range(2, 100)))
    with pytest.raises(training.TrainError, match=r"steps 2-6: .*; resume from .*checkpoint with a lower --lr"):
        train(TrainConfig(**config, checkpoint_every=1, out=str(tmp_path / "kept"), steps=8), progress=False)
    assert (tmp_path / "kept" / "checkpoint").is_dir()  # a checkpoint of finite weights, to resume from


def test_a_resume_by_another_number_of_processes_is_refused(gpts, trained, tmp_path):
    out = copy_of(trained, tmp_path)
    state_file = out / "checkpoint" / "trainer_state.json"
    assert json.loads(state_file.read_text())["world_size"] == 1
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "world_size": 2}))
    before = listing(out)
    result = run("train-ghn", "--dataset", gpts, "--out", out, "--resume", *TINY, "--steps", "3")
    assert result.exit_code == 1 and result.stderr == (
        f"error: --resume: {out} was trained by 2 processes, not 1; resume it with 2 processes\n"
    )
    assert listing(out) == before


@pytest.mark.slow
def test_a_checkpoint_that_cannot_record_the_evaluation_loses_no_results(gpts, trained, tmp_path, monkeypatch):

    def read_only(path, text):
        raise PermissionError(13, "Permission denied", str(path))

    ghn = copy_of(trained, tmp_path)
    monkeypatch.setattr(checkpoint_module, "write_text_atomic", read_only)
    result = run(
        "eval-ghn",
        "--dataset",
        gpts,
        "--ghn",
        ghn,
        "--out",
        tmp_path / "eval",
        "--archs",
        "1",
        "--steps",
        "1",
        "--batch-size",
        "2",
        "--seq-len",
        "8",
        "--record",
        "--workers",  # inline: the worker processes have tests of their own (test_workers.py)
        "1",
    )
    assert result.exit_code == 1 and result.stderr == (
        f"error: {ghn}/config.json: cannot record the evaluation there (Permission denied)\n"
    ), result.output
    assert json.loads((tmp_path / "eval" / "eval.json").read_text())["summary"]["archs"] == 1


def test_a_damaged_evaluation_record_still_describes_the_checkpoint(checkpoint):

    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(
        json.dumps({**config, "evaluation": {"archs": 8, "predicted_alone": "high"}})
    )
    assert describe(load_checkpoint(checkpoint)).endswith(
        "; its recorded evaluation is unreadable (graphkit eval-ghn --record measures it again)"
    )
