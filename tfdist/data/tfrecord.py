"""TFRecord sources (token ids or text) and writers for token/text TFRecords."""

import logging
import posixpath

import tensorflow as tf

from tfdist.data.corruption import (check_tfrecord_tails, explain_data_loss, read_tfrecords,
                                    skipped_records_log)
from tfdist.data.files import check_holds_examples, expand_files
from tfdist.data.source import SequenceSource
from tfdist.data.tokens import BOS_ID, EOS_ID, NUM_RESERVED, ByteVocabulary

logger = logging.getLogger("tfdist.data")

FORMATS = ("tokens", "text", "raw")
DEFAULT_FEATURES = {"tokens": "tokens", "text": "text", "raw": None}
RECORDS_PER_BLOCK = 256
"""Packed records are parsed this many at a time (one call, not one per record)."""


class TFRecordReading:
    """How a source whose `files` are TFRecord files reads them (a mixin).

    The class it is mixed into sets `files`, `compression_type` and
    `skipped` (a `SkippedRecords`, or None to fail on a corrupt record).
    Without skipping, the files are read in order as one dataset, identical
    in every worker; with skipping, file by file through `read_file`.

    Example:

        class MyTFRecordSource(TFRecordReading, SequenceSource): ...
    """

    def read_file(self, path):
        return read_tfrecords(path, self.compression_type, self.skipped)

    def read_all(self):
        # Sequential, in file order: identical in every worker (record sharding).
        if self.skipped is not None:
            return super().read_all()  # file by file, each through read_file
        return tf.data.TFRecordDataset(list(self.files), compression_type=self.compression_type)


class TFRecordSource(TFRecordReading, SequenceSource):
    """Sequences stored in TFRecord files.

    Formats:

    * `"tokens"`: `tf.train.Example`s with an int64 list feature of token ids
      (written by `write_token_tfrecords`). One record is one example, cut or
      right-padded to `sequence_length + 1` tokens (`pack=False`, default for
      this format), or records are concatenated and cut into windows
      (`pack=True`).
    * `"text"`: `tf.train.Example`s with a bytes feature holding UTF-8 text
      (written by `write_text_tfrecords`).
    * `"raw"`: each record is itself UTF-8 text.

    Text is tokenised per byte as `[BOS] bytes [EOS]` and packed into windows
    (`pack=True`, default for text). Packed records are read and parsed in
    blocks of `RECORDS_PER_BLOCK` (after sharding, which stays per record).

    Args:
        files: glob, comma-separated globs, or list of paths.
        sequence_length: tokens per example (inputs and targets each).
        format: `"tokens"`, `"text"` or `"raw"`.
        feature: name of the feature holding the tokens/text (default
            `"tokens"` / `"text"`; unused for `"raw"`).
        vocab_size: for `"tokens"`: number of token ids. None scans the files
            once for the largest id (pass it to avoid that pass).
        vocabulary: for text formats, a `ByteVocabulary` (default: all bytes).
        pack: see above; None picks the format's default.
        compression_type: `""`, `"GZIP"` or `"ZLIB"`.
        skip_corrupt_records: False (default): reading a damaged file fails
            with TensorFlow's `DataLossError`, which
            `tfdist.data.explain_data_loss` (the recipes call it) turns into
            an error naming the file and record. True (uncompressed files
            only): a damaged file is read up to its last readable record,
            the rest of it is skipped and noted in `self.skipped` (a
            `tfdist.data.SkippedRecords` log; None when not skipping).

    Raises:
        FileNotFoundError: the pattern matches no file.
        NoExamplesError: the files are empty, or hold too few bytes for one
            packed example (a `ValueError` naming them).
        ValueError: unknown format, or bad sizes.
        CorruptDataError: a file ends inside a record (cut short; checked
            for uncompressed files when not skipping corrupt records), or
            the vocab_size scan met a damaged file.

    Example:

    >>> paths = write_token_tfrecords([[1, 5, 6, 3]] * 100, "/tmp/toy", num_files=4)
    >>> source = TFRecordSource("/tmp/toy-*.tfrecord", sequence_length=3, vocab_size=8)
    """

    def __init__(self, files, sequence_length=128, *, format="tokens", feature=None,
                 vocab_size=None, vocabulary=None, pack=None, compression_type="",
                 skip_corrupt_records=False):
        if format not in FORMATS:
            raise ValueError(f"Unknown TFRecord format {format!r}; valid formats: "
                             f"{', '.join(FORMATS)}.")
        if not isinstance(sequence_length, int) or sequence_length < 1:
            raise ValueError(f"sequence_length must be a positive integer, got {sequence_length!r}.")
        self.files = expand_files(files)
        self.format = format
        self.feature = feature if feature is not None else DEFAULT_FEATURES[format]
        self.sequence_length = sequence_length
        self.compression_type = compression_type or ""
        self.skipped = skipped_records_log(skip_corrupt_records, self.compression_type)
        self.pack = (format != "tokens") if pack is None else bool(pack)
        self.decodes_blocks = self.pack  # read in blocks of records (see `read`)
        self._check_files()
        if format == "tokens":
            if vocabulary is not None:
                raise ValueError("vocabulary applies to text formats; for format='tokens' pass "
                                 "vocab_size.")
            if vocab_size is None:
                vocab_size = self._scan_vocab_size()
            if not isinstance(vocab_size, int) or vocab_size <= NUM_RESERVED:
                raise ValueError(f"vocab_size must be an integer > {NUM_RESERVED}, got "
                                 f"{vocab_size!r}.")
            self.vocab_size = vocab_size
            self.vocabulary = None
        else:
            if vocab_size is not None:
                raise ValueError("vocab_size applies to format='tokens'; text formats take "
                                 "vocabulary=ByteVocabulary(...).")
            self.vocabulary = vocabulary or ByteVocabulary()
            self.vocab_size = self.vocabulary.vocab_size

    def _check_files(self):
        window = self.sequence_length + 1
        if self.pack and not self.compression_type:
            # A record of N bytes holds at most N + 2 tokens, and 16 bytes of framing.
            check_holds_examples(
                self.files, window,
                too_short=f"the {window} tokens of one example of sequence_length "
                          f"{self.sequence_length} + 1; use more data or a smaller "
                          "sequence_length (the recipes' --sequence-length)")
        else:
            check_holds_examples(self.files)
        if self.skipped is None:  # when skipping, reading notes a file cut short
            check_tfrecord_tails(self.files, self.compression_type)

    def grouped(self, records):
        """Packed: `records` in blocks of `RECORDS_PER_BLOCK`, as `decode` takes
        them (every read goes through it: see `Source.grouped`).

        Example:

        >>> blocks = source.read(plan_sharding(source.num_files, 1, 0, files=source.files))
        """
        return records.batch(RECORDS_PER_BLOCK) if self.pack else records

    def _ids(self, record):
        if self.format == "raw":
            text = record
        elif self.format == "text":
            parsed = tf.io.parse_single_example(
                record, {self.feature: tf.io.FixedLenFeature([], tf.string)})
            text = parsed[self.feature]
        else:
            parsed = tf.io.parse_single_example(
                record, {self.feature: tf.io.VarLenFeature(tf.int64)})
            return tf.cast(parsed[self.feature].values, tf.int32)
        return tf.concat([[BOS_ID], self.vocabulary.encode(text), [EOS_ID]], axis=0)

    def _block_ids(self, records):
        """The token ids of a 1-D block of records, as a ragged `[records, None]` int32."""
        if self.format == "tokens":
            return tf.cast(tf.RaggedTensor.from_sparse(self._block_token_ids(records)), tf.int32)
        texts = self._block_texts(records)
        ends = tf.ones([tf.shape(texts)[0], 1], tf.int32)
        return tf.concat([ends * BOS_ID, self.vocabulary.encode_batch(texts), ends * EOS_ID],
                         axis=1)

    def _block_token_ids(self, records):
        return tf.io.parse_example(records, {self.feature: tf.io.VarLenFeature(tf.int64)})[
            self.feature]

    def _block_texts(self, records):
        if self.format == "text":
            return tf.io.parse_example(
                records, {self.feature: tf.io.FixedLenFeature([], tf.string)})[self.feature]
        return records

    def tokens_in(self, record):
        """How many tokens `decode(record)` gives; for a block of texts in bytes, BOS
        and EOS around a token a byte, without encoding them.

        Example:

        >>> int(source.tokens_in(next(iter(source.read(plan)))))
        3584
        """
        if not self.pack:
            return super().tokens_in(record)
        if self.format == "tokens":
            return tf.size(self._block_token_ids(record).values, out_type=tf.int64)
        if not isinstance(self.vocabulary, ByteVocabulary):
            return super().tokens_in(record)
        texts = self._block_texts(record)
        return self.vocabulary.count_batch(texts) + 2 * tf.size(texts, out_type=tf.int64)

    def decode(self, record):
        """One record's token ids; packed, a block's as a ragged `[records, None]` int32.

        Example:

        >>> source.decode(next(iter(source.read(plan))))
        """
        ids = self._block_ids(record) if self.pack else self._ids(record)
        if self.format == "tokens":
            values = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
            tf.debugging.assert_less(
                values, self.vocab_size,
                message=f"A token id in {self.feature!r} is >= vocab_size={self.vocab_size}")
            tf.debugging.assert_non_negative(values, message="Negative token id in TFRecord")
        return ids

    def _scan_vocab_size(self):
        logger.info("TFRecordSource: scanning %d file(s) for the largest token id "
                    "(pass vocab_size= to skip this pass).", len(self.files))
        try:
            largest = self.read_all().map(
                lambda r: tf.reduce_max(tf.concat([self._ids(r), [0]], 0)),
                num_parallel_calls=tf.data.AUTOTUNE).reduce(tf.constant(0), tf.maximum)
        except tf.errors.DataLossError as error:
            raise explain_data_loss(error, [self]) from error
        return max(int(largest) + 1, NUM_RESERVED + 1)

    def describe(self):
        return (f"TFRecordSource({len(self.files)} file(s), format={self.format!r}, "
                f"feature={self.feature!r}, vocab_size={self.vocab_size}, "
                f"sequence_length={self.sequence_length}, pack={self.pack}"
                + (", skip_corrupt_records=True" if self.skipped is not None else "") + ")")


def _shard_paths(output_prefix, num_files):
    if isinstance(num_files, bool) or not isinstance(num_files, int) or num_files < 1:
        raise ValueError(f"num_files must be a positive integer, got {num_files!r}.")
    directory = posixpath.dirname(output_prefix)
    if directory:
        tf.io.gfile.makedirs(directory)
    return [f"{output_prefix}-{i:05d}-of-{num_files:05d}.tfrecord" for i in range(num_files)]


def _refuse_another_shard_set(output_prefix, num_files):
    """Shards of the same prefix written with another file count would stay beside the
    new ones, and a pattern such as `PREFIX-*` would read both sets as one."""
    pattern = f"{output_prefix}-?????-of-?????.tfrecord"
    suffix = f"-of-{num_files:05d}.tfrecord"
    others = sorted(path for path in tf.io.gfile.glob(pattern) if not path.endswith(suffix))
    if others:
        shown = ", ".join(posixpath.basename(path) for path in others[:3])
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        raise FileExistsError(
            f"{output_prefix!r} already has shards written as another set ({shown}{more}); "
            f"{num_files} new file(s) beside them would be read together with them by a "
            f"pattern such as {output_prefix}-*. Remove them, or write under another prefix.")


def write_tfrecord_shards(examples, output_prefix, num_files):
    """Writes `tf.train.Example`s round-robin into `num_files` TFRecord files.

    The files are written under temporary names and renamed when every
    example is in: if `examples` raises, no file of the set is left behind
    (a partial set would read as a whole, smaller one). A set of the same
    prefix and count is replaced; one of another count is refused.

    Returns:
        The paths written, `<output_prefix>-0000i-of-0000n.tfrecord`.

    Raises:
        FileExistsError: shards of the same prefix with another count exist.

    Example:

        paths = write_tfrecord_shards(examples, "/data/train", num_files=2)
    """
    paths = _shard_paths(output_prefix, num_files)
    _refuse_another_shard_set(output_prefix, num_files)
    partial = [f"{path}.partial" for path in paths]
    writers = [tf.io.TFRecordWriter(path) for path in partial]
    try:
        try:
            for i, example in enumerate(examples):
                writers[i % num_files].write(example.SerializeToString())
        finally:
            for writer in writers:
                writer.close()
    except BaseException:
        for path in partial:
            if tf.io.gfile.exists(path):
                tf.io.gfile.remove(path)
        raise
    for path, final in zip(partial, paths, strict=True):
        tf.io.gfile.rename(path, final, overwrite=True)
    return paths


def write_token_tfrecords(sequences, output_prefix, num_files=1, feature="tokens"):
    """Writes token-id sequences as `tf.train.Example`s, round-robin over files.

    Files are named `{output_prefix}-00000-of-0000N.tfrecord`; record `i` goes
    to file `i % num_files`.

    Args:
        sequences: iterable of int sequences (token ids >= 0).
        output_prefix: path prefix of the files (directories are created).
        num_files: number of files to spread the records over.
        feature: name of the int64 list feature.

    Returns:
        The list of written paths.

    Example:

    >>> write_token_tfrecords([[1, 4, 5, 3], [1, 6, 3]], "/tmp/tok", num_files=2)
    ['/tmp/tok-00000-of-00002.tfrecord', '/tmp/tok-00001-of-00002.tfrecord']
    """
    def examples():
        for row, sequence in enumerate(sequences):
            ids = [int(t) for t in sequence]
            if ids and min(ids) < 0:
                raise ValueError(f"sequence {row} holds the token id {min(ids)}; token ids are "
                                 "integers >= 0.")
            yield tf.train.Example(features=tf.train.Features(feature={
                feature: tf.train.Feature(int64_list=tf.train.Int64List(value=ids))}))
    return write_tfrecord_shards(examples(), output_prefix, num_files)


def write_text_tfrecords(texts, output_prefix, num_files=1, feature="text"):
    """Writes texts as `tf.train.Example`s with one bytes feature, round-robin over files.

    Args:
        texts: iterable of `str` (UTF-8 encoded) or `bytes`.
        output_prefix: path prefix of the files (directories are created).
        num_files: number of files to spread the records over.
        feature: name of the bytes feature.

    Returns:
        The list of written paths.

    Example:

    >>> write_text_tfrecords(["hello", "world"], "/tmp/txt")
    ['/tmp/txt-00000-of-00001.tfrecord']
    """
    def examples():
        for text in texts:
            data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
            yield tf.train.Example(features=tf.train.Features(feature={
                feature: tf.train.Feature(bytes_list=tf.train.BytesList(value=[data]))}))
    return write_tfrecord_shards(examples(), output_prefix, num_files)
