"""What every TFDS-backed source shares: the prepared builder, the clear
not-prepared error, and reading a split sharded per input pipeline.

Sharding uses TFDS's own tools: by file through
`tfds.ReadConfig(input_context=...)` when the split has at least as many
shards as input pipelines, otherwise by record through `tfds.even_splits`
(each pipeline reads only its slice of examples).
"""

import os

import tensorflow as tf

from tfdist.data import sharding


class DatasetNotPreparedError(FileNotFoundError):
    """A TFDS dataset is not on disk and downloading was not allowed.

    Example:

        try:
            builder = prepared_builder("cifar10", data_dir="/data/tfds")
        except DatasetNotPreparedError as error:
            print(error)  # says how to prepare it or allow the download
    """


def import_tfds():
    """Imports tensorflow_datasets, or says how to install it.

    Example:

    >>> tfds = import_tfds()
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError as error:  # pragma: no cover - depends on the install
        raise ImportError("TFDS sources need tensorflow-datasets: pip install "
                          "'tfdist[datasets]' (or pip install tensorflow-datasets).") from error
    return tfds


def prepared_builder(name, data_dir=None, download=False):
    """Returns the TFDS builder of `name`, prepared (downloading only when allowed).

    Args:
        name: TFDS name, optionally with config/version.
        data_dir: TFDS data directory (default TFDS's).
        download: download and prepare the dataset when it is missing.

    Raises:
        ValueError: unknown dataset.
        DatasetNotPreparedError: not prepared and `download=False`; the
            message gives the `tfds build` command (and the manual-download
            note for datasets such as imagenet2012).

    Example:

    >>> builder = prepared_builder("cifar10", data_dir="/data/tfds")
    """
    tfds = import_tfds()
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as error:
        first_line = str(error).splitlines()[0]
        raise ValueError(f"Unknown TFDS dataset {name!r} ({first_line}). See "
                         "https://www.tensorflow.org/datasets/catalog for the names.") from error
    if builder.is_prepared():
        return builder
    if not download:
        where = "TFDS's default data_dir" if data_dir is None else data_dir
        flag = "" if data_dir is None else f" --data_dir {data_dir}"
        manual = ""
        if getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None):
            root = data_dir or tfds.core.constants.DATA_DIR
            manual = (f"\n{name!r} needs a manual download first: put its files in "
                      f"{os.path.join(root, 'downloads', 'manual')} (see "
                      f"https://www.tensorflow.org/datasets/catalog/{name.split('/')[0]}).")
        raise DatasetNotPreparedError(
            f"TFDS dataset {name!r} is not prepared in {where} (looked for "
            f"{builder.data_dir}) and download=False. Prepare it once with\n"
            f"    tfds build {name}{flag}\n"
            "(needs internet on that machine; copy the directory to the others), or "
            f"pass download=True to download and prepare it now.{manual}")
    builder.download_and_prepare()
    return builder


EVALUATION_SPLIT = "evaluation"
"""A split name meaning "the dataset's held-out split": `validation` when
the dataset has one, else `test` (what a recipe's --validation-dataset reads)."""


def resolve_split(builder, split, name):
    """Checks `split` against the builder's splits; resolves `EVALUATION_SPLIT`.

    TFDS split expressions are accepted (`train[:90%]`, `train+test`); each
    named split must exist. A builder that lists no splits (as under
    `tfds.testing.mock_data`) is taken at its word, and "evaluation" is then
    `test`.

    Args:
        builder: a prepared TFDS builder.
        split: a TFDS split expression, or "evaluation".
        name: the dataset's name, for messages.

    Returns:
        The split expression to read.

    Raises:
        ValueError: a split the dataset does not have (its splits are named),
            or "evaluation" for a dataset with neither `validation` nor `test`.

    Example:

    >>> resolve_split(tfds.builder("imdb_reviews"), "evaluation", "imdb_reviews")
    'test'
    """
    available = list(builder.info.splits.keys())
    if split == EVALUATION_SPLIT:
        if not available:
            return "test"
        for candidate in ("validation", "test"):
            if candidate in available:
                return candidate
        raise ValueError(f"TFDS dataset {name!r} has no 'validation' or 'test' split to "
                         f"evaluate on; its splits are {', '.join(available)}. Name one with "
                         "a split option (e.g. a slice such as 'train[90%:]').")
    if not isinstance(split, str) or not split.strip():
        raise ValueError(f"split must be a TFDS split name such as 'train', got {split!r}.")
    if available:
        named = [part.split("[", 1)[0].strip() for part in split.split("+")]
        unknown = [part for part in named if part not in available]
        if unknown:
            raise ValueError(f"TFDS dataset {name!r} has no split {', '.join(map(repr, unknown))}; "
                             f"its splits are {', '.join(available)}.")
    return split


class TFDSSplit:
    """Mixin for sources that read one split of a prepared TFDS builder.

    Subclasses set `self.builder` and `self.split`; they get `num_files`,
    `num_examples` and `read_split`.

    Example:

    >>> class MySource(TFDSSplit, Source):
    ...     def read(self, plan, *, shuffle_files=False, seed=None):
    ...         return self.read_split(plan, shuffle_files, seed).map(lambda e: e["text"])
    """

    @property
    def num_files(self):
        """Number of shard files of the split (0 when TFDS does not know it)."""
        try:
            return int(self.builder.info.splits[self.split].num_shards)
        except (KeyError, ValueError, AttributeError, TypeError):
            return 0

    @property
    def num_examples(self):
        """Examples in the split, or None when TFDS does not know."""
        try:
            return int(self.builder.info.splits[self.split].num_examples) or None
        except (KeyError, ValueError, AttributeError, TypeError):
            return None

    def read_split(self, plan, shuffle_files=False, seed=None, decoders=None):
        """This input pipeline's share of the split, as TFDS example dicts.

        Args:
            plan: the pipeline's `tfdist.data.ShardPlan`.
            shuffle_files: shuffle the shard files (file sharding only).
            seed: the file-shuffle seed.
            decoders: TFDS `decoders` (e.g. `SkipDecoding` for features
                decoded later in the pipeline's parallel map).
        """
        tfds = import_tfds()
        if plan.mode == sharding.FILE:
            context = tf.distribute.InputContext(num_input_pipelines=plan.count,
                                                 input_pipeline_id=plan.index)
            read_config = tfds.ReadConfig(input_context=context, shuffle_seed=seed)
            return self.builder.as_dataset(split=self.split, shuffle_files=shuffle_files,
                                           read_config=read_config, decoders=decoders)
        if plan.mode == sharding.RECORD:
            split = self.split if plan.count == 1 else tfds.even_splits(
                self.split, n=plan.count)[plan.index]
            return self.builder.as_dataset(split=split, shuffle_files=False,
                                           read_config=tfds.ReadConfig(), decoders=decoders)
        raise ValueError(f"Unknown shard mode {plan.mode!r}; expected one of {sharding.MODES}.")
