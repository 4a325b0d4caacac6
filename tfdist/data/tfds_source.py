"""TensorFlow Datasets (TFDS) text datasets as a byte-level language-modelling source.

Nothing is downloaded unless asked: with `download=False` (the default) a
dataset that is not prepared in `data_dir` is a `DatasetNotPreparedError`
that says how to prepare it.

Sharding uses TFDS's own tools: by file through
`tfds.ReadConfig(input_context=...)` when the split has at least as many
shards as input pipelines, otherwise by record through `tfds.even_splits`
(each pipeline reads only its slice of examples).
"""

import logging

import tensorflow as tf

from tfdist.data import sharding
from tfdist.data.source import SequenceSource
from tfdist.data.tokens import BOS_ID, EOS_ID, ByteVocabulary

logger = logging.getLogger("tfdist.data")


class DatasetNotPreparedError(FileNotFoundError):
    """A TFDS dataset is not on disk and downloading was not allowed."""


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as error:  # pragma: no cover - depends on the install
        raise ImportError("TFDS sources need tensorflow-datasets: pip install "
                          "'tfdist[datasets]' (or pip install tensorflow-datasets).") from error
    return tfds


def _text_features(features):
    """Names of the scalar string features of a TFDS FeaturesDict, in order."""
    names = []
    for name, feature in features.items():
        try:
            if feature.dtype == tf.string and tuple(feature.shape) == ():
                names.append(name)
        except (AttributeError, TypeError):
            continue
    return names


class TFDSSource(SequenceSource):
    """A text feature of a TFDS dataset, tokenised per byte into fixed windows.

    Each example's text becomes `[BOS] bytes [EOS]`; documents are packed
    into consecutive windows of `sequence_length + 1` tokens (`pack=True`) or
    cut/padded one per example (`pack=False`).

    Args:
        name: TFDS name, optionally with config/version (`"imdb_reviews"`,
            `"lm1b"`, `"wiki40b/en"`).
        split: split or sub-split (`"train"`, `"test[:10%]"`).
        feature: the text feature; None picks the first scalar string feature.
        sequence_length: tokens per example (inputs and targets each).
        data_dir: TFDS data directory (default: TFDS's, `~/tensorflow_datasets`).
        download: download and prepare the dataset when it is missing.
        vocabulary: a `ByteVocabulary` (default: all bytes).
        pack: pack documents into windows (True) or one example each (False).

    Raises:
        DatasetNotPreparedError: not prepared and `download=False`.
        ValueError: unknown dataset, or no such text feature (the available
            features are listed).

    Example:

    >>> source = TFDSSource("imdb_reviews", feature="text", sequence_length=256)
    >>> dataset = distribute_dataset(strategy, source, global_batch_size=32)
    """

    def __init__(self, name, split="train", *, feature=None, sequence_length=128, data_dir=None,
                 download=False, vocabulary=None, pack=True):
        tfds = _import_tfds()
        if not isinstance(sequence_length, int) or sequence_length < 1:
            raise ValueError(f"sequence_length must be a positive integer, got {sequence_length!r}.")
        try:
            builder = tfds.builder(name, data_dir=data_dir)
        except tfds.core.registered.DatasetNotFoundError as error:
            first_line = str(error).splitlines()[0]
            raise ValueError(f"Unknown TFDS dataset {name!r} ({first_line}). See "
                             "https://www.tensorflow.org/datasets/catalog for the names.") from error
        if not builder.is_prepared():
            if not download:
                where = "TFDS's default data_dir" if data_dir is None else data_dir
                flag = "" if data_dir is None else f" --data_dir {data_dir}"
                raise DatasetNotPreparedError(
                    f"TFDS dataset {name!r} is not prepared in {where} (looked for "
                    f"{builder.data_dir}) and download=False. Prepare it once with\n"
                    f"    tfds build {name}{flag}\n"
                    "(needs internet on that machine; copy the directory to the others), or "
                    "pass download=True to download and prepare it now.")
            builder.download_and_prepare()
        features = builder.info.features
        text_features = _text_features(features)
        if feature is None:
            if not text_features:
                raise ValueError(f"TFDS dataset {name!r} has no scalar text feature; its "
                                 f"features are {', '.join(features.keys())}.")
            feature = text_features[0]
        elif feature not in text_features:
            raise ValueError(f"Feature {feature!r} of TFDS dataset {name!r} is not a scalar "
                             f"text feature; text features: {', '.join(text_features) or 'none'} "
                             f"(all features: {', '.join(features.keys())}).")
        self.name = name
        self.split = split
        self.feature = feature
        self.builder = builder
        self.sequence_length = sequence_length
        self.vocabulary = vocabulary or ByteVocabulary()
        self.vocab_size = self.vocabulary.vocab_size
        self.pack = bool(pack)

    @property
    def num_files(self):
        """Number of shard files of the split (0 when TFDS does not know it)."""
        try:
            return int(self.builder.info.splits[self.split].num_shards)
        except (KeyError, ValueError, AttributeError, TypeError):
            return 0

    @property
    def num_examples(self):
        try:
            return int(self.builder.info.splits[self.split].num_examples) or None
        except (KeyError, ValueError, AttributeError, TypeError):
            return None

    def read(self, plan, *, shuffle_files=False, seed=None):
        tfds = _import_tfds()
        decoders = {name: tfds.decode.SkipDecoding()
                    for name in self.builder.info.features.keys() if name != self.feature}
        if plan.mode == sharding.FILE:
            context = tf.distribute.InputContext(num_input_pipelines=plan.count,
                                                 input_pipeline_id=plan.index)
            read_config = tfds.ReadConfig(input_context=context, shuffle_seed=seed)
            dataset = self.builder.as_dataset(split=self.split, shuffle_files=shuffle_files,
                                              read_config=read_config, decoders=decoders)
        elif plan.mode == sharding.RECORD:
            split = self.split if plan.count == 1 else tfds.even_splits(
                self.split, n=plan.count)[plan.index]
            dataset = self.builder.as_dataset(split=split, shuffle_files=False,
                                              read_config=tfds.ReadConfig(), decoders=decoders)
        else:
            raise ValueError(f"Unknown shard mode {plan.mode!r}; expected one of {sharding.MODES}.")
        feature = self.feature
        return dataset.map(lambda example: example[feature])

    def decode(self, record):
        return tf.concat([[BOS_ID], self.vocabulary.encode(record), [EOS_ID]], axis=0)

    def describe(self):
        return (f"TFDSSource({self.name!r}, split={self.split!r}, feature={self.feature!r}, "
                f"vocab_size={self.vocab_size}, sequence_length={self.sequence_length}, "
                f"pack={self.pack})")
