"""Dataset strings (`--dataset scheme:rest`): their schemes, read without TensorFlow.

`missing_local_path` finds a local file or folder a string names that cannot
exist, so the recipes refuse a mistyped path before TensorFlow starts.

`tfdist.data` builds the sources; the recipes check their flags with these
before TensorFlow starts (importing `tfdist.data` would start it).

Example:

    dataset_scheme("tfrecord:/data/*.tfrecord") in TFRECORD_SCHEMES   # True
"""

import os

SCHEMES = ("embedded", "tfds", "tfrecord", "text", "shapes", "tfds_images", "imagenet_tfrecord",
           "image_folder")
IMAGE_SCHEMES = ("shapes", "tfds_images", "imagenet_tfrecord", "image_folder")
"""Schemes whose sources are `tfdist.data.images.ImageSource`s: `(image, label)` examples."""
TFRECORD_SCHEMES = ("tfrecord", "imagenet_tfrecord")
"""Schemes read from TFRecord files: they take `skip_corrupt_records`."""
FILE_SCHEMES = ("text", "tfrecord", "imagenet_tfrecord")
"""Schemes whose argument is one or more file patterns, separated by commas."""
WILDCARDS = "*?["


def dataset_scheme(spec):
    """The scheme of a dataset string, lower-cased.

    Example:

    >>> dataset_scheme("tfds:imdb_reviews"), dataset_scheme(" Shapes ")
    ('tfds', 'shapes')
    """
    return spec.strip().partition(":")[0].strip().lower()


def scheme_and_argument(spec):
    """`(scheme, argument)` of a dataset string: the scheme lower-cased, the argument (what
    follows the first `:`) stripped, `""` if none.

    Example:

    >>> scheme_and_argument("TFRecord: /data/*.tfrecord")
    ('tfrecord', '/data/*.tfrecord')
    """
    return dataset_scheme(spec), spec.strip().partition(":")[2].strip()


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


def missing_local_path(spec):
    """A local path of the dataset string `spec` that does not exist, or None.

    For `text:`, `tfrecord:` and `imagenet_tfrecord:` each comma-separated
    pattern is checked up to its first wildcard (`*`, `?`, `[`): a plain
    path must exist, and a pattern's folder must. For `image_folder:` the
    folder must exist. Remote paths (`gs://...`) and anything the file
    reader's own glob could still match pass; that reader names the rest.

    Example:

    >>> missing_local_path("text:/no/such/dir/*.txt")
    '/no/such/dir'
    >>> missing_local_path("tfds:imdb_reviews") is None
    True
    """
    scheme, rest = scheme_and_argument(spec)
    if scheme == "image_folder":
        paths = [rest] if rest else []
    elif scheme in FILE_SCHEMES:
        paths = [pattern.strip() for pattern in rest.split(",") if pattern.strip()]
    else:
        return None
    for path in paths:
        if "://" in path:
            continue
        cut = min((path.index(char) for char in WILDCARDS if char in path), default=None)
        needed = path if cut is None else os.path.dirname(path[:cut])
        if needed and not os.path.exists(needed):
            return needed
    return None
