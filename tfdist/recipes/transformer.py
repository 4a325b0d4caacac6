"""Transformer recipe: a causal decoder language model under any strategy.

    python -m tfdist.recipes.transformer --strategy mirrored --devices 2
    python -m tfdist.launch --workers 2 -- \\
        python -m tfdist.recipes.transformer --strategy multi_worker_mirrored

With no `--dataset` it trains on an embedded generated task (reverse a random
token sequence) that needs no download: the loss falls far below its chance
level and the token accuracy rises far above it within the default run.
"""

import sys

from tfdist.recipes.config import Option
from tfdist.recipes.recipe_runner import Recipe
from tfdist.recipes.recipe_types import RecipeData

MODEL_SIZES = ("tiny", "small", "base", "large")

OPTIONS = [
    Option("model_size", str, "tiny",
           "Model size: tiny (minutes on 2 CPU cores), small (4 layers, d=256), base, large.",
           choices=MODEL_SIZES),
    Option("sequence_length", int, None,
           "Tokens per example for file/TFDS data (the embedded task fixes its own).", minimum=2,
           for_datasets=("tfds", "tfrecord", "text")),
    Option("dropout", float, None, "Dropout rate (default: the model size's).", minimum=0.0),
    Option("gelu", str, "exact", "Feed-forward GELU: exact (erf; in bfloat16 XLA-compiled on its "
           "own, the faster one there) or tanh (the approximation GPT-2 uses, within 1e-3).",
           choices=("exact", "tanh")),
    Option("num_examples", int, 4096, "Training examples of the embedded task.", minimum=1,
           for_datasets=("embedded",)),
    Option("validation_dataset", str, None,
           "Validation data in the --dataset forms, read with the training data's vocabulary and "
           "sequence length (default: the embedded task's validation split, or none)."),
]

DEFAULTS = {
    "dataset": "embedded:reverse",
    "global_batch_size": 64,
    "epochs": 3,
    "learning_rate": 3e-3,
    "warmup_steps": 30,
    "schedule": "cosine",
    "optimizer": "adamw",
}

EPILOG = """\
datasets (--dataset, --validation-dataset):
  embedded[:TASK]       generated task, no download: reverse (default), copy, sort
  tfds:NAME             a prepared TFDS text dataset, e.g. tfds:imdb_reviews
  tfrecord:GLOB         TFRecord files of token ids or text
  text:GLOB             plain text files, byte-level tokens

examples:
  python -m tfdist.recipes.transformer --strategy mirrored --devices 2
  python -m tfdist.recipes.transformer --config transformer_tiny --epochs 5
  python -m tfdist.recipes.transformer --dataset "text:train/*.txt" --validation-dataset "text:valid/*.txt"
  python -m tfdist.launch --workers 2 -- python -m tfdist.recipes.transformer --strategy multi_worker_mirrored
"""


def build_data(config):
    """Training and validation sources from `--dataset` and `--validation-dataset`.

    Example:

    >>> data = build_data(config)  # config: the recipe's parsed flags
    >>> data.info["vocab_size"], data.info["sequence_length"]
    (20, 18)
    """
    from tfdist.data import dataset_scheme, make_source, make_validation_source, skip_corrupt_option

    spec = config.dataset
    if dataset_scheme(spec) == "embedded":
        train = make_source(spec, num_examples=config.num_examples, seed=config.seed, split="train")
        validation = make_validation_source(spec, num_examples=_embedded_validation_size(config),
                                            seed=config.seed)
    else:
        skip = getattr(config, "skip_corrupt_records", False)
        train = make_source(spec, sequence_length=config.sequence_length,
                            **skip_corrupt_option(spec, skip))
        validation = None
    if config.validation_dataset:
        validation = validation_source(config.validation_dataset, train, config)
    chance = train.chance()
    chance_figures = {}
    if chance is not None:
        chance_figures = {"loss": chance.loss, "accuracy": chance.accuracy}
    return RecipeData(
        train=train, validation=validation, description=train.describe(),
        tokens_per_example=train.sequence_length, chance=chance_figures,
        info={"vocab_size": train.vocab_size, "sequence_length": train.sequence_length})


def _embedded_validation_size(config):
    return max(config.global_batch_size * 4, 512)


def validation_source(spec, train, config):
    """The `--validation-dataset` source, tokenised like the training data.

    Read with `tfdist.data.make_validation_source` (a TFDS dataset's
    `validation` split, or `test` when it has none; an embedded task's
    validation split). A text source (text, TFDS, text TFRecords) reuses the
    training source's vocabulary (a `vocabulary=build` one included) and
    sequence length; a token-id TFRecord source gets the training vocabulary
    size. Whatever it is, its vocabulary must be the model's.

    Args:
        spec: the `--validation-dataset` string (the `--dataset` forms).
        train: the training source.
        config: the recipe config (seed and batch size for embedded tasks).

    Raises:
        ValueError: its vocabulary size differs from the training data's
            (both are named).

    Example:

    >>> train = make_source("text:train/*.txt", sequence_length=64, vocabulary="build")
    >>> validation_source("text:valid/*.txt", train, config).vocab_size == train.vocab_size
    True
    """
    from tfdist.data import dataset_scheme, make_validation_source, skip_corrupt_option

    scheme = dataset_scheme(spec)
    if scheme == "embedded":
        options = {"num_examples": _embedded_validation_size(config), "seed": config.seed}
    else:
        options = {"sequence_length": train.sequence_length}
        vocabulary = getattr(train, "vocabulary", None)
        if scheme in ("text", "tfds") and vocabulary is not None:
            options["vocabulary"] = vocabulary
        elif scheme == "tfrecord" and vocabulary is None:
            options["vocab_size"] = train.vocab_size
    skip = getattr(config, "skip_corrupt_records", False)
    options.update(skip_corrupt_option(spec, skip))
    validation = make_validation_source(spec, **options)
    if validation.vocab_size != train.vocab_size:
        raise ValueError(
            f"--validation-dataset {spec!r} has a vocabulary of {validation.vocab_size} tokens, "
            f"but the training data {config.dataset!r} (and so the model) has "
            f"{train.vocab_size}; validate on data of the same kind as --dataset.")
    return validation


def build_model(config, data):
    """The decoder LM sized for the data, its masked loss and accuracy
    (`tfdist.models.builders.build_language_model`).

    Example:

    >>> with strategy.scope():
    ...     built = build_model(config, build_data(config))
    >>> built.description[:10]
    'decoder LM'
    """
    from tfdist.models.builders import build_language_model

    return build_language_model(config.model_size, data.info["vocab_size"],
                                data.info["sequence_length"], dropout=config.dropout,
                                gelu=config.gelu, embedding_shards=parameter_server_count())


def parameter_server_count():
    """Number of ps tasks of the strategy in scope (0 outside parameter_server).

    Example:

    >>> parameter_server_count()  # outside a parameter-server strategy
    0
    """
    import tensorflow as tf

    from tfdist.distribute.introspection import is_parameter_server
    from tfdist.training.ps_loop import cluster_spec

    strategy = tf.distribute.get_strategy()
    return len(cluster_spec(strategy).get("ps", ())) if is_parameter_server(strategy) else 0


def layout_map(config, device_mesh, model):
    """How `--tensor-parallel K` splits the decoder LM: `tfdist.models.decoder_lm_layout_map`
    (every block's attention by heads, its feed-forward pair by channels, the output
    projection by vocabulary when the vocabulary divides by K).

    Example:

    >>> mesh = keras.distribution.DeviceMesh((2,), ["model"], ["cpu:0", "cpu:1"])
    >>> layout_map(config, mesh, built.model)
    <...LayoutMap object at ...>
    """
    from tfdist.models import decoder_lm_layout_map

    return decoder_lm_layout_map(device_mesh, vocab_size=int(model.outputs[0].shape[-1]))


def train_examples(config):
    """Training examples known before reading any data (an embedded task), or None."""
    from tfdist.data.specs import dataset_scheme

    return config.num_examples if dataset_scheme(config.dataset) == "embedded" else None


RECIPE = Recipe(
    name="transformer",
    description="Train a Transformer decoder language model under any tf.distribute strategy.",
    options=OPTIONS, defaults=DEFAULTS, build_data=build_data, build_model=build_model,
    train_examples=train_examples, epilog=EPILOG, layout_map=layout_map)

main = RECIPE.main


if __name__ == "__main__":
    sys.exit(main())
