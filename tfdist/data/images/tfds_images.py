"""TensorFlow Datasets (TFDS) image classification datasets by name (cifar10, imagenet2012, ...).

Nothing is downloaded unless asked: with `download=False` (the default) a
dataset that is not prepared in `data_dir` is a
`tfdist.data.DatasetNotPreparedError` that says how to prepare it.

Sharding is TFDS's own, as in `tfdist.data.TFDSSource`: by file through
`tfds.ReadConfig(input_context=...)` when the split has at least as many
shard files as input pipelines, else by record through `tfds.even_splits`.
Images are read encoded and decoded in the pipeline's parallel `decode`.
"""


import tensorflow as tf

from tfdist.data.images.base import IMAGENET_MEAN, IMAGENET_STD, ImageSource, image_size_tuple
from tfdist.data.tfds_common import TFDSSplit, import_tfds, prepared_builder, resolve_split

NORMALIZATION = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "imagenet2012": (IMAGENET_MEAN, IMAGENET_STD),
}
"""Per-channel mean/std (in [0, 1] units) of known datasets' training splits;
other datasets default to 0.5 / 0.5."""

DEFAULT_LARGE_SIZE = 224


def _feature_keys(name, features, image_key, label_key, supervised_keys):
    tfds = import_tfds()
    images = [k for k, f in features.items() if isinstance(f, tfds.features.Image)]
    labels = [k for k, f in features.items() if isinstance(f, tfds.features.ClassLabel)]
    if supervised_keys and len(supervised_keys) == 2 and all(
            isinstance(k, str) for k in supervised_keys):
        image_key = image_key or supervised_keys[0]
        label_key = label_key or supervised_keys[1]
    image_key = image_key or (images[0] if images else None)
    label_key = label_key or (labels[0] if labels else None)
    if image_key not in images:
        raise ValueError(f"TFDS dataset {name!r}: {image_key!r} is not an Image feature; image "
                         f"features: {', '.join(images) or 'none'} (all features: "
                         f"{', '.join(features.keys())}).")
    if label_key not in labels:
        raise ValueError(f"TFDS dataset {name!r}: {label_key!r} is not a ClassLabel feature; "
                         f"class-label features: {', '.join(labels) or 'none'} (all features: "
                         f"{', '.join(features.keys())}).")
    return image_key, label_key


class TFDSImageSource(TFDSSplit, ImageSource):
    """An image classification dataset from TFDS (`Image` + `ClassLabel` features).

    Args:
        name: TFDS name (`"cifar10"`, `"mnist"`, `"imagenet2012"`, ...).
        split: split or sub-split (`"train"`, `"test"`, `"train[:10%]"`), or
            "evaluation" (`validation` if the dataset has it, else `test`); checked.
        image_size: output size; default the dataset's own size when fixed
            (32x32x3 for cifar10), else 224x224 with the dataset's channels.
        data_dir: TFDS data directory (default TFDS's).
        download: download and prepare the dataset when it is missing.
        image_key, label_key: the features to use (default the dataset's
            supervised keys, else its first Image / ClassLabel feature).
        mean, std: per-channel normalisation (default: `NORMALIZATION` for
            known datasets, else 0.5 / 0.5).
        **image_options: other `ImageSource` options (`train_crop`,
            `padding`, `crop_fraction`, `flip`, `cache_decoded`,
            `augment_seed`).

    Raises:
        DatasetNotPreparedError: not prepared and `download=False`.
        ValueError: unknown dataset, or no such image/label feature (the
            available ones are listed).

    Example:

    >>> train = TFDSImageSource("cifar10", split="train")
    >>> train.num_classes, train.image_size, train.class_names[0]
    (10, (32, 32, 3), 'airplane')
    """

    def __init__(self, name, split="train", *, image_size=None, data_dir=None, download=False,
                 image_key=None, label_key=None, mean=None, std=None, **image_options):
        builder = prepared_builder(name, data_dir=data_dir, download=download)
        info = builder.info
        self.image_key, self.label_key = _feature_keys(
            name, info.features, image_key, label_key, info.supervised_keys)
        self.name = name
        self.split = resolve_split(builder, split, name)
        self.builder = builder
        native = tuple(info.features[self.image_key].shape)
        channels = native[-1] or 3
        if image_size is None:
            image_size = native if None not in native else DEFAULT_LARGE_SIZE
        image_size = image_size_tuple(image_size, channels)
        self.native_shape = native
        label = info.features[self.label_key]
        base = name.split("/")[0].split(":")[0]
        default_mean, default_std = NORMALIZATION.get(base, (0.5, 0.5))
        super().__init__(label.num_classes, image_size, class_names=label.names,
                         mean=default_mean if mean is None else mean,
                         std=default_std if std is None else std, **image_options)

    def read(self, plan, *, shuffle_files=False, seed=None):
        tfds = import_tfds()
        decoders = {self.image_key: tfds.decode.SkipDecoding()}
        image_key, label_key = self.image_key, self.label_key
        return self.read_split(plan, shuffle_files, seed, decoders).map(
            lambda example: (example[image_key], example[label_key]))

    def decode_example(self, record):
        encoded, label = record
        image = tf.io.decode_image(encoded, channels=self.native_shape[-1] or self.image_size[2],
                                   expand_animations=False)
        if None not in self.native_shape:
            image = tf.ensure_shape(image, self.native_shape)
        if image.shape[-1] != self.image_size[2]:
            image = tf.image.grayscale_to_rgb(image) if self.image_size[2] == 3 else \
                tf.image.rgb_to_grayscale(image)
        return image, label

    def describe(self):
        return (f"{super().describe()[:-1]}, tfds={self.name!r}, split={self.split!r}, "
                f"image_key={self.image_key!r}, label_key={self.label_key!r})")
