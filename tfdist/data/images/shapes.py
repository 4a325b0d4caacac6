"""Embedded image dataset: procedurally drawn shapes and patterns, no download.

Eight classes (`SHAPE_CLASSES`), each a foreground figure on a plain
background: circle, square, triangle, cross, ring (filled shapes and
outlines) and a square patch of horizontal stripes, vertical stripes or a
checkerboard (textures). Every image draws its position, size, stripe
period and phase, foreground and background colours (every channel differs
by 0.35-0.65 between them) and Gaussian pixel noise (std 0.08) at random.
Class identity survives the training augmentation (shifts and horizontal
flips).

Generation is deterministic (numpy, seeded by `(seed, split)`: the train,
validation and test splits are independent streams) and vectorised: 8192
images of 32x32x3 take well under a second. Classes are balanced (sizes
differ by at most one), so a model that learned nothing scores

    accuracy = 1 / num_classes        (0.125 with the 8 classes)
    loss     = ln(num_classes)        (2.079 nats)

A tiny ResNet (`build_resnet("resnet_tiny", 8, (32, 32, 3))`) gets far above
that within a couple of minutes on 2 CPU cores.
"""

import numpy as np
import tensorflow as tf

from tfdist.data.images.base import ImageSource, image_size_tuple

SHAPE_CLASSES = ("circle", "square", "triangle", "cross", "ring", "horizontal_stripes",
                 "vertical_stripes", "checkerboard")
SPLITS = ("train", "validation", "test")
DEFAULT_NUM_EXAMPLES = {"train": 8192, "validation": 2048, "test": 2048}
_CHUNK = 1024


def _draw(name, dx, dy, r, period, phase):
    """Boolean masks `[n, H, W]` of one class; `dx`, `dy` are offsets from each centre."""
    inside_box = (np.abs(dx) <= 0.9 * r) & (np.abs(dy) <= 0.9 * r)
    if name == "circle":
        return dx ** 2 + dy ** 2 <= r ** 2
    if name == "ring":
        d2 = dx ** 2 + dy ** 2
        return (d2 <= r ** 2) & (d2 >= (0.55 * r) ** 2)
    if name == "square":
        return (np.abs(dx) <= 0.8 * r) & (np.abs(dy) <= 0.8 * r)
    if name == "triangle":  # apex up, base at 0.8 r below the centre
        t = (dy + r) / (1.8 * r)
        return (t >= 0) & (t <= 1) & (np.abs(dx) <= r * t)
    if name == "cross":
        w = np.maximum(1.0, 0.25 * r)
        return (((np.abs(dx) <= w) & (np.abs(dy) <= r))
                | ((np.abs(dy) <= w) & (np.abs(dx) <= r)))
    if name == "horizontal_stripes":
        return inside_box & (np.floor((dy + phase) / period) % 2 == 0)
    if name == "vertical_stripes":
        return inside_box & (np.floor((dx + phase) / period) % 2 == 0)
    if name == "checkerboard":
        return inside_box & ((np.floor((dx + phase) / period)
                              + np.floor((dy + phase) / period)) % 2 == 0)
    raise ValueError(f"Unknown shape class {name!r}; valid classes: {', '.join(SHAPE_CLASSES)}.")


def _check_classes(classes):
    classes = (classes,) if isinstance(classes, str) else tuple(classes)
    unknown = [c for c in classes if c not in SHAPE_CLASSES]
    if unknown:
        raise ValueError(f"Unknown shape class(es) {', '.join(map(repr, unknown))}; valid "
                         f"classes: {', '.join(SHAPE_CLASSES)}.")
    if len(classes) < 2 or len(set(classes)) != len(classes):
        raise ValueError(f"classes must be at least 2 distinct names from "
                         f"{', '.join(SHAPE_CLASSES)}; got {classes!r}.")
    return classes


def generate_shapes(num_examples, image_size=32, *, classes=SHAPE_CLASSES, seed=0,
                    split="train", noise=0.08):
    """Draws `num_examples` labelled shape images with numpy.

    Args:
        num_examples: number of images, >= 1.
        image_size: an int or `(height, width)` (3 channels; at least 8 pixels).
        classes: class names, a subset of `SHAPE_CLASSES` (label = position).
        seed: integer seed.
        split: "train", "validation" or "test" (independent streams).
        noise: std of the Gaussian pixel noise, in [0, 1] units.

    Returns:
        `(images, labels)`: uint8 `[n, H, W, 3]` and int32 `[n]`, classes
        balanced.

    Raises:
        ValueError: a bad count, size, class or split (naming it).

    Example:

    >>> images, labels = generate_shapes(16, 32, seed=1)
    >>> images.shape, images.dtype, sorted(set(labels.tolist()))
    ((16, 32, 32, 3), dtype('uint8'), [0, 1, 2, 3, 4, 5, 6, 7])
    """
    if not isinstance(num_examples, (int, np.integer)) or isinstance(num_examples, bool) \
            or num_examples < 1:
        raise ValueError(f"num_examples must be an integer >= 1, got {num_examples!r}.")
    height, width, channels = image_size_tuple(image_size)
    if channels != 3 or min(height, width) < 8:
        raise ValueError(f"Shapes are RGB images of at least 8x8 pixels, got image_size "
                         f"{image_size!r}.")
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; valid splits: {', '.join(SPLITS)}.")
    classes = _check_classes(classes)
    n, k = int(num_examples), len(classes)
    rng = np.random.default_rng([int(seed), SPLITS.index(split), 0x5EED])
    labels = rng.permutation(np.arange(n) % k).astype(np.int32)
    side = min(height, width)
    r = rng.uniform(0.18, 0.4, n) * side
    cy = rng.uniform(r, height - r)
    cx = rng.uniform(r, width - r)
    period = rng.integers(2, max(3, side // 8) + 1, n).astype(np.float64)
    phase = rng.uniform(0, 8, n)
    foreground = rng.uniform(0, 1, (n, 3))
    background = (foreground + rng.uniform(0.35, 0.65, (n, 3))) % 1.0
    yy, xx = np.mgrid[0:height, 0:width] + 0.5

    images = np.empty((n, height, width, 3), np.uint8)
    for start in range(0, n, _CHUNK):
        block = slice(start, min(n, start + _CHUNK))
        masks = np.zeros((block.stop - start, height, width), bool)
        for label, name in enumerate(classes):
            rows = np.flatnonzero(labels[block] == label)
            index = rows + start
            at = (slice(None), None, None)
            masks[rows] = _draw(name, xx - cx[index][at], yy - cy[index][at], r[index][at],
                                period[index][at], phase[index][at])
        pixels = np.where(masks[..., None], foreground[block, None, None, :],
                          background[block, None, None, :])
        pixels += rng.normal(0.0, noise, pixels.shape)
        images[block] = np.clip(np.round(pixels * 255.0), 0, 255).astype(np.uint8)
    return images, labels


class ShapesSource(ImageSource):
    """The embedded image dataset (see the module docstring): in memory, sharded by record.

    Args:
        num_examples: images in the split; default 8192 for "train", 2048
            for "validation" and "test".
        image_size: an int or `(height, width)`; default 32.
        split: "train", "validation" or "test" (independent streams).
        seed: generation seed.
        classes: class names, a subset of `SHAPE_CLASSES` (default all 8).
        noise: std of the pixel noise, in [0, 1] units.
        **image_options: `ImageSource` options (`train_crop`, `padding`,
            `flip`, `mean`, `std`, `augment_seed`, ...). Defaults: mean and
            std 0.5 (pixels map to [-1, 1]); no cache (already in memory).

    Attributes:
        images, labels: the generated arrays (uint8 `[n, H, W, 3]`, int32 `[n]`).

    Example:

    >>> train = ShapesSource(split="train")
    >>> valid = ShapesSource(split="validation")
    >>> train.num_classes, train.image_size, train.class_names[:2]
    (8, (32, 32, 3), ('circle', 'square'))
    >>> model = build_resnet("resnet_tiny", train.num_classes, train.image_size)
    """

    records_in_memory = True  # a training pipeline gathers its batches (see `Source`)

    def __init__(self, num_examples=None, image_size=32, *, split="train", seed=0,
                 classes=SHAPE_CLASSES, noise=0.08, cache_decoded=False, **image_options):
        if split not in SPLITS:
            raise ValueError(f"Unknown split {split!r}; valid splits: {', '.join(SPLITS)}.")
        if num_examples is None:
            num_examples = DEFAULT_NUM_EXAMPLES[split]
        classes = _check_classes(classes)
        self.images, self.labels = generate_shapes(num_examples, image_size, classes=classes,
                                                   seed=seed, split=split, noise=noise)
        self.split = split
        self.seed = seed
        super().__init__(len(classes), self.images.shape[1:], class_names=classes,
                         cache_decoded=cache_decoded, **image_options)

    @property
    def num_examples(self):
        return int(self.labels.shape[0])

    def read_all(self):
        return tf.data.Dataset.from_tensor_slices((self.images, self.labels))

    def decode_example(self, record):
        return record

    def describe(self):
        return f"{super().describe()[:-1]}, split={self.split!r}, seed={self.seed})"
