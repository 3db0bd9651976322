"""Graph hypernetworks: LoGAH (arXiv 2405.16287) reads an ArchGraph and predicts every parameter.

``model`` holds the network (encoder, low-rank and GHN-3 decoders, the Table 1 variants),
``data`` the image and text sources it trains on, ``training`` the training loop (DDP under
torchrun), ``checkpoint`` the safetensors + JSON checkpoints (five ship with graphkit),
``predict`` loads predictions into a model and ``evaluate`` compares them with random and
orthogonal initialisation.
"""

from graphkit.ghn.checkpoint import BUNDLED, CheckpointError, bundled_for, load_checkpoint, save_checkpoint
from graphkit.ghn.config import LOGAH_VARIANTS, LoGAHConfig
from graphkit.ghn.encoding import targets
from graphkit.ghn.model import LoGAH
from graphkit.ghn.predict import PredictError, predict
from graphkit.ghn.training import TrainConfig, TrainError, train
from graphkit.training.data import DataError, load_source

__all__ = [
    "LoGAH",
    "LoGAHConfig",
    "LOGAH_VARIANTS",
    "targets",
    "predict",
    "PredictError",
    "load_checkpoint",
    "save_checkpoint",
    "CheckpointError",
    "BUNDLED",
    "bundled_for",
    "load_source",
    "DataError",
    "train",
    "TrainConfig",
    "TrainError",
]
