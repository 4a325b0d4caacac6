"""tfdist.training.arrays: in-memory (x, y) data as Keras's global batches, with seeded orders."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.trainers.data_adapters import array_slicing, data_adapter_utils
from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

from tfdist.training.arrays import (
    DEFAULT_BATCH_SIZE,
    array_dataset,
    is_array_input,
    python_input_dataset,
    shuffle_seed,
    split_validation,
)

ROWS, BATCH = 103, 10  # 10 full batches and a last one of 3 rows
SHUFFLES = [False, True, "batch"]


def row_data(rows=ROWS):
    """x whose row i is (i, -i), y = i: every batch tells which rows it holds."""
    ids = np.arange(rows)
    return np.stack([ids, -ids], axis=1).astype("float64"), ids


def passes(dataset, count=2):
    """The y batches of `count` passes (a new iterator each), as lists of lists."""
    return [[batch[1].numpy().tolist() for batch in dataset] for _ in range(count)]


def flat(batches):
    return [row for batch in batches for row in batch]


def assert_same_batches(expected, actual):
    tf.nest.assert_same_structure(expected, actual, expand_composites=False)
    for e, a in zip(tf.nest.flatten(expected), tf.nest.flatten(actual), strict=True):
        assert e.dtype == a.dtype
        np.testing.assert_array_equal(e.numpy(), a.numpy())


@pytest.mark.parametrize("shuffle", SHUFFLES)
def test_every_row_once_per_pass_with_a_short_last_batch(shuffle):
    x, y = row_data()
    dataset = array_dataset(x, y, batch_size=BATCH, shuffle=shuffle, seed=5)
    assert len(dataset) == math.ceil(ROWS / BATCH)
    for _ in range(2):
        batches = list(dataset)
        assert [int(b[1].shape[0]) for b in batches] == [BATCH] * 10 + [3]
        ids = np.concatenate([b[1].numpy() for b in batches])
        assert sorted(ids.tolist()) == list(range(ROWS))
        rows = np.concatenate([b[0].numpy() for b in batches])
        np.testing.assert_array_equal(rows, x[ids])  # x and y rows stay together
        assert (ids.tolist() == list(range(ROWS))) == (shuffle is False)


def test_shuffle_batch_is_kerass_within_batch_shuffle():
    """Keras's "batch": batches in input order, rows shuffled inside each, anew every pass."""
    x, y = row_data()
    first, second = passes(array_dataset(x, y, batch_size=BATCH, shuffle="batch", seed=5))
    blocks = [list(range(start, min(start + BATCH, ROWS))) for start in range(0, ROWS, BATCH)]
    for order in (first, second):
        assert [sorted(batch) for batch in order] == blocks
        # Each batch gets its own shuffle, not one permutation for all.
        arrangements = {tuple(np.argsort(batch)) for batch in order[:-1]}
        assert len(arrangements) > 5
    assert first != second


@pytest.mark.parametrize("shuffle", [True, "batch"])
def test_seeded_orders_ignore_the_global_seed(shuffle):
    x, y = row_data()
    tf.random.set_seed(1)
    one = passes(array_dataset(x, y, batch_size=BATCH, shuffle=shuffle, seed=42), 3)
    keras.utils.set_random_seed(2)  # a different global TF, numpy and Python seed
    other = array_dataset(x, y, batch_size=BATCH, shuffle=shuffle, seed=42)
    tf.random.set_seed(3)
    assert passes(other, 3) == one  # first iter() gives A, the second B, then C
    assert one[0] != one[1] != one[2]
    assert passes(array_dataset(x, y, batch_size=BATCH, shuffle=shuffle, seed=43), 1)[0] != one[0]


def test_unseeded_shuffle_draws_its_seed_from_the_global_seeds():
    x, y = row_data()
    keras.utils.set_random_seed(7)
    one = passes(array_dataset(x, y, batch_size=BATCH, shuffle=True))
    keras.utils.set_random_seed(7)
    assert passes(array_dataset(x, y, batch_size=BATCH, shuffle=True)) == one
    assert one[0] != one[1]
    np.random.seed(7)
    drawn = shuffle_seed()
    np.random.seed(7)
    assert shuffle_seed() == drawn and shuffle_seed(11) == 11


def test_element_forms_and_structures_equal_kerass_adapter():
    """Without shuffling, batches equal those of Keras's own ArrayDataAdapter: structure,
    dtypes (float64 and float16 become floatx), values, the (x,) wrapping of a tuple x."""
    rs = np.random.RandomState(0)
    n = 13
    cases = [
        dict(x=rs.rand(n, 2)),
        dict(x=rs.rand(n, 2), y=rs.rand(n)),
        dict(x=rs.rand(n, 2), y=rs.rand(n), sample_weight=rs.rand(n)),
        dict(x={"ids": rs.randint(0, 9, (n, 3)), "dense": rs.rand(n, 2)}, y=rs.rand(n, 1)),
        dict(x=[rs.rand(n, 2), rs.rand(n).astype("float16")]),
        dict(x=(rs.rand(n, 2), tf.constant(rs.rand(n, 4))), y=rs.randint(0, 2, n)),
        dict(x=rs.rand(n, 2), y={"a": rs.rand(n, 1), "b": rs.randint(0, 3, n)},
             sample_weight=rs.rand(n)),  # one weight array for every output, as Keras
        dict(x=rs.rand(n, 2), y=[rs.rand(n, 1), rs.rand(n, 2)],
             sample_weight=[rs.rand(n), rs.rand(n)]),
    ]
    for case in cases:
        ours = list(array_dataset(batch_size=5, **case))
        theirs = list(ArrayDataAdapter(batch_size=5, **case).get_tf_dataset())
        assert len(ours) == len(theirs) == 3
        for expected, actual in zip(theirs, ours, strict=True):
            assert_same_batches(expected, actual)
    x_only, with_y, with_weights = (next(iter(array_dataset(batch_size=5, **case)))
                                    for case in cases[:3])
    assert tf.is_tensor(x_only) and x_only.dtype == tf.float32
    assert isinstance(with_y, tuple) and len(with_y) == 2
    assert isinstance(with_weights, tuple) and len(with_weights) == 3
    dict_x = next(iter(array_dataset(batch_size=5, **cases[3])))[0]
    assert set(dict_x) == {"ids", "dense"} and dict_x["ids"].dtype == tf.int64
    list_x = next(iter(array_dataset(batch_size=5, **cases[4])))
    assert isinstance(list_x, tuple) and len(list_x) == 1 and len(list_x[0]) == 2


@pytest.mark.parametrize("labels", ["integers", "column", "one_hot"])
def test_class_weight_gives_kerass_sample_weights(labels):
    rs = np.random.RandomState(1)
    classes = rs.randint(0, 4, ROWS)
    y = {"integers": classes, "column": classes[:, None],
         "one_hot": np.eye(4, dtype="float32")[classes]}[labels]
    x, _ = row_data()
    class_weight = {0: 0.5, 1: 2.0, 3: 4.0}  # class 2 is missing: weight 1
    expected = data_adapter_utils.class_weight_to_sample_weights(y, class_weight)
    assert sorted(set(expected.tolist())) == [0.5, 1.0, 2.0, 4.0]
    dataset = array_dataset(x, y, batch_size=BATCH, shuffle=True, seed=3,
                            class_weight=class_weight)
    for batch_x, batch_y, weights in dataset:
        rows = batch_x.numpy()[:, 0].astype(int)
        np.testing.assert_array_equal(weights.numpy(), expected[rows])
        np.testing.assert_array_equal(batch_y.numpy(), y[rows])
    keras_batches = list(ArrayDataAdapter(x, y, batch_size=BATCH, class_weight=class_weight)
                         .get_tf_dataset())
    for expected_batch, batch in zip(keras_batches, array_dataset(
            x, y, batch_size=BATCH, class_weight=class_weight), strict=True):
        assert_same_batches(expected_batch, batch)


def test_split_validation_equals_kerass_split():
    x, y = row_data()
    weights = np.linspace(0, 1, ROWS)
    for data in ((x, y, weights), ({"a": x, "b": y}, [y, y], None), (x, None, None)):
        ours = split_validation(*data, 0.25)
        theirs = array_slicing.train_validation_split(data, validation_split=0.25)
        for part_ours, part_theirs in zip(ours, theirs, strict=True):
            tf.nest.map_structure(np.testing.assert_array_equal, part_ours, part_theirs)
    (train_x, train_y, train_w), (val_x, val_y, val_w) = split_validation(x, y, weights, 0.25)
    assert len(train_y) == 77 and val_y.tolist() == list(range(77, ROWS))  # the last rows
    assert train_x.dtype == val_x.dtype == np.float32  # Keras's floatx cast
    assert split_validation(x, y, None, 0) == ((x, y, None), None)
    assert split_validation(x, y, None, 0.0)[1] is None


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1, 1.5, float("nan"), "0.2", True, None])
def test_split_validation_refuses_bad_fractions(bad):
    x, y = row_data()
    with pytest.raises(ValueError, match=r"validation_split must be a float in \[0, 1\).*"
                       + repr(bad).replace("(", r"\(").replace(".", r"\.")):
        split_validation(x, y, None, bad)


def test_split_validation_refuses_datasets_and_too_few_rows():
    with pytest.raises(TypeError, match="validation_data"):
        split_validation(tf.data.Dataset.range(3), None, None, 0.5)
    with pytest.raises(ValueError, match="not sufficient"):  # Keras's own check
        split_validation(np.zeros((1, 2)), np.zeros(1), None, 0.5)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, None, "8"])
def test_bad_batch_size_is_named(bad):
    with pytest.raises(ValueError, match=f"batch_size must be an integer >= 1, got {bad!r}"):
        array_dataset(*row_data(), batch_size=bad)


@pytest.mark.parametrize("bad", ["yes", "Batch", 1, None, 0.5])
def test_bad_shuffle_is_named_with_the_allowed_values(bad):
    with pytest.raises(ValueError, match=rf"shuffle must be one of \(False, True, 'batch'\).*"
                       rf"got {bad!r}"):
        array_dataset(*row_data(), batch_size=BATCH, shuffle=bad)


@pytest.mark.parametrize("bad", ["1", 1.5, True])
def test_bad_seed_is_named(bad):
    with pytest.raises(ValueError, match=f"seed must be an int or None, got {bad!r}"):
        array_dataset(*row_data(), batch_size=BATCH, shuffle=True, seed=bad)


def test_mismatched_row_counts_are_listed():
    x, y = row_data()
    with pytest.raises(ValueError, match=r"same number of rows.*x: 103, y: 102"):
        array_dataset(x, y[:-1], batch_size=BATCH)
    with pytest.raises(ValueError, match=r"x\['a'\]: 103, x\['b'\]: 50, y: 103"):
        array_dataset({"a": x, "b": x[:50]}, y, batch_size=BATCH)
    with pytest.raises(ValueError, match=r"y: 103, sample_weight: 7"):
        array_dataset(x, y, np.ones(7), batch_size=BATCH)


def test_class_weight_refusals_match_keras():
    x, y = row_data()
    with pytest.raises(ValueError, match="class_weight and sample_weight cannot be used together"):
        array_dataset(x, y, np.ones(ROWS), batch_size=BATCH, class_weight={0: 2.0})
    with pytest.raises(ValueError, match="only supported for a single output"):
        array_dataset(x, (y, y), batch_size=BATCH, class_weight={0: 2.0})
    with pytest.raises(ValueError, match="needs targets y"):
        array_dataset(x, batch_size=BATCH, class_weight={0: 2.0})
    with pytest.raises(ValueError, match=r"class_weight must be a dict.*list"):
        array_dataset(x, y, batch_size=BATCH, class_weight=[1.0, 2.0])
    # Keras refuses the same combinations.
    with pytest.raises(ValueError):
        ArrayDataAdapter(x, y, np.ones(ROWS), class_weight={0: 2.0})
    with pytest.raises(ValueError):
        ArrayDataAdapter(x, (y, y), class_weight={0: 2.0})


def test_non_array_inputs_are_refused_with_their_type():
    def batches():
        yield np.zeros((2, 2))

    for bad, name in ((tf.data.Dataset.range(3), "_RangeDataset"), (batches(), "generator"),
                      ([[1.0, 2.0], [3.0, 4.0]], "list"), (None, "NoneType")):
        with pytest.raises(TypeError, match=f"x must be numpy arrays.*got {name}"):
            array_dataset(bad, batch_size=BATCH)
    with pytest.raises(TypeError, match="y must be numpy arrays.*got str"):
        array_dataset(np.zeros((3, 1)), "labels", batch_size=BATCH)
    with pytest.raises(ValueError, match=r"x is a scalar"):
        array_dataset(np.float32(3.0), batch_size=BATCH)


def test_is_array_input():
    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 1

        def __getitem__(self, index):
            return np.zeros((2, 2)), np.zeros(2)

    arrays = np.zeros((4, 2))
    strategy = tf.distribute.get_strategy()
    for yes in (arrays, tf.zeros((4, 2)), tf.ragged.constant([[1], [2, 3]]),
                [arrays, arrays], (arrays, None), {"a": arrays, "b": [tf.zeros(4)]}):
        assert is_array_input(yes), yes
    for no in (None, [], {}, tf.data.Dataset.range(3),
               strategy.experimental_distribute_dataset(tf.data.Dataset.range(3).batch(2)),
               lambda input_context: None, (i for i in range(3)), Batches(),
               [[1.0, 2.0], [3.0, 4.0]], "text", {"a": tf.data.Dataset.range(3)}):
        assert not is_array_input(no), no


def test_dataset_options_shard_by_data():
    options = array_dataset(*row_data(), batch_size=BATCH, shuffle=True, seed=1).options()
    assert (options.experimental_distribute.auto_shard_policy
            == tf.data.experimental.AutoShardPolicy.DATA)
    assert options.deterministic is True
    assert DEFAULT_BATCH_SIZE == 32


@pytest.mark.parametrize("shuffle", [True, "batch"])
def test_two_replicas_see_every_row_once_per_pass(shuffle):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    x, y = row_data()
    dataset = array_dataset(x, y, batch_size=BATCH, shuffle=shuffle, seed=9)
    distributed = strategy.experimental_distribute_dataset(dataset)
    expected = passes(array_dataset(x, y, batch_size=BATCH, shuffle=shuffle, seed=9))
    seen = []
    for _ in range(2):
        sizes, order = [], []
        for batch_x, batch_y in distributed:
            parts = strategy.experimental_local_results(batch_y)
            x_parts = strategy.experimental_local_results(batch_x)
            assert len(parts) == 2
            sizes.append([int(p.shape[0]) for p in parts])
            for part, x_part in zip(parts, x_parts, strict=True):
                np.testing.assert_array_equal(x_part.numpy(), x[part.numpy()])
            order.append([row for part in parts for row in part.numpy().tolist()])
        assert sizes == [[5, 5]] * 10 + [[2, 1]]  # the last batch is split too
        assert sorted(flat(order)) == list(range(ROWS))
        seen.append(order)
    assert seen == expected  # replicas split the same global batches, pass after pass


def test_data_sharding_across_two_workers_covers_every_row_once():
    """TensorFlow's DATA auto-shard rewrite (what MultiWorkerMirroredStrategy applies to
    each worker's copy), on two copies built under different global seeds."""
    from tensorflow.python.distribute import input_ops  # the rewrite tf.distribute uses

    x, y = row_data()
    shards = []
    for worker in range(2):
        tf.random.set_seed(100 + worker)
        copy = array_dataset(x, y, batch_size=BATCH, shuffle=True, seed=4)
        shards.append(passes(input_ops.auto_shard_dataset(copy, 2, worker, 2)))
    for pass_index in range(2):
        rows = flat(shards[0][pass_index]) + flat(shards[1][pass_index])
        assert sorted(rows) == list(range(ROWS))
    assert shards[0][0] != shards[0][1]


def test_python_input_dataset_uses_kerass_adapters():
    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 3

        def __getitem__(self, index):
            return np.full((2, 1), index, "float32"), np.array([0, 1])

    def generator():
        for index in range(3):
            yield np.full((2, 1), index, "float64"), np.array([0.0, 1.0])

    weighted = list(python_input_dataset(Batches(), class_weight={1: 3.0}))
    assert [b[2].numpy().tolist() for b in weighted] == [[1.0, 3.0]] * 3
    batches = list(python_input_dataset(generator()))
    assert [b[0].numpy().ravel().tolist() for b in batches] == [[0, 0], [1, 1], [2, 2]]
    with pytest.raises(ValueError, match="class_weight"):  # Keras refuses it for generators
        python_input_dataset(generator(), class_weight={1: 3.0})
    with pytest.raises(TypeError, match="generator or a keras.utils.PyDataset; got ndarray"):
        python_input_dataset(np.zeros((3, 1)))
