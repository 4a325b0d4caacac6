"""What the benchmark trains: the recipes' models on synthetic or embedded data.

A `Workload` names a model (`transformer` or `cnn`), its size, the data and
the flags that shape the model and its optimizer. Its model is built by
`tfdist.models.builders` (the builders the recipes call), its data by
`tfdist.data` (the recipes' embedded datasets, or random tokens in an
in-memory source) and its optimizer by `tfdist.schedules`, with the recipes'
defaults (`OPTIMIZER_DEFAULTS`, `EMBEDDED_DATA`).

Example:

    workload = Workload("transformer", size="small", sequence_length=128, vocab_size=8000)
    data = workload.build_data(global_batch_size=32)
    with strategy.scope():
        built = workload.build_model(data, 32)    # a tfdist.models.builders.BuiltModel
"""

import argparse
import dataclasses

from tfdist.schedules.choices import OPTIMIZER_NAMES, SCHEDULE_NAMES
from tfdist.runtime.argtypes import check_int_at_least

MODELS = ("transformer", "cnn")
DATA_KINDS = {"transformer": ("synthetic", "embedded"), "cnn": ("embedded",)}
"""Data each model can be measured on: `synthetic` random tokens (no input
work beyond the pipeline), or the recipe's `embedded` dataset (the
Transformer's reverse task, the CNN's drawn shapes)."""

DEFAULT_SIZES = {"transformer": "small", "cnn": "resnet_tiny"}
SYNTHETIC_EXAMPLES = 2048
EMBEDDED_DATA = {"transformer": "embedded:reverse", "cnn": "shapes"}
"""The recipes' default `--dataset` (embedded, no download)."""
EMBEDDED_EXAMPLES = 4096
"""The recipes' default `--num-examples` of their embedded data."""
OPTIMIZER_DEFAULTS = {
    "transformer": {"optimizer": "adamw", "learning_rate": 3e-3, "schedule": "cosine",
                    "warmup_steps": 30, "weight_decay": 0.0},
    "cnn": {"optimizer": "momentum", "learning_rate": 0.1, "schedule": "cosine",
            "warmup_steps": 20, "weight_decay": 5e-4},
}
"""The recipes' optimizer defaults (tests/bench keeps them equal to the recipes')."""

DEFAULT_BATCHES = {"tiny": 64, "small": 32, "base": 16, "large": 16, "resnet_tiny": 128}
"""The global batch each model size is benchmarked at by default: the recipes' defaults
(the Transformer recipe's 64 for `tiny`, transformer_small.yaml's 32, the CNN recipe's
and cnn_tiny.yaml's 128), except `base` and `large`, CPU-sized (transformer_base.yaml's
256 takes over a minute a step on 2 CPU cores)."""


def default_batch(model, size):
    """The global batch `tfdist bench autotune` and `engine` use for a model (`DEFAULT_BATCHES`):
    the recipes' default, CPU-sized for `base` and `large`; for a size it does not
    list, 32 for the Transformer and 64 for the CNN.

    Example:

    >>> default_batch("cnn", "resnet_tiny"), default_batch("transformer", "base")
    (128, 16)
    """
    return DEFAULT_BATCHES.get(size) or {"transformer": 32, "cnn": 64}[model]


QUICK_DATA = {"transformer": dict(sequence_length=32, vocab_size=256), "cnn": dict(image_size=16)}
"""The tiny data of the benches' `--quick`: the Transformer's synthetic tokens, the
CNN's image side."""


def data_options(model, quick, sequence_length=None, vocab_size=None):
    """`Workload` keyword arguments of a model's data: the token shape given (the
    Transformer's), else `QUICK_DATA` under `--quick`, else `Workload`'s defaults.

    Example:

    >>> data_options("transformer", True, vocab_size=300)
    {'sequence_length': 32, 'vocab_size': 300}
    >>> data_options("cnn", False)
    {}
    """
    options = dict(QUICK_DATA[model]) if quick else {}
    if model == "transformer":
        options.update((name, value) for name, value in (("sequence_length", sequence_length),
                                                         ("vocab_size", vocab_size)) if value)
    return options


@dataclasses.dataclass(frozen=True)
class WorkloadData:
    """A workload's training data.

    Attributes:
        train: the training `Source` (see `tfdist.data`).
        description: one line naming the data.
        tokens_per_example: tokens in one example (None for images).
        info: what the model builder needs (vocab_size and sequence_length,
            or num_classes and image_size).

    Example:

    >>> Workload("transformer", size="tiny").build_data(32).tokens_per_example
    128
    """

    train: object
    description: str
    tokens_per_example: int = None
    info: dict = dataclasses.field(default_factory=dict)


def parse_model_flags(model, flags):
    """The model and optimizer settings of a workload: the recipes' defaults
    and the recipe flags given (`--recipe-flags`) that shape the model or its
    optimizer.

    Args:
        model: "transformer" or "cnn".
        flags: recipe flags, e.g. `["--dropout", "0"]`.

    Raises:
        ValueError: a flag the benchmark does not use, or a bad value (named).

    Example:

    >>> parse_model_flags("transformer", ["--dropout", "0"]).dropout
    0.0
    """
    parser = argparse.ArgumentParser(prog=f"tfdist bench ({model}) --recipe-flags",
                                     add_help=False, exit_on_error=False)
    taken = [parser.add_argument("--optimizer", choices=OPTIMIZER_NAMES),
             parser.add_argument("--learning-rate", type=float),
             parser.add_argument("--schedule", choices=SCHEDULE_NAMES),
             parser.add_argument("--warmup-steps", type=int),
             parser.add_argument("--weight-decay", type=float)]
    if model == "transformer":
        taken += [parser.add_argument("--dropout", type=float, default=None),
                  parser.add_argument("--gelu", choices=("exact", "tanh"), default="exact")]
    else:
        taken += [parser.add_argument("--label-smoothing", type=float, default=0.0),
                  parser.add_argument("--sync-bn", nargs="?", const="true", default="false",
                                      choices=("true", "false", "1", "0", "yes", "no", "on",
                                               "off"))]
    parser.set_defaults(**OPTIMIZER_DEFAULTS[model])
    try:
        settings, unknown = parser.parse_known_args(list(flags))
    except argparse.ArgumentError as error:
        raise ValueError(f"--recipe-flags: {error}.") from None
    if unknown:
        raise ValueError(
            f"--recipe-flags: {' '.join(unknown)} does not shape the {model} benchmark's model or "
            f"optimizer; it takes {', '.join(action.option_strings[0] for action in taken)}.")
    if model == "cnn":
        settings.sync_bn = settings.sync_bn in ("true", "1", "yes", "on")
    return settings


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
        allowed = self.size_choices()
        if self.size not in allowed:
            raise ValueError(f"Unknown {self.model} size {self.size!r}; choose one of "
                             f"{', '.join(allowed)}.")
        for name in ("sequence_length", "vocab_size"):
            value = getattr(self, name)
            check_int_at_least(name, value, 2)
        object.__setattr__(self, "recipe_flags", tuple(str(f) for f in self.recipe_flags))

    def size_choices(self):
        """The sizes this model comes in (the recipe's `--model-size` / `--model` choices).

        Example:

        >>> Workload("cnn").size_choices()[:2]
        ('resnet_tiny', 'resnet18')
        """
        from tfdist.models import RESNET_NAMES, TRANSFORMER_SIZES

        return tuple(TRANSFORMER_SIZES) if self.model == "transformer" else RESNET_NAMES

    @property
    def label(self):
        """A short human label, e.g. 'transformer small (synthetic tokens)'."""
        what = {"synthetic": "synthetic tokens",
                "embedded": "embedded reverse task" if self.model == "transformer"
                else "embedded shapes"}[self.data]
        return f"{self.model} {self.size} ({what})"

    def settings(self):
        """The model and optimizer settings: the recipes' defaults and `recipe_flags`.

        Example:

        >>> Workload("transformer", size="tiny").settings().optimizer
        'adamw'
        """
        return parse_model_flags(self.model, self.recipe_flags)

    def xla_blocker(self):
        """Why this workload's model cannot be XLA-compiled, or None.

        Example:

        >>> Workload("cnn", recipe_flags=("--sync-bn",)).xla_blocker()[:23]
        'synchronised batch norm'
        """
        if self.model == "cnn" and self.settings().sync_bn:
            from tfdist.models.builders import SYNC_BN_XLA_BLOCKER

            return SYNC_BN_XLA_BLOCKER
        return None

    def build_data(self, global_batch_size):
        """The training data: a `WorkloadData`.

        Args:
            global_batch_size: examples per step (kept for the callers; the
                training data does not depend on it).

        Image examples are cast to the compute dtype of the Keras policy in
        force when the pipeline is built: set the precision first.

        Example:

        >>> Workload("transformer", size="tiny").build_data(32).tokens_per_example
        128
        """
        del global_batch_size
        if self.data == "synthetic":
            return _synthetic_tokens(self.sequence_length, self.vocab_size, self.seed)
        from tfdist.data import make_source

        options = {"image_size": self.image_size} if self.model == "cnn" else {}
        train = make_source(EMBEDDED_DATA[self.model], split="train",
                            num_examples=EMBEDDED_EXAMPLES, seed=self.seed, **options)
        if self.model == "transformer":
            info = {"vocab_size": train.vocab_size, "sequence_length": train.sequence_length}
            return WorkloadData(train=train, description=train.describe(),
                                tokens_per_example=train.sequence_length, info=info)
        info = {"num_classes": train.num_classes, "image_size": train.image_size}
        return WorkloadData(train=train, description=train.describe(), info=info)

    def build_model(self, data, global_batch_size):
        """The model, loss and metrics the recipe builds (call inside the strategy scope).

        Args:
            data: the `WorkloadData` of `build_data`.
            global_batch_size: examples per step (kept for the callers).

        Returns:
            A `tfdist.models.builders.BuiltModel` (with `flops_per_example`).

        Example:

        >>> with strategy.scope():
        ...     built = workload.build_model(workload.build_data(32), 32)
        """
        del global_batch_size
        from tfdist.models.builders import build_image_classifier, build_language_model

        settings = self.settings()
        if self.model == "transformer":
            return build_language_model(self.size, data.info["vocab_size"],
                                        data.info["sequence_length"], dropout=settings.dropout,
                                        gelu=settings.gelu)
        return build_image_classifier(self.size, data.info["num_classes"],
                                      data.info["image_size"], sync_bn=settings.sync_bn,
                                      label_smoothing=settings.label_smoothing)

    def keras_standard_loss(self):
        """The loss and accuracy a Keras user writes for this task: `(loss, metrics)`.

        The Transformer's is `SparseCategoricalCrossentropy(from_logits=True,
        ignore_class=PAD_ID)` with `SparseCategoricalAccuracy`; the CNN's the
        same loss without `ignore_class`. Speed goals are set against Keras
        `fit` with these (the recipes' own losses are faster).

        Raises:
            ValueError: label smoothing in `recipe_flags` (Keras's sparse
                cross-entropy has none; the recipe's own loss has it).

        Example:

        >>> loss, metrics = Workload("transformer").keras_standard_loss()
        >>> loss.ignore_class, metrics[0].name
        (0, 'accuracy')
        """
        import keras

        from tfdist.data.tokens import PAD_ID

        if self.model == "cnn" and self.settings().label_smoothing:
            raise ValueError("Keras's SparseCategoricalCrossentropy has no label smoothing; "
                             "drop --label-smoothing from the recipe flags to compare with "
                             "Keras's standard loss.")
        ignore = {"ignore_class": PAD_ID} if self.model == "transformer" else {}
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, **ignore)
        return loss, [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    def build_optimizer(self, global_batch_size, total_steps=1000, keras_standard=False):
        """The recipe's optimizer and schedule (call inside the strategy scope).

        Args:
            global_batch_size: examples per step (kept for the callers).
            total_steps: length of the learning-rate schedule (its warmup is
                capped at half of it).
            keras_standard: Keras's own optimizer class (`keras.optimizers.AdamW`)
                instead of the recipe's fused one, as a Keras user writes it.

        Example:

        >>> with strategy.scope():
        ...     optimizer = Workload("transformer").build_optimizer(32)  # AdamW, cosine
        """
        del global_batch_size
        from tfdist.schedules.optimizers import build_optimizer

        settings = self.settings()
        warmup = min(settings.warmup_steps, total_steps // 2)
        return build_optimizer(settings.optimizer, settings.learning_rate,
                               schedule=settings.schedule, warmup_steps=warmup,
                               total_steps=total_steps, weight_decay=settings.weight_decay,
                               fused=not keras_standard)


def _synthetic_tokens(sequence_length, vocab_size, seed):
    import numpy as np

    from tfdist.data import NUM_RESERVED, ArraySource

    rng = np.random.default_rng(seed)
    tokens = rng.integers(NUM_RESERVED, vocab_size,
                          size=(SYNTHETIC_EXAMPLES, sequence_length + 1), dtype=np.int32)
    source = ArraySource.from_token_rows(tokens, vocab_size=vocab_size)
    return WorkloadData(
        train=source,
        description=f"synthetic tokens: {SYNTHETIC_EXAMPLES} x {sequence_length}, vocab {vocab_size}",
        tokens_per_example=sequence_length,
        info={"vocab_size": vocab_size, "sequence_length": sequence_length})
