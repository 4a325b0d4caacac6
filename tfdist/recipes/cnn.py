"""CNN recipe: a ResNet image classifier under any strategy.

    python -m tfdist.recipes.cnn --strategy mirrored --devices 2
    python -m tfdist.launch --workers 2 -- \\
        python -m tfdist.recipes.cnn --strategy multi_worker_mirrored

With no `--dataset` it trains on embedded procedurally drawn shapes (8
classes, 32x32, no download) and reaches a validation accuracy far above the
1/8 chance level within the default run.
"""

import sys

from tfdist.recipes.config import Option
from tfdist.recipes.recipe_runner import Recipe
from tfdist.recipes.recipe_types import RecipeData
from tfdist.xla import FUSED_BATCH_NORM_BEATS_XLA, SYNC_BN_XLA_BLOCKER

MODELS = ("resnet_tiny", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152")

OPTIONS = [
    Option("model", str, "resnet_tiny",
           "ResNet variant: resnet_tiny (minutes on 2 CPU cores), resnet18/34/50/101/152.",
           choices=MODELS),
    Option("image_size", int, None, "Square image size fed to the model (default: the dataset's).",
           minimum=8),
    Option("num_classes", int, None,
           "Classes, for ImageNet-style TFRecords without a label map (default: 1000).", minimum=2,
           for_datasets=("imagenet_tfrecord",)),
    Option("label_smoothing", float, 0.0, "Label smoothing of the cross-entropy (0..1).",
           minimum=0.0),
    Option("sync_bn", bool, False,
           "Synchronised batch norm: statistics over the global batch instead of each replica's "
           "share (for small per-replica batches; it all-reduces inside the model, so XLA is off)."),
    Option("validation_dataset", str, None,
           "Validation data in the --dataset forms; a TFDS dataset is read from its validation "
           "(else test) split (default: the embedded validation split, or none)."),
    Option("num_examples", int, 4096, "Training examples of the embedded shapes dataset.", minimum=1,
           for_datasets=("shapes",)),
]

DEFAULTS = {
    "dataset": "shapes",
    "global_batch_size": 128,
    "epochs": 4,
    "optimizer": "momentum",
    "learning_rate": 0.1,
    "warmup_steps": 20,
    "schedule": "cosine",
    "weight_decay": 5e-4,
}

EPILOG = """\
datasets (--dataset, --validation-dataset):
  shapes                      embedded drawn shapes, 8 classes, 32x32, no download (default)
  tfds_images:NAME            a prepared TFDS image dataset, e.g. tfds_images:cifar10
  imagenet_tfrecord:GLOB      ImageNet-style TFRecords (image/encoded, image/class/label)
  image_folder:PATH           PATH/CLASS_NAME/*.jpg|png

examples:
  python -m tfdist.recipes.cnn --strategy mirrored --devices 2
  python -m tfdist.recipes.cnn --config cnn_cifar10_resnet18
  python -m tfdist.launch --workers 2 -- python -m tfdist.recipes.cnn --strategy multi_worker_mirrored
"""


def build_data(config):
    """Training and validation image sources from `--dataset` and `--validation-dataset`.

    Example:

    >>> data = build_data(config)  # config: the recipe's parsed flags
    >>> data.info["num_classes"], data.info["image_size"]  # the embedded shapes
    (8, (32, 32, 3))
    """
    from tfdist.data import dataset_scheme, make_source, make_validation_source, skip_corrupt_option

    options = {"image_size": config.image_size}
    skip = getattr(config, "skip_corrupt_records", False)
    if dataset_scheme(config.dataset) == "imagenet_tfrecord":
        options["num_classes"] = config.num_classes
    if config.dataset == "shapes":
        train = make_source("shapes", split="train", num_examples=config.num_examples,
                            seed=config.seed, **options)
        validation = make_validation_source("shapes", seed=config.seed,
                                            num_examples=max(config.global_batch_size * 4, 512),
                                            **options)
    else:
        train = make_source(config.dataset, **options, **skip_corrupt_option(config.dataset, skip))
        validation = None
    if config.validation_dataset:
        # The held-out split: a TFDS dataset's validation (else test) split.
        validation = make_validation_source(config.validation_dataset, **options,
                                            **skip_corrupt_option(config.validation_dataset, skip))
    chance = train.chance()
    return RecipeData(
        train=train, validation=validation, description=train.describe(),
        chance={"loss": chance.loss, "accuracy": chance.accuracy},
        info={"num_classes": train.num_classes, "image_size": train.image_size})


def build_model(config, data):
    """The ResNet for the data (inside the strategy scope), its loss and accuracy
    (`tfdist.models.builders.build_image_classifier`).

    Example:

    >>> with strategy.scope():
    ...     built = build_model(config, build_data(config))
    >>> built.model.name
    'resnet_tiny'
    """
    from tfdist.models.builders import build_image_classifier

    return build_image_classifier(config.model, data.info["num_classes"], data.info["image_size"],
                                  sync_bn=config.sync_bn, label_smoothing=config.label_smoothing)


def xla_blocker(config):
    """Why this configuration's model cannot be XLA-compiled, or None.

    Example:

    >>> xla_blocker(argparse.Namespace(sync_bn=True))
    'synchronised batch norm all-reduces inside the model, ...'
    """
    if config.sync_bn:
        return SYNC_BN_XLA_BLOCKER
    return None


def xla_slower_on_cpu(config):
    """Why `--xla auto` leaves this configuration's step uncompiled on CPUs, or None.

    Example:

    >>> xla_slower_on_cpu(argparse.Namespace(sync_bn=False))
    "the ResNet's fused batch-norm kernels run its step faster than XLA compiles it on CPUs"
    """
    if config.sync_bn:
        return None  # synchronised batch norm is not fused, and blocks XLA anyway
    return FUSED_BATCH_NORM_BEATS_XLA


def layout_map(config, device_mesh, model):  # pylint: disable=unused-argument
    """How `--tensor-parallel K` splits the ResNet: `tfdist.models.resnet_layout_map`
    (the last stage's convolutions by output channels).

    Example:

    >>> mesh = keras.distribution.DeviceMesh((2,), ["model"], ["cpu:0", "cpu:1"])
    >>> layout_map(config, mesh, built.model)
    <...LayoutMap object at ...>
    """
    from tfdist.models import resnet_layout_map

    return resnet_layout_map(device_mesh, config.model)


def train_examples(config):
    """Training examples known before reading any data (the embedded shapes), or None."""
    return config.num_examples if config.dataset == "shapes" else None


RECIPE = Recipe(
    name="cnn",
    description="Train a ResNet image classifier under any tf.distribute strategy.",
    options=OPTIONS, defaults=DEFAULTS, build_data=build_data, build_model=build_model,
    xla_blocker=xla_blocker, xla_slower_on_cpu=xla_slower_on_cpu, train_examples=train_examples,
    epilog=EPILOG, layout_map=layout_map)

main = RECIPE.main


if __name__ == "__main__":
    sys.exit(main())
