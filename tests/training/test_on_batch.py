"""`Trainer.train_on_batch`, `test_on_batch` and `predict_on_batch` against Keras's own
on one device: a loop of single batches on 2 replicas ends with Keras's weights and
returns Keras's figures, batch after batch."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers.workers.train_common import mirrored
from tfdist.training import Trainer

BATCHES = 3
ROWS = 8


def classifier(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    outputs = keras.layers.Dense(3, activation="softmax")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def batches():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(BATCHES, ROWS, 5)).astype("float32")
    y = rng.integers(0, 3, size=(BATCHES, ROWS)).astype("int32")
    weights = rng.uniform(0.5, 2.0, size=(BATCHES, ROWS)).astype("float32")
    return x, y, weights


def run(model, on_batch_owner):
    """Trains batch by batch, then tests and predicts one batch; returns every figure."""
    x, y, weights = batches()
    trained = [on_batch_owner.train_on_batch(x[i], y[i], sample_weight=weights[i])
               for i in range(BATCHES)]
    with_class_weight = on_batch_owner.train_on_batch(x[0], y[0], class_weight={0: 1.0, 1: 2.0,
                                                                             2: 0.5},
                                                      return_dict=True)
    tested = on_batch_owner.test_on_batch(x[1], y[1], return_dict=True)
    predicted = on_batch_owner.predict_on_batch(x[2])
    return trained, with_class_weight, tested, predicted, model.get_weights()


@pytest.fixture(scope="module")
def one_device_keras():
    model = classifier()
    return run(model, model)


def test_a_loop_of_batches_on_two_replicas_equals_keras_on_one_device(one_device_keras):
    strategy = mirrored(2)
    with strategy.scope():
        model = classifier()
    trainer = Trainer(model)
    trained, with_class_weight, tested, predicted, weights = run(model, trainer)
    keras_trained, keras_class_weight, keras_tested, keras_predicted, keras_weights = (
        one_device_keras)
    for ours, theirs in zip(trained, keras_trained, strict=True):  # [loss, accuracy] per batch
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert with_class_weight.keys() == keras_class_weight.keys() == {"loss", "accuracy"}
    for name, value in keras_class_weight.items():
        assert with_class_weight[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    for name, value in keras_tested.items():
        assert tested[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    np.testing.assert_allclose(predicted, keras_predicted, rtol=1e-5, atol=1e-6)
    for ours, theirs in zip(weights, keras_weights, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert int(trainer.optimizer.iterations.numpy()) == BATCHES + 1


def test_the_comparison_can_fail(one_device_keras):
    """One batch fewer leaves the weights measurably elsewhere."""
    model = classifier()
    x, y, weights = batches()
    for i in range(BATCHES - 1):
        model.train_on_batch(x[i], y[i], sample_weight=weights[i])
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(
        model.get_weights(), one_device_keras[-1], strict=True))
    assert moved > 1e-3


def test_each_call_reports_its_own_batch_and_accumulation_updates_every_kth_call():
    strategy = mirrored(2)
    with strategy.scope():
        model = classifier()
    trainer = Trainer(model, grad_accum_steps=2)
    x, y, _ = batches()
    first = trainer.test_on_batch(x[0], y[0], return_dict=True)
    assert trainer.test_on_batch(x[0], y[0], return_dict=True) == pytest.approx(first)
    before = [w.copy() for w in model.get_weights()]
    trainer.train_on_batch(x[0], y[0])
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))
    trainer.train_on_batch(x[1], y[1])
    assert int(trainer.optimizer.iterations.numpy()) == 1
    assert not all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))


def test_what_is_not_one_batch_is_refused_naming_it():
    strategy = mirrored(2)
    with strategy.scope():
        model = classifier()
    trainer = Trainer(model)
    x, y, _ = batches()
    dataset = tf.data.Dataset.from_tensor_slices((x[0], y[0])).batch(4)
    with pytest.raises(ValueError, match=re.escape(
            "train_on_batch takes one batch of arrays or tensors (or a list / dict of them), got "
            "a tf.data.Dataset; for a dataset use fit, evaluate or predict.")):
        trainer.train_on_batch(dataset)
    with pytest.raises(ValueError, match=re.escape("test_on_batch got an empty batch (0 rows).")):
        trainer.test_on_batch(x[0][:0], y[0][:0])



def test_a_batch_that_does_not_split_evenly_over_the_replicas_is_still_keras_batch():
    """7 rows on 2 replicas (4 and 3): the figures and the update of Keras on one device."""
    x, y, _ = batches()
    keras_model = classifier()
    expected = (keras_model.train_on_batch(x[0][:7], y[0][:7], return_dict=True),
                keras_model.test_on_batch(x[1][:7], y[1][:7], return_dict=True),
                keras_model.predict_on_batch(x[2][:7]), keras_model.get_weights())
    strategy = mirrored(2)
    with strategy.scope():
        model = classifier()
    trainer = Trainer(model)
    actual = (trainer.train_on_batch(x[0][:7], y[0][:7], return_dict=True),
              trainer.test_on_batch(x[1][:7], y[1][:7], return_dict=True),
              trainer.predict_on_batch(x[2][:7]), model.get_weights())
    for ours, theirs in zip(actual[:2], expected[:2], strict=True):
        assert ours.keys() == theirs.keys()
        for name, value in theirs.items():
            assert ours[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    np.testing.assert_allclose(actual[2], expected[2], rtol=1e-5, atol=1e-6)
    for ours, theirs in zip(actual[3], expected[3], strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_a_model_split_into_pipeline_stages_trains_batch_by_batch_like_keras(one_device_keras):
    """model_parallel=2 (two stages on the 2 logical CPUs, 2 micro-batches)."""
    model = classifier()
    trainer = Trainer(model, model_parallel=2, micro_batches=2)
    trained, with_class_weight, tested, predicted, weights = run(model, trainer)
    for ours, theirs in zip(trained, one_device_keras[0], strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    for ours, theirs in zip(weights, one_device_keras[-1], strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(predicted, one_device_keras[3], rtol=1e-5, atol=1e-6)
