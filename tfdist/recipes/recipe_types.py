"""What a recipe's builders return: its data (`RecipeData`) and its model (`RecipeModel`).

TensorFlow-free: the fields hold whatever the builders made.

Example:

    RecipeData(train=source, validation=None, description=source.describe())
"""

import dataclasses
from typing import Callable


@dataclasses.dataclass(frozen=True)
class RecipeData:
    """What a recipe's data builder returns.

    Attributes:
        train: the training `Source` (see `tfdist.data`).
        validation: the validation `Source`, or None.
        description: one line for the start-up block.
        tokens_per_example: tokens in one example, for tokens/s (None for
            data without a token axis).
        chance: a dict of metric name to its chance-level value, printed
            beside the final figures so a reader sees what was learned.
        info: anything the model builder needs (vocabulary size, classes...).

    Example:

    >>> RecipeData(train=source, validation=None, description=source.describe()).chance
    {}
    """

    train: object
    validation: object
    description: str
    tokens_per_example: int = None
    chance: dict = dataclasses.field(default_factory=dict)
    info: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RecipeModel:
    """What a recipe's model builder returns (called inside the strategy scope).

    The built-in recipes return `tfdist.models.builders.BuiltModel`, which
    has these fields (the benchmarks build the same models from there).

    Attributes:
        model: a `keras.Model`.
        loss: a Keras loss.
        metrics: a list of Keras metrics.
        description: one line for the start-up block.
        flops_per_example: model training FLOPs per example, for MFU.
        prepare_optimizer: called with the optimizer once it is built (still
            in the strategy scope), e.g. to exclude variables from weight
            decay; None for nothing.
        xla_blocker: why the replica step of this model cannot be compiled
            with XLA (e.g. a cross-replica collective inside the model), or
            None when it can.

    Example:

    >>> RecipeModel(model=model, loss="mse", metrics=[], description="a test model").xla_blocker is None
    True
    """

    model: object
    loss: object
    metrics: list
    description: str
    flops_per_example: float = None
    prepare_optimizer: Callable = None
    xla_blocker: str = None
