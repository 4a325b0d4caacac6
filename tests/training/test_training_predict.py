"""predict() returns rows in input order; evaluate() equals single-device evaluate."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.training import Trainer
from helpers.workers import train_common as common


def trainer_for(devices, model_fn=common.dense_model, loss="mse", **kwargs):
    strategy = devices if isinstance(devices, tf.distribute.Strategy) else common.mirrored(devices)
    model = model_fn(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1)
    return Trainer(model, optimizer, loss, strategy=strategy, **kwargs)


@pytest.fixture(scope="module")
def two_replicas():
    return trainer_for(2)


@pytest.mark.parametrize("rows", [37, 33])  # last batch 5 rows (3 + 2), 1 row (1 + 0)
def test_predict_returns_input_order_on_two_replicas(two_replicas, rows):
    x, y = common.regression_arrays(n=rows)
    expected = two_replicas.model(x).numpy()
    for element in (x, (x,), (x, y)):
        predictions = two_replicas.predict(common.dataset(element, 8), verbose=0)
        assert predictions.shape == expected.shape
        np.testing.assert_allclose(predictions, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["default", "one_device"])
def test_predict_and_evaluate_under_single_device_strategies(two_replicas, kind):
    strategy = (tf.distribute.get_strategy() if kind == "default"
                else tf.distribute.OneDeviceStrategy("/cpu:1"))
    trainer = trainer_for(strategy, metrics=["mae"])
    x, y = common.regression_arrays(n=37)
    np.testing.assert_allclose(trainer.predict(common.dataset(x, 8), verbose=0),
                               two_replicas.predict(common.dataset(x, 8), verbose=0),
                               rtol=1e-5, atol=1e-6)
    evaluation = trainer.evaluate(common.dataset((x, y), 8), return_dict=True, verbose=0)
    assert evaluation["loss"] == pytest.approx(
        float(np.mean((trainer.model(x).numpy() - y) ** 2)), rel=1e-5)


def test_predict_honours_steps_and_xla(two_replicas):
    x, _ = common.regression_arrays(n=37)
    xla = trainer_for(2, jit_compile=True)
    predictions = xla.predict(common.dataset(x, 8), steps=2, verbose=0)
    np.testing.assert_allclose(predictions, two_replicas.model(x[:16]).numpy(), rtol=1e-5,
                               atol=1e-6)


def test_evaluate_equals_one_device_with_masks_and_short_batches():
    tokens, targets = common.token_arrays(n=37)
    data = common.dataset((tokens, targets), 8)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    trainers = [trainer_for(n, common.token_model, loss, metrics=["accuracy"]) for n in (1, 2)]
    results = [t.evaluate(data, return_dict=True, verbose=0) for t in trainers]
    keras_result = trainers[0].model.evaluate(data, return_dict=True, verbose=0)  # Keras, 1 device
    assert set(results[0]) == {"loss", "accuracy"}
    for name in results[0]:
        assert results[0][name] == pytest.approx(keras_result[name], rel=1e-6)
        assert results[1][name] == pytest.approx(results[0][name], rel=1e-6)


def test_evaluate_weighted_metrics_and_list_output():
    x, y, sample_weight = common.regression_arrays(n=37, weighted=True)
    data = common.dataset((x, y, sample_weight), 8)
    results = [trainer_for(n, metrics=["mae"], weighted_metrics=["mse"])
               .evaluate(data, verbose=0) for n in (1, 2)]
    assert len(results[0]) == 3  # loss, mae, weighted mse
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6)
    # The weighted metric really is weighted, the plain one is not.
    assert results[0][2] != pytest.approx(float(np.mean(
        (trainer_for(1).model(x).numpy() - y) ** 2)), rel=1e-3)


def test_evaluate_steps_limits_batches():
    x, y = common.regression_arrays(n=37)
    trainer = trainer_for(2)
    first_two = trainer.evaluate(common.dataset((x, y), 8), steps=2, verbose=0)
    expected = float(np.mean((trainer.model(x[:16]).numpy() - y[:16]) ** 2))
    assert first_two == pytest.approx(expected, rel=1e-5)
    with pytest.warns(UserWarning, match="ran out of data"):
        trainer.evaluate(common.dataset((x, y), 8), steps=9, verbose=0)
