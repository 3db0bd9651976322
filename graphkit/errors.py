"""Errors graphkit raises for bad input: each message is one line that names the cause."""


class GraphkitError(Exception):
    """Base class: the CLI prints these as one line and exits non-zero (tracebacks with --debug)."""


class GraphError(GraphkitError):
    """A graph is malformed or fails validation."""


class TraceError(GraphkitError):
    """A model could not be turned into a graph."""


class NeedsValuesError(TraceError):
    """A model on the meta device could not be traced because the tracer needs a value it does
    not hold (a causal-mask buffer made in ``__init__``): built on a real device, it can be."""


class UnusedParameterError(TraceError):
    """A parameter was never read by the forward with the example inputs (a spare module, or a
    branch those inputs do not take): other inputs may take it."""


class ModelSourceError(GraphkitError):
    """A model source (a Hugging Face model folder, ``timm:NAME?k=v``, ``hf:MODEL_TYPE?k=v``) could
    not be loaded; raised by :func:`graphkit.sources.load_model_source`."""


class ModelFileError(ModelSourceError):
    """A user's MODEL.py could not be loaded (the model source that is a Python file)."""


class TrainError(GraphkitError):
    """Training a hypernetwork, or up-training a model, cannot start or continue (bad dataset,
    data, option, resume folder or loss); raised by ``graphkit.ghn.training``,
    ``graphkit.finetune`` and the pool and run folder they read."""


class CheckpointError(GraphkitError):
    """A checkpoint is missing, unreadable or does not fit what it is asked to do: a
    hypernetwork's (:mod:`graphkit.ghn.checkpoint`) or a training run's optimizer state
    (:mod:`graphkit.training.state`)."""
