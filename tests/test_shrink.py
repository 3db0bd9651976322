"""The mini zoos (graphkit.datasets.shrink): zoo models shrunk through their own constructor or
config keep every op kind and parameter kind, train, rebuild from their record, and are split
by zoo family (timm module, model type)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from graphkit.cli import app
from graphkit.datasets import load
from graphkit.datasets.shrink import (
    BYTE_VOCAB,
    HELD_OUT_SHARE,
    IMAGE_SIZE,
    LARGE_IMAGE_SIZES,
    Plan,
    data_keys,
    decoder_plans,
    held_out_zoo_families,
    kinds,
    trainability,
    vision_plans,
)
from graphkit.datasets.store import RUN_FILE, graph_to_row, write_dataset
from graphkit.datasets.zoo import (
    CACHE_DIR,
    ZOOS,
    ZooError,
    _cache_path,
    generate_zoo,
    library_versions,
    mini_outcome,
    trace_zoo_model,
)
from graphkit.families import build_model
from graphkit.ghn.checkpoint import load_checkpoint
from graphkit.ghn.evaluate import EvalConfig, EvalError
from graphkit.ghn.evaluate import evaluate as evaluate_ghn
from graphkit.ghn.pool import ArchPool, functional_model
from graphkit.ghn.space import training_space
from graphkit.ghn.training import TrainConfig, train

#: op kinds a mini model may add to the full one: a classifier, for the models published without
#: one (EVA-02's and AIMv2's encoders), which every vision variant gets
MAY_ADD = {"head"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("timm", "vit_base_patch16_224"),  # timm.models.vision_transformer
        ("timm", "swin_tiny_patch4_window7_224"),  # hierarchical: per-stage depths, shifted windows
        ("timm", "eva02_base_patch14_224"),  # published without a classifier
        ("transformers", "qwen3_moe"),  # MoE sizes, GQA
        ("transformers", "gpt2"),  # special tokens past the byte vocabulary, a position table
    ],
)
def test_a_shrunk_zoo_model_keeps_every_kind_trains_and_rebuilds_from_its_record(kind, name):
    outcome = mini_outcome(kind, name)
    assert "row" in outcome, outcome.get("error")
    config = json.loads(outcome["row"]["config"])
    full = trace_zoo_model(
        build_model({k: v for k, v in config.items() if k in ("family", "model", "model_type")}), config
    )
    small = trace_zoo_model(build_model(config), config)  # the record's config rebuilds it
    assert small.fingerprint() == outcome["row"]["fingerprint"]
    (full_ops, full_params), (ops, params) = kinds(full), kinds(small)
    assert full_ops <= ops and ops - full_ops <= MAY_ADD
    assert full_params <= params and {op for op, _ in params - full_params} <= MAY_ADD
    assert small.num_params < 6_000_000 < full.num_params
    model = build_model(config, "cpu")
    assert trainability(model, "image" if kind == "timm" else "text") is None
    if kind == "timm":
        assert (config["image_size"], config["num_classes"]) == (32, 10)
    else:  # the config's own names (GPT-2's n_layer) read through transformers' aliases
        assert config["vocab_size"] == model.config.vocab_size == BYTE_VOCAB
        assert model.config.num_hidden_layers in (2, 3, 4) and 64 <= model.config.hidden_size <= 256


def test_vision_plans_shrink_by_name_and_keep_what_they_do_not_know():
    arguments = {
        "embed_dim": 768,
        "depth": 12,
        "num_heads": 12,
        "patch_size": 16,
        "mlp_ratio": 4.0,
        "drop_rate": 0.0,
        "global_attn_indexes": [2, 5, 8, 11],
    }
    plan, overrides = vision_plans("vision_transformer", arguments)[0]
    assert plan == Plan(2, 2)
    assert overrides == {"embed_dim": 192, "depth": 2, "num_heads": 3, "patch_size": 8, "global_attn_indexes": [1]}
    swin = {"embed_dim": 96, "depths": (2, 2, 6, 2), "num_heads": (3, 6, 12, 24), "window_size": 7, "patch_size": 4}
    assert vision_plans("swin_transformer", swin)[0][1] == {  # one width, doubled each of 4 stages: 768
        "embed_dim": 24,
        "depths": [2, 2, 2, 2],
        "num_heads": [1, 1, 3, 6],
        "window_size": 4,
        "patch_size": 2,
    }
    # ConViT's embed_dim is per head (the family table): only the heads shrink
    assert vision_plans("convit", {"embed_dim": 48, "num_heads": 16, "depth": 12})[0][1] == {"num_heads": 4, "depth": 2}


def test_the_last_vision_plans_take_larger_images_and_say_so_in_their_overrides():
    arguments = {"embed_dim": 768, "depth": 12, "num_heads": 12, "patch_size": 16}
    plans = vision_plans("vision_transformer", arguments)
    sides = [plan.image_size for plan, _ in plans]
    assert sides[0] == IMAGE_SIZE and sides[-1] == max(LARGE_IMAGE_SIZES)
    assert sides == sorted(sides)  # every 32-pixel plan is tried before a larger one
    for plan, overrides in plans:
        assert overrides.get("img_size", IMAGE_SIZE) == plan.image_size
        assert data_keys(overrides)["image_size"] == plan.image_size


@pytest.mark.slow
def test_a_model_that_pools_32_pixels_to_one_token_is_shrunk_at_64_and_keeps_its_tanh_head():
    """CoAtNet's last stage downsamples 32 times: at 32 pixels its attention sees a single key,
    which the tracer refuses, so its family (timm's maxxvit, MaxViT's too) never reached the mini
    zoo and the vision checkpoint never trained on the tanh of its classifier head."""
    outcome = mini_outcome("timm", "coatnet_0_224")
    assert "row" in outcome, outcome.get("error")
    assert outcome["plan"].endswith("image_size=64")
    config = json.loads(outcome["row"]["config"])
    assert (config["image_size"], config["shrink"]["img_size"]) == (64, 64)
    model = build_model(config, "cpu")
    assert model.pretrained_cfg["input_size"] == (3, 64, 64)
    graph = trace_zoo_model(build_model(config), config)
    assert graph.fingerprint() == outcome["row"]["fingerprint"] and "tanh" in kinds(graph)[0]
    assert trainability(model, "image") is None


@pytest.mark.slow
def test_pvt_v2_whose_keys_pool_to_one_at_32_pixels_is_shrunk_at_64():
    """PVT-v2 reduces its keys by 8, 4, 2 and 1 in stages of strides 4 to 32: at 32 pixels every
    attention sees one key, which the tracer refuses (issue #46); at 64 each sees four."""
    outcome = mini_outcome("timm", "pvt_v2_b0")
    assert "row" in outcome, outcome.get("error")
    assert outcome["plan"].endswith("image_size=64")
    config = json.loads(outcome["row"]["config"])
    graph = trace_zoo_model(build_model(config), config)
    assert graph.fingerprint() == outcome["row"]["fingerprint"] and "attention" in kinds(graph)[0]


def test_decoder_plans_keep_a_layer_of_each_kind_and_move_special_tokens_onto_bytes():
    reference = {
        "num_hidden_layers": 26,
        "hidden_size": 2304,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "intermediate_size": 9216,
        "vocab_size": 262144,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 20,
        "pad_token_id": 0,
        "bos_token_id": 2,
        "eos_token_id": [1, 106, 262143],
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
    }
    plan, overrides = decoder_plans(reference)[0]
    assert overrides["layer_types"] == ["sliding_attention", "full_attention"] and overrides["num_hidden_layers"] == 2
    assert (overrides["hidden_size"], overrides["num_attention_heads"], overrides["num_key_value_heads"]) == (128, 4, 2)
    assert overrides["vocab_size"] == BYTE_VOCAB and overrides["eos_token_id"] == [1, 106, 3]  # 0, 1, 2 are taken
    assert (overrides["attn_layer_period"], overrides["attn_layer_offset"]) == (2, 1)
    mha = decoder_plans({"num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 12})[0][1]
    mqa = decoder_plans({"num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 1})[0][1]
    assert mha["num_key_value_heads"] == 4 and "num_key_value_heads" not in mqa  # MQA stays MQA


class _Classifier(nn.Module):
    def __init__(self, classes: int, scale: float = 1.0) -> None:
        super().__init__()
        self.proj = nn.Linear(3 * 32 * 32, classes)
        self.scale = scale

    def forward(self, x):
        return self.proj(x.flatten(1)) * self.scale


def test_the_trainability_check_names_a_wrong_output_or_a_loss_that_is_not_finite():
    assert trainability(_Classifier(10), "image") is None
    assert trainability(_Classifier(1000), "image") == "returns (2, 1000), not the (2, 10) a image model's loss needs"
    assert trainability(_Classifier(10, float("inf")), "image").startswith("the loss is nan")


def test_the_split_holds_out_whole_zoo_families_deterministically():
    families = [f"family-{i}" for i in range(20)]
    held = held_out_zoo_families(families, seed=0)
    assert len(held) >= HELD_OUT_SHARE * len(families) and len(held) == 3
    assert held == held_out_zoo_families(list(reversed(families)) * 2, seed=0)  # order and repeats do not matter
    assert held != held_out_zoo_families(families, seed=1)
    assert held_out_zoo_families(["one"]) == [] and len(held_out_zoo_families(["a", "b"])) == 1
    # a zoo family with an op kind no other has stays in training: held out, it could not be
    # evaluated, and the hypernetwork would refuse that op on every model (MaxViT's tanh)
    architectures = [({f}, {"linear", "unique"} if f == held[0] else {"linear"}) for f in families]
    covered = held_out_zoo_families(families, seed=0, architectures=architectures)
    assert held[0] not in covered and len(covered) == len(held) and set(held[1:]) <= set(covered)
    # an architecture two zoo families share leaves training with either: its op is no cover
    twins = [({held[0], "family-x"}, {"shared"}), *(({f}, {"linear"}) for f in families)]
    assert held[0] not in held_out_zoo_families([*families, "family-x"], seed=0, architectures=twins)
    # fewer are held out when too few zoo families leave their ops to others
    assert held_out_zoo_families(families, seed=0, architectures=[({f}, {f}) for f in families]) == []


@pytest.mark.slow
def test_a_tiny_mini_zoo_is_generated_split_by_zoo_family_and_its_records_train(tmp_path):
    out = tmp_path / "mini"
    generate = ["generate", "zoo-vits-mini", "--num", "3", "--out", str(out), "--seed", "0", "--resume"]
    # a run an earlier graphkit started and saved one model of, under the key it wrote then
    # ("family", now "zoo_family": issue #47): resumed, that model is not traced again
    zoo, first = ZOOS["zoo-vits-mini"], ZOOS["zoo-vits-mini"].candidates()[0]
    identity = {"zoo": zoo.name, "limit": 3, "libraries": library_versions(zoo), "seed": 0}
    (out / CACHE_DIR).mkdir(parents=True)
    (out / RUN_FILE).write_text(json.dumps(identity))
    saved = {"family" if key == "zoo_family" else key: value for key, value in mini_outcome("timm", first).items()}
    _cache_path(out, first).write_text(json.dumps(saved))
    result = CliRunner().invoke(app, generate)
    assert result.exit_code == 0, result.output
    assert "(2 traced now, 1 from an earlier run)" in result.output
    assert "1 of 3 zoo families held out whole" in result.output
    report = json.loads((out / "report.json").read_text())
    assert (report["candidates"], report["records"], report["failed"]) == (3, 3, [])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["held_out_zoo_families"] == report["split"]["held_out_zoo_families"] and manifest["seed"] == 0
    dataset = load(out)
    by_split = {s: {r.config["zoo_family"] for r in dataset.filter(split=s)} for s in ("train", "eval")}
    assert by_split["eval"] == set(manifest["held_out_zoo_families"]) and not by_split["eval"] & by_split["train"]
    # a finished run's report in the earlier keys: resumed, it is read as now
    split = report["split"]
    report["split"] = {"families": split["zoo_families"], "held_out_families": split["held_out_zoo_families"]}
    (out / "report.json").write_text(json.dumps(report))
    finished = CliRunner().invoke(app, generate)
    assert finished.exit_code == 0 and "1 of 3 zoo families held out whole" in finished.output, finished.output
    assert len(by_split["train"]) == 2
    record = dataset[0]
    model = record.build_model(device="cpu")
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    pool = ArchPool(out, "train")  # what train-ghn reads: one family of configs, shells it can call
    assert pool.family == "timm" and sum(1 for _ in pool.model(0).parameters()) > 0
    run = tmp_path / "run"
    train = ["train-ghn", "--dataset", str(out), "--data", "digits", "--out", str(run), "--meta-batch", "1"]
    train += ["--batch-size", "2", "--checkpoint-every", "1"]
    first = CliRunner().invoke(app, [*train, "--steps", "1"])
    assert first.exit_code == 0, first.output
    # timm's pool has no default data source: the resume compares the --data its run recorded
    resumed = CliRunner().invoke(app, [*train, "--steps", "2", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((run / "config.json").read_text())["steps"] == 2
    # a curriculum's first stage on one family (train-ghn --zoo-families), with the whole split's
    # role maps, so that a stage on the whole zoo can start from it
    family = sorted(by_split["train"])[0]
    stage = tmp_path / "stage"
    staged = CliRunner().invoke(app, [*train[:6], str(stage), "--steps", "1", "--role-maps", "--zoo-families", family])
    assert staged.exit_code == 0, staged.output
    ghn = load_checkpoint(stage)
    assert ghn.info["train"]["zoo_families"] == [family] and ghn.config.roles == tuple(pool.roles())
    kept = [r.graph for r in pool.records if r.config["zoo_family"] == family]
    assert len(kept) < len(pool.records) and ghn.info["space"] == json.loads(json.dumps(training_space(kept)))
    # meta-batches that mix the zoo's families, each family as likely (2 families, 3 a step: one repeats)
    mixed = [*train[:6], str(tmp_path / "mixed"), "--steps", "1", "--meta-batch", "3", "--batch-size", "2"]
    assert CliRunner().invoke(app, [*mixed, "--mix-families"]).exit_code == 0
    assert load_checkpoint(tmp_path / "mixed").info["train"]["mix_families"] is True
    unknown = CliRunner().invoke(app, [*train[:6], str(tmp_path / "none"), "--zoo-families", f"{family},nosuch"])
    assert unknown.exit_code == 1 and "split 'train' has no zoo family 'nosuch'; it has " in unknown.stderr
    # and evaluated on the held-out family, each model built by its library (eval-ghn refused
    # "unknown family 'timm'" while it built records as graphkit families only); the split held
    # out a family whose ops the training families have (CaiT's, which they lack, stays in train)
    evaluation = tmp_path / "eval"
    evaluate = ["eval-ghn", "--dataset", str(out), "--ghn", str(run), "--split", "eval", "--archs", "1"]
    evaluate += ["--data", "digits", "--steps", "2", "--batch-size", "2", "--workers", "1", "--out", str(evaluation)]
    evaluated = CliRunner().invoke(app, evaluate)
    assert evaluated.exit_code == 0, evaluated.output
    summary = json.loads((evaluation / "eval.json").read_text())["summary"]
    assert summary["archs"] == 1 and summary["horizons"] == [0, 2]
    # an architecture with an op the hypernetwork never saw is passed over and named, and the next
    # one taken; with none left, one line
    ghn = load_checkpoint(run)
    train = ArchPool(out, "train").records
    ops = [{node.op for node in record.graph.nodes} for record in train]
    first = next(i for i, kinds in enumerate(ops) if kinds - set().union(*ops[:i], *ops[i + 1 :]))
    ghn.info["trained_ops"] = sorted(set().union(*ops[:first], *ops[first + 1 :]))
    skipped = []
    config = EvalConfig(str(out), split="train", data="digits", archs=1, steps=1, batch_size=2, workers=1)
    rows = evaluate_ghn(config, ghn, progress=False, on_skip=lambda *why: skipped.append(why))
    assert [record for record, _ in skipped] == [train[first].id] and "was not trained on" in skipped[0][1]
    assert {row["id"] for row in rows} == {train[0 if first else 1].id}
    ghn.info["trained_ops"] = ["input"]
    with pytest.raises(EvalError, match=r"^no architecture of .* \(train\) can be evaluated: .*was not trained on"):
        evaluate_ghn(config, ghn, progress=False)


def test_bad_mini_zoo_options_are_one_line_errors(tmp_path):
    with pytest.raises(ZooError, match="^--seed must be an integer of at least 0, got -1$"):
        generate_zoo("zoo-vits-mini", tmp_path / "a", seed=-1)
    with pytest.raises(ZooError, match="^--seed applies to recipes and mini zoos, not to zoo-vits"):
        generate_zoo("zoo-vits", tmp_path / "b", seed=3)
    refused = CliRunner().invoke(app, ["generate", "zoo-decoders-mini", "--attention", "gqa", "--out", str(tmp_path)])
    assert refused.exit_code != 0 and "--attention applies to recipes, not to zoo-decoders-mini" in refused.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.slow
def test_a_zoo_decoder_trains_as_hypernetwork_training_calls_it_without_a_cache():
    """train-ghn calls a record's model as model(ids) in train mode; a hybrid whose layers are all
    linear attention (Bamba at 2 layers) returned a cache and failed in its own bookkeeping
    ("get_seq_length can only be called on Attention layers") unless built without one."""
    small = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
    config = {"family": "transformers", "model_type": "bamba", "shrink": {**small, "vocab_size": 256}}
    model = build_model(config, "cpu").train()
    assert model.config.use_cache is False
    logits = model(torch.randint(0, 256, (2, 16))).logits
    assert logits.shape == (2, 16, 256) and torch.isfinite(logits).all()


@pytest.mark.slow
def test_a_mini_rwkv_takes_lent_parameters_in_train_mode_after_eval_mode():
    """train-ghn lends a mini model the hypernetwork's predictions (views of one output) through
    functional_call, in train mode, and its diagnostics run it in eval mode between steps. RWKV's
    fp16 rescaling wrote into the lent weights in place at each switch, which autograd refuses
    ("a view ... has been modified inplace", train-ghn on zoo-decoders-mini stopped at step 662)."""
    shrink = {"hidden_size": 64, "attention_hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    model = functional_model(
        {"family": "transformers", "model_type": "rwkv", "shrink": {**shrink, "vocab_size": 256}}, "cpu"
    )
    assert model.config.rescale_every == 0
    shapes = {name: p.shape for name, p in model.named_parameters()}
    flat = torch.randn(sum(s.numel() for s in shapes.values()), requires_grad=True)
    views = (0.02 * flat).split([s.numel() for s in shapes.values()])  # as the decoder's output: views of one
    lent = {name: view.view(shape) for (name, shape), view in zip(shapes.items(), views)}
    ids = torch.randint(256, (2, 8))
    with torch.no_grad():
        torch.func.functional_call(model.eval(), lent, (ids,))
    torch.func.functional_call(model.train(), lent, (ids,)).logits.sum().backward()
    assert torch.isfinite(flat.grad).all()


@pytest.mark.slow
def test_a_zoo_model_with_batch_norm_trains_under_bf16_autocast(tmp_path):
    """With --amp (the default on a GPU) graphkit's families run in bf16 throughout; a library's
    model keeps float32 buffers (batch norm's running statistics), so in bf16 its first batch
    norm failed ("Expected running_mean to have type BFloat16 but got Float": train-ghn on
    zoo-vits-mini stopped at step 0 on an H200). A zoo's models run in float32 under autocast."""
    config = {  # EfficientViT-MSRA (convolutions with batch norm), as the mini zoo shrinks it (mini_outcome)
        "family": "timm",
        "model": "efficientvit_m0",
        "zoo_family": "efficientvit_msra",
        "image_size": 128,
        "in_chans": 3,
        "num_classes": 10,
        "shrink": {"depth": [1, 2, 2], "img_size": 128, "window_size": [4, 4, 4]},
    }
    graph = trace_zoo_model(build_model(config), config)
    write_dataset([graph_to_row(graph, config, id="efficientvit_m0", split="train")], tmp_path / "bn", name="bn")
    config = TrainConfig(
        dataset=str(tmp_path / "bn"), out=str(tmp_path / "run"), data="digits", steps=1, meta_batch=1, batch_size=2
    )
    train(dataclasses.replace(config, amp=True), progress=False)
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text())["ce"] > 0
