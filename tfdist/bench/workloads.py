"""What the benchmark trains: the recipes' models on synthetic or embedded data.

A `Workload` names a recipe (`transformer` or `cnn`), the recipe's flags
that size the model, and the data. Its data and model are built by the
recipe's own `build_data` / `build_model`, from the recipe's own option list
(so the defaults are the recipe's), except for synthetic token data, which
the recipe has no flag for: random tokens in an in-memory source.

Example:

    workload = Workload("transformer", size="small", sequence_length=128, vocab_size=8000)
    data = workload.build_data(global_batch_size=32)
    with strategy.scope():
        built = workload.build_model(data)        # a tfdist.recipes.recipe_runner.RecipeModel
"""

import dataclasses
import importlib

MODELS = ("transformer", "cnn")
DATA_KINDS = {"transformer": ("synthetic", "embedded"), "cnn": ("embedded",)}
"""Data each model can be measured on: `synthetic` random tokens (no input
work beyond the pipeline), or the recipe's `embedded` dataset (the
Transformer's reverse task, the CNN's drawn shapes)."""

DEFAULT_SIZES = {"transformer": "small", "cnn": "resnet_tiny"}
SYNTHETIC_EXAMPLES = 2048


@dataclasses.dataclass(frozen=True)
class Workload:
    """A recipe's model and data, sized for a benchmark.

    Args:
        model: "transformer" or "cnn".
        size: the Transformer's `--model-size` (tiny, small, base, large) or
            the CNN's `--model` (resnet_tiny, resnet18, ...); None for the
            benchmark default (`DEFAULT_SIZES`).
        data: "synthetic" (Transformer only: random tokens) or "embedded"
            (the recipe's embedded dataset).
        sequence_length: tokens per synthetic example.
        vocab_size: token ids of the synthetic data (and the model's vocabulary).
        image_size: the CNN's image side in pixels (None: the dataset's, 32).
        seed: seed of the synthetic tokens and the embedded data.
        recipe_flags: more recipe flags for the model and optimizer, e.g.
            `("--dropout", "0")`.

    Raises:
        ValueError: an unknown model, data kind or size (allowed values named).

    Example:

    >>> Workload("cnn").label
    'cnn resnet_tiny (embedded shapes)'
    """

    model: str
    size: str = None
    data: str = None
    sequence_length: int = 128
    vocab_size: int = 8000
    image_size: int = None
    seed: int = 0
    recipe_flags: tuple = ()

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"Unknown benchmark model {self.model!r}; choose one of "
                             f"{', '.join(MODELS)}.")
        if self.size is None:
            object.__setattr__(self, "size", DEFAULT_SIZES[self.model])
        if self.data is None:
            object.__setattr__(self, "data", DATA_KINDS[self.model][0])
        if self.data not in DATA_KINDS[self.model]:
            raise ValueError(f"Data {self.data!r} is not available for the {self.model} "
                             f"benchmark; choose one of {', '.join(DATA_KINDS[self.model])}.")
        allowed = self._size_choices()
        if self.size not in allowed:
            raise ValueError(f"Unknown {self.model} size {self.size!r}; choose one of "
                             f"{', '.join(allowed)}.")
        for name in ("sequence_length", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"{name} must be an integer >= 2, got {value!r}.")
        object.__setattr__(self, "recipe_flags", tuple(str(f) for f in self.recipe_flags))

    def _size_choices(self):
        module = self.recipe_module()
        if self.model == "transformer":
            return module.MODEL_SIZES
        return module.MODELS

    def recipe_module(self):
        """The recipe module (`tfdist.recipes.transformer` or `.cnn`).

        Example:

        >>> Workload("cnn").recipe_module().__name__
        'tfdist.recipes.cnn'
        """
        return importlib.import_module(f"tfdist.recipes.{self.model}")

    @property
    def label(self):
        """A short human label, e.g. 'transformer small (synthetic tokens)'."""
        what = {"synthetic": "synthetic tokens",
                "embedded": "embedded reverse task" if self.model == "transformer"
                else "embedded shapes"}[self.data]
        return f"{self.model} {self.size} ({what})"

    @property
    def size_flag(self):
        """The recipe flag that selects the size."""
        return "--model-size" if self.model == "transformer" else "--model"

    def recipe_config(self, global_batch_size, extra_flags=()):
        """The recipe's config namespace for this workload (recipe defaults + size).

        Args:
            global_batch_size: examples per step over all replicas.
            extra_flags: more recipe flags, e.g. `["--dropout", "0"]`.

        Example:

        >>> Workload("transformer", size="tiny").recipe_config(32).model_size
        'tiny'
        """
        from tfdist.recipes.config import parse_config

        recipe = self.recipe_module().RECIPE
        flags = [self.size_flag, self.size, "--global-batch-size", str(global_batch_size),
                 "--seed", str(self.seed)]
        if self.model == "cnn" and self.image_size:
            flags += ["--image-size", str(self.image_size)]
        return parse_config(flags + list(self.recipe_flags) + list(extra_flags),
                            recipe.all_options(),
                            prog=f"tfdist bench ({self.model})")

    def build_data(self, global_batch_size):
        """The training data: a `tfdist.recipes.recipe_runner.RecipeData`.

        Args:
            global_batch_size: examples per step (the recipe's config needs it).

        Image examples are cast to the compute dtype of the Keras policy in
        force when the pipeline is built: set the precision first.

        Example:

        >>> Workload("transformer", size="tiny").build_data(32).tokens_per_example
        128
        """
        config = self.recipe_config(global_batch_size)
        if self.data == "synthetic":
            return _synthetic_tokens(self.sequence_length, self.vocab_size, self.seed)
        return self.recipe_module().build_data(config)

    def build_model(self, data, global_batch_size):
        """The recipe's model, loss and metrics (call inside the strategy scope).

        Args:
            data: the `RecipeData` of `build_data`.
            global_batch_size: examples per step.

        Returns:
            A `tfdist.recipes.recipe_runner.RecipeModel` (with `flops_per_example`).

        Example:

        >>> with strategy.scope():
        ...     built = workload.build_model(workload.build_data(32), 32)
        """
        return self.recipe_module().build_model(self.recipe_config(global_batch_size), data)

    def build_optimizer(self, global_batch_size, total_steps=1000):
        """The recipe's optimizer and schedule (call inside the strategy scope).

        Args:
            global_batch_size: examples per step.
            total_steps: length of the learning-rate schedule (its warmup is
                capped at half of it).

        Example:

        >>> with strategy.scope():
        ...     optimizer = Workload("transformer").build_optimizer(32)  # AdamW, cosine
        """
        from tfdist.schedules.optimizers import build_optimizer

        config = self.recipe_config(global_batch_size)
        warmup = min(config.warmup_steps, total_steps // 2)
        return build_optimizer(config.optimizer, config.learning_rate, schedule=config.schedule,
                               warmup_steps=warmup, total_steps=total_steps,
                               weight_decay=config.weight_decay)


def _synthetic_tokens(sequence_length, vocab_size, seed):
    import numpy as np

    from tfdist.data import NUM_RESERVED, ArraySource
    from tfdist.recipes.recipe_types import RecipeData

    rng = np.random.default_rng(seed)
    tokens = rng.integers(NUM_RESERVED, vocab_size,
                          size=(SYNTHETIC_EXAMPLES, sequence_length + 1), dtype=np.int32)
    source = ArraySource.from_token_rows(tokens, vocab_size=vocab_size)
    return RecipeData(
        train=source, validation=None,
        description=f"synthetic tokens: {SYNTHETIC_EXAMPLES} x {sequence_length}, vocab {vocab_size}",
        tokens_per_example=sequence_length,
        info={"vocab_size": vocab_size, "sequence_length": sequence_length})
