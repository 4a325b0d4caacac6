"""Where a Keras program run through `Trainer` used to differ from Keras itself:
a reused `Trainer` follows the model's latest `compile()` and `trainable`
state, `evaluate()` returns Keras's order, and `predict()` returns a
`tf.RaggedTensor` for ragged outputs. Under one device and 2 replicas; the
same programs run on 2 workers in tests/test_keras_programs_multiworker.py.
"""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import keras_programs as programs
from tfdist.training import Trainer
from helpers.workers.train_common import mirrored


# ------------------------------------------------- following the model (item 1)
@functools.lru_cache(maxsize=1)
def keras_fine_tuning():
    """Two-phase Keras fit on one device (computed once for the tests below)."""
    return programs.keras_fine_tune()


@pytest.mark.parametrize("replicas", [None, 2])
def test_fine_tuning_on_one_trainer_equals_two_phase_keras_fit(replicas):
    expected = keras_fine_tuning()
    strategy = None if replicas is None else mirrored(replicas)
    actual = programs.tfdist_fine_tune(strategy)
    programs.assert_same_fine_tuning(actual, expected)


def test_fine_tuning_comparison_can_fail():
    """Had the trainer kept the frozen base and the first learning rate, the
    weights would end elsewhere."""
    reference, _ = keras_fine_tuning()
    model, arguments, _ = programs.fine_tuning()
    model.fit(verbose=0, **arguments)
    model.fit(verbose=0, **arguments)  # phase 2 as if nothing had changed
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(
        model.get_weights(), reference, strict=True))
    assert moved > 1e-3


def test_an_unchanged_model_keeps_its_step_functions():
    model, arguments = programs.class_weights(mirrored(2))
    arguments.update(epochs=1, validation_split=0.0)
    trainer = Trainer(model)
    trainer.fit(verbose=0, **arguments)
    steps = trainer.step_functions
    trainer.fit(verbose=0, **arguments)
    trainer.evaluate(arguments["x"], arguments["y"], verbose=0)
    assert trainer.step_functions is steps


def test_a_new_compile_brings_its_settings_and_trainer_arguments_still_win():
    strategy = mirrored(2)
    model, arguments = programs.class_weights(strategy)
    trainer = Trainer(model, loss="mse", jit_compile=False)
    trainer.fit(verbose=0, **{**arguments, "y": arguments["y"].astype("float32")[:, None] * 0,
                              "class_weight": None, "epochs": 1})
    with strategy.scope():
        model.compile(keras.optimizers.SGD(0.5), "sparse_categorical_crossentropy",
                      metrics=["accuracy"], steps_per_execution=3, jit_compile=True)
    logs = trainer.evaluate(arguments["x"], arguments["y"].astype("float32")[:, None],
                            batch_size=16, return_dict=True, verbose=0)
    assert (trainer.steps_per_execution, trainer.jit_compile) == (3, False)
    assert trainer.optimizer.learning_rate.numpy() == pytest.approx(0.5)
    assert model.loss == "mse" and set(logs) == {"loss", "accuracy"}
    predictions = model.predict(arguments["x"], batch_size=16, verbose=0)
    assert logs["loss"] == pytest.approx(float(np.mean(np.mean(
        (predictions - arguments["y"][:, None]) ** 2, axis=-1))), rel=1e-5)


def test_a_layer_made_trainable_without_a_new_optimizer_is_refused_with_the_way_out():
    strategy = mirrored(2)
    model, arguments, _ = programs.fine_tuning(strategy)
    trainer = Trainer(model)
    trainer.fit(verbose=0, **arguments)
    model.get_layer("base").trainable = True
    with pytest.raises(ValueError, match=r"not built for \(.*base.*Compile the model again "
                                         r"with a new optimizer inside strategy.scope\(\)"):
        trainer.fit(verbose=0, **arguments)


def test_an_optimizer_from_outside_the_scope_is_refused_after_a_new_compile():
    strategy = mirrored(2)
    model, arguments, _ = programs.fine_tuning(strategy)
    trainer = Trainer(model)
    trainer.fit(verbose=0, **arguments)
    model.compile(keras.optimizers.SGD(0.01), "mse")  # not in strategy.scope()
    with pytest.raises(ValueError, match="created outside the scope"):
        trainer.fit(verbose=0, **arguments)


# ------------------------------------------------------ evaluate's order (item 2)
def _list_outputs_with_metrics(strategy=None):
    model, arguments = programs.list_outputs(strategy)
    with programs._scope(strategy):
        model.compile(keras.optimizers.SGD(0.05), loss=["mae", "binary_crossentropy"],
                      loss_weights=[0.5, 2.0], metrics=[["mse"], ["accuracy", "auc"]])
    return model, arguments


def _single_output_with_metrics(strategy=None):
    model, arguments = programs.sample_weights(strategy)
    with programs._scope(strategy):
        model.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"],
                      weighted_metrics=["mse"])
    return model, arguments


@pytest.mark.parametrize("program", [_single_output_with_metrics, _list_outputs_with_metrics,
                                     programs.two_outputs])
@pytest.mark.parametrize("replicas", [None, 2])
def test_evaluate_returns_keras_values_in_keras_order(program, replicas):
    expected_model, arguments = program()
    evaluation = dict(x=arguments["x"], y=arguments["y"], batch_size=arguments["batch_size"],
                      verbose=0)
    expected = expected_model.evaluate(**evaluation)
    model, _ = program(None if replicas is None else mirrored(replicas))
    trainer = Trainer(model)
    actual = trainer.evaluate(**evaluation)
    assert isinstance(actual, list) and len(actual) > 2
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-7)
    named = trainer.evaluate(**evaluation, return_dict=True)
    expected_named = expected_model.evaluate(**evaluation, return_dict=True)
    assert sorted(named) == sorted(expected_named)
    for name, value in expected_named.items():
        assert named[name] == pytest.approx(value, rel=1e-6, abs=1e-7), name


# ------------------------------------------------------- ragged outputs (item 3)
@pytest.mark.parametrize("replicas", [None, 2])
def test_predict_returns_a_ragged_tensor_for_ragged_outputs_like_keras(replicas):
    expected_model, arguments = programs.ragged_scorer()
    expected = expected_model.predict(verbose=0, **arguments)
    model, _ = programs.ragged_scorer(None if replicas is None else mirrored(replicas))
    actual = Trainer(model).predict(verbose=0, **arguments)
    assert isinstance(expected, tf.RaggedTensor) and isinstance(actual, tf.RaggedTensor)
    assert actual.row_lengths().numpy().tolist() == expected.row_lengths().numpy().tolist()
    np.testing.assert_allclose(actual.flat_values.numpy(), expected.flat_values.numpy(),
                               rtol=1e-6, atol=1e-7)


def test_predict_of_batches_with_different_lengths_is_ragged_like_keras():
    """Dense outputs whose non-batch shape changes between batches (per-batch
    padding) are joined into a RaggedTensor by Keras; so they are here."""
    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((None,)), keras.layers.Reshape((-1, 1)),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
    batches = tf.data.Dataset.from_tensors(tf.constant([[1.0, 0.0], [2.0, 3.0]])).concatenate(
        tf.data.Dataset.from_tensors(tf.constant([[4.0, 5.0, 6.0], [7.0, 0.0, 0.0]])))
    expected = model.predict(batches, verbose=0)
    actual = Trainer(model).predict(batches, verbose=0)
    assert isinstance(expected, tf.RaggedTensor) and isinstance(actual, tf.RaggedTensor)
    np.testing.assert_allclose(actual.flat_values.numpy(), expected.flat_values.numpy(),
                               rtol=1e-6)
    assert actual.row_lengths().numpy().tolist() == expected.row_lengths().numpy().tolist()


@pytest.mark.parametrize("replicas", [None, 2])
def test_validation_data_without_a_full_batch_logs_no_val_metrics_like_keras(replicas):
    """3 validation rows in batches of 4 with the remainder dropped: no batch. Keras logs
    no `val_` keys and `evaluate` returns []; tfdist did log `val_loss` 0.0."""
    x, y = np.ones((8, 2), "float32"), np.ones((8, 1), "float32")
    empty = tf.data.Dataset.from_tensor_slices((x[:3], y[:3])).batch(4, drop_remainder=True)

    def compiled():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse", metrics=["mae"])
        return model

    with pytest.warns(UserWarning):
        expected = compiled().fit(x, y, batch_size=4, validation_data=empty, verbose=0)
    strategy = None if replicas is None else mirrored(replicas)
    if strategy is None:
        model = compiled()
    else:
        with strategy.scope():
            model = compiled()
    trainer = Trainer(model, strategy=strategy)
    with pytest.warns(UserWarning, match="The evaluation data gave no batch"):
        history = trainer.fit(x, y, batch_size=4, validation_data=empty, verbose=0)
    assert set(history.history) - {"learning_rate"} == set(expected.history) == {"loss", "mae"}
    with pytest.warns(UserWarning, match="gave no batch"):
        assert trainer.evaluate(empty, verbose=0) == []
    with pytest.warns(UserWarning, match="gave no batch"):
        assert trainer.evaluate(empty, verbose=0, return_dict=True) == {}
