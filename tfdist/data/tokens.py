"""Reserved token ids, byte-level tokenisation and fixed-length windows.

Every sequence source in `tfdist.data` produces the same element: a pair
`(inputs, targets)` of int32 vectors of length `sequence_length`, where
`targets[i]` is the token that follows `inputs[i]` and the pad id 0 marks a
position that must not count in the loss or the accuracy. Train with a loss
that ignores class 0, e.g.
`keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)`.

Reserved ids: 0 = pad, 1 = BOS, 2 = SEP, 3 = EOS. Data tokens start at 4.
Text is tokenised without any download, one token per UTF-8 byte.
"""

import collections

import numpy as np
import tensorflow as tf

PAD_ID = 0
BOS_ID = 1
SEP_ID = 2
EOS_ID = 3
NUM_RESERVED = 4
RESERVED_NAMES = {PAD_ID: "<pad>", BOS_ID: "<bos>", SEP_ID: "<sep>", EOS_ID: "<eos>"}


class ByteVocabulary:
    """Maps UTF-8 bytes to token ids placed after the reserved ids.

    Two flavours:

    * all bytes (the default, `byte_values=None`): byte `b` is id `b + 4`,
      `vocab_size` is 260, nothing is ever unknown;
    * a compact vocabulary of the bytes that occur in some text
      (`ByteVocabulary.from_files` / `from_texts`): id 4 is `<unk>` for a byte
      outside it and the known bytes get ids 5, 6, ... in byte order, so
      `vocab_size` is `5 + len(byte_values)` (smaller embeddings for ASCII text).

    Args:
        byte_values: iterable of ints in [0, 255], the bytes to keep, or None
            for all 256 bytes.

    Example:

    >>> vocab = ByteVocabulary()
    >>> vocab.encode(tf.constant("hi")).numpy().tolist()
    [108, 109]
    >>> vocab.decode([1, 108, 109, 3])
    b'hi'
    """

    def __init__(self, byte_values=None):
        if byte_values is None:
            self.byte_values = tuple(range(256))
            self.unk_id = None
            first_id = NUM_RESERVED
        else:
            values = sorted(set(int(b) for b in byte_values))
            bad = [b for b in values if not 0 <= b <= 255]
            if bad:
                raise ValueError(f"byte_values must be ints in [0, 255]; got {bad[:5]}.")
            if not values:
                raise ValueError("byte_values is empty: a vocabulary needs at least one byte.")
            self.byte_values = tuple(values)
            self.unk_id = NUM_RESERVED
            first_id = NUM_RESERVED + 1
        table = np.full([256], self.unk_id if self.unk_id is not None else 0, np.int32)
        for offset, byte in enumerate(self.byte_values):
            table[byte] = first_id + offset
        self._table = table
        self._id_to_byte = {int(table[b]): b for b in self.byte_values}
        self.vocab_size = first_id + len(self.byte_values)

    @classmethod
    def from_texts(cls, texts):
        """Builds a compact vocabulary of the bytes occurring in `texts`.

        Args:
            texts: iterable of `str` or `bytes`.

        Example:

        >>> ByteVocabulary.from_texts(["abba"]).vocab_size  # pad..eos, unk, a, b
        7
        """
        counts = collections.Counter()
        for text in texts:
            counts.update(text.encode("utf-8") if isinstance(text, str) else bytes(text))
        return cls(counts.keys())

    @classmethod
    def from_files(cls, files):
        """Builds a compact vocabulary of the bytes occurring in `files`.

        Reads every file once, in full: meant for small corpora.

        Args:
            files: iterable of paths (anything `tf.io.gfile` opens).

        Example:

        >>> vocab = ByteVocabulary.from_files(["/data/shakespeare.txt"])
        """
        present = set()
        for path in files:
            with tf.io.gfile.GFile(path, "rb") as handle:
                while True:
                    chunk = handle.read(1 << 20)
                    if not chunk:
                        break
                    present.update(chunk)
        return cls(present)

    def encode(self, text):
        """Returns the int32 token ids of a scalar string tensor (no BOS/EOS).

        Args:
            text: scalar `tf.string` tensor.

        Example:

        >>> ByteVocabulary().encode(tf.constant("A")).numpy().tolist()
        [69]
        """
        raw = tf.io.decode_raw(text, tf.uint8)
        return tf.gather(tf.constant(self._table), tf.cast(raw, tf.int32))

    def encode_batch(self, texts):
        """Returns the token ids of a 1-D string tensor as a ragged `[len(texts), None]` int32.

        Vectorised: one op sequence for the whole batch, cheaper than mapping
        `encode` over single strings.

        Args:
            texts: 1-D `tf.string` tensor.

        Example:

        >>> ByteVocabulary().encode_batch(tf.constant(["A", "hi"])).to_list()
        [[69], [108, 109]]
        """
        # All the bytes at once, cut back into texts by their lengths (no string per byte).
        raw = tf.reshape(tf.io.decode_raw(tf.strings.reduce_join(texts), tf.uint8), [-1])
        ids = tf.gather(tf.constant(self._table), tf.cast(raw, tf.int32))
        return tf.RaggedTensor.from_row_lengths(ids, _byte_lengths(texts), validate=False)

    def count_batch(self, texts):
        """The number of ids `encode_batch(texts)` gives (one a byte), an int64 scalar,
        without encoding them.

        Example:

        >>> int(ByteVocabulary().count_batch(tf.constant(["A", "hé"])))
        4
        """
        return tf.reduce_sum(_byte_lengths(texts))

    def decode(self, ids):
        """Returns the bytes of token ids, skipping reserved ids (`<unk>` -> `?`).

        Args:
            ids: iterable of ints (or a 1-D tensor / array).

        Example:

        >>> ByteVocabulary().decode([72, 0, 0])
        b'D'
        """
        out = bytearray()
        for token in np.asarray(ids).reshape(-1).tolist():
            if token in self._id_to_byte:
                out.append(self._id_to_byte[token])
            elif token == self.unk_id:
                out.append(ord("?"))
        return bytes(out)

    def __repr__(self):
        kind = "all bytes" if self.unk_id is None else f"{len(self.byte_values)} bytes + <unk>"
        return f"ByteVocabulary({kind}, vocab_size={self.vocab_size})"


def _byte_lengths(texts):
    """The byte length of each string of `texts` (one id a byte), int64."""
    return tf.cast(tf.strings.length(texts, unit="BYTE"), tf.int64)


def pad_or_truncate(tokens, length):
    """Cuts a 1-D token tensor to `length` or right-pads it with the pad id 0.

    Args:
        tokens: 1-D integer tensor.
        length: the fixed output length.

    Example:

    >>> pad_or_truncate(tf.constant([5, 6]), 4).numpy().tolist()
    [5, 6, 0, 0]
    """
    tokens = tokens[:length]
    tokens = tf.pad(tokens, [[0, length - tf.shape(tokens)[0]]], constant_values=PAD_ID)
    tokens.set_shape([length])
    return tokens


def pack_windows(dataset, length, documents_per_chunk=128):
    """Concatenates a dataset of 1-D token vectors and cuts it into windows.

    The stream is cut into consecutive, non-overlapping windows of exactly
    `length` tokens; the last window of the stream is right-padded with 0, so
    no token is lost. Documents are grouped `documents_per_chunk` at a time so
    that the per-element cost is paid per chunk, not per token.

    Args:
        dataset: `tf.data.Dataset` of 1-D int32 tensors of any length.
        length: window length (for language modelling, `sequence_length + 1`).
        documents_per_chunk: documents concatenated per step of the scan.

    Returns:
        A `tf.data.Dataset` of int32 vectors of shape `[length]`.

    Example:

    >>> ds = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[4, 5, 6], [7, 8]]))
    >>> [w.tolist() for w in pack_windows(ds, 2).as_numpy_iterator()]
    [[4, 5], [6, 7], [8, 0]]
    """
    if not isinstance(length, int) or length < 1:
        raise ValueError(f"Window length must be a positive integer, got {length!r}.")
    chunks = dataset.ragged_batch(documents_per_chunk).map(
        lambda docs: (tf.cast(docs.flat_values, tf.int32), False))
    flush = tf.data.Dataset.from_tensors((tf.zeros([0], tf.int32), True))

    def step(carry, chunk_and_last):
        chunk, is_last = chunk_and_last
        tokens = tf.concat([carry, chunk], axis=0)
        size = tf.shape(tokens)[0]
        padded_size = tf.where(is_last, (size + length - 1) // length * length, size)
        tokens = tf.pad(tokens, [[0, padded_size - size]], constant_values=PAD_ID)
        full = padded_size // length * length
        windows = tf.reshape(tokens[:full], [-1, length])
        return tokens[full:], windows

    windows = chunks.concatenate(flush).scan(tf.zeros([0], tf.int32), step)
    return windows.unbatch()


def language_model_pair(tokens):
    """Splits `length + 1` tokens into `(inputs, targets)` for next-token prediction.

    Args:
        tokens: 1-D integer tensor of static length `L + 1`.

    Returns:
        `(tokens[:-1], tokens[1:])` as int32, each of length `L`.

    Example:

    >>> x, y = language_model_pair(tf.constant([1, 7, 8, 3]))
    >>> x.numpy().tolist(), y.numpy().tolist()
    ([1, 7, 8], [7, 8, 3])
    """
    tokens = tf.cast(tokens, tf.int32)
    return tokens[:-1], tokens[1:]
