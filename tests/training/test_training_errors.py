"""Teaching errors for what the distributed step cannot do correctly."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.training import Trainer
from helpers.workers import train_common as common

DATA = common.dataset(common.regression_arrays(n=32), 16)


def sgd_in(strategy, **kwargs):
    with strategy.scope():
        return keras.optimizers.SGD(0.1, **kwargs)


def test_model_built_outside_the_scope_is_refused():
    strategy = common.mirrored(2)
    model = common.dense_model(tf.distribute.get_strategy())
    with pytest.raises(ValueError, match="built outside the scope.*MirroredStrategy"):
        Trainer(model, sgd_in(strategy), "mse", strategy=strategy)


def test_optimizer_created_outside_the_scope_is_refused():
    strategy = common.mirrored(2)
    with pytest.raises(ValueError, match="optimizer 'sgd.*' was created outside the scope"):
        Trainer(common.dense_model(strategy), keras.optimizers.SGD(0.1), "mse", strategy=strategy)


def test_trainer_outside_the_scope_without_strategy_argument_uses_the_models_strategy():
    strategy = common.mirrored(2)
    model = common.dense_model(strategy)
    assert Trainer(model, sgd_in(strategy), "mse").strategy is strategy


def test_a_model_built_under_another_strategy_is_refused():
    strategy = common.mirrored(2)
    model = common.dense_model(strategy)
    other = common.mirrored(2)
    with other.scope():
        optimizer = keras.optimizers.SGD(0.1)
    with pytest.raises(ValueError, match="pass strategy="):
        Trainer(model, optimizer, "mse", strategy=other)


def test_strategy_is_taken_from_the_active_scope():
    strategy = common.mirrored(2)
    model = common.dense_model(strategy)
    optimizer = sgd_in(strategy)
    with strategy.scope():
        trainer = Trainer(model, optimizer, "mse")
    assert trainer.strategy is strategy


def test_keras_gradient_accumulation_is_refused_with_the_replacement():
    strategy = common.mirrored(2)
    with pytest.raises(ValueError, match=r"Trainer\(grad_accum_steps=4\)"):
        Trainer(common.dense_model(strategy), sgd_in(strategy, gradient_accumulation_steps=4),
                "mse", strategy=strategy)


def test_periodic_moving_average_overwrite_is_refused_under_mirrored():
    strategy = common.mirrored(2)
    with pytest.raises(ValueError, match="Drop ema_overwrite_frequency"):
        Trainer(common.dense_model(strategy),
                sgd_in(strategy, use_ema=True, ema_overwrite_frequency=2), "mse",
                strategy=strategy)


def test_two_clippings_are_refused():
    strategy = common.mirrored(2)
    with pytest.raises(ValueError, match="choose one"):
        Trainer(common.dense_model(strategy), sgd_in(strategy, clipnorm=1.0), "mse",
                strategy=strategy, clip_norm=1.0)


@pytest.mark.parametrize("kwargs,message", [
    ({"grad_accum_steps": 0}, "grad_accum_steps must be an integer >= 1, got 0"),
    ({"steps_per_execution": 1.5}, "steps_per_execution must be an integer >= 1, got 1.5"),
    ({"clip_norm": -1.0}, r"clip_norm must be a finite number > 0 or None \(no clipping\), got -1.0"),
    # an infinite norm would scale every gradient by inf * 0 = NaN
    ({"clip_norm": float("inf")}, r"clip_norm must be a finite number > 0 or None \(no clipping\), got inf"),
    ({"jit_compile": "yes"}, "jit_compile must be True, False or None, got 'yes'"),
])
def test_bad_arguments_name_the_value(kwargs, message):
    strategy = tf.distribute.get_strategy()
    with pytest.raises(ValueError, match=message):
        Trainer(common.dense_model(strategy), sgd_in(strategy), "mse", **kwargs)


def test_an_optimizer_name_is_resolved_by_keras_compile_inside_the_scope():
    strategy = common.mirrored(2)
    trainer = Trainer(common.dense_model(strategy), "sgd", "mse", strategy=strategy)
    assert isinstance(trainer.optimizer, keras.optimizers.SGD)
    assert strategy.extended.variable_created_in_scope(trainer.optimizer.iterations.value)


def test_bad_inputs_name_what_is_allowed():
    strategy = common.mirrored(2)
    trainer = Trainer(common.dense_model(strategy), sgd_in(strategy), "mse", strategy=strategy)
    with pytest.raises(TypeError, match="must be numpy arrays.*got str"):
        trainer.fit("train.csv")
    with pytest.raises(ValueError, match="no targets"):
        trainer.fit(np.zeros((4, common.FEATURES), "float32"), verbose=0)
    with pytest.raises(ValueError, match="no targets"):
        trainer.fit(DATA.map(lambda x, y: x), verbose=0)
    with pytest.raises(ValueError, match="verbose must be one of"):
        trainer.fit(DATA, verbose="loud")
    with pytest.raises(ValueError, match="epochs must be an integer >= 0"):
        trainer.fit(DATA, epochs=-1)


def test_unbuilt_model_is_built_inside_the_scope():
    strategy = common.mirrored(2)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(common.TARGETS)])
        optimizer = keras.optimizers.SGD(0.1)
    trainer = Trainer(model, optimizer, "mse", strategy=strategy)
    history = trainer.fit(DATA, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert all(strategy.extended.variable_created_in_scope(v.value) for v in model.variables)
    assert all(isinstance(v.value, tf.distribute.DistributedValues)
               for v in model.trainable_variables)


def test_validation_steps_without_validation_data_warns_naming_it():
    """Keras's fit ignores it silently; the Trainer runs the fit and says so."""
    strategy = common.mirrored(2)
    trainer = Trainer(common.dense_model(strategy), sgd_in(strategy), "mse", strategy=strategy)
    with pytest.warns(UserWarning, match=r"^validation_steps=2 has no effect: this fit has no "
                                         r"validation data\. Pass validation_data="):
        history = trainer.fit(DATA, epochs=1, validation_steps=2, verbose=0)
    assert "loss" in history.history and "val_loss" not in history.history


def test_a_fit_that_ends_inside_an_accumulation_warns_and_the_next_fit_adds_to_it():
    strategy = common.mirrored(2)
    trainer = Trainer(common.dense_model(strategy), sgd_in(strategy), "mse", strategy=strategy,
                      grad_accum_steps=4)
    data = DATA.repeat()
    with pytest.warns(UserWarning, match=r"^fit ended between two optimizer updates "
                                         r"\(grad_accum_steps=4\): the gradients of the "
                                         r"micro-batches since the last update are held"):
        trainer.fit(data, epochs=1, steps_per_epoch=6, verbose=0)
    assert int(trainer.model.optimizer.iterations.numpy()) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(data, epochs=1, steps_per_epoch=2, verbose=0)  # 8 micro-batches in all
    assert int(trainer.model.optimizer.iterations.numpy()) == 2
    assert not [w for w in caught if "between two optimizer updates" in str(w.message)]
