"""`make_source`: a dataset string (the recipes' `--dataset` flag) to a Source."""

from tfdist.data.source import Source

SCHEMES = ("embedded", "tfds", "tfrecord", "text")
DEFAULT_EMBEDDED_TASK = "reverse"
EXAMPLES = ("embedded", "embedded:reverse", "tfds:imdb_reviews", "tfrecord:/data/*.tfrecord",
            "text:/data/*.txt")


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
      `vocabulary`, `compression_type`.
    * `"text:GLOB[,GLOB...]"`: plain text files. Options: `sequence_length`,
      `vocabulary` (`bytes`, `build`), `pack`.

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
    scheme, _, rest = spec.strip().partition(":")
    scheme = scheme.lower()
    rest = rest.strip()
    if scheme not in SCHEMES:
        raise ValueError(f"Unknown dataset scheme {scheme!r} in {spec!r}; valid schemes: "
                         f"{', '.join(SCHEMES)} (e.g. {', '.join(map(repr, EXAMPLES[1:]))}).")
    if scheme == "embedded":
        from tfdist.data.embedded import EmbeddedTaskSource
        return _construct(EmbeddedTaskSource, spec, rest or DEFAULT_EMBEDDED_TASK, options)
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


def _construct(cls, spec, argument, options):
    try:
        return cls(argument, **options)
    except TypeError as error:
        if "unexpected keyword argument" in str(error):
            raise TypeError(f"Bad option for dataset {spec!r} ({cls.__name__}): {error}. "
                            "See help(tfdist.data.make_source) for each scheme's options.") \
                from error
        raise
