"""What a recipe's builders return: its data (`RecipeData`) and its model (`RecipeModel`).

TensorFlow-free: the fields hold whatever the builders made.

Example:

    RecipeData(train=source, validation=None, description=source.describe())
"""

import dataclasses


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


def __getattr__(name):
    """`RecipeModel`: what a recipe's model builder returns, loaded on first use.

    It is `tfdist.models.builders.BuiltModel` (model, loss, metrics,
    description, flops_per_example, prepare_optimizer, xla_blocker), the one
    definition the benchmarks build the same models with; loading it imports
    Keras, which the recipes' flag parsing never needs.

    Example:

    >>> from tfdist.recipes.recipe_types import RecipeModel
    >>> RecipeModel(model=model, loss="mse", metrics=[], description="a test model").xla_blocker is None
    True
    """
    if name == "RecipeModel":
        from tfdist.models.builders import BuiltModel  # pylint: disable=import-outside-toplevel

        return BuiltModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
