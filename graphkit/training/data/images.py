"""Image sources: scikit-learn's bundled digits and a folder of class folders, resized per
batch to whatever size and channel count a model takes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from graphkit.training.data.source import SPLITS, DataError, DataSource, fixed_split


class ImageSource(DataSource):
    """Labelled images, either uint8 (N, C, H, W) tensors in memory or files read per batch by ``load``.

    Batches are float (B, in_chans, image_size, image_size): scaled to [0, 1], resized bilinearly,
    channels repeated (1 -> C) or averaged (C -> 1), then normalised with mean 0.5 / std 0.5 to [-1, 1]."""

    task = "image"

    def __init__(
        self,
        spec: str,
        splits: Mapping[str, tuple[Any, Tensor]],
        num_classes: int,
        channels: int,
        shape: str,
        load: Callable[[Any], Tensor] | None = None,
    ) -> None:
        super().__init__(spec, {s: len(t) for s, (_, t) in splits.items()})
        self.splits, self.num_classes, self.channels, self.shape, self.load = splits, num_classes, channels, shape, load

    def check(self, config: Mapping[str, Any]) -> None:
        """Also: the head must cover every class, and channels must match or be 1 on one side."""
        super().check(config)
        if self.num_classes > config["num_classes"]:
            raise DataError(
                f"{self.spec} has {self.num_classes} classes but the {config['family']} config has num_classes "
                f"{config['num_classes']}; build the model with {self.num_classes} (timm: num_classes, "
                "transformers: num_labels, graphkit's families: num_classes)"
            )
        if self.channels != config["in_chans"] and 1 not in (self.channels, config["in_chans"]):
            raise DataError(
                f"{self.spec} images have {self.channels} channels; "
                f"in_chans {config['in_chans']} needs 1 or {self.channels}"
            )

    def describe(self) -> str:
        """E.g. "digits: 1,437 train / 360 eval images, 10 classes, 8x8x1"."""
        sizes = f"{self.sizes['train']:,} train / {self.sizes['eval']:,} eval"
        return f"{self.spec}: {sizes} images, {self.num_classes} classes, {self.shape}"

    def _batch(self, config, batch_size, generator, split):
        images, targets = self.splits[split]
        idx = torch.randint(len(targets), (batch_size,), generator=generator)
        if self.load is None:
            return fit_images(images[idx], config), targets[idx]
        return torch.cat([fit_images(self.load(images[i])[None], config) for i in idx.tolist()]), targets[idx]


def fit_images(images: Tensor, config: Mapping[str, Any]) -> Tensor:
    """uint8 (B, C, H, W) -> the normalised float input ``config``'s model takes."""
    x = images.float() / 255
    size, chans = config["image_size"], config["in_chans"]
    if x.shape[-2:] != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=False)
    if x.shape[1] != chans:
        x = x.expand(-1, chans, -1, -1) if x.shape[1] == 1 else x.mean(1, keepdim=True)
    return (x - 0.5) / 0.5


def digits(spec: str, _: Path | None) -> ImageSource:
    from sklearn.datasets import load_digits

    digits = load_digits()  # 1,797 8x8 images, values 0..16
    images = torch.from_numpy(digits.data * (255 / 16)).round().to(torch.uint8).view(-1, 1, 8, 8)
    targets = torch.from_numpy(digits.target).long()
    splits = {s: (images[i], targets[i]) for s, i in zip(SPLITS, fixed_split(len(targets), 0.8))}
    return ImageSource(spec, splits, 10, 1, "8x8x1")


def image_folder(spec: str, folder: Path) -> ImageSource:
    """Class subfolders; ``train/`` with ``val/`` or ``eval/`` are the splits, else a fixed 90/10 split."""
    from torchvision.datasets import ImageFolder
    from torchvision.transforms.functional import pil_to_tensor

    held_out = next((folder / d for d in ("val", "eval") if (folder / d).is_dir()), None)
    try:
        if (folder / "train").is_dir() and held_out is not None:
            train, held = ImageFolder(str(folder / "train")), ImageFolder(str(held_out))
            extra = sorted(set(held.classes) - set(train.classes))
            if extra:
                raise DataError(f"{spec}: {held_out} has class {extra[0]!r}, which {folder / 'train'} lacks")
            samples = {
                "train": train.samples,
                "eval": [(p, train.class_to_idx[held.classes[t]]) for p, t in held.samples],
            }
        else:
            train = ImageFolder(str(folder))
            samples = {s: [train.samples[j] for j in i] for s, i in zip(SPLITS, fixed_split(len(train.samples), 0.9))}
    except OSError as e:  # ImageFolder: FileNotFoundError when it finds no class folder or image
        raise DataError(
            f"{spec}: no images in {folder} (expected class subfolders of image files, optionally "
            f"under train/ and val/; {e})"
        ) from None
    splits = {s: ([p for p, _ in v], torch.tensor([t for _, t in v], dtype=torch.long)) for s, v in samples.items()}

    def load(path: str) -> Tensor:
        try:
            return pil_to_tensor(train.loader(path))
        except Exception as e:  # PIL fails on a damaged or huge image in many ways; this runs mid-training
            raise DataError(
                f"{spec}: cannot read the image {path} ({type(e).__name__}: {e}); remove or replace it and resume"
            ) from None

    return ImageSource(spec, splits, len(train.classes), 3, "RGB files", load=load)
