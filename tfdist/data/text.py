"""Plain-text files as a byte-level language-modelling source."""

import tensorflow as tf

from tfdist.data.files import check_holds_examples, expand_files
from tfdist.data.source import SequenceSource
from tfdist.data.tokens import ByteVocabulary

VOCABULARIES = ("bytes", "build")
LINES_PER_RECORD = 64


class TextSource(SequenceSource):
    """Plain UTF-8 text files, one token per byte, cut into fixed windows.

    A file is read in records of `LINES_PER_RECORD` consecutive lines (the
    unit that record sharding hands out, and that is tokenised in one
    vectorised step); each line becomes its bytes followed by the newline
    byte, so the token stream decodes back to the file's text. With
    `pack=True` (default) the stream is cut into consecutive windows of
    `sequence_length + 1` tokens, and every window is a contiguous piece of
    text: a shard's files are read one after the other and records stay in
    order. With `pack=False` each line is one example, cut or padded.

    Args:
        files: glob, comma-separated globs, or list of paths.
        sequence_length: tokens per example (inputs and targets each).
        vocabulary: `"bytes"` (all 256 bytes, vocab_size 260), `"build"` (only
            the bytes found in the files, plus `<unk>`; reads the files once),
            or a `ByteVocabulary`.
        pack: pack lines into windows (True) or one example per line (False).

    Raises:
        FileNotFoundError: the pattern matches no file.
        NoExamplesError: the files are empty, or hold too few bytes for one
            example (a `ValueError` naming them).
        ValueError: unknown vocabulary or bad sequence_length.

    Example:

    >>> source = TextSource("/data/shakespeare/*.txt", sequence_length=128, vocabulary="build")
    >>> source.vocab_size
    70
    """

    decodes_blocks = True  # a record is LINES_PER_RECORD lines

    def __init__(self, files, sequence_length=128, *, vocabulary="bytes", pack=True):
        if not isinstance(sequence_length, int) or sequence_length < 1:
            raise ValueError(f"sequence_length must be a positive integer, got {sequence_length!r}.")
        self.files = expand_files(files)
        self.sequence_length = sequence_length
        self.pack = bool(pack)
        self.keep_record_order = self.pack
        self._check_holds_examples()
        if isinstance(vocabulary, ByteVocabulary):
            self.vocabulary = vocabulary
        elif vocabulary == "bytes":
            self.vocabulary = ByteVocabulary()
        elif vocabulary == "build":
            self.vocabulary = ByteVocabulary.from_files(self.files)
        else:
            raise ValueError(f"Unknown vocabulary {vocabulary!r}; valid: "
                             f"{', '.join(VOCABULARIES)} or a ByteVocabulary.")
        self.vocab_size = self.vocabulary.vocab_size

    def _check_holds_examples(self):
        window = self.sequence_length + 1
        if not self.pack:  # a line is an example: one byte makes a line
            check_holds_examples(self.files)
            return
        # A token per byte, plus a newline for a last line without one.
        check_holds_examples(
            self.files, max(1, window - len(self.files)),
            too_short=f"the {window} tokens (a token per byte) of one example of "
                      f"sequence_length {self.sequence_length} + 1; use more text or a smaller "
                      "sequence_length (the recipes' --sequence-length)")

    def read_file(self, path):
        return tf.data.TextLineDataset(path).batch(LINES_PER_RECORD)

    def read_all(self):
        # Sequential, in file order: identical in every worker (record sharding).
        return tf.data.TextLineDataset(list(self.files)).batch(LINES_PER_RECORD)

    def decode(self, record):
        return self.vocabulary.encode_batch(record + "\n")

    def tokens_in(self, record):
        """A token a byte of each line and its newline, without encoding them.

        Example:

        >>> int(source.tokens_in(tf.constant(["ab", "c"])))
        5
        """
        return self.vocabulary.count_batch(record) + tf.size(record, out_type=tf.int64)

    def describe(self):
        return (f"TextSource({len(self.files)} file(s), {self.vocabulary!r}, "
                f"sequence_length={self.sequence_length}, pack={self.pack})")
