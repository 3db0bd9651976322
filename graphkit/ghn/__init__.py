"""Graph hypernetworks: LoGAH (arXiv 2405.16287) reads an ArchGraph and predicts every parameter.

``model`` holds the network (encoder, low-rank decoder, the Table 1 variants), ``predict``
loads its predictions into a model. Training, evaluation and bundled checkpoints are the rest
of issue #5.
"""

from graphkit.ghn.model import VARIANTS, LoGAH, LoGAHConfig
from graphkit.ghn.predict import PredictError, predict

__all__ = ["LoGAH", "LoGAHConfig", "VARIANTS", "predict", "PredictError"]
