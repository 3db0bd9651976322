"""Stream calibration (graphkit.ghn.calibrate): predicted models outside the training space get
the residual stream and logit spread of their family's init, at the sizes people use."""

import math

import pytest
import torch
from torch import nn

import graphkit
from graphkit.errors import PredictError
from graphkit.families import build_model
from graphkit.ghn import load_checkpoint
from graphkit.ghn.calibrate import CalibrationError, balance_logits, balanced_head, calibrate, check_calibration, factor
from graphkit.ghn.predict import predict, predicted_params

VIT = {"family": "vit", "image_size": 8, "patch_size": 2, "num_classes": 10}


def statistics(model: nn.Module, blocks: nn.Module, inputs) -> tuple[float, float, float]:
    """The last block's stream RMS, the share of it that varies from token to token, and the
    logits' standard deviation."""
    seen = []
    hook = blocks[-1].register_forward_hook(
        lambda module, args, out: seen.append(out[0] if isinstance(out, tuple) else out)
    )
    with torch.no_grad():
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    hook.remove()
    stream, out = seen[0].float(), (out.logits if hasattr(out, "logits") else out).float()
    varying = ((stream - stream.mean(1, keepdim=True)).pow(2).mean() / stream.pow(2).mean()).item()
    return stream.pow(2).mean().sqrt().item(), varying, out.std().item()


def lowest(stream: torch.Tensor, branch: torch.Tensor) -> float:
    """The ``a`` in [0, 1] that brings ``RMS(stream + a branch)`` lowest, on a grid of 1/1000."""
    grid = torch.linspace(0, 1, 1001, dtype=torch.float64)
    return grid[min(range(1001), key=lambda i: (stream + grid[i] * branch).pow(2).sum().item())].item()


def test_factor_keeps_what_fits_and_meets_the_target_exactly_where_it_does_not():
    generator = torch.Generator().manual_seed(0)
    stream, branch = torch.randn(64, 32, generator=generator), torch.randn(64, 32, generator=generator)
    rms = lambda x: x.pow(2).mean().sqrt().item()  # noqa: E731
    assert factor(stream, branch, 10.0) == 1.0  # the whole branch keeps the stream below 10
    a = factor(stream, 5 * branch, 2.0)
    assert 0 < a < 1 and math.isclose(rms(stream + a * 5 * branch), 2.0, rel_tol=1e-6)
    # already above the target: the factor that brings the stream lowest (a branch unrelated to
    # the stream only adds to it: out), not the branch dropped whatever it does. This branch takes
    # a third of the stream back out and adds noise: RMS^2 = (3 - x)^2 + 4 x^2, lowest at x = 0.6
    assert factor(3 * stream, branch, 1.0) == pytest.approx(0.0, abs=0.05)
    a = factor(3 * stream, 2 * branch - stream, 1.0)
    assert a == pytest.approx(0.6, abs=0.05) and a == pytest.approx(lowest(3 * stream, 2 * branch - stream), abs=1e-3)
    assert factor(stream, -0.5 * stream, 0.6) == 1.0  # a branch that brings the stream down is kept whole
    assert factor(stream, torch.zeros_like(branch), 0.1) == 1.0


@pytest.fixture(scope="module")
def vits():
    return load_checkpoint("logah-tiny-vits")


@pytest.mark.slow
def test_predicted_vit_large_propagates_like_its_init(vits):
    """ViT-L's shape (24 x 1024, 16 heads) at digits' resolution, grown from its twin and
    calibrated: uncalibrated, its stream is 9x init's and its logits 3-4x as spread; calibrated,
    both are within 2x on a batch the calibration did not see."""
    config = dict(VIT, num_layers=24, hidden=1024, heads=16)
    inputs = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    init = build_model(config, "cpu").eval()
    init_rms, init_varying, init_std = statistics(init, init.blocks, inputs)
    del init
    model = build_model(config, "meta")
    graph = graphkit.trace(model)
    predict(model, vits, graph=graph, calibrate=True)
    rms, varying, std = statistics(model.eval(), model.blocks, inputs)
    assert 0.5 < rms / init_rms < 2 and 0.5 < std / init_std < 2, (rms, init_rms, std, init_std)
    assert varying > 0.5 * init_varying


@pytest.mark.slow
def test_predicted_gpt2_large_propagates_like_its_init():
    """GPT-2-Large's shape (36 x 1280, 20 heads), with a small vocabulary to stay cheap: the
    stream RMS and logit spread within 2x of init's. (The share of the stream that varies from
    token to token stays a few percent, against init's 27%: calibration scales, it does not
    remove the constant every block writes; BENCHMARKS.md has the measurement.)
    ``predict(calibrate=True)`` would build this init again as the reference (seed 0, 10 s at this
    size): the test hands it over (test_predict_calibrates_only_when_asked covers the wiring)."""
    gpts = load_checkpoint("logah-tiny-gpts")
    config = {"family": "gpt2", "num_layers": 36, "hidden": 1280, "heads": 20, "vocab_size": 1000, "context": 64}
    inputs = {"input_ids": torch.randint(0, 1000, (4, 32), generator=torch.Generator().manual_seed(1))}
    torch.manual_seed(0)
    init = build_model(config, "cpu").eval()
    init_rms, _, init_std = statistics(init, init.transformer.h, inputs)
    model = build_model(config, "meta")
    graph = graphkit.trace(model)
    predict(model, gpts, graph=graph)
    calibrate(model, graph, reference=init)
    del init
    rms, _, std = statistics(model.eval(), model.transformer.h, inputs)
    assert math.isfinite(std)
    assert 0.5 < rms / init_rms < 2 and 0.5 < std / init_std < 2, (rms, init_rms, std, init_std)


@pytest.mark.slow
def test_predict_calibrates_only_when_asked(vits):
    config = dict(VIT, num_layers=12, hidden=384, heads=6)
    graph = graphkit.trace(build_model(config, "meta"))
    written = predict(build_model(config, "meta"), vits, graph=graph)
    for name, value in predicted_params(vits, graph).items():
        torch.testing.assert_close(written[name], value, msg=name)
    calibrated = predict(build_model(config, "meta"), vits, graph=graph, calibrate=True)
    assert calibrated["blocks.11.mlp.fc2.weight"].norm() < 0.5 * written["blocks.11.mlp.fc2.weight"].norm()
    torch.testing.assert_close(calibrated["blocks.11.mlp.fc1.weight"], written["blocks.11.mlp.fc1.weight"])


def test_calibration_only_shrinks_and_leaves_an_init_as_it_is():
    """A model at its own init is its own target: every factor is 1 and nothing changes."""
    config = dict(VIT, num_layers=3, hidden=64, heads=2)
    torch.manual_seed(0)
    model = build_model(config, "cpu")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = calibrate(model, graphkit.trace(build_model(config, "meta")))
    assert len(result.factors) == 6 and all(a == pytest.approx(1.0) for a in result.factors.values())
    assert result.head_factor == pytest.approx(1.0)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, before[name], msg=name)


def test_calibration_scales_each_branch_in_flight_as_the_weights_then_compute(vits):
    """The factors found with the branches rescaled in flight are the factors the weights get:
    after calibration the stream is at the init's on the calibration batch itself."""
    config = dict(VIT, num_layers=12, hidden=384, heads=6)
    model = build_model(config, "meta")
    graph = graphkit.trace(model)
    predict(model, vits, graph=graph)
    result = calibrate(model, graph)
    assert result.stream["before"] > 5 * result.stream["init"]
    assert result.stream["after"] == pytest.approx(result.stream["init"], rel=1e-3)
    assert result.logit_std["after"] == pytest.approx(result.logit_std["init"], rel=1e-3)
    assert min(result.factors.values()) < 0.2 and max(result.factors.values()) <= 1.0


def test_a_tied_output_layer_is_not_rescaled():
    """Scaling an LM head tied to the token embedding would scale the stream's input too."""
    gpts = load_checkpoint("logah-tiny-gpts")
    config = {
        "family": "gpt2",
        "num_layers": 12,
        "hidden": 128,
        "heads": 2,
        "vocab_size": 1000,
        "context": 64,
        "tied": True,
    }
    model = build_model(config, "meta")
    graph = graphkit.trace(model)
    predict(model, gpts, graph=graph)
    embedding = model.transformer.wte.weight.clone()
    result = calibrate(model, graph)
    assert result.head_factor == 1.0 and model.lm_head.weight is model.transformer.wte.weight
    torch.testing.assert_close(model.transformer.wte.weight, embedding)


class Handwritten(nn.Module):
    """Not one of graphkit's families: no config to read its init from."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.block, self.head = nn.Embedding(50, 16), nn.Linear(16, 16), nn.Linear(16, 50)

    def forward(self, ids):
        x = self.embed(ids)
        return self.head(x + self.block(x))


def test_a_model_of_no_family_is_refused_before_anything_is_written():
    model = Handwritten()
    graph = graphkit.trace(model, ((torch.zeros(2, 8, dtype=torch.long),), {}))
    with pytest.raises(CalibrationError, match="graphkit's families"):
        check_calibration(graph)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CalibrationError):
        calibrate(model, graph)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, before[name], msg=name)


def offset_vit() -> tuple[nn.Module, object, torch.Tensor]:
    """A small ViT whose head adds one large guess to every image (a bias of 0 to 9 times 3),
    its graph, and a batch of images."""
    config = dict(VIT, num_layers=2, hidden=32, heads=2)
    torch.manual_seed(0)
    model = build_model(config, "cpu")
    with torch.no_grad():
        model.head.bias.copy_(3.0 * torch.arange(10.0))
    return model, graphkit.trace(build_model(config, "meta")), torch.randn(16, 3, 8, 8)


def test_balancing_evens_the_classes_and_keeps_what_tells_images_apart():
    model, graph, images = offset_vit()
    with torch.no_grad():
        before = model.eval()(images)
    model.train()
    shift = balance_logits(model, graph, images)
    assert model.training  # the caller's mode is given back
    with torch.no_grad():
        after = model.eval()(images)
    assert before.argmax(1).eq(9).all()  # the guess: class 9 for every image
    prior = after.softmax(-1).mean(0)
    assert (prior * 10 - 1).abs().max() < 0.01  # every class predicted equally often on average
    # one shift for every image: the differences between images are the prediction's as they were
    torch.testing.assert_close(after - after[:1], before - before[:1], atol=1e-4, rtol=0)
    assert shift > 5 and len(set(after.argmax(1).tolist())) > 1


def test_a_balanced_model_is_left_as_it_is():
    model, graph, images = offset_vit()
    balance_logits(model, graph, images)
    bias = model.head.bias.clone()
    assert balance_logits(model, graph, images) < 1e-3
    torch.testing.assert_close(model.head.bias, bias, atol=1e-3, rtol=0)


def test_balancing_runs_the_model_twice_unless_its_output_moves_less_than_the_bias():
    """The steps are taken on one pass's logits and checked by a second pass; a model that halves
    its head's logits (as one averaging two heads does) takes further passes and is balanced too."""
    model, graph, images = offset_vit()
    passes = []
    model.register_forward_hook(lambda *_: passes.append(1))
    balance_logits(model, graph, images)
    assert len(passes) == 2
    model, graph, images = offset_vit()
    with torch.no_grad():
        model.head.bias.mul_(0.1)
    forward, passes = model.forward, []
    model.forward = lambda x: passes.append(1) or 0.5 * forward(x)
    balance_logits(model, graph, images)
    with torch.no_grad():
        prior = model(images).softmax(-1).mean(0)
    assert len(passes) > 3 and (prior * 10 - 1).abs().max() < 0.01


def test_a_head_without_a_bias_or_whose_output_is_not_the_logits_is_refused_unchanged():
    model, graph, images = offset_vit()
    model.head = nn.Linear(32, 10, bias=False)
    with pytest.raises(CalibrationError, match="^head: the output layer has no bias"):
        balance_logits(model, graph, images)
    model, graph, images = offset_vit()
    before = model.head.bias.clone()
    forward = model.forward
    model.forward = lambda x: forward(x).flip(-1).cumsum(-1)  # the head's output combined further
    with pytest.raises(CalibrationError, match="does not balance the model's predicted classes"):
        balance_logits(model, graph, images)
    torch.testing.assert_close(model.head.bias, before, atol=0, rtol=0)
    assert balanced_head(build_model(dict(VIT, num_layers=2, hidden=32, heads=2), "meta"), graph) == "head"


def test_predict_balances_the_classes_only_when_given_images_and_refuses_before_writing(vits):
    config = dict(VIT, num_layers=2, hidden=64, heads=2)
    graph = graphkit.trace(build_model(config, "meta"))
    images = torch.randn(32, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    plain = predict(build_model(config, "meta"), vits, graph=graph)
    model = build_model(config, "meta")
    balanced = predict(model, vits, graph=graph, balance_on=images)
    for name, value in plain.items():  # only the output layer's bias moves
        if name != "head.bias":
            torch.testing.assert_close(balanced[name], value, msg=name)
    assert not torch.allclose(balanced["head.bias"], plain["head.bias"])
    with torch.no_grad():
        prior = model.eval()(images).softmax(-1).mean(0)
    assert (prior * 10 - 1).abs().max() < 0.01
    unbiased = build_model(config, "meta")
    unbiased.head = nn.Linear(64, 10, bias=False, device="meta")
    refusal = "^VisionTransformer: cannot balance its classes: head: the output layer has no bias"
    with pytest.raises(PredictError, match=refusal):
        predict(unbiased, vits, graph=graphkit.trace(unbiased), balance_on=images)
    assert all(p.is_meta for p in unbiased.parameters())  # nothing was written
