"""`ImageSource`: the base of image classification sources, in the shared tfdist.data pipeline.

An image source plugs into `tfdist.data.input_pipeline` like any `Source`; the
pipeline's hooks do the image work, all in parallel `tf.data` maps:

    read (file- or record-sharded) -> decode: decode_example + eval view (uint8)
    -> to_examples: [cache the decoded uint8 images] -> normalise, cast to the compute dtype
    -> (pipeline) shuffle -> augment (training only): random crop + flip -> batch

Examples are `(image, label)`: `image` `[H, W, C]` in the compute dtype of
the Keras global dtype policy when the pipeline is built (`float32`;
`bfloat16` under "mixed_bfloat16", `float16` under "mixed_float16"),
normalised per channel; `label` an int32 class id in `[0, num_classes)`.

Evaluation sees the centre view (`eval_view`); training augments that same
view: pad-and-crop for small images (CIFAR-style), random resized crop for
large ones, then a random horizontal flip. (The pipeline tells a source
only through `augment` whether it is training, so the training crop starts
from the evaluation view, not from the full decoded image.)

Caching: a source with `cache_decoded=True` caches each pipeline's decoded
uint8 images in memory after the first epoch (4x smaller than float32), so
JPEG/PNG decoding runs once. Do not also pass `cache=True` to the pipeline.

Reproducibility: `augment_image` is a pure function of its stateless seed.
A seeded training pipeline (`make_dataset_fn(..., seed=S)`, the recipes')
gives every example its seed from its pass over the data and its place in
that pass (`ImageSource.augment_with_seed`), so runs repeat exactly, every
pass still differs, and a resumed run augments as the uninterrupted one.
Without a seed, `ImageSource.augment` draws the seed per example from a
stateful random op (seeded by `augment_seed` and the global TF seed); in
tf.data's parallel maps the draws go to examples in thread order.
"""

import math
import numbers

import tensorflow as tf

from tfdist.data.embedded import Chance
from tfdist.data.images import augment as transforms
from tfdist.data.source import Source

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_MEAN = 0.5
DEFAULT_STD = 0.5
DEFAULT_CROP_FRACTION = 0.875
CACHE_LIMIT_BYTES = 1 << 30
"""With `cache_decoded="auto"`, a source caches its decoded images when they
take at most this many bytes (uint8) in total."""

_INT32_MAX = 2 ** 31 - 1


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def image_size_tuple(image_size, channels=3):
    """Normalises an image size to `(height, width, channels)`.

    Args:
        image_size: an int (square), `(height, width)` or `(height, width,
            channels)`, positive integers.
        channels: channels when `image_size` does not give them.

    Raises:
        ValueError: any other value, naming it.

    Example:

    >>> image_size_tuple(32), image_size_tuple((224, 200, 1))
    ((32, 32, 3), (224, 200, 1))
    """
    size = (image_size, image_size) if _is_int(image_size) else image_size
    if isinstance(size, (tuple, list)) and len(size) == 2:
        size = (size[0], size[1], channels)
    if (not isinstance(size, (tuple, list)) or len(size) != 3
            or not all(_is_int(d) and d >= 1 for d in size)):
        raise ValueError(f"image_size must be an int, (height, width) or (height, width, "
                         f"channels) of positive integers, got {image_size!r}.")
    return tuple(int(d) for d in size)


def _per_channel(name, value, channels):
    values = (value,) * channels if isinstance(value, numbers.Real) else tuple(value)
    if len(values) == 1:
        values *= channels
    if len(values) != channels or not all(isinstance(v, numbers.Real) for v in values):
        raise ValueError(f"{name} must be a number or {channels} numbers (one per channel), "
                         f"got {value!r}.")
    if name == "std" and min(values) <= 0:
        raise ValueError(f"std must be positive, got {value!r}.")
    return tuple(float(v) for v in values)


class ImageSource(Source):
    """Base class of image classification sources: `(image, label)` examples.

    Subclasses implement `read_all` / `read_file` (or `read`) and
    `decode_example(record) -> (uint8 image [h, w, C], integer label)`; the
    base class turns that into the evaluation view, caches, normalises, casts
    to the compute dtype and augments (see the module docstring).

    Args:
        num_classes: number of classes, >= 1.
        image_size: output size, an int, `(H, W)` or `(H, W, C)`.
        class_names: optional names, one per class.
        mean, std: per-channel normalisation in [0, 1] units (a number or
            one per channel); default 0.5 / 0.5 (maps to [-1, 1]).
        train_crop: "auto" ("pad" up to 64x64, else "resized"), "pad",
            "resized" or "none".
        padding: pixels of the "pad" crop; default `max(1, H // 8)` (4 at 32).
        crop_fraction: evaluation centre crop; default 1.0 for "pad"/"none"
            sources, 0.875 for "resized".
        flip: random horizontal flip in training.
        cache_decoded: cache the decoded uint8 images (True/False), or
            "auto": cache when `num_examples * H * W * C <= CACHE_LIMIT_BYTES`.
        augment_seed: op seed of the per-example augmentation seeds (None:
            from the global TF seed); runs repeat exactly under op
            determinism (see the module docstring).

    Attributes:
        num_classes, image_size, class_names, mean, std, train_crop, padding,
        crop_fraction, flip, cache_decoded: as resolved.

    Example (an in-memory source of 10 random images):

    >>> class Noise(ImageSource):
    ...     def __init__(self):
    ...         super().__init__(num_classes=2, image_size=(8, 8, 3))
    ...     def read_all(self):
    ...         images = np.random.randint(0, 256, (10, 8, 8, 3), np.uint8)
    ...         return tf.data.Dataset.from_tensor_slices((images, np.arange(10) % 2))
    ...     def decode_example(self, record):
    ...         return record
    >>> image, label = next(iter(make_dataset_fn(Noise(), 4, training=False)(None)))
    >>> image.shape, label.dtype
    (TensorShape([4, 8, 8, 3]), tf.int32)
    """

    def __init__(self, num_classes, image_size, *, class_names=None, mean=DEFAULT_MEAN,
                 std=DEFAULT_STD, train_crop="auto", padding=None, crop_fraction=None, flip=True,
                 cache_decoded="auto", augment_seed=None):
        if not _is_int(num_classes) or num_classes < 1:
            raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}.")
        self.num_classes = int(num_classes)
        self.image_size = image_size_tuple(image_size)
        height, width, channels = self.image_size
        if class_names is not None:
            class_names = tuple(str(name) for name in class_names)
            if len(class_names) != self.num_classes:
                raise ValueError(f"class_names has {len(class_names)} names but num_classes is "
                                 f"{self.num_classes}.")
        self.class_names = class_names
        self.mean = _per_channel("mean", mean, channels)
        self.std = _per_channel("std", std, channels)
        self.train_crop = transforms.resolve_crop(train_crop, height, width)
        if padding is None:
            padding = max(1, height // 8)
        if not _is_int(padding) or padding < 0:
            raise ValueError(f"padding must be an integer >= 0, got {padding!r}.")
        self.padding = int(padding)
        if crop_fraction is None:
            crop_fraction = DEFAULT_CROP_FRACTION if self.train_crop == "resized" else 1.0
        if not isinstance(crop_fraction, numbers.Real) or not 0.0 < crop_fraction <= 1.0:
            raise ValueError(f"crop_fraction must be in (0, 1], got {crop_fraction!r}.")
        self.crop_fraction = float(crop_fraction)
        self.flip = bool(flip)
        if cache_decoded == "auto":
            total = self.num_examples
            cache_decoded = total is not None and total * height * width * channels <= \
                CACHE_LIMIT_BYTES
        elif not isinstance(cache_decoded, bool):
            raise ValueError(f"cache_decoded must be True, False or 'auto', got "
                             f"{cache_decoded!r}.")
        self.cache_decoded = cache_decoded
        self.augment_seed = augment_seed
        if self.train_crop == "none" and not self.flip:
            self.augment = None  # nothing to do: the pipeline skips the map

    def decode_example(self, record):
        """Parses one raw record into `(uint8 image [h, w, C], integer label)`.

        Subclasses implement it; it runs in a parallel map. The image may have
        any height and width (`decode` makes the evaluation view).

        Args:
            record: one element of `read_all()` / `read_file()`.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement decode_example().")

    def decode(self, record):
        """Returns `(uint8 image [H, W, C], int32 label)`: the evaluation view of the record."""
        image, label = self.decode_example(record)
        height, width, channels = self.image_size
        image = tf.ensure_shape(image, [None, None, channels])
        image = transforms.eval_view(image, (height, width), self.crop_fraction)
        return image, tf.cast(label, tf.int32)

    @property
    def caches_examples(self):
        return self.cache_decoded

    def to_examples(self, dataset):
        """Caches the decoded images (if `cache_decoded`), then normalises them and casts
        to the compute dtype of the Keras policy in force now (pipeline-build time)."""
        return self.to_unfinished_examples(dataset).map(
            self._normalizer(), num_parallel_calls=tf.data.AUTOTUNE)

    def to_unfinished_examples(self, dataset):
        """The decoded uint8 images, cached if `cache_decoded` (`to_examples` before
        it normalises them)."""
        return dataset.cache() if self.cache_decoded else dataset

    def finish_example(self, decoded):
        """One decoded uint8 `(image, label)` normalised and cast to the compute dtype.

        Example:

        >>> image, label = source.finish_example(source.decode(record))
        """
        return self._normalizer()(*decoded)

    finish_batch = finish_example
    """A batch of decoded uint8 `(images, labels)` normalised and cast: the
    transform is per pixel, so `finish_example` does it for a batch as well."""

    @property
    def augment_batch_with_seeds(self):
        """The training augmentation of a batch, vectorised (`augment_batch`), one
        seed per example, for the crops it does ("pad", "none"); None for "resized"
        (augmented image by image, `augment_with_seed`)."""
        if self.train_crop not in transforms.BATCH_CROPS:
            return None
        return self._augment_batch

    def _augment_batch(self, batch, seeds):
        images, labels = batch
        return transforms.augment_batch(images, seeds, crop=self.train_crop,
                                        padding=self.padding, flip=self.flip), labels

    to_example = finish_example
    """One decoded `(image, label)` normalised and cast, as `to_examples` does without
    its cache (a positioned pipeline skips records before decoding them)."""

    def _normalizer(self):
        dtype = transforms.compute_dtype()
        mean, std = self.mean, self.std
        return lambda image, label: (transforms.normalize(image, mean, std, dtype), label)

    def augment(self, example):
        """The training augmentation of one `(image, label)` example, its seed drawn
        from a stateful random op (pipelines that cannot give a seed; see
        `augment_with_seed`)."""
        seed = tf.random.uniform([2], maxval=_INT32_MAX, dtype=tf.int32, seed=self.augment_seed)
        return self.augment_with_seed(example, seed)

    def augment_with_seed(self, example, seed):
        """The training augmentation of one `(image, label)` example, a pure function
        of `seed` (a stateless seed, shape [2]; see `augment_image`).

        A seeded training pipeline gives each example a seed derived from its
        pass and its place in the pass, so a resumed run augments every
        example as the uninterrupted run did, whatever the threads' order.

        Example:

        >>> image, label = source.augment_with_seed((image, label), tf.constant([3, 7]))
        """
        image, label = example
        image = transforms.augment_image(image, seed, crop=self.train_crop,
                                         padding=self.padding, flip=self.flip)
        return image, label

    def chance(self):
        """Loss and accuracy of a uniform guess: `log(num_classes)` and `1 / num_classes`.

        Exact for a source with balanced classes (the embedded shapes); a
        reference level for others.

        Example:

        >>> round(ShapesSource().chance().loss, 3)
        2.079
        """
        k = self.num_classes
        return Chance(loss=math.log(k), accuracy=1.0 / k,
                      description=f"uniform guess over {k} classes")

    def augmentation(self):
        """Describes the training augmentation in words, e.g. "pad 4 + crop, flip"."""
        parts = {"pad": f"pad {self.padding} + crop", "resized": "random resized crop",
                 "none": "no crop"}[self.train_crop]
        return parts + (", flip" if self.flip else "")

    def describe(self):
        height, width, channels = self.image_size
        examples = "" if self.num_examples is None else f"{self.num_examples} examples, "
        return (f"{type(self).__name__}({examples}{self.num_classes} classes, image "
                f"{height}x{width}x{channels}, train: {self.augmentation()}, eval: centre "
                f"{self.crop_fraction:g}, cache_decoded={self.cache_decoded})")
