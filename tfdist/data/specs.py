"""Dataset strings (`--dataset scheme:rest`): their schemes, read without TensorFlow.

`tfdist.data` builds the sources; the recipes check their flags with these
before TensorFlow starts (importing `tfdist.data` would start it).

Example:

    dataset_scheme("tfrecord:/data/*.tfrecord") in TFRECORD_SCHEMES   # True
"""

SCHEMES = ("embedded", "tfds", "tfrecord", "text", "shapes", "tfds_images", "imagenet_tfrecord",
           "image_folder")
IMAGE_SCHEMES = ("shapes", "tfds_images", "imagenet_tfrecord", "image_folder")
"""Schemes whose sources are `tfdist.data.images.ImageSource`s: `(image, label)` examples."""
TFRECORD_SCHEMES = ("tfrecord", "imagenet_tfrecord")
"""Schemes read from TFRecord files: they take `skip_corrupt_records`."""


def dataset_scheme(spec):
    """The scheme of a dataset string, lower-cased.

    Example:

    >>> dataset_scheme("tfds:imdb_reviews"), dataset_scheme(" Shapes ")
    ('tfds', 'shapes')
    """
    return spec.strip().partition(":")[0].strip().lower()
