"""`make_source`: a dataset string (the recipes' `--dataset` flag) to a Source."""

import re

from tfdist.data.source import Source
from tfdist.data.specs import SCHEMES, TFRECORD_SCHEMES, dataset_scheme, scheme_and_argument

DEFAULT_EMBEDDED_TASK = "reverse"
EXAMPLES = ("embedded", "embedded:reverse", "tfds:imdb_reviews", "tfrecord:/data/*.tfrecord",
            "text:/data/*.txt", "shapes", "tfds_images:cifar10", "imagenet_tfrecord:/data/train-*",
            "image_folder:/data/train")


def make_source(spec="embedded", **options):
    """Returns the source a dataset string names.

    Strings:

    * `"embedded"` / `"embedded:TASK"`: generated task (`copy`, `reverse`,
      `sort`; default `reverse`), no download. Options: `num_examples`,
      `payload_length`, `payload_vocab`, `seed`, `split`.
    * `"tfds:NAME"`: a TFDS text dataset (`tfds:imdb_reviews`, `tfds:lm1b`).
      Options: `split`, `feature`, `sequence_length`, `data_dir`,
      `download` (default False), `pack`, `vocabulary`.
    * `"tfrecord:GLOB[,GLOB...]"`: TFRecord files. Options: `sequence_length`,
      `format` (`tokens`, `text`, `raw`), `feature`, `vocab_size`, `pack`,
      `vocabulary`, `compression_type`, `skip_corrupt_records`.
    * `"text:GLOB[,GLOB...]"`: plain text files. Options: `sequence_length`,
      `vocabulary` (`bytes`, `build`), `pack`.

    Image classification sources (`IMAGE_SCHEMES`; `(image, label)` examples,
    see `tfdist.data.images`) also take the `ImageSource` options
    `train_crop`, `padding`, `crop_fraction`, `flip`, `mean`, `std`,
    `cache_decoded`, `augment_seed`:

    * `"shapes"`: the embedded drawn-shapes dataset (8 classes, 32x32x3), no
      download. Options: `num_examples`, `image_size`, `split`, `seed`,
      `classes`, `noise`.
    * `"tfds_images:NAME"`: a TFDS image dataset (`tfds_images:cifar10`,
      `tfds_images:imagenet2012`). Options: `split`, `image_size`,
      `data_dir`, `download` (default False), `image_key`, `label_key`.
    * `"imagenet_tfrecord:GLOB[,GLOB...]"`: ImageNet-style TFRecords
      (`image/encoded`, `image/class/label`). Options: `num_classes`,
      `image_size`, `label_offset` (default 1), `class_names`,
      `compression_type`, `skip_corrupt_records`.
    * `"image_folder:PATH"`: `PATH/CLASS_NAME/*.jpg|png`. Options:
      `image_size`, `extensions`.

    Options whose value is None are ignored, so a recipe can pass its flags
    through unchanged.

    Args:
        spec: a dataset string as above, or a `Source` (returned as is).
        **options: keyword arguments of the source's constructor.

    Raises:
        ValueError: unknown scheme (the valid ones are listed), or a missing
            name/pattern.
        FileNotFoundError: a file pattern matches nothing (it is named).
        TypeError: an option the source does not take.

    Example:

    >>> source = make_source("embedded:sort", num_examples=2048)
    >>> source = make_source("tfrecord:/data/train-*.tfrecord", vocab_size=8000)
    >>> source = make_source("shapes", split="validation")
    """
    options = {key: value for key, value in options.items() if value is not None}
    if isinstance(spec, Source):
        if options:
            raise ValueError(f"Got a Source object and options {sorted(options)}: options only "
                             "apply when the source is named by a string.")
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"Dataset must be a non-empty string such as {EXAMPLES[1]!r}, got "
                         f"{spec!r}.")
    scheme, rest = scheme_and_argument(spec)
    if scheme not in SCHEMES:
        raise ValueError(f"Unknown dataset scheme {scheme!r} in {spec!r}; valid schemes: "
                         f"{', '.join(SCHEMES)} (e.g. {', '.join(map(repr, EXAMPLES[1:]))}).")
    if scheme == "embedded":
        from tfdist.data.embedded import EmbeddedTaskSource
        return _construct(EmbeddedTaskSource, spec, rest or DEFAULT_EMBEDDED_TASK, options)
    if scheme == "shapes":
        from tfdist.data.images.shapes import ShapesSource
        if rest:
            raise ValueError(f"Dataset {spec!r}: 'shapes' takes no argument; pass options "
                             "instead, e.g. make_source('shapes', num_examples=4096).")
        return _construct(ShapesSource, spec, None, options, positional=False)
    if not rest and scheme in _IMAGE_ARGUMENT:
        raise ValueError(f"Dataset {spec!r} needs {_IMAGE_ARGUMENT[scheme]}.")
    if scheme == "tfds_images":
        from tfdist.data.images.tfds_images import TFDSImageSource
        return _construct(TFDSImageSource, spec, rest, options)
    if scheme == "imagenet_tfrecord":
        from tfdist.data.images.imagenet_tfrecord import ImageNetTFRecordSource
        return _construct(ImageNetTFRecordSource, spec, rest, options)
    if scheme == "image_folder":
        from tfdist.data.images.folder import ImageFolderSource
        return _construct(ImageFolderSource, spec, rest, options)
    if not rest:
        what = "a TFDS name, e.g. 'tfds:imdb_reviews'" if scheme == "tfds" else (
            f"a file pattern, e.g. '{scheme}:/data/*.{'tfrecord' if scheme == 'tfrecord' else 'txt'}'")
        raise ValueError(f"Dataset {spec!r} needs {what}.")
    if scheme == "tfds":
        from tfdist.data.tfds_source import TFDSSource
        return _construct(TFDSSource, spec, rest, options)
    if scheme == "tfrecord":
        from tfdist.data.tfrecord import TFRecordSource
        return _construct(TFRecordSource, spec, rest, options)
    from tfdist.data.text import TextSource
    return _construct(TextSource, spec, rest, options)


def skip_corrupt_option(spec, skip):
    """The `make_source` option that skips corrupt records, for the schemes that have it.

    Args:
        spec: a dataset string.
        skip: whether corrupt records should be skipped (a recipe's
            `--skip-corrupt-records`).

    Returns:
        `{"skip_corrupt_records": True}` for a TFRecord scheme
        (`TFRECORD_SCHEMES`) when `skip`, else `{}`.

    Example:

    >>> skip_corrupt_option("tfrecord:/data/*.tfrecord", True)
    {'skip_corrupt_records': True}
    >>> skip_corrupt_option("embedded", True)
    {}
    """
    if skip and isinstance(spec, str) and dataset_scheme(spec) in TFRECORD_SCHEMES:
        return {"skip_corrupt_records": True}
    return {}


def make_validation_source(spec, **options):
    """`make_source` for held-out data (what a recipe's `--validation-dataset`
    reads): unless `split` is given, the generated datasets (`embedded`,
    `shapes`) give their validation split and a TFDS dataset its held-out
    split (`EVALUATION_SPLIT`: `validation`, else `test`). File schemes name
    their files instead.

    Args:
        spec: a dataset string (see `make_source`).
        **options: as for `make_source`.

    Example:

    >>> make_validation_source("tfds_images:cifar10").split   # cifar10 has no validation split
    'test'
    """
    from tfdist.data.tfds_common import EVALUATION_SPLIT

    held_out = {"embedded": "validation", "shapes": "validation", "tfds": EVALUATION_SPLIT,
                "tfds_images": EVALUATION_SPLIT}
    scheme = dataset_scheme(spec) if isinstance(spec, str) else None
    if scheme in held_out and options.get("split") is None:
        options["split"] = held_out[scheme]
    return make_source(spec, **options)


_IMAGE_ARGUMENT = {
    "tfds_images": "a TFDS name, e.g. 'tfds_images:cifar10'",
    "imagenet_tfrecord": "a file pattern, e.g. 'imagenet_tfrecord:/data/imagenet/train-*'",
    "image_folder": "a directory, e.g. 'image_folder:/data/train' (holding CLASS_NAME/*.jpg)",
}


def _construct(cls, spec, argument, options, positional=True):
    try:
        return cls(argument, **options) if positional else cls(**options)
    except TypeError as error:
        decided = re.search(r"got multiple values for (?:keyword )?argument '(\w+)'", str(error))
        if decided:  # an option the source sets itself (the shapes' class count, say)
            raise TypeError(f"Bad option for dataset {spec!r} ({cls.__name__}): "
                            f"{decided.group(1)} is set by the source itself; drop it. See "
                            "help(tfdist.data.source_factory) for each scheme's options.") from error
        if "unexpected keyword argument" in str(error):
            raise TypeError(f"Bad option for dataset {spec!r} ({cls.__name__}): {error}. "
                            "See help(tfdist.data.source_factory) for each scheme's options.") \
                from error
        raise
