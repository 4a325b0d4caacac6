"""The input iterators tfdist makes end at once (no idle after the last step).

tf.data's autotune thread sleeps between passes, its period doubling up to
60 s, and deleting an iterator that runs one waits for the sleep to end: the
idle seen between the last step and the exit of multi-device runs. tfdist
distributes datasets with that thread off (`without_autotune_model`), unless
the dataset's own options ask for it.
"""

import os

import pytest
import tensorflow as tf

from tfdist.training.inputs import distribute, without_autotune_model


def test_a_dataset_without_autotune_options_gets_the_tuner_off_and_full_parallelism():
    dataset = without_autotune_model(tf.data.Dataset.range(8).batch(4))
    assert dataset.options().autotune.enabled is False
    assert dataset.options().autotune.initial_parallelism == os.cpu_count()
    # Same elements, same order.
    assert [b.numpy().tolist() for b in dataset] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("field, value", [("enabled", True), ("enabled", False),
                                          ("initial_parallelism", 3)])
def test_a_dataset_whose_options_set_autotune_is_left_as_it_is(field, value):
    options = tf.data.Options()
    setattr(options.autotune, field, value)
    dataset = tf.data.Dataset.range(8).with_options(options)
    assert without_autotune_model(dataset) is dataset


@pytest.mark.parametrize("form", ["dataset", "dataset_fn"])
def test_fit_evaluate_and_predict_iterate_their_datasets_without_the_tuner(form):
    # Under the default strategy the distributed dataset is the dataset itself,
    # so the options it runs with can be read back.
    dataset = tf.data.Dataset.range(8).batch(4)
    data = dataset if form == "dataset" else (lambda context: dataset)
    distributed = distribute(tf.distribute.get_strategy(), data)
    assert distributed.options().autotune.enabled is False
    assert [b.numpy().tolist() for b in distributed] == [[0, 1, 2, 3], [4, 5, 6, 7]]
