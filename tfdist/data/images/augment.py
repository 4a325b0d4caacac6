"""Image transforms of the image pipeline: evaluation view, training augmentation, normalisation.

Pure functions over one image (`[height, width, channels]`), built on
`tf.image`; every random transform takes an explicit stateless `seed`
(a shape-`[2]` integer tensor), so the same seed always gives the same image.

    decode -> eval_view (resize shorter side + center crop, uint8)
           -> [cache] -> normalize (per-channel mean/std, compute dtype)
           -> training only: pad_and_random_crop or random_resized_crop, random flip
"""

import tensorflow as tf

CROPS = ("pad", "resized", "none")
"""Training crops: "pad" (pad-and-crop, small images), "resized" (random
resized crop, large images), "none" (no crop)."""

SMALL_IMAGE_MAX_SIZE = 64
"""With `train_crop="auto"`, images whose height and width are both at most
this many pixels get the "pad" crop, larger ones the "resized" crop."""

DEFAULT_SCALE = (0.08, 1.0)
DEFAULT_RATIO = (3 / 4, 4 / 3)

BATCH_CROPS = ("pad", "none")
"""The crops `augment_batch` does for a whole batch at once."""
_DRAW_RANGE = 2 ** 31 - 1
_INDEX_SHUFFLE_PAD = 498247692  # what `index_shuffle` prepends to a seed of shape [2]


def compute_dtype():
    """Returns the compute dtype of the Keras global dtype policy, e.g. "float32".

    "bfloat16" under "mixed_bfloat16", "float16" under "mixed_float16".

    Example:

    >>> keras.mixed_precision.set_global_policy("mixed_bfloat16")
    >>> compute_dtype()
    'bfloat16'
    """
    import keras  # here, so that importing tfdist.data does not import Keras
    return keras.mixed_precision.dtype_policy().compute_dtype


def resolve_crop(train_crop, height, width):
    """Returns the training crop for an image size: `train_crop` itself, or for "auto"
    "pad" when both sides are at most `SMALL_IMAGE_MAX_SIZE`, else "resized".

    Args:
        train_crop: "auto" or one of `CROPS`.
        height, width: the output image size in pixels.

    Raises:
        ValueError: unknown `train_crop` (the valid ones are listed).

    Example:

    >>> resolve_crop("auto", 32, 32), resolve_crop("auto", 224, 224)
    ('pad', 'resized')
    """
    if train_crop == "auto":
        return "pad" if max(height, width) <= SMALL_IMAGE_MAX_SIZE else "resized"
    if train_crop not in CROPS:
        raise ValueError(f"Unknown train_crop {train_crop!r}; valid values: auto, "
                         f"{', '.join(CROPS)}.")
    return train_crop


def _to_uint8(image):
    return tf.cast(tf.round(tf.clip_by_value(image, 0.0, 255.0)), tf.uint8)


def eval_view(image, size, crop_fraction=1.0):
    """Resizes the shorter side and center-crops a uint8 image to `size` (the evaluation view).

    The image is scaled so that a centred window of `size / crop_fraction`
    fits it (shorter side to `size / crop_fraction`; antialiased), then the
    centre `size` is cut out. `crop_fraction=0.875` is the usual ImageNet
    evaluation (shorter side 256, centre 224); 1.0 keeps the whole shorter
    side. An image that already has the size (and `crop_fraction=1`) is
    returned unchanged.

    Args:
        image: uint8 `[h, w, c]` tensor, any `h`, `w`.
        size: `(height, width)` of the result.
        crop_fraction: in (0, 1].

    Returns:
        uint8 `[height, width, c]`.

    Example:

    >>> eval_view(tf.zeros([375, 500, 3], tf.uint8), (224, 224), 0.875).shape
    TensorShape([224, 224, 3])
    """
    height, width = int(size[0]), int(size[1])
    if not 0.0 < crop_fraction <= 1.0:
        raise ValueError(f"crop_fraction must be in (0, 1], got {crop_fraction!r}.")
    static = image.shape
    if crop_fraction == 1.0 and static[0] == height and static[1] == width:
        return image
    shape = tf.shape(image)

    def resize_and_crop():
        h = tf.cast(shape[0], tf.float32)
        w = tf.cast(shape[1], tf.float32)
        scale = tf.maximum(height / h, width / w) / crop_fraction
        new_h = tf.maximum(height, tf.cast(tf.math.ceil(h * scale), tf.int32))
        new_w = tf.maximum(width, tf.cast(tf.math.ceil(w * scale), tf.int32))
        resized = _to_uint8(tf.image.resize(image, [new_h, new_w], antialias=True))
        return tf.image.resize_with_crop_or_pad(resized, height, width)

    if crop_fraction == 1.0 and None in (static[0], static[1]):  # right size: unchanged
        same = tf.logical_and(tf.equal(shape[0], height), tf.equal(shape[1], width))
        result = tf.cond(same, lambda: image, resize_and_crop)
    else:
        result = resize_and_crop()
    return tf.ensure_shape(result, [height, width, static[-1]])


def normalize(image, mean, std, dtype="float32"):
    """Maps a uint8 image to `(image / 255 - mean) / std` per channel, in `dtype`.

    Args:
        image: uint8 `[..., channels]`.
        mean, std: per-channel sequences (in [0, 1] units) of length
            `channels` (or 1).
        dtype: result dtype, e.g. `compute_dtype()`.

    Example:

    >>> normalize(tf.constant([[[255, 0, 0]]], tf.uint8), [0.5] * 3, [0.5] * 3).numpy()
    array([[[ 1., -1., -1.]]], dtype=float32)
    """
    scaled = tf.cast(image, tf.float32) / 255.0
    # The same value for every channel is a scalar: the same arithmetic, without
    # broadcasting over the channels (2.6x faster on a batch of 32x32 images).
    mean, std = (values[0] if len(set(values)) == 1 else values
                 for values in (_floats(mean), _floats(std)))
    mean = tf.constant(mean, tf.float32)
    std = tf.constant(std, tf.float32)
    return tf.cast((scaled - mean) / std, dtype)


def _floats(values):
    """A tuple of the per-channel floats (`values` a sequence or one number)."""
    if isinstance(values, (int, float)):
        return (float(values),)
    return tuple(float(v) for v in values)


def pad_and_random_crop(image, padding, seed):
    """Pads `padding` zero pixels on each side and crops a random window of the original size.

    The CIFAR augmentation (He et al. 2015: pad 4, crop 32). On a normalised
    image the padding is the mean colour.

    Args:
        image: `[h, w, c]` with a static shape.
        padding: pixels added on each side, >= 0.
        seed: stateless seed, shape `[2]`.

    Example:

    >>> pad_and_random_crop(tf.ones([32, 32, 3]), 4, seed=[1, 2]).shape
    TensorShape([32, 32, 3])
    """
    if padding <= 0:
        return image
    size = image.shape.as_list()
    if None in size:
        raise ValueError(f"pad_and_random_crop needs a static image shape, got {size}.")
    padded = tf.pad(image, [[padding, padding], [padding, padding], [0, 0]])
    return tf.image.stateless_random_crop(padded, size, seed=seed)


def random_resized_crop(image, size, seed, scale=DEFAULT_SCALE, ratio=DEFAULT_RATIO):
    """Crops a random window (area fraction in `scale`, aspect ratio in `ratio`) and resizes it.

    The Inception / ResNet ImageNet augmentation, through
    `tf.image.stateless_sample_distorted_bounding_box` (falls back to the
    whole image when no window fits in 10 attempts).

    Args:
        image: `[h, w, c]`, any float or integer dtype.
        size: `(height, width)` of the result.
        seed: stateless seed, shape `[2]`.
        scale: `(min, max)` fraction of the image area.
        ratio: `(min, max)` width / height of the window.

    Returns:
        `[height, width, c]` in the dtype of `image` (bilinear).

    Example:

    >>> random_resized_crop(tf.zeros([64, 80, 3]), (32, 32), seed=[0, 1]).shape
    TensorShape([32, 32, 3])
    """
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seed,
        min_object_covered=0.0, aspect_ratio_range=ratio, area_range=scale, max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    window = tf.slice(image, begin, crop_size)
    resized = tf.image.resize(tf.cast(window, tf.float32), [int(size[0]), int(size[1])])
    return tf.ensure_shape(tf.cast(resized, image.dtype), [size[0], size[1], image.shape[-1]])


def augment_image(image, seed, *, crop="pad", padding=4, scale=DEFAULT_SCALE,
                  ratio=DEFAULT_RATIO, flip=True):
    """The training augmentation: a random crop then a random horizontal flip.

    Deterministic: the same image and seed give the same result.

    Args:
        image: `[h, w, c]` with a static shape (the evaluation view).
        seed: stateless seed, shape `[2]` int32/int64.
        crop: "pad" (`pad_and_random_crop`), "resized" (`random_resized_crop`
            back to the image's size) or "none".
        padding: for "pad", pixels added on each side.
        scale, ratio: for "resized", see `random_resized_crop`.
        flip: flip left-right with probability 1/2.

    Returns:
        An image of the same shape and dtype.

    Example:

    >>> image = tf.random.uniform([32, 32, 3])
    >>> a = augment_image(image, seed=[3, 4])
    >>> bool(tf.reduce_all(a == augment_image(image, seed=[3, 4])))
    True
    """
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
    if crop == "pad":
        image = pad_and_random_crop(image, padding, crop_seed)
    elif crop == "resized":
        image = random_resized_crop(image, image.shape[:2], crop_seed, scale, ratio)
    elif crop != "none":
        raise ValueError(f"Unknown crop {crop!r}; valid crops: {', '.join(CROPS)}.")
    if flip:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return image


def augment_batch(images, seeds, *, crop="pad", padding=4, flip=True):
    """The training augmentation of a batch: each image's own random crop and flip, vectorised.

    The batch form of `augment_image` for the crops in `BATCH_CROPS`: the
    same transforms (zero padding, a window of the original size, a
    left-right flip with probability 1/2), done by two gathers for the
    whole batch instead of a few ops per image (0.7 ms for 128 images of
    32x32 on a 2-core Zen 5, against 1.3 ms image by image in a parallel
    `Dataset.map`). Image i's choices are a function of `seeds[i]` alone,
    drawn with `tf.random.experimental.index_shuffle` (which takes one seed
    per row), so an image is augmented the same whichever batch, replica or
    resumed run it lands in. The draws differ from `augment_image`'s.

    Args:
        images: `[batch, height, width, channels]` with static height and width.
        seeds: int `[batch, 2]`, one stateless seed per image.
        crop: "pad" or "none".
        padding: for "pad", pixels added on each side.
        flip: flip left-right with probability 1/2.

    Returns:
        A batch of the same shape and dtype.

    Example:

    >>> batch = augment_batch(tf.ones([8, 32, 32, 3]), tf.stack([tf.range(8)] * 2, axis=1))
    >>> batch.shape
    TensorShape([8, 32, 32, 3])
    """
    if crop not in BATCH_CROPS:
        raise ValueError(f"augment_batch does the crops {', '.join(BATCH_CROPS)}, not {crop!r}; "
                         "augment each image with augment_image instead.")
    height, width = images.shape[1], images.shape[2]
    if height is None or width is None:
        raise ValueError(f"augment_batch needs a static image size, got {images.shape}.")
    seeds = tf.cast(seeds, tf.int64)
    count = tf.shape(seeds)[0]

    # `tf.random.experimental.index_shuffle` pads a seed of shape [2] to the
    # op's [3] and so cannot take one seed per row ([n, 2] becomes [n + 1, 2]);
    # its op can, padded per row as the function pads a single seed.
    row_seeds = tf.concat([tf.fill([count, 1], tf.constant(_INDEX_SHUFFLE_PAD, tf.int64)), seeds],
                          axis=1)

    def draw(which, values):
        """Per image, an int in [0, values): the place of `which` in a permutation seeded by it."""
        place = tf.raw_ops.RandomIndexShuffle(
            index=tf.fill([count], tf.constant(which, tf.int64)), seed=row_seeds,
            max_index=tf.fill([count], tf.constant(_DRAW_RANGE, tf.int64)), rounds=4)
        return place % values

    padding = padding if crop == "pad" else 0
    if padding > 0:
        images = tf.pad(images, [[0, 0], [padding, padding], [padding, padding], [0, 0]])
        top, left = draw(0, 2 * padding + 1), draw(1, 2 * padding + 1)
    else:
        top = left = tf.zeros([count], tf.int64)
    rows = top[:, None] + tf.range(height, dtype=tf.int64)[None, :]
    columns = tf.range(width, dtype=tf.int64)[None, :]
    if flip:
        columns = tf.where(draw(2, 2)[:, None] == 1, width - 1 - columns, columns)
    columns = left[:, None] + columns
    images = tf.gather(images, rows, axis=1, batch_dims=1)
    return tf.gather(images, columns, axis=2, batch_dims=1)
