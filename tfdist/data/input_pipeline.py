"""Sharded, batched input pipelines: one `tf.data.Dataset` per input pipeline.

`make_dataset_fn` builds the function that
`strategy.distribute_datasets_from_function` calls once per input pipeline
(per worker) with a `tf.distribute.InputContext`; `distribute_dataset` does
that call. Per pipeline:

    read this pipeline's shard (by FILE or by RECORD, see tfdist.data.sharding)
    -> decode (parallel map) -> to_examples (e.g. pack text into windows)
    -> [cache] -> [shuffle, training] -> [augment, training] -> [repeat]
    -> batch(per-replica batch size) -> prefetch

Elements are per-replica batches: the strategy hands each replica its own.

A seeded training pipeline over images held in memory (the embedded
shapes) gives the same batches without a tf.data step per example: its
shard is decoded once, each pass's shuffle is drawn over indices, and each
batch is gathered, normalised and augmented at once (`_gathered_batches`).

Uneven shards: the number of examples per worker can differ (uneven files,
record counts not divisible by the number of workers). Train on a repeated
dataset (`repeat=True`, the default when training) with a fixed
`steps_per_epoch`, so every worker runs the same number of steps; otherwise a
worker that runs out first leaves the others waiting in an all-reduce.
"""

import contextlib
import logging
import numbers
import time

import tensorflow as tf

from tfdist.data import sharding
from tfdist.data.files import check_holds_examples
from tfdist.data.source import Source
from tfdist.runtime.argtypes import check_bool
from tfdist.seam import install_quiet_device_iterators, leave_tfdist_code_unconverted

# Multi-device iterators end without waiting for a tuner they do not use (see the seam).
install_quiet_device_iterators()
# tfdist's graph code is traced as written, without AutoGraph's rewrite (see the seam).
leave_tfdist_code_unconverted()

logger = logging.getLogger("tfdist.data")

DEFAULT_SHUFFLE_BUFFER = 10_000
DEFAULT_DETERMINISTIC_SEED = 0
_PASS_SEED_STRIDE = 1_000_003
"""Pass p of a positionable pipeline seeded s shuffles with seed s * stride + p."""
_ENDLESS = 2 ** 62
COUNT_SECONDS = 5.0
"""How long `count_examples` reads a source whose size it does not know, at most."""
_COUNT_CHUNK = 1024


def per_replica_batch_size(global_batch_size, num_replicas):
    """Returns `global_batch_size // num_replicas`, checking that it divides.

    Args:
        global_batch_size: examples per step across all replicas, >= 1.
        num_replicas: replicas in sync (all devices of all workers), >= 1.

    Raises:
        ValueError: not divisible (both numbers and valid neighbours named),
            or not positive integers.

    Example:

    >>> per_replica_batch_size(64, 4)
    16
    """
    for name, value in (("global_batch_size", global_batch_size), ("num_replicas", num_replicas)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    if global_batch_size % num_replicas:
        lower = global_batch_size // num_replicas * num_replicas
        upper = lower + num_replicas
        choices = f"{lower} or {upper}" if lower else f"{upper}"
        raise ValueError(
            f"global_batch_size={global_batch_size} is not divisible by the number of replicas "
            f"({num_replicas}): every replica must get the same batch. Use a multiple of "
            f"{num_replicas}, e.g. {choices}.")
    return global_batch_size // num_replicas


def _pass_size(examples, skip):
    """Examples in one pass, when known or when a pass is shorter than `skip`
    (counted then: reading one pass costs less than reading `skip`); else -1.

    No function runs per element (a call costs 10-40 us): fixed-size numbers
    (token windows) are counted in chunks in one read; other elements (raw
    records: batching would copy each string) are first skipped over, and
    counted only when the pass turns out shorter than `skip`, without a copy
    (`_count_without_copies`).
    """
    size = int(examples.cardinality())
    if size >= 0 or not tf.executing_eagerly():
        return size if size >= 0 else -1
    specs = tf.nest.flatten(examples.element_spec)
    batchable = all(spec.shape.is_fully_defined() for spec in specs)
    numbers = batchable and all(isinstance(spec, tf.TensorSpec) and spec.dtype != tf.string
                                for spec in specs)
    if not numbers and any(True for _ in examples.skip(skip - 1).take(1)):
        return -1
    examples = examples.take(skip)
    if numbers:
        counted = int(examples.batch(_COUNT_CHUNK).reduce(
            tf.constant(0, tf.int64),
            lambda count, chunk: count + tf.cast(tf.shape(tf.nest.flatten(chunk)[0])[0], tf.int64)))
    else:
        counted = _count_without_copies(examples)
    return counted if 0 < counted < skip else -1


def _count_without_copies(examples):
    """The elements of a finite dataset, counted without batching them (which
    copies each string) or a function call for each: every `_COUNT_CHUNK`-th
    element, then those from the last of them on (two reads, about 1 us an
    element each on 2 cores)."""
    zero = tf.constant(0, tf.int64)

    def count(dataset):
        return int(dataset.reduce(zero, lambda total, _: total + 1))

    groups = count(examples.shard(_COUNT_CHUNK, 0))
    if groups == 0:
        return 0
    before_last = (groups - 1) * _COUNT_CHUNK
    return before_last + count(examples.skip(before_last))


def _windows_in_pass(source, records, skip):
    """The windows a packed pass of `records` gives, counted from its tokens
    (`source.tokens_in`, without packing them): as `_pass_size`, -1 once
    they pass `skip` (read no further) or when not counted eagerly."""
    if not tf.executing_eagerly():
        return -1
    window = source.sequence_length + 1
    tokens = 0
    counts = records.map(_whole_element(source.tokens_in), num_parallel_calls=tf.data.AUTOTUNE)
    for chunk in counts.batch(_COUNT_CHUNK).as_numpy_iterator():
        tokens += int(chunk.sum())
        if tokens > skip * window:
            return -1
    windows = -(-tokens // window)
    return windows if 0 < windows < skip else -1


def _first_in_pass(pass_index, start_pass, offset):
    """Where pass `pass_index` starts: `offset` in the first pass of a resumed stream, else 0."""
    return tf.where(pass_index == start_pass, tf.constant(offset, tf.int64), 0)


def _on_local_disk(plan):
    """Whether a shard's files are on a local or mounted disk (no `scheme://` path),
    where reading them without parallel reads costs less a record."""
    return all("://" not in str(path) for path in plan.files)


def _one_record_order(plan):
    """Whether a shard's records come in one fixed order every pass (no file order to shuffle)."""
    return plan.mode == sharding.RECORD or len(plan.files) <= 1


def _whole_element(fn):
    """Wraps `fn(element)` for `Dataset.map`, which unpacks tuple elements into arguments."""
    def apply(*components):
        return fn(components[0] if len(components) == 1 else components)
    return apply


class DatasetFn:
    """The per-input-pipeline dataset function built by `make_dataset_fn`.

    Call it with a `tf.distribute.InputContext` (or None for one pipeline and
    one replica). It records how each pipeline was sharded.

    Attributes:
        plans: dict `{input_pipeline_id: ShardPlan}` of the calls so far.
        source, global_batch_size: as given.

    Example:

    >>> fn = make_dataset_fn(source, 64, training=False)
    >>> dataset = fn(tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0,
    ...                                         num_replicas_in_sync=2))
    >>> fn.plans[0].mode
    'record'
    """

    def __init__(self, source, global_batch_size, *, training=True,
                 shuffle_buffer=DEFAULT_SHUFFLE_BUFFER, seed=None, deterministic=False,
                 cache=False, repeat=None, drop_remainder=True):
        if not isinstance(source, Source):
            raise TypeError(f"source must be a tfdist.data.Source (make_source('embedded:reverse'), "
                            f"ArraySource(...), or a subclass of Source), got {source!r}.")
        per_replica_batch_size(global_batch_size, 1)  # type/positivity check
        if not isinstance(shuffle_buffer, int) or shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be a positive integer, got {shuffle_buffer!r}.")
        if not (isinstance(cache, bool) or isinstance(cache, str)):
            raise ValueError(f"cache must be True/False or a file path prefix, got {cache!r}.")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)
                                 or not 0 <= seed < 2**63):
            raise ValueError(f"seed must be None or an integer in [0, 2**63), got {seed!r}.")
        if not (repeat is None or isinstance(repeat, bool)):
            raise ValueError(
                f"repeat must be True (repeat forever), False (one pass) or None (repeat when "
                f"training), got {repeat!r}; for N passes over the data train N epochs of one "
                "pass each (repeat=False), or repeat with steps_per_epoch.")
        for name, value in (("training", training), ("deterministic", deterministic),
                            ("drop_remainder", drop_remainder)):
            check_bool(name, value)
        if seed is None and deterministic:
            seed = DEFAULT_DETERMINISTIC_SEED
        self.source = source
        self.global_batch_size = global_batch_size
        self.training = bool(training)
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.deterministic = bool(deterministic)
        self.cache = cache
        self.repeat = self.training if repeat is None else bool(repeat)
        self.drop_remainder = bool(drop_remainder)
        self.plans = {}
        self.parameter_server_workers = None
        self.start_batch = 0

    def _copy(self):
        copy = DatasetFn(self.source, self.global_batch_size, training=self.training,
                         shuffle_buffer=self.shuffle_buffer, seed=self.seed,
                         deterministic=self.deterministic, cache=self.cache, repeat=self.repeat,
                         drop_remainder=self.drop_remainder)
        copy.parameter_server_workers = self.parameter_server_workers
        copy.start_batch = self.start_batch
        return copy

    @property
    def can_position(self):
        """Whether `positioned` can start this pipeline mid-stream without replaying it.

        True for a seeded, repeated training pipeline (the recipes') whose
        source can be read in an order the pipeline gives it (in memory, one
        file, files it reads itself, or anything cached) and augments, if at
        all, with a seed it is given (`augment_with_seed`). A TFDS source of
        several shards (TFDS orders them), a parameter-server pipeline, or
        any other dataset is resumed by replaying the consumed batches.

        Example:

        >>> make_dataset_fn(make_source("embedded:reverse"), 64, seed=1).can_position
        True
        """
        source = self.source
        return (self.training and self.repeat and self.seed is not None
                and self.parameter_server_workers is None
                and (source.num_files <= 1 or source.orders_files or bool(self.cache)
                     or source.caches_examples)
                and (source.augment is None
                     or callable(getattr(source, "augment_with_seed", None))))

    def positioned(self, batches):
        """Returns a copy whose pipelines start after `batches` global batches.

        The copy yields exactly what this one yields after its first
        `batches` batches, without producing them: every pass over the data
        has its own file order and shuffle seed, so whole passes are skipped
        by starting at the next pass; within a pass the elements before the
        position are drawn but never augmented or batched (raw records, never
        decoded, for a source of one example per record; decoded examples for
        the others, once if cached). Use it to resume training at a data
        position (`Trainer.fit` does).

        Args:
            batches: global batches already consumed (an int >= 0).

        Raises:
            ValueError: the pipeline cannot be positioned (`can_position`).

        Example:

        >>> fn = make_dataset_fn(make_source("embedded:reverse"), 64, seed=1)
        >>> later = fn.positioned(402)   # what fn yields from its 403rd batch on
        """
        if not self.can_position:
            raise ValueError(
                "This input pipeline cannot be started mid-stream (it needs training=True, "
                "repeat, a seed, and an augmentation that takes its seed); resume it by "
                "replaying the consumed batches instead.")
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
            raise ValueError(f"batches must be an integer >= 0, got {batches!r}.")
        copy = self._copy()
        copy.start_batch = batches
        return copy

    def for_parameter_server(self, num_workers):
        """Returns a copy whose every worker reads only its own 1/`num_workers` of the records.

        Under `ParameterServerStrategy` each worker builds this pipeline
        (`ClusterCoordinator.create_per_worker_dataset`) with an input context
        of one pipeline; the copy shards by
        `tf.distribute.coordinator.experimental_get_current_worker_index()`.

        Example:

        >>> per_worker_fn = make_dataset_fn(source, 64).for_parameter_server(2)
        """
        copy = self._copy()
        copy.parameter_server_workers = int(num_workers)
        return copy

    def __call__(self, input_context=None):
        if input_context is None:
            input_context = tf.distribute.InputContext()
        batch_size = per_replica_batch_size(self.global_batch_size,
                                            input_context.num_replicas_in_sync)
        source = self.source
        files = list(source.files) if source.files else None
        plan = sharding.plan_sharding(source.num_files, input_context.num_input_pipelines,
                                      input_context.input_pipeline_id, files=files)
        self.plans[plan.index] = plan
        if plan.mode == sharding.FILE and plan.count > 1:
            check_holds_examples(plan.files, where=f"the files of input pipeline {plan.index} of "
                                                   f"{plan.count}, sharded by file")
        logger.info("%s; per-replica batch %d (global %d over %d replicas); source: %s",
                    plan.describe(), batch_size, self.global_batch_size,
                    input_context.num_replicas_in_sync, source.describe())

        if self.can_position:
            examples_per_step = batch_size * (input_context.num_replicas_in_sync
                                              // input_context.num_input_pipelines)
            skip = self.start_batch * examples_per_step
            dataset = self._gathered_batches(plan, skip, batch_size)
            finish_batch = None
            if dataset is None:
                dataset, finish_batch = self._passes(plan, skip)
                dataset = dataset.batch(batch_size, drop_remainder=self.drop_remainder,
                                        num_parallel_calls=tf.data.AUTOTUNE)
        else:  # (`positioned` refuses such a pipeline: it starts at batch 0)
            finish_batch = None
            records = source.read(plan, shuffle_files=self.training, seed=self.seed)
            if self.parameter_server_workers:
                # Called on each worker through ClusterCoordinator.create_per_worker_dataset,
                # where the input context says one pipeline: shard by the worker's index.
                records = records.shard(
                    self.parameter_server_workers,
                    tf.distribute.coordinator.experimental_get_current_worker_index())
            dataset = self._examples(records, plan)
            if self.training:
                dataset = dataset.shuffle(self.shuffle_buffer, seed=self.seed,
                                          reshuffle_each_iteration=True)
                if source.augment is not None:
                    dataset = dataset.map(_whole_element(source.augment),
                                          num_parallel_calls=tf.data.AUTOTUNE)
            if self.repeat:
                dataset = dataset.repeat()
            dataset = dataset.batch(batch_size, drop_remainder=self.drop_remainder,
                                    num_parallel_calls=tf.data.AUTOTUNE)
        if finish_batch is not None:
            dataset = dataset.map(finish_batch, num_parallel_calls=tf.data.AUTOTUNE)
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
        return dataset.with_options(self._options())

    def _examples(self, records, plan, *, finished=True):
        """The examples of `records`: decoded, regrouped by the source, cached if asked
        (with `finished=False`, never cached: the source's unfinished examples)."""
        source = self.source
        dataset = records.map(_whole_element(source.decode), num_parallel_calls=tf.data.AUTOTUNE,
                              deterministic=True if source.keep_record_order else None)
        if not finished:
            return source.to_unfinished_examples(dataset)
        dataset = source.to_examples(dataset)
        if self.cache:
            dataset = dataset.cache(self._cache_path(plan))
        return dataset

    def _gathered_batches(self, plan, skip, batch_size):
        """The batches of `_passes`, gathered from the shard's examples in memory, or None.

        For a source that decodes its shard in memory (`examples_in_memory`)
        and finishes a batch at once (`finish_batch`), when the pipeline
        caches nothing itself. Pass p shuffles the indices of the shard's
        examples exactly as `_passes` shuffles the examples (the same buffer
        and seed: a shuffle's order depends on neither the elements nor their
        type), and the first pass starts `skip % size` in, by slicing. The
        indices are cut into batches (`Dataset.rebatch`, across passes), and
        each batch is gathered, finished and augmented with the seeds of its
        examples' (pass, index): the same batches as `_passes` gives, without
        a tf.data step per example (about 6 of the 8 ms of CPU time that a
        batch of 128 shapes cost on a 2-core Zen 5).
        """
        finish_batch = self._batch_finisher()
        if self.cache or finish_batch is None:
            return None
        examples = self.source.examples_in_memory(plan)
        if examples is None:
            return None
        size = int(tf.nest.flatten(examples)[0].shape[0])
        start_pass, offset = divmod(skip, size)

        def indices_of_pass(pass_index):
            order = self._pass_order(tf.data.Dataset.range(size), pass_index)
            order = order.batch(size).get_single_element()
            first = _first_in_pass(pass_index, start_pass, offset)
            return (tf.fill([size - first], pass_index), tf.range(first, size), order[first:])

        def gathered(pass_indices, indices, order):
            decoded = tf.nest.map_structure(lambda stacked: tf.gather(stacked, order), examples)
            return finish_batch(pass_indices, indices, decoded)

        keys = tf.data.Dataset.range(start_pass, _ENDLESS).map(indices_of_pass)
        return keys.rebatch(batch_size, drop_remainder=self.drop_remainder).map(
            gathered, num_parallel_calls=tf.data.AUTOTUNE)

    def _augment_seeds(self):
        """`seeds_of(pass_index, index)`: the stateless seed, `[..., 2]`, of the example
        at `index` of pass `pass_index` (tensors of the same shape)."""
        seed = tf.constant(self.seed, tf.int64)
        augment_seed = tf.constant(getattr(self.source, "augment_seed", None) or 0, tf.int64)

        def seeds_of(pass_index, index):
            return tf.stack([seed * _PASS_SEED_STRIDE + pass_index,
                             augment_seed * _PASS_SEED_STRIDE + index], axis=-1)

        return seeds_of

    def _batch_finisher(self):
        """`finish(pass_indices, indices, decoded)`: a batch of decoded examples finished
        (`finish_batch`) and, when the source augments, augmented with the seeds of
        its examples (`augment_batch_with_seeds`); None when the source cannot."""
        source = self.source
        augments = source.augment is not None
        if not callable(source.finish_batch) or (
                augments and not callable(source.augment_batch_with_seeds)):
            return None
        seeds_of = self._augment_seeds()

        def finish(pass_indices, indices, decoded):
            batch = source.finish_batch(decoded)
            if not augments:
                return batch
            return source.augment_batch_with_seeds(batch, seeds_of(pass_indices, indices))

        return finish

    def _pass_order(self, elements, pass_index):
        """`elements` shuffled in the order of pass `pass_index`."""
        # The order of pass p is a function of the pipeline's seed and p
        # alone, not of `tf.random.set_seed` (a global seed would also make
        # TensorFlow compare this seed tensor with 0 in Python and fail).
        tf.compat.v1.get_default_graph().seed = None
        seed = tf.constant(self.seed, tf.int64) * _PASS_SEED_STRIDE + pass_index
        return elements.shuffle(self.shuffle_buffer, seed=seed, reshuffle_each_iteration=False)

    def _passes(self, plan, skip):
        """The training stream of a positionable pipeline, `skip` examples in.

        Pass p reads the shard's files in an order of its own (when they are
        not cached and more than one), shuffles its examples with its own
        seed, and augments each with a seed of (p, index in the pass): pass p
        is the same whether or not the passes before it were produced.
        Starting `skip` examples in starts at pass `skip // size` and drops
        `skip % size` elements of it, before augmentation, and before
        decoding for a source of one example per record (`to_example`), or
        before the last step for a source that has one (`finish_example`):
        nothing runs a function per element before the skip. A source that
        augments a batch at once (`augment_batch_with_seeds`, with
        `finish_batch`) is finished and augmented after batching, each
        example with its own seed of (p, index).

        Returns:
            `(stream, finish_batch)`: the stream of examples, and None or the
            function to map over its batches.
        """
        source = self.source
        caches = bool(self.cache) or source.caches_examples
        per_record = callable(source.to_example) and not caches
        finish = None if self.cache or per_record else source.finish_example
        augment = source.augment_with_seed if source.augment is not None else None
        # Finished and augmented a batch at a time when the source can (images
        # padded and cropped): vectorised, no function runs per example.
        finish_batch = self._batch_finisher()
        by_batch = (augment is not None and not self.cache and finish_batch is not None
                    and (per_record or finish is not None))
        stream = self._unfinished_passes(plan, skip, caches, per_record, finish,
                                         keyed=augment is not None)
        seeds_of = self._augment_seeds()

        if by_batch:
            if per_record:
                stream = stream.map(
                    lambda pass_index, indexed: (pass_index, (indexed[0],
                                                              source.decode(indexed[1]))),
                    num_parallel_calls=tf.data.AUTOTUNE)
            return stream, lambda pass_indices, indexed: finish_batch(pass_indices, *indexed)
        if not (per_record or finish or augment):
            return stream, None

        def finished(element):
            if per_record:
                return source.to_example(source.decode(element))
            return element if finish is None else finish(element)

        if augment is None:
            return stream.map(_whole_element(finished), num_parallel_calls=tf.data.AUTOTUNE), None

        def augmented(pass_index, indexed):
            index, element = indexed
            return augment(finished(element), seeds_of(pass_index, index))

        return stream.map(augmented, num_parallel_calls=tf.data.AUTOTUNE), None

    def _unfinished_passes(self, plan, skip, caches, per_record, finish, *, keyed):
        """Pass after pass of shuffled elements, `skip` in: raw records (`per_record`),
        unfinished examples (`finish`) or examples; `keyed`: each as
        `(pass, (index in the pass, element))`.

        Resumed inside a pass of several files on a local disk, that pass is
        read without parallel reads (`Source.read_in_sequence`: the same
        records in the same order, about 1 us a record to skip instead of 5 on
        2 cores); the passes after it are read in parallel again. Files in a
        remote store (`gs://`, ...) are read in parallel throughout.
        """
        source = self.source
        seed = tf.constant(self.seed, tf.int64)

        def elements(records):
            if per_record:
                return records
            return self._examples(records, plan, finished=finish is None)

        several_orders = not (caches or _one_record_order(plan))
        if several_orders:
            num_files = len(plan.files)

            def file_order(pass_index):
                return tf.random.experimental.stateless_shuffle(
                    tf.range(num_files), seed=tf.stack([seed, pass_index]))

            def unshuffled(pass_index):
                return elements(source.read(plan, file_order=file_order(pass_index)))
        else:
            records = source.read(plan)  # one order every pass (a cache keeps the first)
            fixed = elements(records)

            def unshuffled(pass_index):
                return fixed

        def shuffled(pass_index, unshuffled_elements, skipped):
            # Skipped here, nothing but the shuffle's draw touches a skipped
            # element: no function runs on it.
            order = self._pass_order(unshuffled_elements, pass_index).skip(skipped)
            if not keyed:
                return order
            # (p, (index in the pass, element)), zipped rather than mapped.
            return tf.data.Dataset.zip((tf.data.Dataset.from_tensors(pass_index).repeat(),
                                        order.enumerate(start=skipped)))

        # Where the stream starts: whole passes are skipped by counting one,
        # read without parallel reads: raw records and packed windows (from
        # their tokens) in any order, file after file; other elements in the
        # order a pass has them.
        in_sequence = several_orders and _on_local_disk(plan)
        size = -1
        if skip and per_record:
            size = _pass_size(source.read_in_any_order(plan), skip)
        elif skip and not caches and getattr(source, "windows_follow_from_tokens", False):
            size = _windows_in_pass(source, source.read_in_any_order(plan), skip)
        elif skip:
            counted = (elements(source.read_in_sequence(
                plan, file_order=file_order(tf.constant(0, tf.int64)))) if in_sequence
                else unshuffled(tf.constant(0, tf.int64)))
            size = _pass_size(counted, skip)
        start_pass, offset = divmod(skip, size) if size > 0 else (0, skip)

        def one_pass(pass_index):
            skipped = _first_in_pass(pass_index, start_pass, offset)
            return shuffled(pass_index, unshuffled(pass_index), skipped)

        if not (offset and in_sequence):
            return tf.data.Dataset.range(start_pass, _ENDLESS).flat_map(one_pass)

        def first_pass(pass_index):
            records = source.read_in_sequence(plan, file_order=file_order(pass_index))
            return shuffled(pass_index, elements(records), offset)

        # The pass the stream starts inside, read in sequence, then the rest.
        # Built in a dataset function as `one_pass` is: a shuffle's seed also
        # depends on where it is built once a global seed is set.
        return tf.data.Dataset.range(start_pass, start_pass + 1).flat_map(first_pass).concatenate(
            tf.data.Dataset.range(start_pass + 1, _ENDLESS).flat_map(one_pass))

    def _cache_path(self, plan):
        if self.cache is True:
            return ""
        return f"{self.cache}.pipeline-{plan.index:03d}-of-{plan.count:03d}"

    def _options(self):
        options = tf.data.Options()
        # Evaluation and prediction data keep their order (predictions line
        # up with the inputs, and a run is comparable with the next). A
        # seeded training pipeline keeps its order too: the same seed gives
        # the same batches, so a run resumed from a backup replays exactly the
        # data of an uninterrupted one (parallel steps that may reorder
        # elements made resumed runs differ, depending on thread timing).
        options.deterministic = self.deterministic or not self.training or self.seed is not None
        # Already sharded here; keep tf.distribute from sharding again.
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF)
        return options


def make_dataset_fn(source, global_batch_size, *, training=True,
                    shuffle_buffer=DEFAULT_SHUFFLE_BUFFER, seed=None, deterministic=False,
                    cache=False, repeat=None, drop_remainder=True):
    """Returns `fn(input_context) -> tf.data.Dataset` of per-replica batches.

    Args:
        source: a `tfdist.data.Source` (see `make_source`).
        global_batch_size: examples per step over all replicas; must be
            divisible by the number of replicas.
        training: shuffle files and examples and apply `source.augment`.
        shuffle_buffer: examples in the shuffle buffer.
        seed: shuffle seed (files and examples); the same seed gives the
            same order (a resumed run replays the same batches). None for a
            random order, where parallel steps may also reorder elements.
        deterministic: reproducible order: `tf.data.Options.deterministic`
            and a seeded shuffle (seed 0 when `seed` is None). Same seed,
            same order. Without it and without a seed, parallel steps may
            reorder training elements (faster); evaluation data
            (`training=False`) always keeps its order.
        cache: cache decoded examples before shuffling: True (memory) or a
            file path prefix (one cache file per input pipeline).
        repeat: repeat forever (None: repeat when training). With repeat,
            train with a fixed `steps_per_epoch` (see the module docstring).
        drop_remainder: drop the last partial batch (static batch shape).
            For evaluation over exactly every example, pass False.

    Returns:
        A `DatasetFn` (callable; records the shard plan per pipeline).

    Raises:
        ValueError: a bad argument; or, when called, a global batch size not
            divisible by the number of replicas.

    Example:

    >>> fn = make_dataset_fn(EmbeddedTaskSource("reverse"), 64, seed=1, deterministic=True)
    >>> inputs, targets = next(iter(fn(None)))
    >>> inputs.shape
    TensorShape([64, 18])
    """
    return DatasetFn(source, global_batch_size, training=training, shuffle_buffer=shuffle_buffer,
                     seed=seed, deterministic=deterministic, cache=cache, repeat=repeat,
                     drop_remainder=drop_remainder)


def distribute_dataset(strategy, source, global_batch_size, *, input_options=None, **kwargs):
    """Builds a `tf.distribute.DistributedDataset` of `source` for `strategy`.

    Uses `strategy.distribute_datasets_from_function(make_dataset_fn(...))`:
    each worker builds its own pipeline over its own shard, and each replica
    receives `global_batch_size / num_replicas_in_sync` examples per step.
    The shard decision is logged on the `tfdist.data` logger (INFO).

    Args:
        strategy: a `tf.distribute.Strategy`.
        source: a `tfdist.data.Source`.
        global_batch_size: examples per step over all replicas.
        input_options: optional `tf.distribute.InputOptions`.
        **kwargs: the keyword arguments of `make_dataset_fn` (`training`,
            `shuffle_buffer`, `seed`, `deterministic`, `cache`, `repeat`,
            `drop_remainder`).

    Returns:
        A `tf.distribute.DistributedDataset`; iterate it and pass elements to
        `strategy.run`. Under `ParameterServerStrategy`, the `DatasetFn`
        itself: `Trainer.fit` builds it on every worker, each reading its own
        shard of the records, and evaluates it on the chief.

    Raises:
        ValueError: `global_batch_size` not divisible by
            `strategy.num_replicas_in_sync` (both numbers are named).

    Example:

    >>> strategy = tf.distribute.MirroredStrategy()
    >>> source = make_source("embedded:reverse")
    >>> dataset = distribute_dataset(strategy, source, global_batch_size=64)
    >>> for inputs, targets in dataset:
    ...     strategy.run(train_step, args=(inputs, targets))
    """
    if not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(f"strategy must be a tf.distribute.Strategy (tfdist.create_strategy(...), "
                        f"or tf.distribute.get_strategy() for the default one), got {strategy!r}.")
    if input_options is not None and not isinstance(input_options, tf.distribute.InputOptions):
        raise TypeError(f"input_options must be a tf.distribute.InputOptions or None, got "
                        f"{input_options!r}.")
    per_replica_batch_size(global_batch_size, strategy.num_replicas_in_sync)
    dataset_fn = make_dataset_fn(source, global_batch_size, **kwargs)
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        # The chief cannot distribute a dataset itself: the Trainer builds the
        # pipeline on every worker (sharded by worker) and evaluates on the chief.
        return dataset_fn
    return strategy.distribute_datasets_from_function(dataset_fn, options=input_options)


def count_examples(source, limit=None, time_budget=COUNT_SECONDS):
    """The number of examples in `source`: known, or counted by reading it.

    A source that knows its size (`num_examples`; not a packed sequence
    source, whose size counts documents) is not read. Otherwise its
    examples are counted in one pass (sequence sources: decoded and packed
    as training sees them; other sources: one example per record), stopping
    at `limit` examples or after `time_budget` seconds. Skipped corrupt
    records are not noted in the source's `skipped` log by this pass.

    Args:
        source: a `tfdist.data.Source`.
        limit: stop counting after this many examples (None: count all).
        time_budget: seconds to spend reading at most.

    Returns:
        The number of examples, or None when it is unknown: more than
        `limit`, the time budget ran out, or the source cannot be read
        whole (e.g. a damaged file; training reports that).

    Example:

    >>> count_examples(make_source("text:/data/small.txt", sequence_length=64))
    55
    """
    known = source.num_examples
    if _packed(source):
        known = None  # the documents' count, not the windows packed from them
    if known is not None:
        return known if limit is None or known <= limit else None
    deadline = time.monotonic() + time_budget
    counted = 0
    try:
        with _without_skipped_log(source):
            sizes = _examples(source)
            if limit is not None:
                sizes = sizes.take(limit + 1)
            sizes = sizes.batch(_COUNT_CHUNK).map(lambda chunk: tf.shape(chunk)[0])
        for size in sizes:
            counted += int(size)
            if (limit is not None and counted > limit) or time.monotonic() > deadline:
                return None
    except (tf.errors.OpError, NotImplementedError, ValueError, TypeError) as error:
        logger.info("count_examples: %s not counted (%s).", source.describe(), error)
        return None
    return counted


def describe_epoch_passes(source, global_batch_size, steps_per_epoch, *,
                          time_budget=COUNT_SECONDS, steps_name="--steps-per-epoch"):
    """The line to say when one training epoch reads the data more than once, else None.

    Training repeats its dataset (`repeat=True`), so `steps_per_epoch` x
    `global_batch_size` beyond the number of examples reads them again
    inside the epoch, without an error. Call it once, before training, and
    log the line as a warning.

    Args:
        source: the training `Source`.
        global_batch_size: examples per step over all replicas.
        steps_per_epoch: steps in one epoch.
        time_budget: seconds to count a source that does not know its size
            (`count_examples`); when the count is not done by then, None.
        steps_name: how the line names the steps per epoch.

    Returns:
        A line such as "--steps-per-epoch 300 x global batch 32 = 9600
        examples per epoch, 174.5 passes over the 55 training examples: each
        epoch repeats the data", or None when an epoch reads each example at
        most once (or the count is unknown).

    Example:

    >>> line = describe_epoch_passes(train_source, 32, 300)
    >>> if line:
    ...     logging.getLogger("tfdist").warning(line)
    """
    per_epoch = int(steps_per_epoch) * int(global_batch_size)
    examples = count_examples(source, limit=per_epoch, time_budget=time_budget)
    if not examples or examples >= per_epoch:
        return None
    passes = per_epoch / examples
    passes = round(passes, 1 if passes >= 10 else 2)
    return (f"{steps_name} {steps_per_epoch} x global batch {global_batch_size} = {per_epoch} "
            f"examples per epoch, {passes:g} passes over the {examples} training examples: each "
            "epoch repeats the data")


def _examples(source):
    """Every example of `source` (one element per example), for counting."""
    from tfdist.data.source import SequenceSource

    files = list(source.files) if source.files else None
    records = source.read(sharding.plan_sharding(source.num_files, 1, 0, files=files))
    if not isinstance(source, SequenceSource):
        return records.map(lambda *_: 0)  # one record, one example
    decoded = records.map(_whole_element(source.decode), num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True)
    return source.to_examples(decoded).map(lambda *_: 0)


def _packed(source):
    from tfdist.data.source import SequenceSource

    return isinstance(source, SequenceSource) and bool(source.pack)


@contextlib.contextmanager
def _without_skipped_log(source):
    """Builds datasets whose skipped records go to a throwaway log, not the source's."""
    skipped = getattr(source, "skipped", None)
    if skipped is None:
        yield
        return
    source.skipped = type(skipped)()
    try:
        yield
    finally:
        source.skipped = skipped
