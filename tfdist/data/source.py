"""The Source interface: where records come from and how they become examples.

A source knows its data; the pipeline (`tfdist.data.input_pipeline`) knows
distribution. The pipeline asks the source for the records of one shard
(`read`), maps `decode` over them in parallel, lets the source regroup them
into examples (`to_examples`, e.g. packing text into fixed windows), then
caches, shuffles, applies the optional training-only `augment`, repeats,
batches and prefetches.

To add a source (images, audio, ...), subclass `Source` and implement either
`read_file` (file-backed: the base class then handles file and record
sharding) or `read_all` (in-memory: records are sharded), plus `decode`.
"""

import inspect

import numpy as np
import tensorflow as tf

from tfdist.data import sharding
from tfdist.data.tokens import PAD_ID, language_model_pair, pack_windows, pad_or_truncate


READ_CYCLE_LENGTH = 8
"""Files `Source.read` reads in turn, one record from each (fewer when a shard has fewer)."""

MAX_GATHERED_BYTES = 2 ** 30
"""The largest shard of records in memory (in bytes) that `Source.examples_in_memory`
decodes into one more copy; a larger one is streamed record by record."""


class Source:
    """Base class of all input sources.

    Attributes:
        files: tuple of file paths in a fixed order (empty for in-memory
            sources). Sources that manage their own files (TFDS) leave it
            empty and override `num_files` and `read`.
        augment: `None`, or a method `augment(example) -> example` that the
            pipeline maps over examples in training only, after the cache
            (so random augmentations differ per epoch).
        keep_record_order: consecutive records belong together (lines of a
            text packed into windows): files of a shard are read one after
            the other and `decode` keeps the order, even when the pipeline
            is not deterministic. Default False (records are independent).
        skipped: None, or a `tfdist.data.corruption.SkippedRecords` log of
            the damaged data this source skipped (TFRecord sources built
            with `skip_corrupt_records=True`).
        orders_files: `read` honours a `file_order` (True when `read` takes
            one, as the base class's does; False for TFDS sources, whose
            `read` lets TFDS order the shard files).
        to_example: None, or a method `to_example(decoded) -> example` for a
            source whose `to_examples` maps each decoded record to exactly one
            example and caches nothing: a positioned pipeline then skips
            records before decoding them.
        finish_example: None, or a method `finish_example(element) -> example`
            for a source whose `to_examples` ends with a map of it over the
            elements `to_unfinished_examples` returns: a positioned pipeline
            shuffles and skips unfinished elements and finishes only those it
            keeps (a map costs a function call per element, ~10 us on a CPU
            core; skipping through one costs seconds per 100,000 elements).
        finish_batch, augment_batch_with_seeds: None, or methods
            `finish_batch(batch) -> batch` (what `finish_example` does, for a
            whole batch) and `augment_batch_with_seeds(batch, seeds) -> batch`
            (the training augmentation of a batch, `seeds` `[batch, 2]`, one
            per example): a positioned pipeline then finishes and augments
            after batching, vectorised (images: `ImageSource`).
        records_in_memory: `read_all` serves records held in memory (arrays)
            and a record decodes to one example (`to_example`): a positioned
            pipeline then decodes its shard once (`examples_in_memory`) and
            gathers each batch from it, without a tf.data step per example.

    Example (an in-memory source of squares):

    >>> class Squares(Source):
    ...     def read_all(self):
    ...         return tf.data.Dataset.range(10)
    ...     def decode(self, record):
    ...         return record, record * record
    """

    files = ()
    augment = None
    keep_record_order = False
    skipped = None
    to_example = None
    finish_example = None
    finish_batch = None
    augment_batch_with_seeds = None
    records_in_memory = False

    @property
    def orders_files(self):
        """Whether `read` takes a `file_order` (a subclass's own `read` may not)."""
        return "file_order" in inspect.signature(self.read).parameters

    @property
    def caches_examples(self):
        """Whether `to_examples` caches what it is given (read once, then served from memory)."""
        return False

    @property
    def num_files(self):
        """Number of independently readable files (0 for in-memory sources)."""
        return len(self.files)

    @property
    def num_examples(self):
        """Number of examples in the whole source, or None when unknown."""
        return None

    def read_file(self, path):
        """Returns the records of one file as a `tf.data.Dataset`.

        Args:
            path: scalar `tf.string` tensor, one entry of `files`.
        """
        raise NotImplementedError(f"{type(self).__name__} does not read files.")

    def read_all(self):
        """Returns every record of the source, always in the same order.

        The default reads `files` one after the other. Record sharding keeps
        every N-th record of this stream, so its order must be identical in
        every worker (no parallel, non-deterministic interleaving here).
        """
        if not self.files:
            raise NotImplementedError(
                f"{type(self).__name__} has no files: implement read_all() or read_file().")
        return tf.data.Dataset.from_tensor_slices(list(self.files)).flat_map(self.read_file)

    def read(self, plan, *, shuffle_files=False, seed=None, file_order=None):
        """Returns the raw records of one input pipeline's shard.

        Args:
            plan: a `tfdist.data.sharding.ShardPlan`.
            shuffle_files: shuffle the order of this shard's files (file
                mode only; reshuffled every epoch).
            seed: seed of that shuffle, or None.
            file_order: None, or a 1-D int tensor permuting `plan.files`:
                read the shard's files in that order (file mode only; a
                positioned pipeline gives each pass its own order).

        Example:

        >>> plan = sharding.plan_sharding(source.num_files, 2, 0, files=source.files)
        >>> records = source.read(plan)
        """
        return self.grouped(self._read_records(plan, shuffle_files=shuffle_files, seed=seed,
                                               file_order=file_order))

    def grouped(self, records):
        """The records every read of the base class hands on (`read`,
        `read_in_any_order`, `read_in_sequence`): `records` as they are. A
        source whose `decode` takes a block of records at once overrides it
        (packed `TFRecordSource`: blocks of `RECORDS_PER_BLOCK`).

        Example:

        >>> source.grouped(tf.data.Dataset.range(3)).cardinality().numpy()
        3
        """
        return records

    def _read_records(self, plan, *, shuffle_files=False, seed=None, file_order=None,
                      parallel=True):
        """What the base class's `read` gives; `parallel=False`: in the same order,
        each file read in turn by one thread (cheaper a record, slower on remote storage)."""
        if plan.mode == sharding.FILE:
            files = list(plan.files)
            if not files:
                raise ValueError(f"{type(self).__name__}: file-sharding plan lists no files.")
            if file_order is not None:
                dataset = tf.data.Dataset.from_tensor_slices(tf.gather(files, file_order))
            else:
                dataset = tf.data.Dataset.from_tensor_slices(files)
                if shuffle_files and len(files) > 1:
                    dataset = dataset.shuffle(len(files), seed=seed,
                                              reshuffle_each_iteration=True)
            return self._read_each(dataset, len(files), parallel=parallel)
        if plan.mode == sharding.RECORD:
            return self.read_all().shard(plan.count, plan.index)
        raise ValueError(f"Unknown shard mode {plan.mode!r}; expected one of {sharding.MODES}.")

    def read_in_any_order(self, plan):
        """The raw records of `plan`'s shard, in whichever order reads them fastest: to count them.

        A resumed pipeline counts a pass of records to skip whole passes
        (`DatasetFn.positioned`); the count does not depend on the order.
        `read` interleaves a file-sharded shard's files in parallel (about
        5 us a record on 2 cores: 1.4 s to find that a pass holds 320,000
        ImageNet records), while one file after another costs about 0.6 us.
        A source with a `read` of its own gets `read(plan)`.

        Example:

        >>> int(source.read_in_any_order(plan).reduce(0, lambda count, _: count + 1))
        320000
        """
        if (type(self).read is Source.read and plan.mode == sharding.FILE
                and len(plan.files) > 1):
            files = tf.data.Dataset.from_tensor_slices(list(plan.files))
            return self.grouped(files.flat_map(self.read_file))
        return self.read(plan)

    def _read_each(self, paths, num_files, *, parallel=True):
        """The records of the files `paths` gives, interleaved as `read` does: in
        turn from up to `READ_CYCLE_LENGTH` open files (one after another with
        `keep_record_order`), in parallel or not (the same order either way)."""
        if self.keep_record_order:
            return paths.flat_map(self.read_file)
        return paths.interleave(self.read_file, cycle_length=min(num_files, READ_CYCLE_LENGTH),
                                block_length=1,
                                num_parallel_calls=tf.data.AUTOTUNE if parallel else None)

    def read_in_sequence(self, plan, file_order=None):
        """What `read(plan, file_order=file_order)` gives, in the same order, read
        without parallel reads: about 1 us a record instead of 5 on 2 cores, to
        skip through (a remote store reads faster in parallel). A source with a
        `read` of its own gets that `read`.

        Example:

        >>> skipped = source.read_in_sequence(plan).take(300_000)
        """
        if type(self).read is not Source.read:
            return self.read(plan) if file_order is None else self.read(plan, file_order=file_order)
        return self.grouped(self._read_records(plan, file_order=file_order, parallel=False))

    def examples_in_memory(self, plan):
        """The decoded examples of `plan`'s shard, stacked (a leading example axis), or None.

        Only a source whose records are in memory (`records_in_memory`), one
        example per record (`to_example`) of fixed-size numbers, sharded by
        record, of at most `MAX_GATHERED_BYTES`, and only when
        called eagerly (as `distribute_datasets_from_function` calls a
        dataset function); None otherwise, and for an empty shard. Row i is
        the i-th element of `self.read(plan).map(self.decode)`.

        Example:

        >>> plan = sharding.plan_sharding(0, 2, 1)
        >>> images, labels = ShapesSource(num_examples=10).examples_in_memory(plan)
        >>> images.shape
        TensorShape([5, 32, 32, 3])
        """
        if not (self.records_in_memory and callable(self.to_example)
                and plan.mode == sharding.RECORD and tf.executing_eagerly()):
            return None
        total = self.num_examples
        count = len(range(plan.index, total, plan.count)) if total is not None else 0
        records = self.read(plan)
        specs = tf.nest.flatten(records.element_spec)
        if count == 0 or not all(spec.shape.is_fully_defined() and spec.dtype != tf.string
                                 for spec in specs):
            return None
        record_bytes = sum(spec.shape.num_elements() * spec.dtype.size for spec in specs)
        if count * record_bytes > MAX_GATHERED_BYTES:
            return None  # streamed: a second copy of so much would cost more than it saves
        # (`Dataset.map` unpacks a tuple record into arguments; `decode` takes it whole.)
        decoded = records.map(lambda *record: self.decode(
            record if len(record) > 1 else record[0]),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return decoded.batch(count).get_single_element()

    def decode(self, record):
        """Maps one raw record to a parsed element (run in parallel). Identity by default."""
        return record

    def to_examples(self, dataset):
        """Regroups decoded elements into examples (dataset-level). Identity by default."""
        return dataset

    def to_unfinished_examples(self, dataset):
        """`to_examples` without its last map of `finish_example` (all of it when that is None).

        Example:

        >>> windows = source.to_unfinished_examples(decoded)   # SequenceSource: token windows
        >>> examples = windows.map(source.finish_example)        # = source.to_examples(decoded)
        """
        return self.to_examples(dataset)

    def describe(self):
        """Returns a one-line description of the source for logs."""
        return type(self).__name__


class SequenceSource(Source):
    """A source of `(inputs, targets)` int32 token vectors of a fixed length.

    Subclasses set `vocab_size`, `sequence_length` and `pack`, and make
    `decode` return a 1-D int32 token vector (a document) or an int32
    `tf.RaggedTensor` `[documents, None]` (a block of documents, when records
    are blocks: cheaper per token; then set `decodes_blocks = True`). `to_examples` then either packs the
    documents into consecutive windows of `sequence_length + 1` tokens
    (`pack=True`) or cuts/pads each document to that length (`pack=False`),
    and splits each window into `(inputs, targets)`.

    Build a model from a source with `source.vocab_size` and
    `source.sequence_length`; positions whose target is 0 are padding.

    Example:

    >>> source = make_source("text:/data/*.txt", sequence_length=64)
    >>> config = transformer_config("tiny", vocab_size=source.vocab_size,
    ...                             max_len=source.sequence_length)
    """

    vocab_size = None
    sequence_length = None
    pack = True
    decodes_blocks = False
    """Whether `decode` returns a block of documents (a ragged tensor), not one document."""

    def to_windows(self, dataset):
        """Turns a dataset of token vectors into windows of `sequence_length + 1` tokens.

        Packed (`pack=True`): the documents are concatenated and cut into
        consecutive windows. Otherwise each document is cut or padded to one.

        Example:

        >>> windows = source.to_windows(tf.data.Dataset.from_tensors(tf.constant([1, 5, 3])))
        """
        window = self.sequence_length + 1
        blocks = isinstance(dataset.element_spec, tf.RaggedTensorSpec)
        if self.pack:
            if blocks:
                dataset = dataset.map(lambda docs: docs.flat_values)
            return pack_windows(dataset, window)
        if blocks:
            return dataset.map(
                lambda docs: docs.to_tensor(default_value=PAD_ID, shape=[None, window]),
                num_parallel_calls=tf.data.AUTOTUNE).unbatch()
        return dataset.map(lambda tokens: pad_or_truncate(tokens, window),
                           num_parallel_calls=tf.data.AUTOTUNE)

    @property
    def windows_follow_from_tokens(self):
        """Whether a pass's windows number `ceil(tokens / (sequence_length + 1))`:
        packed by this class's `to_windows`, so a pass is counted from its
        tokens (`tokens_in`) without packing them.

        Example:

        >>> make_source("text:/data/*.txt", sequence_length=64).windows_follow_from_tokens
        True
        """
        own = type(self)
        return bool(self.pack) and all(
            getattr(own, name) is getattr(SequenceSource, name)
            for name in ("to_windows", "to_examples", "to_unfinished_examples"))

    def tokens_in(self, record):
        """How many tokens `decode(record)` gives, an int64 scalar. This decodes;
        a source that knows the number from the record's length overrides it.

        Example:

        >>> int(source.tokens_in(next(iter(source.read(plan)))))
        4160
        """
        ids = self.decode(record)
        values = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
        return tf.size(values, out_type=tf.int64)

    def to_examples(self, dataset):
        """Turns a dataset of token vectors into `(inputs, targets)` examples."""
        return self.to_windows(dataset).map(self.finish_example,
                                            num_parallel_calls=tf.data.AUTOTUNE)

    def to_unfinished_examples(self, dataset):
        """The token windows that `to_examples` splits (`to_windows`)."""
        return self.to_windows(dataset)

    def finish_example(self, window):
        """Splits one window of `sequence_length + 1` tokens into `(inputs, targets)`.

        Example:

        >>> inputs, targets = source.finish_example(tf.constant([1, 5, 3]))
        """
        return language_model_pair(window)

    @property
    def to_example(self):
        """One document cut or padded into `(inputs, targets)`, when each record is one
        document and is not packed (None otherwise: packing joins records)."""
        if self.pack or self.decodes_blocks:
            return None
        return self._document_example

    def _document_example(self, tokens):
        if isinstance(tokens, tf.RaggedTensor):
            raise TypeError(
                f"{type(self).__name__}.decode returned a block of documents (a ragged tensor) "
                "where one document was expected: set `decodes_blocks = True` on the class.")
        return self.finish_example(pad_or_truncate(tokens, self.sequence_length + 1))

    def chance(self):
        """Returns the loss/accuracy of a model that cannot learn, or None if unknown.

        Sources whose answers are determined by their prompts (the embedded
        tasks) return a `tfdist.data.embedded.Chance`.
        """
        return None

    def describe(self):
        return (f"{type(self).__name__}(vocab_size={self.vocab_size}, "
                f"sequence_length={self.sequence_length})")


class ArraySource(SequenceSource):
    """An in-memory source of ready `(inputs, targets)` token arrays.

    In-memory sources have no files, so they are always sharded by record.

    Args:
        inputs: int array `[num_examples, sequence_length]`.
        targets: int array of the same shape; 0 marks positions that do not
            count in the loss.
        vocab_size: number of token ids (every id must be below it).

    Raises:
        ValueError: shapes differ, are not 2-D, or an id is out of range.

    Example:

    >>> tokens = np.array([[1, 4, 5, 3], [1, 6, 7, 3]])
    >>> source = ArraySource.from_token_rows(tokens, vocab_size=8)
    >>> source.sequence_length, source.num_examples
    (3, 2)
    """

    pack = False

    def __init__(self, inputs, targets, vocab_size):
        inputs = np.asarray(inputs)
        targets = np.asarray(targets)
        if inputs.ndim != 2 or inputs.shape != targets.shape:
            raise ValueError("inputs and targets must be 2-D arrays of the same shape "
                             f"[num_examples, sequence_length]; got {inputs.shape} and "
                             f"{targets.shape}.")
        if inputs.shape[0] == 0:
            raise ValueError("ArraySource needs at least one example, got 0.")
        if not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}.")
        for name, array in (("inputs", inputs), ("targets", targets)):
            if array.dtype.kind not in "iub" and not (
                    array.dtype.kind == "f" and np.array_equal(array, np.round(array))):
                # a float such as 1.5 would be cut to the id 1 without a word
                odd = array[array != np.round(array)] if array.dtype.kind == "f" else array
                raise ValueError(f"{name} must hold integer token ids, got {array.dtype} values "
                                 f"such as {odd.flat[0].tolist()!r}.")
            low, high = int(array.min()), int(array.max())
            if low < 0 or high >= vocab_size:
                raise ValueError(f"{name} hold ids in [{low}, {high}], outside "
                                 f"[0, vocab_size={vocab_size}).")
        self.inputs = inputs.astype(np.int32)
        self.targets = targets.astype(np.int32)
        self.vocab_size = int(vocab_size)
        self.sequence_length = int(inputs.shape[1])

    @classmethod
    def from_token_rows(cls, tokens, vocab_size):
        """Builds a source from `[N, L + 1]` token rows (inputs = row[:-1], targets = row[1:]).

        Args:
            tokens: int array `[num_examples, sequence_length + 1]`.
            vocab_size: number of token ids.

        Example:

        >>> ArraySource.from_token_rows([[1, 4, 3]], vocab_size=5).targets.tolist()
        [[4, 3]]
        """
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or tokens.shape[1] < 2:
            raise ValueError(f"tokens must be a 2-D array with at least 2 columns, got shape "
                             f"{tokens.shape}.")
        return cls(tokens[:, :-1], tokens[:, 1:], vocab_size)

    @property
    def num_examples(self):
        return int(self.inputs.shape[0])

    def read_all(self):
        return tf.data.Dataset.from_tensor_slices((self.inputs, self.targets))

    finish_example = None

    def to_examples(self, dataset):
        return dataset

    def to_unfinished_examples(self, dataset):
        return dataset

    def to_example(self, decoded):
        """One record as its example (records are ready `(inputs, targets)` pairs).

        Example:

        >>> inputs, targets = source.to_example(source.decode(record))
        """
        return decoded

    def describe(self):
        return (f"{type(self).__name__}({self.num_examples} examples in memory, "
                f"vocab_size={self.vocab_size}, sequence_length={self.sequence_length})")

