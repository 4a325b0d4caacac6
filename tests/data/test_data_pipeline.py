"""tfdist.data pipeline: sharding, exactly-once delivery, batching, determinism, cache."""

import collections
import logging
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers.replicas import replica_batches
from tfdist.data import (FILE, RECORD, ArraySource, Source, TextSource, TFRecordSource,
                         distribute_dataset, make_dataset_fn, per_replica_batch_size,
                         plan_sharding, write_text_tfrecords, write_token_tfrecords)
from tfdist.data import source as source_module
from tfdist.data.images import ShapesSource
from tfdist.data.tokens import BOS_ID, EOS_ID, NUM_RESERVED
from tfdist.data.translation_task import TranslationTaskSource
from tfdist.distribute.strategy_factory import create_strategy

VOCAB = 1000


def id_rows(ids):
    """Token rows `[BOS, 4 + id, 4 + id, EOS]`: example id = inputs[1] - 4."""
    return [[BOS_ID, NUM_RESERVED + i, NUM_RESERVED + i, EOS_ID] for i in ids]


def ids_of(inputs):
    return [int(i) - NUM_RESERVED for i in np.asarray(inputs)[:, 1]]


@pytest.fixture(scope="module")
def id_files(tmp_path_factory):
    """37 examples over 5 TFRecord files (uneven: 8, 8, 7, 7, 7) and 23 in one file."""
    directory = tmp_path_factory.mktemp("ids")
    write_token_tfrecords(id_rows(range(37)), str(directory / "many"), num_files=5)
    write_token_tfrecords(id_rows(range(23)), str(directory / "one"), num_files=1)
    return directory


def make_id_source(kind, directory):
    if kind == "five_files":
        return TFRecordSource(str(directory / "many-*.tfrecord"), sequence_length=3,
                              vocab_size=VOCAB), list(range(37))
    if kind == "one_file":
        return TFRecordSource(str(directory / "one-*.tfrecord"), sequence_length=3,
                              vocab_size=VOCAB), list(range(23))
    return ArraySource.from_token_rows(id_rows(range(19)), VOCAB), list(range(19))


@pytest.fixture(scope="module")
def mirrored():
    return create_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])


# --- shard decision -----------------------------------------------------------------------

def test_plan_shards_by_file_when_enough_files_else_by_record():
    assert plan_sharding(5, 2, 0).mode == FILE
    assert plan_sharding(2, 2, 1).mode == FILE
    assert plan_sharding(1, 2, 0).mode == RECORD
    assert plan_sharding(3, 4, 3).mode == RECORD
    assert plan_sharding(0, 1, 0).mode == RECORD
    files = ["f0", "f1", "f2", "f3", "f4"]
    assert plan_sharding(5, 2, 0, files=files).files == ("f0", "f2", "f4")
    assert plan_sharding(5, 2, 1, files=files).files == ("f1", "f3")
    assert plan_sharding(1, 2, 1, files=["f0"]).files == ()


@pytest.mark.parametrize("args, message", [
    ((2, 2, 2), r"input_pipeline_id must be in \[0, 2\), got 2"),
    ((2, 0, 0), r"num_input_pipelines must be >= 1, got 0"),
    ((-1, 1, 0), r"num_files must be a non-negative integer, got -1"),
])
def test_plan_rejects_bad_counts(args, message):
    with pytest.raises(ValueError, match=message):
        plan_sharding(*args)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"repeat": 2}, ValueError, "repeat must be True (repeat forever), False (one pass) or None "
                                "(repeat when training), got 2; for N passes over the data"),
    ({"repeat": 0}, ValueError, "repeat must be True (repeat forever), False (one pass)"),
    ({"seed": -1}, ValueError, "seed must be None or an integer in [0, 2**63), got -1."),
    ({"seed": "7"}, ValueError, "seed must be None or an integer in [0, 2**63), got '7'."),
    ({"source": None}, TypeError, "source must be a tfdist.data.Source (make_source("),
    ({"drop_remainder": "no"}, ValueError, "drop_remainder must be True or False, got 'no'."),
    ({"training": "false"}, ValueError, "training must be True or False, got 'false'."),
    ({"deterministic": 1}, ValueError, "deterministic must be True or False, got 1."),
], ids=["repeat-count", "repeat-zero", "seed-negative", "seed-text", "no-source",
        "drop-remainder-text", "training-text", "deterministic-int"])
def test_pipeline_arguments_it_would_misread_are_refused(kwargs, error, message):
    """repeat=2 (tf.data's `repeat(2)`, two passes) repeated forever; a bad seed or a
    missing source failed only when the pipeline was built; drop_remainder="no" or
    training="false" counted as True."""
    arguments = {"source": ArraySource(np.zeros((8, 4), "int32"), np.zeros((8, 4), "int32"), 4)}
    arguments.update(kwargs)
    with pytest.raises(error, match=re.escape(message)):
        make_dataset_fn(arguments.pop("source"), 4, **arguments)
    assert make_dataset_fn(ArraySource(np.zeros((8, 4), "int32"), np.zeros((8, 4), "int32"), 4),
                           4, seed=np.int64(3), repeat=False, drop_remainder=np.bool_(False)).seed == 3


@pytest.mark.parametrize("inputs, message", [
    (np.full((2, 4), 20), "inputs hold ids in [20, 20], outside [0, vocab_size=20)."),
    (np.full((2, 4), -1), "inputs hold ids in [-1, -1], outside [0, vocab_size=20)."),
    # a float id was cut to an integer without a word
    (np.r_[np.ones(7), 1.5].reshape(2, 4),
     "inputs must hold integer token ids, got float64 values such as 1.5."),
    (np.full((2, 4), "a"), "inputs must hold integer token ids, got <U1 values such as 'a'."),
])
def test_array_source_refuses_what_is_no_token_id(inputs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ArraySource(inputs, np.zeros((2, 4), "int32"), 20)
    whole = ArraySource(np.full((2, 4), 19.0), np.zeros((2, 4), "int32"), 20)  # integral floats
    assert whole.inputs.dtype == np.int32 and whole.inputs.max() == 19


@pytest.mark.parametrize("strategy, input_options, message", [
    (None, None, "strategy must be a tf.distribute.Strategy (tfdist.create_strategy(...), or "
                 "tf.distribute.get_strategy() for the default one), got None."),
    ("default", "per_worker", "input_options must be a tf.distribute.InputOptions or None, got "
                              "'per_worker'."),
])
def test_distribute_dataset_names_a_strategy_or_options_of_the_wrong_kind(strategy, input_options,
                                                                          message):
    """Both were AttributeErrors from deep inside (TensorFlow's, for the options)."""
    if strategy == "default":
        strategy = tf.distribute.get_strategy()
    source = ArraySource(np.zeros((8, 4), "int32"), np.zeros((8, 4), "int32"), 4)
    with pytest.raises(TypeError, match=re.escape(message)):
        distribute_dataset(strategy, source, 4, input_options=input_options)


@pytest.mark.parametrize("kind, pipelines, mode", [
    ("five_files", 2, FILE), ("five_files", 5, FILE), ("five_files", 3, FILE),
    ("five_files", 6, RECORD), ("one_file", 2, RECORD), ("memory", 3, RECORD),
])
def test_input_pipelines_partition_the_examples(id_files, kind, pipelines, mode):
    source, all_ids = make_id_source(kind, id_files)
    fn = make_dataset_fn(source, 2 * pipelines, training=True, seed=5, repeat=False,
                         drop_remainder=False)
    per_pipeline = []
    for index in range(pipelines):
        context = tf.distribute.InputContext(pipelines, index, pipelines)
        per_pipeline.append([i for x, _ in fn(context) for i in ids_of(x)])
        assert fn.plans[index].mode == mode
    seen = collections.Counter(i for ids in per_pipeline for i in ids)
    assert sorted(seen) == all_ids and set(seen.values()) == {1}
    assert all(per_pipeline), "a pipeline got no examples"


def test_shard_mode_is_logged(id_files, caplog, mirrored):
    source, _ = make_id_source("five_files", id_files)
    with caplog.at_level(logging.INFO, logger="tfdist.data"):
        distribute_dataset(mirrored, source, 4, training=False)
    messages = [r.getMessage() for r in caplog.records if r.name == "tfdist.data"]
    assert any("sharding by FILE" in m and "per-replica batch 2" in m for m in messages), messages


# --- exactly once across 2 replicas (MirroredStrategy on 2 logical CPUs) --------------------

@pytest.mark.parametrize("kind", ["five_files", "one_file", "memory"])
def test_two_replicas_see_every_example_exactly_once(id_files, mirrored, kind):
    assert mirrored.num_replicas_in_sync == 2
    source, all_ids = make_id_source(kind, id_files)
    dataset = distribute_dataset(mirrored, source, 4, training=True, seed=1, repeat=False,
                                 drop_remainder=False)
    per_replica = [[], []]
    for replica, x, y in replica_batches(mirrored, dataset):
        assert x.shape[0] <= 2 and x.dtype == tf.int32
        np.testing.assert_array_equal(x.numpy()[:, 1:], y.numpy()[:, :-1])
        per_replica[replica].extend(ids_of(x))
    assert all(per_replica), f"a replica got no examples: {per_replica}"
    seen = collections.Counter(per_replica[0] + per_replica[1])
    assert sorted(seen) == all_ids and set(seen.values()) == {1}


# --- batching ---------------------------------------------------------------------------

def test_global_batch_not_divisible_by_replicas_is_an_error(mirrored):
    source = ArraySource.from_token_rows(id_rows(range(10)), VOCAB)
    with pytest.raises(ValueError, match=r"global_batch_size=5 .*number of replicas \(2\)"):
        distribute_dataset(mirrored, source, 5)
    fn = make_dataset_fn(source, 6)
    with pytest.raises(ValueError, match=r"global_batch_size=6 .*replicas \(4\).*4 or 8"):
        fn(tf.distribute.InputContext(1, 0, num_replicas_in_sync=4))
    assert per_replica_batch_size(64, 4) == 16


def test_per_replica_batches_have_static_shape_and_drop_the_remainder():
    source = ArraySource.from_token_rows(id_rows(range(11)), VOCAB)
    fn = make_dataset_fn(source, 8, training=False)
    dataset = fn(tf.distribute.InputContext(1, 0, num_replicas_in_sync=4))
    assert dataset.element_spec[0].shape.as_list() == [2, 3]
    assert [ids_of(x) for x, _ in dataset] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def test_repeat_defaults_to_training():
    source = ArraySource.from_token_rows(id_rows(range(8)), VOCAB)
    train = make_dataset_fn(source, 4)(None)
    evaluate = make_dataset_fn(source, 4, training=False)(None)
    assert train.cardinality().numpy() == tf.data.INFINITE_CARDINALITY
    assert evaluate.cardinality().numpy() == 2


# --- determinism --------------------------------------------------------------------------

def first_ids(fn, batches):
    return [i for x, _ in fn(None).take(batches) for i in ids_of(x)]


@pytest.mark.parametrize("kind", ["five_files", "memory"])
def test_same_seed_gives_the_same_order(id_files, kind):
    source, all_ids = make_id_source(kind, id_files)
    batches = 3 * len(all_ids) // 4  # three epochs through the repeat

    def run(seed):
        fn = make_dataset_fn(source, 4, seed=seed, deterministic=True, shuffle_buffer=64)
        return first_ids(fn, batches)

    first, again, other = run(7), run(7), run(8)
    assert first == again
    assert first != other
    assert sorted(first[:len(all_ids)]) != first[:len(all_ids)]  # it did shuffle
    assert first[:len(all_ids)] != first[len(all_ids):2 * len(all_ids)]  # reshuffled per epoch


# --- cache and augment (the plug-in points an image source uses) ----------------------------

class NoisySource(Source):
    """Every decode and every augment call gives a new value (a counter), so a
    cache is observable. A counter, not a random draw: with a global seed set
    (as earlier tests in the session do) a random op in a dataset function
    repeats its values on every pass."""

    def __init__(self):
        self.calls = tf.Variable(0.0, trainable=False)

    def read_all(self):
        return tf.data.Dataset.range(6)

    def decode(self, record):
        return {"id": record, "value": self.calls.assign_add(1.0)}

    def augment(self, example):
        return dict(example, augment=self.calls.assign_add(1.0))


def two_epochs(fn):
    """Per epoch: {id: {key: value}} over one pass of the (non-repeated) dataset."""
    dataset = fn(None)
    result = []
    for _ in range(2):
        epoch = {}
        for batch in dataset:
            for row in range(batch["id"].shape[0]):
                epoch[int(batch["id"][row])] = {k: float(v[row]) for k, v in batch.items()
                                                if k != "id"}
        assert sorted(epoch) == list(range(6))
        result.append(epoch)
    return result


def test_cache_keeps_decoded_examples():
    first, second = two_epochs(make_dataset_fn(NoisySource(), 2, training=False, cache=True))
    assert first == second
    first, second = two_epochs(make_dataset_fn(NoisySource(), 2, training=False))
    assert first != second


def test_augment_runs_after_the_cache_and_in_training_only(tmp_path):
    fn = make_dataset_fn(NoisySource(), 2, training=True, repeat=False,
                         cache=str(tmp_path / "cache"))
    first, second = two_epochs(fn)
    assert [first[i]["value"] for i in range(6)] == [second[i]["value"] for i in range(6)]
    assert [first[i]["augment"] for i in range(6)] != [second[i]["augment"] for i in range(6)]
    assert list(tmp_path.glob("cache.pipeline-000-of-001*"))
    evaluation, _ = two_epochs(make_dataset_fn(NoisySource(), 2, training=False))
    assert all("augment" not in e for e in evaluation.values())


def test_text_source_windows_partition_across_pipelines(tmp_path):
    (tmp_path / "a.txt").write_text("".join(f"line {i:03d}\n" for i in range(150)))
    source = TextSource(str(tmp_path / "*.txt"), sequence_length=8, pack=False)
    fn = make_dataset_fn(source, 1, training=True, repeat=False, drop_remainder=False)
    lines = []
    for index in range(2):
        mine = []
        for inputs, targets in fn(tf.distribute.InputContext(2, index, 1)):
            mine.append(source.vocabulary.decode(np.concatenate(
                [inputs.numpy()[0, :1], targets.numpy()[0]])).decode())
        assert fn.plans[index].mode == RECORD and mine
        lines += mine
    assert sorted(lines) == [f"line {i:03d}\n" for i in range(150)]


class CountedRows(Source):
    """Id rows in memory whose decode counts its calls (on a variable), not cached."""

    def __init__(self, count, unknown_size=False):
        self.ids = np.arange(count, dtype=np.int64)
        self.decoded = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.unknown_size = unknown_size

    def to_examples(self, dataset):
        # A filter hides the size, as packing text into windows does.
        return dataset.filter(lambda _: True) if self.unknown_size else dataset

    def read_all(self):
        return tf.data.Dataset.from_tensor_slices(self.ids)

    def decode(self, record):
        self.decoded.assign_add(1)
        return record


def take(dataset, batches):
    return [batch.numpy().tolist() for batch in dataset.take(batches)]


@pytest.mark.parametrize("pipelines", [1, 2])
@pytest.mark.parametrize("start", [0, 3, 7, 40])
def test_a_positioned_pipeline_yields_what_the_whole_one_yields_after_those_batches(
        pipelines, start):
    """10 examples per pass, global batch 4: batch 40 is 16 passes in."""
    fn = make_dataset_fn(CountedRows(10), 4, seed=7)
    for index in range(pipelines):
        context = tf.distribute.InputContext(num_input_pipelines=pipelines,
                                             input_pipeline_id=index,
                                             num_replicas_in_sync=pipelines)
        whole = take(fn(context), start + 6)
        assert take(fn.positioned(start)(context), 6) == whole[start:]
    # The stream is pass after pass, each a shuffle of the examples:
    two_passes = sum(take(fn(None), 5), [])
    assert sorted(two_passes[:10]) == sorted(two_passes[10:]) == list(range(10))
    assert two_passes[:10] != two_passes[10:]


@pytest.mark.parametrize("global_seed", [0, 5])
def test_the_pass_order_depends_on_the_pipeline_seed_alone(global_seed):
    """A program's `tf.random.set_seed` (Keras's `set_random_seed`) does not
    change a seeded pipeline's order, so a resumed run that seeds differently
    still continues the same stream (a global seed of 0 once broke the build)."""
    fn = make_dataset_fn(CountedRows(10), 4, seed=7)
    tf.random.set_seed(global_seed)
    try:
        seeded = take(fn.positioned(3)(None), 6)
    finally:
        tf.random.set_seed(None)
    unseeded = take(fn.positioned(3)(None), 6)
    assert seeded == unseeded
    assert seeded != take(make_dataset_fn(CountedRows(10), 4, seed=8).positioned(3)(None), 6)


def test_images_gathered_from_memory_keep_their_order_whatever_the_global_seed():
    """The gathered path draws each pass's shuffle inside a dataset function,
    where a global seed would otherwise enter the shuffle's seed."""
    fn = make_dataset_fn(ShapesSource(30, 8), 4, seed=7)
    labels = lambda: [batch[1].numpy().tolist() for batch in fn.positioned(3)(None).take(12)]  # noqa: E731
    unseeded = labels()
    for global_seed in (0, 5):
        tf.random.set_seed(global_seed)
        try:
            assert labels() == unseeded
        finally:
            tf.random.set_seed(None)
    assert unseeded != [batch[1].numpy().tolist() for batch in
                        make_dataset_fn(ShapesSource(30, 8), 4, seed=8).positioned(3)(None).take(12)]


@pytest.mark.parametrize("unknown_size", [False, True], ids=["known_size", "counted_size"])
def test_positioning_skips_whole_passes_without_reading_them(unknown_size):
    """Starting 100 passes in reads a few passes before the first batch (one
    to count a pass whose size is unknown, the pass it starts in, and what the
    prefetching reads ahead), where the whole pipeline would read 100 passes."""
    source = CountedRows(10, unknown_size=unknown_size)
    fn = make_dataset_fn(source, 5, seed=7)
    later = fn.positioned(201)  # 1005 examples: pass 100, 5 examples in
    first = take(later(None), 1)
    assert source.decoded.numpy() <= 6 * 10
    assert first == take(fn(None), 202)[201:]


def test_token_records_are_counted_file_after_file_with_the_records_read_gives(id_files):
    """What a positioned pipeline counts (`read_in_any_order`): the records of
    the 5 files one after another, not interleaved as `read` gives them, and
    the same records; packed, in the same blocks as `read`."""
    source, ids = make_id_source("five_files", id_files)
    plan = plan_sharding(source.num_files, 1, 0, files=source.files)
    assert plan.mode == FILE
    counted = [ids_of([record]) for record in
               source.read_in_any_order(plan).map(source.decode).map(lambda t: t[:2])]
    file_by_file = [ids_of([record]) for path in plan.files
                    for record in tf.data.TFRecordDataset(path).map(source.decode)
                    .map(lambda t: t[:2])]
    assert counted == file_by_file
    read = [ids_of([record]) for record in source.read(plan).map(source.decode)
            .map(lambda t: t[:2])]
    assert sorted(counted) == sorted(read) == [[i] for i in ids] and counted != read
    packed = TFRecordSource(str(id_files / "many-*.tfrecord"), sequence_length=3,
                            vocab_size=VOCAB, pack=True)
    blocks = list(packed.read_in_any_order(plan))  # blocks of up to 256 records, as read gives
    assert [len(block) for block in blocks] == [len(block) for block in packed.read(plan)] == [37]
    assert [record for block in blocks for record in block.numpy()] == [
        record.numpy() for path in plan.files for record in tf.data.TFRecordDataset(path)]


@pytest.mark.parametrize("pipelines", [1, 2])
def test_a_positioned_pipeline_over_many_files_reads_them_in_a_new_order_every_pass(
        id_files, pipelines):
    """37 examples in 5 files; 2 pipelines shard by file (3 and 2 files each)."""
    source, ids = make_id_source("five_files", id_files)
    fn = make_dataset_fn(source, 2 * pipelines, seed=3)
    for index in range(pipelines):
        context = tf.distribute.InputContext(num_input_pipelines=pipelines,
                                             input_pipeline_id=index,
                                             num_replicas_in_sync=pipelines)
        whole = sum((ids_of(inputs) for inputs, _ in fn(context).take(70)), [])
        later = sum((ids_of(inputs) for inputs, _ in fn.positioned(41)(context).take(29)), [])
        assert later == whole[41 * 2:]
    if pipelines == 1:
        first, second = whole[:37], whole[37:74]
        assert sorted(first) == sorted(second) == ids
        assert first != second


class CountedImages(ShapesSource):
    """Embedded shapes decoded one record at a time, counting the decodes (no
    cache), read as a source of records that are not in memory (as files are)."""

    records_in_memory = False

    def __init__(self, count, **options):
        super().__init__(count, 8, seed=5, cache_decoded=False, **options)
        self.decoded = tf.Variable(0, dtype=tf.int64, trainable=False)

    def decode(self, record):
        self.decoded.assign_add(1)
        return super().decode(record)


class CountedImagesInMemory(CountedImages):
    """The same, as the embedded shapes are: records in memory."""

    records_in_memory = True


def test_a_source_of_one_example_per_record_skips_records_before_decoding_them():
    """A pass of 400 images, started 380 images in: the 380 are drawn as raw
    records but never decoded or augmented, and what follows is what the
    whole pipeline gives after them (augmented with the same seeds)."""
    source = CountedImages(400)
    fn = make_dataset_fn(source, 4, seed=2, shuffle_buffer=50)
    later = list(fn.positioned(95)(None).take(3))
    assert 0 < source.decoded.numpy() <= 100
    whole = list(fn(None).take(98))[95:]
    for (images, labels), (their_images, their_labels) in zip(later, whole, strict=True):
        np.testing.assert_array_equal(images, their_images)
        np.testing.assert_array_equal(labels, their_labels)


@pytest.mark.parametrize("options", [{}, {"train_crop": "none", "flip": False}],
                         ids=["augmented", "not_augmented"])
@pytest.mark.parametrize("pipelines", [1, 2])
@pytest.mark.parametrize("buffer", [1000, 37], ids=["whole_pass_buffer", "small_buffer"])
def test_images_in_memory_are_gathered_a_batch_at_a_time_as_they_would_be_streamed(
        options, pipelines, buffer):
    """A pass of 150 images (75 per pipeline), batches of 8 that straddle the
    passes: decoded once when the pipeline is built (not per example, not per
    pass), and batch for batch the very images, labels and augmentation the
    same source streamed record by record gives, from the start and from a
    position."""
    in_memory, streamed = (kind(150, **options) for kind in (CountedImagesInMemory, CountedImages))
    for index in range(pipelines):
        context = tf.distribute.InputContext(num_input_pipelines=pipelines,
                                             input_pipeline_id=index,
                                             num_replicas_in_sync=pipelines)
        for start in (0, 23):
            before = int(in_memory.decoded.numpy())
            gathered = list(make_dataset_fn(in_memory, 8 * pipelines, seed=6, shuffle_buffer=buffer)
                            .positioned(start)(context).take(30))
            assert int(in_memory.decoded.numpy()) - before == 150 // pipelines
            record_by_record = list(make_dataset_fn(streamed, 8 * pipelines, seed=6,
                                                    shuffle_buffer=buffer)
                                    .positioned(start)(context).take(30))
            for (images, labels), (their_images, their_labels) in zip(
                    gathered, record_by_record, strict=True):
                assert images.dtype == their_images.dtype and images.shape == (8, 8, 8, 3)
                np.testing.assert_array_equal(images, their_images)
                np.testing.assert_array_equal(labels, their_labels)


def test_only_records_in_memory_decoded_eagerly_are_given_as_arrays(monkeypatch):
    """`examples_in_memory`: the shard's decoded examples, row i the i-th of
    `read(plan).map(decode)`; None for records not in memory, for a file
    plan, for an empty shard, for a shard larger than `MAX_GATHERED_BYTES`,
    and inside a `tf.function` (a dataset function traced there, as a
    parameter-server worker's is, streams its records)."""
    source = ShapesSource(10, 8, seed=1)
    plan = plan_sharding(0, 3, 1)
    images, labels = source.examples_in_memory(plan)
    decoded = list(source.read(plan).map(lambda image, label: source.decode((image, label))))
    assert images.shape == (3, 8, 8, 3) and labels.dtype == tf.int32
    for image, label, (their_image, their_label) in zip(images, labels, decoded, strict=True):
        np.testing.assert_array_equal(image, their_image)
        assert int(label) == int(their_label)
    assert CountedImages(10).examples_in_memory(plan) is None
    assert ShapesSource(2, 8).examples_in_memory(plan_sharding(0, 3, 2)) is None
    assert tf.function(lambda: tf.constant(source.examples_in_memory(plan) is None))()
    assert ShapesSource(40, 8).examples_in_memory(plan) is not None
    monkeypatch.setattr(source_module, "MAX_GATHERED_BYTES", 13 * 8 * 8 * 3 + 13 * 4 - 1)
    assert ShapesSource(40, 8).examples_in_memory(plan) is None   # 13 records: 1 byte too many


def counting_calls(base, method):
    """`base` subclassed so that each call of its `method` adds 1 to `calls` (a variable)."""

    class Counted(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.calls = tf.Variable(0, dtype=tf.int64, trainable=False)

    def counted(self, *args):
        self.calls.assign_add(1)
        return getattr(base, method)(self, *args)

    setattr(Counted, method, counted)
    return Counted


CountedText = counting_calls(TextSource, "finish_example")
CountedTokenRecords = counting_calls(TFRecordSource, "decode")
CountedPairs = counting_calls(TranslationTaskSource, "decode")


def test_packed_text_is_skipped_as_windows_never_split_into_examples(tmp_path):
    """3,000 lines packed into 3,333 windows, started 2,400 windows in: the
    skipped windows are packed and shuffled (a window is a slice of the
    stream) but never split into (inputs, targets), the step that runs a
    function per window; what follows is what the whole pipeline gives."""
    (tmp_path / "a.txt").write_text("".join(f"line {i:04d}\n" for i in range(3000)))
    source = CountedText(str(tmp_path / "*.txt"), sequence_length=8)
    fn = make_dataset_fn(source, 8, seed=4, shuffle_buffer=100)
    later = [inputs.numpy().tolist() for inputs, _ in fn.positioned(300)(None).take(2)]
    finished = int(source.calls.numpy())
    assert 0 < finished <= 400
    whole = [inputs.numpy().tolist() for inputs, _ in fn(None).take(302)][300:]
    assert source.calls.numpy() - finished >= 302 * 8  # the whole pipeline splits each
    assert later == whole


def test_token_records_are_skipped_before_decoding_them(tmp_path):
    """600 token records of one example each, started 560 in: the skipped
    records are drawn raw and never parsed."""
    write_token_tfrecords(id_rows(range(600)), str(tmp_path / "ids"), num_files=3)
    source = CountedTokenRecords(str(tmp_path / "ids-*.tfrecord"), sequence_length=3,
                                 vocab_size=VOCAB)
    fn = make_dataset_fn(source, 8, seed=6, shuffle_buffer=64)
    later = [ids_of(inputs) for inputs, _ in fn.positioned(70)(None).take(3)]
    assert 0 < source.calls.numpy() <= 100
    whole = [ids_of(inputs) for inputs, _ in fn(None).take(73)][70:]
    assert later == whole


def test_sentence_pairs_are_skipped_without_running_a_function_on_them():
    """300 padded pairs, started 240 in: the skipped pairs are only drawn."""
    source = CountedPairs(num_examples=300)
    fn = make_dataset_fn(source, 4, seed=2, shuffle_buffer=64)
    later = [tf.nest.map_structure(lambda x: x.numpy().tolist(), batch)
             for batch in fn.positioned(60)(None).take(2)]
    assert 0 < source.calls.numpy() <= 40
    whole = [tf.nest.map_structure(lambda x: x.numpy().tolist(), batch)
             for batch in fn(None).take(62)][60:]
    assert later == whole


class LineBlocks(TextSource):
    """Text decoded in blocks of lines, its class not saying so."""

    decodes_blocks = False


def test_a_sequence_source_decoding_blocks_must_say_so(tmp_path):
    """Unpacked, a record is one example only when it decodes to one document."""
    (tmp_path / "a.txt").write_text("".join(f"line {i:03d}\n" for i in range(40)))
    undeclared = LineBlocks(str(tmp_path / "a.txt"), sequence_length=8, pack=False)
    with pytest.raises(TypeError, match="set `decodes_blocks = True` on the class"):
        make_dataset_fn(undeclared, 4, seed=1)(None)
    declared = TextSource(str(tmp_path / "a.txt"), sequence_length=8, pack=False)
    fn = make_dataset_fn(declared, 4, seed=1)
    later = [inputs.numpy().tolist() for inputs, _ in fn.positioned(12)(None).take(2)]
    assert later == [inputs.numpy().tolist() for inputs, _ in fn(None).take(14)][12:]


def test_only_a_seeded_repeated_training_pipeline_can_be_positioned(id_files):
    rows = CountedRows(10)
    assert make_dataset_fn(rows, 5, seed=1).can_position
    assert not make_dataset_fn(rows, 5).can_position  # no seed: a random order every run
    assert not make_dataset_fn(rows, 5, seed=1, training=False).can_position
    assert not make_dataset_fn(rows, 5, seed=1, repeat=False).can_position
    assert not make_dataset_fn(rows, 5, seed=1).for_parameter_server(2).can_position
    with pytest.raises(ValueError, match="cannot be started mid-stream"):
        make_dataset_fn(rows, 5).positioned(3)
    five, _ = make_id_source("five_files", id_files)  # each pass orders the files itself
    assert make_dataset_fn(five, 5, seed=1).can_position
    own = ReadsFilesItsOwnWay(str(id_files / "many-*.tfrecord"), sequence_length=3,
                              vocab_size=VOCAB)  # as a TFDS source, which orders its shards
    assert not make_dataset_fn(own, 5, seed=1).can_position
    assert make_dataset_fn(own, 5, seed=1, cache=True).can_position  # one order, cached
    with pytest.raises(ValueError, match="batches must be an integer >= 0, got -1"):
        make_dataset_fn(rows, 5, seed=1).positioned(-1)


class ReadsFilesItsOwnWay(TFRecordSource):
    def read(self, plan, *, shuffle_files=False, seed=None):
        return super().read(plan, shuffle_files=shuffle_files, seed=seed)


@pytest.fixture(scope="module")
def eleven_files(tmp_path_factory):
    """60 examples over 11 TFRecord files (6 or 5 each): more files than `read` opens at once."""
    directory = tmp_path_factory.mktemp("eleven")
    write_token_tfrecords(id_rows(range(60)), str(directory / "ids"), num_files=11)
    return directory


def test_read_in_sequence_gives_what_read_gives_in_the_same_order(eleven_files):
    """11 files of 6 or 5 records, 8 open at once: in a shuffled file order,
    `read_in_sequence` (no parallel reads) gives record for record what `read`
    gives, unpacked, and packed in the same blocks; the order is not file
    after file."""
    plan = plan_sharding(11, 1, 0, files=sorted(tf.io.gfile.glob(str(eleven_files / "ids-*"))))
    order = tf.random.experimental.stateless_shuffle(tf.range(11), seed=[3, 1])
    for pack in (False, True):
        source = TFRecordSource(str(eleven_files / "ids-*"), sequence_length=3,
                                vocab_size=VOCAB, pack=pack)
        read = [element.numpy() for element in source.read(plan, file_order=order)]
        in_sequence = [element.numpy() for element in source.read_in_sequence(plan, order)]
        assert len(read) == (1 if pack else 60)
        for theirs, ours in zip(read, in_sequence, strict=True):
            np.testing.assert_array_equal(ours, theirs)
    unpacked = TFRecordSource(str(eleven_files / "ids-*"), sequence_length=3, vocab_size=VOCAB)
    file_after_file = [record.numpy() for index in order.numpy()
                       for record in tf.data.TFRecordDataset(plan.files[index])]
    in_order = [record.numpy() for record in unpacked.read_in_sequence(plan, order)]
    assert sorted(in_order) == sorted(file_after_file) and in_order != file_after_file


@pytest.mark.parametrize("pack", [False, True])
def test_a_pipeline_resumed_inside_a_pass_reads_that_pass_in_sequence_and_lands_where_the_stream_is(
        eleven_files, pack, monkeypatch):
    """Token records in 11 files, with a global seed set (a shuffle's seed
    then depends on where it is built): resumed inside the first pass and
    inside the third, the pipeline gives what the whole stream gives there.
    The pass it resumes inside is read without parallel reads
    (`read_in_sequence`, with that pass's file order), and only that pass."""
    keras.utils.set_random_seed(7)
    source = TFRecordSource(str(eleven_files / "ids-*"), sequence_length=3, vocab_size=VOCAB,
                            pack=pack)
    fn = make_dataset_fn(source, 4, seed=5, shuffle_buffer=8)
    whole = [batch for batch in fn(None).take(60)]
    per_pass = len(list(source.to_unfinished_examples(
        source.read(fn.plans[0]).map(source.decode))))  # 60 unpacked; fewer windows packed
    reads = []
    read_in_sequence = source.read_in_sequence
    monkeypatch.setattr(source, "read_in_sequence", lambda plan, file_order=None: (
        reads.append(file_order is not None) or read_in_sequence(plan, file_order)))
    for start in (3, (2 * per_pass + 6) // 4):
        del reads[:]
        later = list(fn.positioned(start)(None).take(5))
        for (their_inputs, their_targets), (our_inputs, our_targets) in zip(
                whole[start:start + 5], later, strict=True):
            np.testing.assert_array_equal(our_inputs, their_inputs)
            np.testing.assert_array_equal(our_targets, their_targets)
        assert reads == [True]


class RemoteIds(Source):
    """Three files at `gs://` paths, served from memory: 7, 8 and 9 ids."""

    files = tuple(f"gs://bucket/ids-{index}" for index in range(3))

    def read_file(self, path):
        index = tf.strings.to_number(tf.strings.split(path, "-")[-1], tf.int64)
        return tf.data.Dataset.range(index * 100, index * 100 + 7 + index)

    def decode(self, record):
        return record, record


def test_files_in_a_remote_store_are_read_in_parallel_when_a_pipeline_resumes(monkeypatch):
    """Files at `gs://` paths: a pipeline resumed inside a pass reads them as a
    pass does (in parallel: sequential reads wait on the store a request at a
    time) and lands where the whole stream is."""
    source = RemoteIds()
    fn = make_dataset_fn(source, 3, seed=2, shuffle_buffer=5)
    whole = [inputs.numpy().tolist() for inputs, _ in fn(None).take(20)]
    reads = []
    monkeypatch.setattr(source, "read_in_sequence",
                        lambda plan, file_order=None: reads.append(plan) or pytest.fail(
                            "read in sequence"))
    later = [inputs.numpy().tolist() for inputs, _ in fn.positioned(11)(None).take(6)]
    assert later == whole[11:17] and reads == []


class BuiltVocabulary:
    """A vocabulary that is not bytes: two ids a text (so no count from lengths)."""

    vocab_size = 10

    def encode_batch(self, texts):
        return tf.RaggedTensor.from_row_lengths(
            tf.fill([2 * tf.size(texts)], 7), tf.fill([tf.size(texts)], tf.constant(2, tf.int64)))


def test_a_packed_pass_is_counted_from_its_tokens_as_packing_cuts_it(tmp_path):
    """Packed text lines, texts and token ids in TFRecords (3 files each), and
    texts with a vocabulary that is not bytes: each block's `tokens_in` is the
    number of ids `decode` gives it, so the windows a pass holds follow from
    its tokens; a pipeline resumed 2 passes and 3 batches in, counting them
    that way, gives what the whole stream gives there."""
    rng = np.random.default_rng(4)
    words = ["alpha", "é", "tau", "ü ü"]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(0, 9)))) for _ in range(300)]
    for number in range(3):
        (tmp_path / f"part-{number}.txt").write_text("\n".join(texts[number::3]) + "\n",
                                                     encoding="utf-8")
    write_text_tfrecords(texts, str(tmp_path / "texts"), num_files=3)
    write_token_tfrecords([list(rng.integers(4, 90, size=int(rng.integers(1, 30))))
                           for _ in range(300)], str(tmp_path / "ids"), num_files=3)
    sources = [TextSource(str(tmp_path / "part-*.txt"), sequence_length=15),
               TFRecordSource(str(tmp_path / "texts-*"), sequence_length=15, format="text",
                              pack=True),
               TFRecordSource(str(tmp_path / "ids-*"), sequence_length=15, vocab_size=90,
                              pack=True),
               TFRecordSource(str(tmp_path / "texts-*"), sequence_length=15, format="text",
                              pack=True, vocabulary=BuiltVocabulary())]
    for source in sources:
        assert source.windows_follow_from_tokens
        plan = plan_sharding(source.num_files, 1, 0, files=source.files)
        blocks = list(source.read(plan))
        counted = [int(source.tokens_in(block)) for block in blocks]
        decoded = [int(tf.size(source.decode(block).flat_values)) for block in blocks]
        assert counted == decoded and sum(counted) > 0
        windows = len(list(source.to_unfinished_examples(source.read(plan).map(source.decode))))
        assert windows == -(-sum(counted) // 16)
        fn = make_dataset_fn(source, 4, seed=6, shuffle_buffer=16)
        start = (2 * windows + 12) // 4
        whole = list(fn(None).skip(start).take(3))
        later = list(fn.positioned(start)(None).take(3))
        for (their_inputs, _), (our_inputs, _) in zip(whole, later, strict=True):
            np.testing.assert_array_equal(our_inputs, their_inputs)
    assert not ArraySource.from_token_rows([[4, 5, 6]] * 8, 10).windows_follow_from_tokens


@pytest.mark.parametrize("size", [0, 1, 1023, 1024, 1025, 3 * 1024 + 7])
def test_a_pass_of_strings_or_ragged_elements_is_counted_without_batching_them(size):
    """Counted as every 1,024th element and the ones after the last of them:
    exact on either side of a chunk, for strings and for elements of
    varying shape (which cannot be batched)."""
    from tfdist.data import input_pipeline
    strings = tf.data.Dataset.range(size).map(tf.strings.as_string)
    varying = tf.data.Dataset.range(size).map(lambda index: tf.range(index % 5))
    assert input_pipeline._count_without_copies(strings) == size
    assert input_pipeline._count_without_copies(varying) == size
