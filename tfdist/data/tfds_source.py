"""TensorFlow Datasets (TFDS) text datasets as a byte-level language-modelling source.

Nothing is downloaded unless asked: with `download=False` (the default) a
dataset that is not prepared in `data_dir` is a `DatasetNotPreparedError`
that says how to prepare it.

Sharding is TFDS's own (see `tfdist.data.tfds_common`).
"""

import tensorflow as tf

from tfdist.data.source import SequenceSource
from tfdist.data.tfds_common import TFDSSplit, import_tfds, prepared_builder, resolve_split
from tfdist.data.tokens import BOS_ID, EOS_ID, ByteVocabulary

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


class TFDSSource(TFDSSplit, SequenceSource):
    """A text feature of a TFDS dataset, tokenised per byte into fixed windows.

    Each example's text becomes `[BOS] bytes [EOS]`; documents are packed
    into consecutive windows of `sequence_length + 1` tokens (`pack=True`) or
    cut/padded one per example (`pack=False`).

    Args:
        name: TFDS name, optionally with config/version (`"imdb_reviews"`,
            `"lm1b"`, `"wiki40b/en"`).
        split: split or sub-split (`"train"`, `"test[:10%]"`), or "evaluation"
            (`validation` if the dataset has it, else `test`); checked.
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
        if not isinstance(sequence_length, int) or sequence_length < 1:
            raise ValueError(f"sequence_length must be a positive integer, got {sequence_length!r}.")
        builder = prepared_builder(name, data_dir=data_dir, download=download)
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
        self.split = resolve_split(builder, split, name)
        self.feature = feature
        self.builder = builder
        self.sequence_length = sequence_length
        self.vocabulary = vocabulary or ByteVocabulary()
        self.vocab_size = self.vocabulary.vocab_size
        self.pack = bool(pack)

    def read(self, plan, *, shuffle_files=False, seed=None):
        tfds = import_tfds()
        decoders = {name: tfds.decode.SkipDecoding()
                    for name in self.builder.info.features.keys() if name != self.feature}
        feature = self.feature
        return self.read_split(plan, shuffle_files, seed, decoders).map(
            lambda example: example[feature])

    def decode(self, record):
        return tf.concat([[BOS_ID], self.vocabulary.encode(record), [EOS_ID]], axis=0)

    def describe(self):
        return (f"TFDSSource({self.name!r}, split={self.split!r}, feature={self.feature!r}, "
                f"vocab_size={self.vocab_size}, sequence_length={self.sequence_length}, "
                f"pack={self.pack})")
