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


PAIR_SCHEMES = ("text", "tfds")


def parse_pair_spec(spec):
    """`(scheme, argument)` of a translation `--dataset` string: `text:SRC,TGT` gives
    `("text", (SRC, TGT))`, `tfds:NAME` gives `("tfds", NAME)`.

    Raises:
        ValueError: another scheme, or a text spec without exactly two files.

    Example:

    >>> parse_pair_spec("text:train.de,train.en")
    ('text', ('train.de', 'train.en'))
    """
    scheme, _, rest = spec.strip().partition(":")
    rest = rest.strip()
    if scheme == "text":
        files = tuple(part.strip() for part in rest.split(","))
        if len(files) != 2 or not all(files):
            raise ValueError(f"Dataset {spec!r}: give two line-aligned files, "
                             "text:SOURCE_FILE,TARGET_FILE (e.g. text:train.de,train.en).")
        return scheme, files
    if scheme == "tfds" and rest:
        return scheme, rest
    raise ValueError(f"Dataset {spec!r}: the translation recipe reads embedded, "
                     "text:SOURCE_FILE,TARGET_FILE or tfds:NAME (e.g. tfds:wmt14_translate/de-en).")
